"""The KV tier beyond an engine's own KV cache: vLLM's OffloadingConnector configuration, and
its composition with the NIXL handoff (vLLM's MultiConnector). Pure: plain values in, the
keyword arguments of vLLM's `KVTransferConfig` out.

What vLLM does with it (0.32): after each step the connector stores the engine's newly full
KV blocks in the tier; when a request arrives, the engine's prefix cache is looked up first,
then the tier for the blocks that follow, and the tier's hits are copied back instead of
computed (`num_external_computed_tokens`; vLLM's connector prefix-cache stats count them by
source: `host`, `disk`). Media:

- `cpu`: `CPUOffloadingSpec`, an LRU pool of `size_gib` in host memory per engine;
- `disk`: `TieringOffloadingSpec`, the same host-memory pool as the primary tier in front of
  vLLM's file-system tier under `path` (content-addressed block files written through a
  temporary file and renamed, so engines on one node can share the directory; vLLM neither
  bounds nor cleans it).

With kv_events on, the connector publishes the tier's blocks in the engine's KV events
(`BlockStored` / `BlockRemoved` with `medium` "CPU", or "STORAGE" for the disk tier), with the
full payload (token ids, parent hash: `self_describing_kv_events`).
"""

from __future__ import annotations

from typing import Any, Literal

TierMedium = Literal["none", "cpu", "disk"]
GIB = 1 << 30


def tier_transfer_config(
    medium: TierMedium, size_gib: float | None, path: str | None = None, *,
    kv_events: bool = False,
) -> dict[str, Any] | None:
    """`KVTransferConfig` keywords of vLLM's OffloadingConnector for a tier on `medium` with a
    host-memory pool of `size_gib` per engine (and block files under `path` for `disk`); None
    for `none`."""
    if medium == "none":
        return None
    if size_gib is None or size_gib <= 0:
        raise ValueError(f"a {medium} KV tier needs a positive size_gib, got {size_gib}")
    extra: dict[str, Any] = {"cpu_bytes_to_use": int(size_gib * GIB)}
    if kv_events:
        extra["self_describing_kv_events"] = True
    if medium == "disk":
        if not path:
            raise ValueError("a disk KV tier needs a path")
        extra["spec_name"] = "TieringOffloadingSpec"
        extra["secondary_tiers"] = [{"type": "fs", "root_dir": path,
                                     "enable_kv_events": kv_events}]
    elif medium != "cpu":
        raise ValueError(f"unknown KV tier medium {medium!r}")
    return {"kv_connector": "OffloadingConnector", "kv_role": "kv_both",
            "kv_connector_extra_config": extra}


def engine_transfer_config(
    nixl: dict[str, Any] | None, tier: dict[str, Any] | None
) -> dict[str, Any] | None:
    """One engine's `KVTransferConfig` keywords from its NIXL handoff config and its tier's
    (either may be None). Both: vLLM's MultiConnector over NIXL first, then the tier. NIXL
    first because the MultiConnector loads a request's KV from the first connector that has
    tokens for it: a handed-off request's KV comes over NIXL, any other request's from the tier;
    every connector saves. The MultiConnector takes NIXL's role and engine id, so the
    engine's producer/consumer behaviour is the handoff's, as without a tier.

    The children carry no `engine_id`: the MultiConnector gives each the top-level one, and
    vLLM 0.32 passes it as a keyword next to the child's own keys
    (`KVTransferConfig(**ktc, engine_id=...)` in `_get_connector_classes_and_configs`), so a
    child that names one fails with "got multiple values for keyword argument 'engine_id'"."""
    if nixl is None or tier is None:
        return nixl or tier
    children = [{k: v for k, v in c.items() if k != "engine_id"} for c in (nixl, tier)]
    return {
        "kv_connector": "MultiConnector",
        "kv_role": nixl["kv_role"],
        "engine_id": nixl["engine_id"],
        "kv_buffer_device": nixl["kv_buffer_device"],
        "kv_load_failure_policy": nixl.get("kv_load_failure_policy", "fail"),
        "kv_connector_extra_config": {"connectors": children},
    }
