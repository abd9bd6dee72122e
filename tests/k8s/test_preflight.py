"""`splitserve k8s check`: a config is checked against the target before anything is applied."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from splitserve.cli import main
from splitserve.config import parse_config
from splitserve.k8s.chart import chart_values, effective_config, merge_values
from splitserve.k8s.preflight import errors, preflight
from tests.k8s.conftest import CHART

LLAMA = {"name": "llama", "path": "meta-llama/Llama-3.1-8B-Instruct"}


def cfg(mode: str = "disaggregated", **pools) -> object:
    return parse_config({"model": LLAMA, "device": "cuda", "mode": mode, "pools": pools,
                         "router": {"host": "0.0.0.0"}, "kv_transfer": {"fabric": "infiniband"}})


def keys(findings, level="error") -> list[str]:
    return [f.key for f in findings if f.level == level]


def test_fits_on_a_node() -> None:
    c = cfg(prefill={"tensor_parallel_size": 4}, decode={"tensor_parallel_size": 4})
    assert preflight(c, "helm", gpus_per_node=8) == []


def test_tp_larger_than_a_node() -> None:
    c = cfg(prefill={"tensor_parallel_size": 4}, decode={"tensor_parallel_size": 16})
    assert keys(preflight(c, "helm", gpus_per_node=8)) == ["pools.decode.tensor_parallel_size"]


def test_tp_times_pp_larger_than_a_node() -> None:
    c = cfg("colocated", decode={"tensor_parallel_size": 4, "pipeline_parallel_size": 4})
    (f,) = errors(preflight(c, "helm", gpus_per_node=8))
    assert f.key == "pools.decode" and "16 GPUs" in f.message and "8" in f.message
    assert preflight(c, "helm", gpus_per_node=16) == []


def test_idle_gpus_are_a_warning() -> None:
    c = cfg("colocated", decode={"tensor_parallel_size": 2, "pipeline_parallel_size": 3})
    found = preflight(c, "helm", gpus_per_node=8)
    assert keys(found) == [] and keys(found, "warning") == ["pools.decode"]


def test_kserve_pod_holds_every_replica() -> None:
    c = cfg(prefill={"replicas": 2, "tensor_parallel_size": 2},
            decode={"replicas": 1, "tensor_parallel_size": 4})
    assert keys(preflight(c, "kserve", gpus_per_node=8)) == []
    (f,) = errors(preflight(c, "kserve", gpus_per_node=4))  # each pool fits, all 8 GPUs do not
    assert f.key == "pools" and "8 GPUs" in f.message


def test_pd_compatibility() -> None:
    c = cfg(prefill={"tensor_parallel_size": 2}, decode={"tensor_parallel_size": 3})
    (f,) = errors(preflight(c, "helm", gpus_per_node=8))
    assert f.key == "pools" and "do not divide each other" in f.message
    same = parse_config({"model": LLAMA, "device": "cuda", "mode": "colocated",
                         "pools": {"prefill": {"tensor_parallel_size": 2},
                                   "decode": {"tensor_parallel_size": 3}}})
    assert errors(preflight(same, "helm", gpus_per_node=8)) == []  # no prefill pool deployed


@pytest.mark.parametrize("pool", ["prefill", "decode"])
def test_pipeline_parallelism_with_nixl_is_refused(pool) -> None:
    # vLLM 0.32's NIXL connector (kv_transfer/compat.py nixl_pp_problems): refused where
    # splitserve runs the engines, a warning where KServe's image does.
    c = cfg(**{pool: {"tensor_parallel_size": 2, "pipeline_parallel_size": 2}})
    for target in ("helm", "kserve"):
        (f,) = errors(preflight(c, target, gpus_per_node=8))
        assert f.key == "pools" and f"{pool} PP 2" in f.message and "NIXL" in f.message
    found = preflight(c, "llmisvc", gpus_per_node=8)
    assert keys(found) == [] and keys(found, "warning") == ["pools"]  # (cfg: InfiniBand)
    assert errors(preflight(cfg("colocated", decode={"pipeline_parallel_size": 2}), "helm")) == []


def test_cpu_rules() -> None:
    c = parse_config({"device": "cpu", "mode": "colocated",
                      "pools": {"decode": {"pipeline_parallel_size": 2}}})
    assert "pools.decode.pipeline_parallel_size" in keys(preflight(c, "helm"))
    found = preflight(parse_config({"device": "cpu", "model": LLAMA}), "llmisvc")
    assert keys(found) == ["device"]


def test_model_reachable_by_kserve() -> None:
    tiny = parse_config({"device": "cuda"})
    assert keys(preflight(tiny, "llmisvc")) == ["model.path"]
    assert keys(preflight(tiny, "kserve")) == []  # splitserve builds it in the pod
    local = parse_config({"device": "cuda", "model": {"path": "/models/llama"},
                          "router": {"host": "0.0.0.0"}, "kv_transfer": {"fabric": "roce"}})
    assert keys(preflight(local, "kserve")) == ["model.path"]
    assert keys(preflight(local, "helm"), "warning") == ["model.path"]


def test_loopback_host_warns() -> None:
    found = preflight(parse_config({"device": "cuda", "kv_transfer": {"fabric": "efa"}}), "helm")
    assert keys(found, "warning") == ["router.host"]


@pytest.mark.parametrize("target", ["helm", "llmisvc"])
@pytest.mark.parametrize("fabric", [None, "tcp"])
def test_kv_over_tcp_between_pods_warns(target, fabric) -> None:
    # Unset or tcp, a disaggregated CUDA deployment whose pools are separate pods moves its KV
    # over TCP: a warning naming the key, with the transfer time for this model (Llama 3.1 8B:
    # 128 KiB of KV a token, 134 MB for 1024 tokens at the 0.36 GB/s Dynamo measured).
    data = {"model": LLAMA, "device": "cuda", "router": {"host": "0.0.0.0"}}
    if fabric:
        data["kv_transfer"] = {"fabric": fabric}
    found = preflight(parse_config(data), target)
    assert errors(found) == []
    (f,) = [f for f in found if f.key == "kv_transfer.fabric"]
    assert f.level == "warning"
    assert f.message.startswith("tcp: " if fabric else "not set (tcp): ")
    assert "over TCP" in f.message
    assert "about 369 ms for a 1024-token prompt's KV (134 MB)" in f.message
    assert "set kv_transfer.fabric to infiniband, roce or efa" in f.message
    assert "kvFabric" in f.message


@pytest.mark.parametrize(("data", "target"), [
    ({"kv_transfer": {"fabric": "infiniband"}}, "helm"),
    ({"kv_transfer": {"fabric": "custom", "bandwidth_gbps": 100}}, "llmisvc"),
    ({}, "kserve"),  # one pod runs both pools: the KV stays in the pod
    ({"mode": "colocated"}, "helm"),  # no KV crosses pods
    ({"device": "cpu"}, "helm"),  # a CPU dev cluster
])
def test_no_tcp_warning_where_kv_does_not_cross_pods_over_tcp(data, target) -> None:
    base = {"model": LLAMA, "device": "cuda", "router": {"host": "0.0.0.0"}}
    found = preflight(parse_config({**base, **data}), target)
    assert "kv_transfer.fabric" not in [f.key for f in found]


def test_cli_check_prints_the_tcp_warning(tmp_path: Path, capsys) -> None:
    path = tmp_path / "tcp.yaml"
    path.write_text(yaml.safe_dump({"model": LLAMA, "device": "cuda",
                                    "router": {"host": "0.0.0.0"}}))
    assert main(["k8s", "check", "-c", str(path)]) == 0  # a warning, not an error
    assert "warning: kv_transfer.fabric: not set (tcp)" in capsys.readouterr().err


@pytest.mark.parametrize("values", sorted((CHART / "ci").glob("*.yaml")), ids=lambda p: p.stem)
def test_example_values_pass_preflight(values: Path) -> None:
    vals = merge_values(chart_values(), yaml.safe_load(values.read_text()))
    target = {"llmisvc": "llmisvc", "inferenceservice": "kserve"}.get(vals["kserve"]["mode"], "helm")
    assert errors(preflight(effective_config(vals), target, gpus_per_node=8)) == []


def test_cli_check(tmp_path: Path, capsys) -> None:
    good, bad = tmp_path / "good.yaml", tmp_path / "bad.yaml"
    good.write_text(yaml.safe_dump({"model": LLAMA, "device": "cuda", "router": {"host": "0.0.0.0"},
                                    "pools": {"decode": {"tensor_parallel_size": 4}}}))
    bad.write_text(yaml.safe_dump({"model": LLAMA, "device": "cuda", "mode": "colocated",
                                   "pools": {"decode": {"tensor_parallel_size": 8,
                                                        "pipeline_parallel_size": 2}}}))
    assert main(["k8s", "check", "-c", str(good), "--gpus-per-node", "8"]) == 0
    assert "ok:" in capsys.readouterr().out
    assert main(["k8s", "check", "-c", str(bad), "--gpus-per-node", "8"]) == 1
    err = capsys.readouterr().err
    assert "error: pools.decode:" in err and "16 GPUs" in err
    assert main(["k8s", "check", "-c", str(bad), "--gpus-per-node", "16"]) == 0
    assert main(["k8s", "check", "--target", "llmisvc"]) == 1
    assert "model.path" in capsys.readouterr().err


@pytest.mark.parametrize("target", ["helm", "kserve", "llmisvc"])
def test_several_models_are_refused_for_kubernetes(target) -> None:
    cfg = parse_config({"models": [{"model": {"name": "a"}}, {"model": {"name": "b"}}]})
    assert [(f.level, f.key) for f in preflight(cfg, target)] == [("error", "models")]
