"""scripts/bench_rule_vs_baseline.py: both goodput tables, with the every-gap figure recounted
from a run's requests when its summary predates it. Files only: no server is started."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.scripts import load_script

PRESET = "long-prompt-short-output"


@pytest.fixture(scope="module")
def table():
    return load_script("bench_rule_vs_baseline")


def _request(ttft: float, gaps: list[float]) -> dict:
    return {"index": 0, "scheduled_s": 0.0, "prompt_tokens": 8, "max_tokens": len(gaps) + 1,
            "sent_s": 0.0, "ttft_s": ttft, "itl_s": gaps, "e2e_s": ttft + sum(gaps),
            "output_tokens": len(gaps) + 1, "status_code": 200, "error": None}


def _run(root: Path, side: str, config: str, goodput: float, requests: list[dict],
         every_gap: float | None = None) -> None:
    """One side's comparison.json with one point at rate 2, and that run's files (2 s)."""
    point = {"rate": 2.0, "goodput_rps": goodput}
    if every_gap is not None:
        point["goodput_every_gap_rps"] = every_gap
    side_dir = root / "round-0" / side
    side_dir.mkdir(parents=True)
    (side_dir / "comparison.json").write_text(json.dumps({
        "slo": {"ttft_ms": 1000.0, "tpot_ms": 100.0},
        "results": {PRESET: {config: {"points": [point]}}}}))
    run = side_dir / config / PRESET / "rate-2"
    run.mkdir(parents=True)
    (run / "summary.json").write_text(json.dumps({"config": {"rate": 2.0}, "duration_s": 2.0}))
    (run / "requests.jsonl").write_text("".join(json.dumps(r) + "\n" for r in requests))


def test_every_gap_goodput_is_recounted_from_the_requests(table, tmp_path):
    steady = _request(0.2, [0.05] * 8)
    stalled = _request(0.2, [0.02] * 7 + [0.3])  # mean TPOT 55 ms: met; one gap of 300 ms
    late = _request(1.5, [0.05] * 8)  # TTFT missed
    _run(tmp_path, "candidate-conditional", "conditional", 1.0, [steady, steady, late])
    _run(tmp_path, "candidate-colocated", "colocated", 1.0, [steady, stalled])
    _run(tmp_path, "baseline", "conditional", 0.5, [stalled], every_gap=0.25)  # kept as given
    rounds = table.load(tmp_path)
    got = {side: res[PRESET]["points"][0]["goodput_every_gap_rps"]
           for side, res in rounds["round-0"].items()}
    assert got == {"rule": pytest.approx(1.0), "colocated": pytest.approx(0.5),
                   "baseline": pytest.approx(0.25)}
    mean_lines = table.goodput_table(rounds)
    gap_lines = table.goodput_table(rounds, "goodput_every_gap_rps")
    # on the mean the rule ties colocation (met); on every gap it beats it by twice
    assert mean_lines[-1].split()[-1] == "met" and "1.00 (1.00)" in mean_lines[-1]
    assert gap_lines[-1].split()[-1] == "met" and "0.50 (0.50)" in gap_lines[-1]


def test_a_run_without_its_files_has_no_every_gap_figure(table, tmp_path):
    assert table.recount_every_gap(tmp_path / "absent", 2.0, table.SLO(1000, 100)) is None
