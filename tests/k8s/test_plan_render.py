"""`k8s render --plan-rate`: the LLMInferenceService carries the planner's parallelism and
replicas, and still validates against the upstream CRD."""

from __future__ import annotations

import yaml

from splitserve.cli import main
from splitserve.config import parse_config
from splitserve.controller.planner import apply_plan, plan_for_config

CONFIG = {
    "model": {"name": "llama-3-70b", "path": "meta-llama/Meta-Llama-3-70B-Instruct"},
    "device": "cuda",
    "slo": {"ttft_ms": 1000, "tpot_ms": 50},
    "kv_transfer": {"fabric": "infiniband"},  # over TCP a 70B KV handoff alone takes ~0.9 s
}


def test_apply_plan_sets_every_pool():
    cfg = parse_config(CONFIG)
    plan = plan_for_config(cfg, "h200-141gb", rate=20)
    planned = apply_plan(cfg, plan)
    for pool in plan.pools:
        got = getattr(planned.pools, pool.role)
        assert (got.replicas, got.tensor_parallel_size, got.pipeline_parallel_size) == (
            pool.replicas, pool.tp, pool.pp,
        )


def test_llmisvc_from_plan_matches_plan(tmp_path, capsys, validate):
    cfg_file = tmp_path / "llama70.yaml"
    cfg_file.write_text(yaml.safe_dump(CONFIG))
    rc = main(["k8s", "render", "-c", str(cfg_file), "--target", "llmisvc",
               "--plan-rate", "20", "--accelerator", "h200-141gb"])
    assert rc == 0
    (svc,) = [d for d in yaml.safe_load_all(capsys.readouterr().out) if d]
    validate(svc)
    plan = {p.role: p for p in plan_for_config(parse_config(CONFIG), "h200-141gb", rate=20).pools}
    spec = svc["spec"]
    assert spec["replicas"] == plan["decode"].replicas
    assert spec["parallelism"] == {"tensor": plan["decode"].tp, "pipeline": plan["decode"].pp}
    assert spec["prefill"]["replicas"] == plan["prefill"].replicas
    assert spec["prefill"]["parallelism"] == {
        "tensor": plan["prefill"].tp, "pipeline": plan["prefill"].pp,
    }


def test_impossible_plan_is_refused(tmp_path, capsys):
    cfg_file = tmp_path / "llama405.yaml"
    cfg_file.write_text(yaml.safe_dump({
        **CONFIG, "model": {"name": "llama-3.1-405b", "path": "meta-llama/Llama-3.1-405B"},
        "accelerator": {"name": "h100-80gb", "devices_per_node": 1, "nodes": 1},
    }))
    rc = main(["k8s", "render", "-c", str(cfg_file), "--target", "llmisvc", "--plan-rate", "5"])
    assert rc == 1
    assert "does not fit" in capsys.readouterr().err
