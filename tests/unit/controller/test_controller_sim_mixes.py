"""splitserve.controller.sim.mixes and scripts/sim_mixes.py: every length mix runs on the
colocated, disaggregated and conditional deployments the planner sizes, and the plans hold."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from splitserve.controller.planner import Slo
from splitserve.controller.sim import Scenario, TraceSpec, build
from splitserve.controller.sim.mixes import MIXES, Mix, compare_mixes, format_table, run_arm

from splitserve.config import DisaggregationConfig
from tests.scripts import load_script

LOOSE = Slo(1.0, 0.1)


def small_arm(mix: Mix, arm: str, **kw):
    return run_arm(mix, arm, rate=20, duration_s=30, slo=LOOSE,
                   routing=kw.pop("routing", DisaggregationConfig()), **kw)


def test_only_the_conditional_arm_asks_the_router_policy() -> None:
    chat = MIXES[0]
    disagg, cond = small_arm(chat, "disaggregated"), small_arm(chat, "conditional")
    assert disagg.result.paths == {}  # every prompt remote, no decision taken
    assert sum(cond.result.paths.values()) == cond.result.requests
    assert disagg.plan.mode == cond.plan.mode == "disaggregated"
    assert disagg.shape == cond.shape and disagg.shape.startswith("P ")


def test_conditional_routing_settings_reach_the_policy() -> None:
    # With `prefill: local`, the policy runs every request whole on decode.
    local = DisaggregationConfig(prefill="local")
    cond = small_arm(MIXES[0], "conditional", routing=local)
    assert cond.result.paths == {"local": cond.result.requests}


@pytest.mark.parametrize("mix", [m for m in MIXES if m.prompt_tokens >= 2048], ids=lambda m: m.name)
def test_colocated_plans_for_long_prompts_meet_the_slo_in_the_simulator(mix: Mix) -> None:
    # The planner once sized colocated PP replicas as if their prefill were pipelined; the
    # simulator (rightly: decode pauses for a whole prefill) gave them 0% attainment.
    arm = run_arm(mix, "colocated", rate=50, duration_s=60, slo=LOOSE,
                  routing=DisaggregationConfig())
    assert arm.result.slo_attainment > 0.95, (arm.shape, arm.result)


def test_table_has_one_row_per_mix_and_slo() -> None:
    rows = compare_mixes(MIXES[:2], rate=20, duration_s=20, slo=LOOSE)
    table = format_table(rows).splitlines()
    assert len(table) == 2 + 2
    assert table[2].startswith("| chat (512 / 256) | 1000 ms / 100 ms |")
    assert table[3].startswith("| summarization (4096 / 128) |")
    with pytest.raises(ValueError, match="arm 'mixed'"):
        run_arm(MIXES[0], "mixed", rate=1, duration_s=1, slo=LOOSE, routing=DisaggregationConfig())


def _script():
    return load_script("sim_mixes")


def test_script_prints_the_table_and_writes_json(tmp_path: Path, capsys) -> None:
    out = tmp_path / "mixes.json"
    rc = _script().main(["--rate", "20", "--duration", "20", "--mix", "short", "--slo", "300/30",
                         "--set", "disaggregation.prefill=remote", "--out", str(out)])
    assert rc == 0
    printed = capsys.readouterr().out
    assert "| short (128 / 64) | 300 ms / 30 ms |" in printed
    data = json.loads(out.read_text())
    assert [d["mix"]["name"] for d in data] == ["short"]
    assert set(data[0]["arms"]) == {"colocated", "disaggregated", "conditional"}


def test_script_refuses_bad_options(capsys) -> None:
    script = _script()
    for argv, message in ((["--slo", "300"], "expected TTFT_MS/TPOT_MS"),
                          (["--set", "router.x=1"], "expected disaggregation.KEY=VALUE")):
        with pytest.raises(SystemExit) as err:
            script.parse_args(argv)
        assert err.value.code == 2
        assert message in capsys.readouterr().err


def test_each_router_replica_sees_its_share_of_the_work_in_flight() -> None:
    trace = TraceSpec("steady", 20, 10)
    sim, _, _ = build(Scenario(trace=trace, routing=DisaggregationConfig(), router_replicas=4))
    sim.remote_reqs, sim.decode_streams = 80, 12
    for req in range(80):  # 500 tokens each, sent at t = 0; no time passes
        sim.backlog["prefill"].add(req, 500, 0.0, 0.0)
    load = sim.load(0.0)
    assert (load.prefill_requests, load.prefill_tokens, load.decode_streams) == (20, 10_000, 3)
    assert load.prefill_replicas == len(sim.front.routable)  # every pool replica, unshared
    with pytest.raises(ValueError, match="router_replicas"):
        build(Scenario(trace=trace, router_replicas=0))
