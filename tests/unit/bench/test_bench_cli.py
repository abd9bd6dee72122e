"""`splitserve bench` argument handling (no requests are sent)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from splitserve.bench.cli import config_from_args, main
from splitserve.cli import build_parser


def parse(*argv: str):
    return build_parser().parse_args(["bench", *argv])


def test_defaults_and_full_command_line():
    cfg = config_from_args(parse(
        "--base-url", "http://h:1/v1", "--model", "m", "--rate", "4", "--arrivals", "fixed",
        "--num-requests", "20", "--prompt-len", "512:128", "--output-len", "16-64",
        "--shared-prefix", "256", "--seed", "7", "--ttft-slo-ms", "500", "--tpot-slo-ms", "50",
        "--out", "o/run1", "--sweep-rates", "1,2, 4,8", "--token-low", "3", "--token-high", "99",
    ))
    w = cfg.workload
    t = cfg.target
    assert (t.base_url, t.model, t.max_in_flight) == ("http://h:1/v1", "m", 256)
    assert (w.rate, w.arrivals, w.num_requests, w.shared_prefix) == (4.0, "fixed", 20, 256)
    assert w.seed == 7
    assert (str(w.prompt_len), str(w.output_len), w.token_range) == ("512:128", "16-64", (3, 99))
    assert (cfg.slo.ttft_ms, cfg.slo.tpot_ms) == (500, 50)
    assert cfg.out_dir == Path("o/run1") and cfg.sweep_rates == (1.0, 2.0, 4.0, 8.0)
    default = config_from_args(parse())
    assert default.out_dir.parts[0] == "bench-results" and default.sweep_rates == ()
    assert math.isinf(config_from_args(parse("--rate", "inf")).workload.rate)


@pytest.mark.parametrize("argv", [
    ["--prompt-len", "big"], ["--rate", "0"], ["--sweep-rates", "1,inf"], ["--num-requests", "0"],
    ["--max-in-flight", "0"],
])
def test_bad_values_exit_2(argv, capsys):
    assert main(argv) == 2
    assert capsys.readouterr().err.startswith("splitserve bench: ")


def test_unreachable_server_exits_1(tmp_path, capsys):
    from tests.conftest import free_port

    url = f"http://127.0.0.1:{free_port()}/v1"
    code = main(["--base-url", url, "--num-requests", "2", "--rate", "inf", "--no-plots",
                 "--out", str(tmp_path), "--timeout-s", "5"])
    out = capsys.readouterr().out
    assert code == 1 and "0/2 ok" in out and "ConnectError" in out
