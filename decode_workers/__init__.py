"""Decode pool: Ray Serve replicas that stream generated tokens."""

from splitserve.decode_workers.deployment import DecodeWorker

__all__ = ["DecodeWorker"]
