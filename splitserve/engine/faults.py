"""Fault injection for tests and development (config section `faults`; all off by default).

A fault hits a fixed fraction of prompts: `hits(seed, kind, token_ids, rate)` hashes the seed,
the fault kind and the prompt's token ids into [0, 1). The same prompt is always hit or always
spared, so a test can tell in advance which of its requests a fault reaches (and a retry of a hit
prompt on another replica is hit again). Workers consult the `faults` config section
(`FaultsConfig`) only when its `active` is true, so the request path costs one check when no
fault is configured.

Faults and where they act:
- `prefill_error`: the prefill worker raises `InjectedFault` instead of prefilling;
- `prefill_delay_s`: the prefill worker waits before each prefill (a slow engine);
- `kv_load_failure`: the decode worker points the handoff at a dead NIXL peer, so the
  connector's handshake fails and the engine recomputes the prompt (`kv_load_failure_policy`);
- `kv_load_delay`: the decode worker waits before its engine sees the request, as when the
  decode queue is long; past the handoff's fetch deadline it recomputes instead of pulling.
Killing a replica needs no hook: a test calls `ray.kill` on the replica's actor.
"""

from __future__ import annotations

import hashlib
import socket
from collections.abc import Sequence
from typing import Any

from splitserve.config import FaultsConfig

DEAD_PEER_ENGINE_ID = "splitserve-fault-dead-peer"


class InjectedFault(RuntimeError):
    """Raised by a worker where a configured fault says so."""


def draw(seed: int, kind: str, token_ids: Sequence[int]) -> float:
    """A number in [0, 1) fixed by (seed, fault kind, prompt)."""
    h = hashlib.sha256(f"{seed}:{kind}:".encode())
    h.update(",".join(map(str, token_ids)).encode())
    return int.from_bytes(h.digest()[:8], "big") / 2**64


def hits(seed: int, kind: str, token_ids: Sequence[int], rate: float) -> bool:
    """Whether the fault `kind` at `rate` hits this prompt."""
    return rate > 0 and draw(seed, kind, token_ids) < rate


def prefill_fails(f: FaultsConfig, token_ids: Sequence[int]) -> bool:
    """Should the prefill worker raise for this prompt?"""
    return hits(f.seed, "prefill_error", token_ids, f.prefill_error_rate)


def kv_load_fails(f: FaultsConfig, token_ids: Sequence[int]) -> bool:
    """Should the decode worker send this prompt's KV pull to a dead peer?"""
    return hits(f.seed, "kv_load_failure", token_ids, f.kv_load_failure_rate)


def kv_load_delay_s(f: FaultsConfig, token_ids: Sequence[int]) -> float:
    """Seconds the decode worker waits before its engine sees this prompt (0: none)."""
    if f.kv_load_delay_s and hits(f.seed, "kv_load_delay", token_ids, f.kv_load_delay_rate):
        return f.kv_load_delay_s
    return 0.0


def dead_peer_params(params: dict[str, Any], dead_port: int) -> dict[str, Any]:
    """The handoff redirected to an engine that does not exist, on a port nobody listens on:
    the NIXL handshake times out (vLLM waits 5 s) and the transfer is reported failed."""
    return {**params, "remote_engine_id": DEAD_PEER_ENGINE_ID, "remote_port": dead_port}


def closed_port(host: str) -> int:
    """A port on `host` that was free a moment ago (and that no engine listens on)."""
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]
