"""The KV fabric in the config (`kv_transfer`): its NIXL backend reaches vLLM's KVTransferConfig
(LIBFABRIC on EFA, vLLM's default UCX otherwise), and a custom fabric needs its bandwidth.
No engine starts."""

from __future__ import annotations

import pytest
from splitserve.kv_transfer.nixl import nixl_transfer_config
from vllm.config import KVTransferConfig

from splitserve.config import ConfigError, parse_config
from splitserve.engine.args import engine_spec


def _kv_config(fabric: str | None) -> KVTransferConfig:
    data = {"mode": "disaggregated"} | ({"kv_transfer": {"fabric": fabric}} if fabric else {})
    spec = engine_spec(parse_config(data), "decode", "cuda")
    return KVTransferConfig(**nixl_transfer_config("d-0", "cuda", spec.kv_lease_s,
                                                   role="decode", backend=spec.nixl_backend))


@pytest.mark.parametrize(("fabric", "backends"), [
    (None, ["UCX"]), ("tcp", ["UCX"]), ("infiniband", ["UCX"]), ("roce", ["UCX"]),
    ("efa", ["LIBFABRIC"]),
])
def test_the_fabric_picks_nixls_backend(fabric, backends) -> None:
    # vLLM 0.32 reads kv_connector_extra_config["backends"], default ["UCX"]
    # (nixl/base_worker.py:525); UCX is left out so the default config is what it was.
    cfg = _kv_config(fabric)
    assert cfg.get_from_extra_config("backends", ["UCX"]) == backends
    assert ("backends" in cfg.kv_connector_extra_config) == (backends != ["UCX"])


def test_unknown_backend_is_an_error() -> None:
    with pytest.raises(ValueError, match="unknown NIXL backend 'GDS'"):
        nixl_transfer_config("e", "cuda", backend="GDS")


def test_custom_fabric_needs_its_bandwidth() -> None:
    with pytest.raises(ConfigError, match="fabric custom needs bandwidth_gbps"):
        parse_config({"kv_transfer": {"fabric": "custom"}})
    cfg = parse_config({"kv_transfer": {"fabric": "custom", "bandwidth_gbps": 200}})
    assert cfg.kv_transfer.bandwidth_gbps == 200 and cfg.kv_transfer.nixl_backend == "UCX"
    with pytest.raises(ConfigError, match="kv_transfer.fabric"):
        parse_config({"kv_transfer": {"fabric": "nvlink"}})
    assert parse_config({}).kv_transfer.fabric == "tcp"
