"""The prefill→decode handoff as a small protocol object.

The prefill worker runs the prompt with `max_tokens=1` and `prefill_request_params()`; the engine
returns `kv_transfer_params` naming where its KV blocks wait (engine id, block ids, host/port,
TP size, expiry). `KVHandoff.from_params` checks and keeps them; `decode_request_params()` is
what the decode worker passes to its engine so that it pulls those blocks over NIXL instead of
recomputing the prompt.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

_REQUIRED = ("remote_engine_id", "remote_block_ids", "remote_host", "remote_port")

# The decode request carries the latest wall-clock time (time.time()) at which its engine may
# still start the pull; the decode worker strips it before the engine sees the params.
FETCH_BY_KEY = "splitserve_fetch_by"
# Part of the prefill's KV lease kept as margin: the lease starts just before the router sees the
# handoff, and the router's and decode node's clocks may differ a little.
LEASE_MARGIN = 0.25


class HandoffError(ValueError):
    """The prefill side returned no usable handoff (the router then prefills locally)."""


def prefill_request_params() -> dict[str, Any]:
    """`kv_transfer_params` of the prefill request: keep the blocks for a remote decode."""
    return {"do_remote_decode": True}


@dataclass(frozen=True)
class KVHandoff:
    """Where a prefilled prompt's KV cache waits, as reported by the prefill engine."""

    engine_id: str
    block_ids: tuple[Any, ...]
    host: str
    port: int
    tp_size: int
    num_tokens: int
    expires_at: float | None  # time.perf_counter() of the prefill process; None: no expiry
    raw: dict[str, Any]

    @classmethod
    def from_params(cls, params: dict[str, Any] | None) -> KVHandoff:
        """Validate the engine's `kv_transfer_params`; raise HandoffError when unusable."""
        if not params:
            raise HandoffError("prefill returned no kv_transfer_params")
        missing = [k for k in _REQUIRED if params.get(k) is None]
        if missing:
            raise HandoffError(f"prefill kv_transfer_params lack {missing}")
        return cls(
            engine_id=str(params["remote_engine_id"]),
            block_ids=tuple(params["remote_block_ids"]),
            host=str(params["remote_host"]),
            port=int(params["remote_port"]),
            tp_size=int(params.get("tp_size") or 1),
            num_tokens=int(params.get("remote_num_tokens") or 0),
            expires_at=params.get("remote_blocks_expiry_time"),
            raw=dict(params),
        )

    @property
    def num_blocks(self) -> int:
        """Blocks to transfer (first KV-cache group)."""
        first = self.block_ids[0] if self.block_ids else ()
        return len(first) if isinstance(first, (list, tuple)) else len(self.block_ids)

    def decode_request_params(self, fetch_by: float | None = None) -> dict[str, Any]:
        """`kv_transfer_params` of the decode request: pull these blocks (before `fetch_by`)."""
        params = {**self.raw, "do_remote_prefill": True, "do_remote_decode": False}
        if fetch_by is not None:
            params[FETCH_BY_KEY] = fetch_by
        return params


def fetch_deadline(received_at: float, lease_s: float) -> float:
    """Latest wall-clock time to start pulling a handoff the router received at `received_at`,
    when the prefill engine keeps unpulled blocks for `lease_s` seconds."""
    return received_at + lease_s * (1 - LEASE_MARGIN)


def engine_kv_params(
    params: dict[str, Any] | None, now: float
) -> tuple[dict[str, Any] | None, bool]:
    """(the `kv_transfer_params` to give the decode engine, whether the handoff expired).

    An expired handoff gives None: the blocks may already be freed (and reused) on the prefill
    side, so the decode engine recomputes the prompt instead of reading them.
    """
    if not params or FETCH_BY_KEY not in params:
        return params, False
    rest = {k: v for k, v in params.items() if k != FETCH_BY_KEY}
    if now > float(params[FETCH_BY_KEY]):
        return None, True
    return rest, False
