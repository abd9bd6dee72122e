"""splitserve.controller.sim.fixed and replay traces: a configured deployment simulated on a
recorded schedule, checked against the cost model's arithmetic; and scripts/sim_vs_measured.py
on a synthetic measured directory."""

from __future__ import annotations

import json
from collections import deque
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from splitserve.controller.profiles import GIB, tiny_shape
from splitserve.controller.sim.fixed import (
    CPU_PREFILL_TOKEN_BUDGET,
    FixedDeployment,
    fixed_from_config,
    run_fixed,
)
from splitserve.controller.sim.replica import Replica
from splitserve.controller.sim.trace import replay_trace

from splitserve.config import DECODE_MAX_NUM_SEQS, load_config
from tests.scripts import load_script

# scripts/bench_disagg.py's configurations: every prompt remote / the default policy.
DISAGG = {"mode": "disaggregated", "disaggregation.prefill": "remote"}
COLOCATED = {"mode": "colocated", "pools.decode.replicas": 2}
CONDITIONAL = {"mode": "disaggregated"}


def deployment(**overrides) -> FixedDeployment:
    return fixed_from_config(load_config(None).with_overrides(**overrides))


def test_replay_trace_keeps_the_given_requests_in_arrival_order() -> None:
    t = replay_trace([2.0, 0.0, 1.0], [30, 10, 20], [3, 1, 2], rate=1.5, cached=[0, 0, 16])
    assert t.arrival_s.tolist() == [0.0, 1.0, 2.0]
    assert t.prompt.tolist() == [10, 20, 30] and t.output.tolist() == [1, 2, 3]
    assert t.cached.tolist() == [0, 16, 0]
    assert t.spec.base_rate == 1.5 and t.spec.duration_s == 2.0 and len(t) == 3
    assert replay_trace([0.0], [5], [1], rate=1).cached is None
    with pytest.raises(ValueError, match="cached tokens"):
        replay_trace([0.0], [16], [1], rate=1, cached=[16])
    with pytest.raises(ValueError, match="lengths >= 1"):
        replay_trace([0.0], [0], [1], rate=1)


def test_a_prefill_batch_computes_only_uncached_tokens() -> None:
    rep = Replica(0, None, 0.0)
    rep.pq, rep.pq_tokens = deque([0, 1, 2]), (100 - 60) + 50 + 500
    batch, tokens, sq = rep.take_prefill_batch([100, 50, 500], 200, cached=[60, 0, 0])
    assert batch == [0, 1] and tokens == 40 + 50
    assert sq == (40 * 40 + 2 * 40 * 60) + 50 * 50
    assert rep.pq_tokens == 500 and list(rep.pq) == [2]


def test_config_maps_to_the_deployed_pools() -> None:
    d = deployment(**DISAGG)
    assert d.mode == "disaggregated" and dict(d.replicas) == {"prefill": 1, "decode": 1}
    assert d.accelerator == "cpu" and d.shape == tiny_shape()
    assert d.max_seqs == DECODE_MAX_NUM_SEQS == 128  # the decode pool's slots, for every pool
    assert d.prefill_budget == CPU_PREFILL_TOKEN_BUDGET == 2048
    assert d.kv_cache_bytes == GIB and d.routing.prefill == "remote"
    assert d.slo.ttft_s == 1.0 and d.slo.tpot_s == 0.1
    c = deployment(**COLOCATED)
    assert c.mode == "colocated" and dict(c.replicas) == {"colocated": 2}
    assert deployment(**CONDITIONAL).routing == load_config(None).disaggregation
    with pytest.raises(ValueError, match="needs replicas for"):
        FixedDeployment(tiny_shape(), "cpu", "colocated", {"prefill": 1, "decode": 1})


@pytest.mark.parametrize("cached", [0, 1408])
def test_one_disaggregated_request_costs_prefill_handoff_and_decode_steps(cached: int) -> None:
    d = deployment(**DISAGG)
    c = d.cost()
    trace = replay_trace([0.0], [1536], [16], rate=1.0, cached=[cached])
    r = run_fixed(d, trace)
    n = 1536 - cached
    ttft = (c.prefill_s(n, 1, n * n + 2 * n * cached) + c.kv_transfer_s(1536)
            + c.decode_step_s(1, 1536) + c.acc.router_latency_s)
    assert r.completed == 1 and r.failed == 0
    assert r.ttft_p50_s == pytest.approx(ttft, rel=1e-9)
    assert r.tpot_p50_s == pytest.approx(c.decode_step_s(1, 1536), rel=1e-9)
    assert r.slo_attainment == 1.0


def test_one_colocated_request_has_no_handoff() -> None:
    d = deployment(**COLOCATED)
    c = d.cost()
    r = run_fixed(d, replay_trace([0.0], [1536], [16], rate=1.0))
    # The prefill step samples the first token; 15 decode steps follow.
    assert r.ttft_p50_s == pytest.approx(c.prefill_s(1536) + c.acc.router_latency_s, rel=1e-9)
    assert r.tpot_p50_s == pytest.approx(c.decode_step_s(1, 1537), rel=1e-3)


def test_prompts_queue_behind_one_prefill_engine_but_not_behind_two() -> None:
    trace = replay_trace([0.0] * 4, [1536] * 4, [16] * 4, rate=4.0)
    one = run_fixed(deployment(**DISAGG), trace)
    prefill = deployment(**DISAGG).cost().prefill_s(1536)
    # 1536-token prompts: one per 2048-token step, so the fourth waits for three prefills.
    assert one.ttft_p90_s > 3.5 * prefill
    both = [run_fixed(deployment(**COLOCATED), trace, seed=s) for s in range(3)]
    assert all(b.ttft_p90_s < one.ttft_p90_s for b in both)


def test_a_tighter_slo_lowers_attainment() -> None:
    trace = replay_trace(np.arange(10) * 0.05, [1536] * 10, [16] * 10, rate=20.0)
    loose = deployment(**DISAGG)
    tight = replace(loose, slo=replace(loose.slo, ttft_s=0.5))
    assert run_fixed(loose, trace).slo_attainment > run_fixed(tight, trace).slo_attainment


# --- conditional disaggregation: the router's own policy decides each arrival's path ----------

def conditional(**settings) -> FixedDeployment:
    return deployment(**CONDITIONAL, **{f"disaggregation.{k}": v for k, v in settings.items()})


def test_a_prompt_under_the_floor_runs_whole_on_the_decode_replica() -> None:
    d = conditional(prefill="remote", min_remote_prompt_tokens=128)
    c = d.cost()
    r = run_fixed(d, replay_trace([0.0], [100], [8], rate=1.0))
    assert r.paths == {"local": 1} and r.completed == 1
    # No handoff: the decode engine prefills the prompt, then decodes (as colocated).
    ttft = c.prefill_s(100) + c.acc.router_latency_s
    assert r.ttft_p50_s == pytest.approx(ttft, rel=1e-9)


def test_an_idle_decode_pool_takes_the_prompt_itself_then_the_prefill_pool_does() -> None:
    c = conditional().cost()
    alone = run_fixed(conditional(), replay_trace([0.0], [1536], [16], rate=1.0))
    assert alone.paths == {"local": 1}  # decode idle: the handoff would only cost time
    assert alone.ttft_p50_s == pytest.approx(c.prefill_s(1536) + c.acc.router_latency_s,
                                             rel=1e-9)
    # Long prompts arriving together: once decode is prefilling and streaming, the next go to
    # the prefill pool, so both engines prefill; every prompt remote queues on one engine.
    trace = replay_trace(np.arange(6) * 0.05, [1536] * 6, [16] * 6, rate=20.0)
    r = run_fixed(conditional(), trace)
    on_prefill = r.paths.get("remote", 0) + r.paths.get("offload", 0)
    assert r.paths.get("local", 0) >= 1 and on_prefill >= 1 and r.completed == 6
    remote = run_fixed(conditional(prefill="remote"), trace)
    assert remote.paths == {"remote": 6} and remote.ttft_p90_s > r.ttft_p90_s


def _h100_share_remote(kv_bytes_per_s: float) -> float:
    """Share of prompts the rule sends remote in the simulator on one prefill and one decode
    H100 (Llama-3-8B; 400 prompts of 64 to 6000 tokens, 128 output tokens, 2 req/s) whose
    handoff moves KV at `kv_bytes_per_s`; the config is the default."""
    from splitserve.controller.control import Controller, ControlSpec
    from splitserve.controller.profiles import ReplicaCost, h100_80gb, model_shape
    from splitserve.controller.sim.engine import Simulation
    from splitserve.controller.sim.pool import PoolSpec

    acc = replace(h100_80gb(), kv_transfer_bw=kv_bytes_per_s)
    cost = ReplicaCost(model_shape("llama-3-8b", "llama-3-8b"), acc)
    rng = np.random.default_rng(0)
    n, rate = 400, 2.0
    trace = replay_trace(np.sort(rng.uniform(0, n / rate, n)),
                         rng.integers(64, 6000, n).tolist(), [128] * n, rate=rate)
    specs = {role: PoolSpec(role, cost, 1, max_replicas=1) for role in ("prefill", "decode")}
    cfg = load_config(None)
    sim = Simulation(trace, specs, Controller(ControlSpec("fixed-peak"),
                                              {"prefill": 1, "decode": 1}),
                     routing=cfg.disaggregation, tpot_slo_s=cfg.slo.tpot_ms / 1e3,
                     ttft_slo_s=cfg.slo.ttft_ms / 1e3)
    paths = sim.run()["paths"]
    return paths.get("remote", 0) / sum(paths.values())


def test_the_share_sent_remote_rises_from_a_tcp_to_an_rdma_handoff() -> None:
    tcp = _h100_share_remote(0.36e9)  # TCP between pods (Dynamo: 655 MB in 1.8 s)
    rdma = _h100_share_remote(50e9)  # InfiniBand NDR, 400 Gb/s per GPU
    assert rdma > 2 * tcp and rdma > 0.3, (tcp, rdma)


# --- scripts/sim_vs_measured.py ----------------------------------------------------------------

def sim_vs_measured():
    return load_script("sim_vs_measured")


def write_point(root: Path, config: str, preset: str, rate: float, prompt: int, output: int,
                ttft_p50: float, attainment: float, jsonl: bool) -> None:
    d = root / config / preset / f"rate-{rate:g}"
    d.mkdir(parents=True)
    cfg = {"num_requests": 6, "rate": rate, "arrivals": "poisson", "prompt_len": str(prompt),
           "output_len": str(output), "shared_prefix": 0, "seed": 0, "warmup": 2}
    lat = {"p50": ttft_p50, "p90": 2 * ttft_p50}
    summary = {"config": cfg, "latency_ms": {"ttft": lat, "tpot": {"p50": 50.0, "p90": 60.0}},
               "slo": {"ttft_ms": 1000.0, "tpot_ms": 100.0, "attainment": attainment}}
    (d / "summary.json").write_text(json.dumps(summary))
    if jsonl:
        rows = [{"index": i, "scheduled_s": 0.5 * i, "prompt_tokens": prompt, "max_tokens": output,
                 "output_tokens": output, "ok": True} for i in range(6)]
        (d / "requests.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")


def test_script_helpers() -> None:
    s = sim_vs_measured()
    assert s.cached_tokens(1536, True) == 1408 and s.cached_tokens(1536, False) == 0
    assert s.cached_tokens(128, True) == 0 and s.cached_tokens(129, True) == 128
    assert s.pct_error(90.0, 100.0) == pytest.approx(-10.0) and s.pct_error(1.0, 0.0) is None


def test_script_compares_every_measured_point(tmp_path: Path, capsys) -> None:
    s = sim_vs_measured()
    configs = {"disagg": DISAGG, "conditional": CONDITIONAL}
    (tmp_path / "comparison.json").write_text(json.dumps({"configs": configs}))
    write_point(tmp_path, "disagg", "long", 0.5, 1536, 4, 500.0, 1.0, jsonl=True)
    write_point(tmp_path, "disagg", "long", 1, 1536, 4, 400.0, 0.0, jsonl=False)
    write_point(tmp_path, "conditional", "short", 1, 64, 64, 100.0, 1.0, jsonl=True)
    out = tmp_path / "out.json"
    result = s.main(["--measured", str(tmp_path), "--out", str(out), "--seeds", "2"])
    assert json.loads(out.read_text()) == json.loads(json.dumps(result))
    rows = {(r["config"], r["rate"]): r for r in result["rows"]}
    assert len(rows) == 3
    assert rows[("conditional", 1.0)]["predicted"]["paths"] == {"local": 12}  # 6 x 2 seeds
    first, second = rows[("disagg", 0.5)], rows[("disagg", 1.0)]
    # The first rate's prompts after the 2 warm-up ones are cold; every prompt is warm later.
    assert first["predicted"]["ttft_p90_ms"] > 2 * second["predicted"]["ttft_p90_ms"]
    p = second["predicted"]
    assert second["error_pct"]["ttft_p50_ms"] == pytest.approx(100 * (p["ttft_p50_ms"] - 400) / 400)
    assert second["attainment_error_pp"] == pytest.approx(100 * p["attainment"])
    med = result["median_abs_error"]
    assert med["attainment_pp"] == pytest.approx(
        np.median([abs(r["attainment_error_pp"]) for r in rows.values()]))
    printed = capsys.readouterr().out
    assert "| disagg | long | 1 |" in printed and "| conditional | short | 1 |" in printed
    assert "Median absolute error" in printed
    cold = s.main(["--measured", str(tmp_path), "--out", str(out), "--cold-cache"])
    cold_rows = {(r["config"], r["rate"]): r for r in cold["rows"]}
    assert cold_rows[("disagg", 1.0)]["predicted"]["ttft_p50_ms"] > 2 * p["ttft_p50_ms"]
