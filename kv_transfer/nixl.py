"""Per-replica NIXL connector configuration.

Each engine needs a unique engine id and a side-channel port of its own (plus one per extra TP
rank), also when several replicas share a node; `free_port_block` finds such a block on the
loopback or node address.
"""

from __future__ import annotations

import socket
from typing import Any, Literal

# Blocks a prefill engine keeps for a decode engine that never fetches them (client cancelled,
# decode died). vLLM's default is minutes; a short bound keeps prefill KV from piling up.
ABORT_REQUEST_TIMEOUT_S = 60


def free_port_block(host: str, size: int, attempts: int = 50) -> int:
    """A port p such that p..p+size-1 are all free on `host` right now."""
    for _ in range(attempts):
        with socket.socket() as s:
            s.bind((host, 0))
            base = s.getsockname()[1]
        if base + size > 65535:
            continue
        if all(_is_free(host, base + i) for i in range(1, size)):
            return base
    raise RuntimeError(f"no block of {size} free ports on {host}")


def _is_free(host: str, port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def nixl_env(host: str, port: int) -> dict[str, str]:
    """Environment of an engine process for the NIXL side channel."""
    return {
        "VLLM_NIXL_SIDE_CHANNEL_HOST": host,
        "VLLM_NIXL_SIDE_CHANNEL_PORT": str(port),
        "VLLM_NIXL_ABORT_REQUEST_TIMEOUT": str(ABORT_REQUEST_TIMEOUT_S),
    }


def nixl_transfer_config(engine_id: str, device: Literal["cpu", "cuda"]) -> dict[str, Any]:
    """Keyword arguments of vLLM's `KVTransferConfig` for one engine (both roles use kv_both)."""
    return {
        "kv_connector": "NixlConnector",
        "kv_role": "kv_both",
        "kv_buffer_device": "cpu" if device == "cpu" else "cuda",
        "engine_id": engine_id,
        # A failed or expired pull recomputes the prompt on decode instead of failing the request.
        "kv_load_failure_policy": "recompute",
    }
