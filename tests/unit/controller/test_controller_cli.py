"""`splitserve plan` and `splitserve simulate` through the CLI entry point."""

from __future__ import annotations

import json
import re
from pathlib import Path

import yaml

from splitserve.cli import main


def write_config(tmp_path: Path, data: dict) -> str:
    path = tmp_path / "deploy.yaml"
    path.write_text(yaml.safe_dump(data))
    return str(path)


def test_plan_prints_pools_memory_and_predictions(tmp_path: Path, capsys) -> None:
    cfg = write_config(tmp_path, {"model": {"name": "llama-3-70b", "path": "meta-llama/Meta-Llama-3-70B",
                                            "max_model_len": 8192}, "device": "cuda",
                                  "kv_transfer": {"fabric": "infiniband"}})
    assert main(["plan", "-c", cfg, "--rate", "20", "--accelerator", "h200-141gb"]) == 0
    out = capsys.readouterr().out
    assert "llama-3-70b on h200-141gb" in out
    for needle in ("prefill pool:", "decode pool:", "memory per device", "p90 TTFT", "TPOT",
                   "handoff", "total:", "why"):
        assert needle in out, needle


def test_plan_over_tcp_names_the_handoff(tmp_path: Path, capsys) -> None:
    # The default fabric is TCP: a 1024-token KV of a 70B model (335 MB) takes about 0.9 s
    # between pods, which leaves no prefill plan inside a 1 s TTFT.
    model = {"name": "llama-3-70b", "path": "meta-llama/Meta-Llama-3-70B", "max_model_len": 8192}
    cfg = write_config(tmp_path, {"model": model, "device": "cuda"})
    assert main(["plan", "-c", cfg, "--rate", "20", "--accelerator", "h200-141gb"]) == 1
    err = capsys.readouterr().err
    assert "no prefill parallelism meets the SLO" in err
    assert re.search(r"\(handoff 9[0-9]{2} ms\) > TTFT budget", err), err


def test_plan_uses_the_config_accelerator_section(tmp_path: Path, capsys) -> None:
    cfg = write_config(tmp_path, {
        "model": {"name": "llama-3.1-405b", "path": "meta-llama/Llama-3.1-405B-Instruct"},
        "accelerator": {"name": "h100-80gb", "devices_per_node": 1, "nodes": 1},
    })
    assert main(["plan", "-c", cfg]) == 1
    err = capsys.readouterr().err
    assert "splitserve plan: llama-3.1-405b does not fit on h100-80gb" in err


def test_plan_colocated_override(capsys) -> None:
    assert main(["plan", "--mode", "colocated", "--rate", "3"]) == 0
    assert "colocated pool:" in capsys.readouterr().out


def test_simulate_writes_summary_and_timeline(tmp_path: Path, capsys) -> None:
    out_dir = tmp_path / "out"
    rc = main(["simulate", "--trace", "steady", "--policy", "ours", "--rate", "5",
               "--duration", "60", "--out", str(out_dir)])
    assert rc == 0
    printed = capsys.readouterr().out
    assert "SLO attainment" in printed and "device-hours" in printed
    summary = json.loads((out_dir / "steady-ours-disaggregated.json").read_text())
    assert summary["completed"] + summary["failed"] == summary["requests"] > 0
    timeline = json.loads((out_dir / "steady-ours-disaggregated-timeline.json").read_text())
    assert {row["pool"] for row in timeline} == {"prefill", "decode"}
    assert all(row["ready"] + row["starting"] >= 1 for row in timeline)
