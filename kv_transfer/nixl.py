"""Per-replica NIXL connector configuration.

Each engine needs a unique engine id and a side-channel port of its own (plus one per extra TP
rank), also when several replicas share a node; `free_port_block` finds such a block on the
loopback or node address.
"""

from __future__ import annotations

import random
import socket
from typing import Any, Literal

# Blocks a prefill engine keeps for a decode engine that never fetches them (client cancelled,
# decode died). Older vLLM read this variable; vLLM >= 0.32 bounds such blocks by the NIXL
# connector's `kv_lease_duration` instead, which `nixl_transfer_config` sets
# (`disaggregation.kv_lease_s`). Kept in the environment for older engines.
ABORT_REQUEST_TIMEOUT_S = 60


# Side-channel ports come from outside the kernel's ephemeral range. A port from bind(0) is
# ephemeral, so in the seconds between this check and the engine binding it (after the model
# loads) an outgoing connection (Ray's gRPC, zmq, an HTTP client) could be given it; the engine's
# handshake listener then dies with "Address already in use" and the engine never gets ready.
LOWEST_PORT = 10000
EPHEMERAL_RANGE_FILE = "/proc/sys/net/ipv4/ip_local_port_range"
DEFAULT_EPHEMERAL_RANGE = (32768, 60999)  # Linux's default


def ephemeral_port_range(path: str = EPHEMERAL_RANGE_FILE) -> tuple[int, int]:
    """The kernel's range of automatically assigned ports (Linux), else Linux's default."""
    try:
        with open(path) as f:
            low, high = (int(x) for x in f.read().split())
        return low, high
    except (OSError, ValueError):
        return DEFAULT_EPHEMERAL_RANGE


def port_block_bases(size: int, ephemeral: tuple[int, int]) -> tuple[int, int]:
    """Inclusive range of first ports p whose block p..p+size-1 avoids the ephemeral range:
    below it if there is room, else above it, else anywhere unprivileged."""
    low, high = ephemeral
    if low - size >= LOWEST_PORT:
        return LOWEST_PORT, low - size
    if high + 1 <= 65536 - size:
        return high + 1, 65536 - size
    return 1024, 65536 - size


def free_port_block(
    host: str, size: int, attempts: int = 50, rng: random.Random | None = None
) -> int:
    """A port p such that p..p+size-1 are all free on `host` right now, chosen at random outside
    the ephemeral range (so that only another engine's pick could collide with it)."""
    rng = rng or random.SystemRandom()
    first, last = port_block_bases(size, ephemeral_port_range())
    for _ in range(attempts):
        base = rng.randint(first, last)
        if all(_is_free(host, base + i) for i in range(size)):
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


# vLLM's `kv_role` of each pool's engines. vLLM 0.32 deprecates `kv_both` with the NIXL connector
# (vllm/distributed/kv_transfer/kv_connector/v1/nixl/connector.py:97-103, "Please set
# kv_role='kv_producer' for prefill instances and kv_role='kv_consumer' for decode instances").
# Both roles still run whole requests, which splitserve needs: a prefill replica runs whole
# requests on the router's offload paths (`offload`, `short_offload`, `short_output_offload` in
# router/policy.py) and a decode replica prefills locally (fallback, short prompts). In vLLM 0.32
# the role does not gate what a request may do: the NIXL scheduler acts on each request's
# kv_transfer_params (nixl/pull_scheduler.py:59 `params.get("do_remote_prefill")`, :69
# `do_remote_decode`, :209 `if not params: return False, None`), so a request without them is an
# ordinary local request whatever the role. What the role changes (paths under vllm/):
#   - `is_kv_producer` (config/kv_transfer.py:131): the connector's `requires_kv_delivery`
#     (distributed/kv_transfer/kv_connector/v1/base.py:206; a request preempted with a hand-off
#     pending is recomputed) and Mamba partial-tail offloads (v1/core/sched/scheduler.py:3018):
#     a decode engine hands no KV off, so it needs neither;
#   - `is_kv_consumer` (config/kv_transfer.py:135): deferred block frees under async scheduling
#     or PP (v1/core/sched/scheduler.py:191) and the KV-fetch gauge (v1/metrics/loggers.py:571):
#     a prefill engine never loads KV (only decode requests carry `do_remote_prefill`,
#     kv_transfer/handoff.py), so it needs neither;
#   - pipeline parallelism is refused on a `kv_consumer` (nixl/base_worker.py:775-779,
#     "NixlPushConnector consumer (decode) does not support pipeline_parallel_size > 1");
#     `compat.check_pd_compatible` refuses PP with NIXL before any engine starts.
# Decode migration (router/retry.py) recomputes on the new replica: no decode-to-decode KV.
KV_ROLES: dict[str, str] = {"prefill": "kv_producer", "decode": "kv_consumer"}


def kv_role(role: str | None) -> str:
    """vLLM's `kv_role` for an engine of pool `role` (see `KV_ROLES`). None, an engine whose
    pool is unknown, keeps `kv_both` (deprecated in vLLM 0.32 but still accepted)."""
    if role is None:
        return "kv_both"
    try:
        return KV_ROLES[role]
    except KeyError:
        raise ValueError(f"unknown pool {role!r}; expected one of {sorted(KV_ROLES)}") from None


# NIXL's transport plugins that splitserve configures (`config.kv_transfer.nixl_backend`): UCX
# (vLLM's default: InfiniBand, RoCE, TCP, shared memory) and LIBFABRIC (AWS EFA). Both ship in
# the nixl 1.5.1 wheel (nixl_cu13.libs/nixl/libplugin_UCX.so, libplugin_LIBFABRIC.so); vLLM 0.32
# reads the choice from `kv_connector_extra_config["backends"]` (nixl/base_worker.py:525,
# default ["UCX"]).
NIXL_BACKENDS = ("UCX", "LIBFABRIC")


def nixl_transfer_config(
    engine_id: str, device: Literal["cpu", "cuda"], lease_s: int = 30,
    *, role: str | None = None, backend: str = "UCX",
) -> dict[str, Any]:
    """Keyword arguments of vLLM's `KVTransferConfig` for one engine of pool `role`
    (`kv_producer` for prefill, `kv_consumer` for decode: `kv_role`).

    `lease_s`: how long a prefill engine keeps KV blocks that no decode engine has pulled; a
    decode engine holding the request renews the lease by heartbeats until it pulls.
    `backend`: NIXL's transport plugin (`NIXL_BACKENDS`); UCX is vLLM's default and is left out.
    """
    if backend not in NIXL_BACKENDS:
        raise ValueError(f"unknown NIXL backend {backend!r}; expected one of {NIXL_BACKENDS}")
    extra: dict[str, Any] = {"kv_lease_duration": lease_s}
    if backend != "UCX":
        extra["backends"] = [backend]
    return {
        "kv_connector": "NixlConnector",
        "kv_role": kv_role(role),
        "kv_buffer_device": "cpu" if device == "cpu" else "cuda",
        "engine_id": engine_id,
        # A failed or expired pull recomputes the prompt on decode instead of failing the request.
        "kv_load_failure_policy": "recompute",
        "kv_connector_extra_config": extra,
    }
