"""KV-cache handoff between prefill and decode workers (NIXL): the handoff protocol object,
per-replica connector configuration, and the deploy-time compatibility check; and the KV tier
beyond engine memory (`tier`: vLLM's offloading connector, composed with NIXL)."""

from splitserve.kv_transfer.compat import CompatibilityError, check_pd_compatible
from splitserve.kv_transfer.handoff import HandoffError, KVHandoff, prefill_request_params

__all__ = [
    "CompatibilityError",
    "HandoffError",
    "KVHandoff",
    "check_pd_compatible",
    "prefill_request_params",
]
