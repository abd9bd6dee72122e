"""Prefill pool: Ray Serve replicas that compute prompts' KV caches."""

from splitserve.prefill_workers.deployment import PrefillWorker

__all__ = ["PrefillWorker"]
