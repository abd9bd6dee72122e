"""splitserve.engine.args: config -> engine spec, vLLM kwargs and environment (no vLLM)."""

from __future__ import annotations

import pytest

from splitserve.config import ConfigError, parse_config
from splitserve.engine.args import engine_env, engine_kwargs, engine_spec, omp_threads_bind


@pytest.mark.parametrize(
    ("cores", "ranks", "expected"),
    [
        ([2, 3], 2, "2|3"),
        ([0, 1, 2, 3], 2, "0,1|2,3"),
        ([4, 5, 6], 1, "4,5,6"),
        ([0, 1, 2, 3, 4, 5], 3, "0,1|2,3|4,5"),
        ([7], 1, "7"),
    ],
)
def test_omp_threads_bind(cores: list[int], ranks: int, expected: str) -> None:
    assert omp_threads_bind(cores, ranks) == expected


@pytest.mark.parametrize(("cores", "ranks"), [([0, 1, 2], 2), ([0], 2), ([], 1), ([0, 1], 0), ([0], -1)])
def test_omp_threads_bind_errors(cores: list[int], ranks: int) -> None:
    with pytest.raises(ValueError, match=rf"cannot split cores .* evenly over {ranks} ranks"):
        omp_threads_bind(cores, ranks)


def _cfg(**model):
    return parse_config(
        {
            "model": model,
            "pools": {
                "prefill": {"tensor_parallel_size": 2, "max_num_seqs": 8, "kv_cache_gib": 3},
                "decode": {"pipeline_parallel_size": 2, "max_num_seqs": 32, "gpu_memory_utilization": 0.5},
            },
        }
    )


def test_engine_spec_tiny_model_is_float32() -> None:
    spec = engine_spec(_cfg(), "decode", "cpu")
    assert spec.dtype == "float32"
    assert spec.model is None
    assert spec.served_name == "splitserve-tiny"


def test_engine_spec_explicit_path_keeps_auto() -> None:
    spec = engine_spec(_cfg(path="/models/llama"), "decode", "cuda")
    assert spec.dtype == "auto"
    assert spec.model == "/models/llama"


def test_engine_spec_explicit_dtype_kept_for_tiny() -> None:
    assert engine_spec(_cfg(dtype="bfloat16"), "decode", "cpu").dtype == "bfloat16"


def test_engine_spec_picks_role_pool() -> None:
    cfg = _cfg(max_model_len=512, seed=7)
    pre = engine_spec(cfg, "prefill", "cpu")
    dec = engine_spec(cfg, "decode", "cpu")
    assert (pre.role, pre.tensor_parallel_size, pre.pipeline_parallel_size) == ("prefill", 2, 1)
    assert (pre.max_num_seqs, pre.kv_cache_gib) == (8, 3)
    assert (dec.role, dec.tensor_parallel_size, dec.pipeline_parallel_size) == ("decode", 1, 2)
    assert (dec.max_num_seqs, dec.gpu_memory_utilization) == (32, 0.5)
    assert pre.ranks == 2 and dec.ranks == 2
    assert pre.max_model_len == 512 and pre.seed == 7


def test_engine_kwargs_cpu() -> None:
    kw = engine_kwargs(engine_spec(_cfg(), "prefill", "cpu"), "/tmp/m")
    assert kw["enforce_eager"] is True
    assert "gpu_memory_utilization" not in kw
    assert kw["model"] == "/tmp/m"
    assert kw["served_model_name"] == "splitserve-tiny"
    assert kw["dtype"] == "float32"
    assert kw["tensor_parallel_size"] == 2
    assert kw["max_num_seqs"] == 8
    assert kw["enable_prefix_caching"] is True


def test_engine_kwargs_cuda() -> None:
    kw = engine_kwargs(engine_spec(_cfg(), "decode", "cuda"), "/tmp/m")
    assert kw["gpu_memory_utilization"] == 0.5
    assert "enforce_eager" not in kw
    assert kw["pipeline_parallel_size"] == 2


def test_engine_env_cpu() -> None:
    env = engine_env(engine_spec(_cfg(), "prefill", "cpu"), [4, 5, 6, 7])
    assert env == {"VLLM_CPU_OMP_THREADS_BIND": "4,5|6,7", "VLLM_CPU_KVCACHE_SPACE": "3",
                   "ONEDNN_PRIMITIVE_CACHE_CAPACITY": "0", "SPLITSERVE_FORK_ENGINE_WORKERS": "1",
                   "SPLITSERVE_MQ_WAIT_MS": "2"}


def test_engine_env_step_wait_follows_the_pool() -> None:
    cfg = parse_config({"pools": {"prefill": {"step_wait_ms": 5},
                                  "decode": {"step_wait_ms": 0}}})
    assert engine_env(engine_spec(cfg, "prefill", "cpu"), [0])["SPLITSERVE_MQ_WAIT_MS"] == "5"
    # empty, not absent: an engine process must not inherit a value from its host's environment
    assert engine_env(engine_spec(cfg, "decode", "cpu"), [0])["SPLITSERVE_MQ_WAIT_MS"] == ""


def test_engine_env_cpu_uneven_cores_raises() -> None:
    with pytest.raises(ValueError):
        engine_env(engine_spec(_cfg(), "prefill", "cpu"), [0, 1, 2])


def test_engine_env_cuda_is_empty() -> None:
    assert engine_env(engine_spec(_cfg(), "decode", "cuda"), [0, 1]) == {}


def test_forked_engine_workers_can_be_turned_off(monkeypatch) -> None:
    monkeypatch.setenv("SPLITSERVE_FORK_ENGINE_WORKERS", "0")
    env = engine_env(engine_spec(_cfg(), "prefill", "cpu"), [4, 5, 6, 7])
    assert env["SPLITSERVE_FORK_ENGINE_WORKERS"] == "0"


def test_step_budget_reaches_the_engine_only_when_set() -> None:
    cfg = parse_config({"pools": {"decode": {"max_num_batched_tokens": 512}}})
    assert engine_kwargs(engine_spec(cfg, "decode", "cpu"), "/m")["max_num_batched_tokens"] == 512
    assert "max_num_batched_tokens" not in engine_kwargs(engine_spec(cfg, "prefill", "cpu"), "/m")


@pytest.mark.parametrize(
    ("pool", "seqs"), [({"max_num_batched_tokens": 100}, 128),  # decode's default slots
                       ({"max_num_batched_tokens": 16, "max_num_seqs": 32}, 32)],
)
def test_step_budget_below_the_sequence_slots_is_refused(pool, seqs) -> None:
    with pytest.raises(ConfigError, match=rf"max_num_batched_tokens \({pool['max_num_batched_tokens']}\) "
                       rf"must be at least max_num_seqs \({seqs}\)"):
        parse_config({"pools": {"decode": pool}})


def test_the_models_parsers_and_the_pools_scheduling_reach_the_engine() -> None:
    cfg = parse_config({
        "model": {"path": "/models/qwen", "tool_call_parser": "hermes",
                  "reasoning_parser": "qwen3"},
        "mode": "disaggregated",
        "pools": {"decode": {"scheduling_policy": "priority"}},
    })
    decode, prefill = engine_spec(cfg, "decode", "cuda"), engine_spec(cfg, "prefill", "cuda")
    assert (decode.tool_call_parser, decode.reasoning_parser) == ("hermes", "qwen3")
    # `priority` reaches vLLM's scheduler where the pool runs priority scheduling
    assert engine_kwargs(decode, "/models/qwen")["scheduling_policy"] == "priority"
    assert engine_kwargs(prefill, "/models/qwen")["scheduling_policy"] == "fcfs"


def test_the_tiny_model_gets_its_tool_call_parser_and_a_real_model_none() -> None:
    assert engine_spec(_cfg(), "decode", "cpu").tool_call_parser == "pythonic"
    assert engine_spec(_cfg(path="/models/llama"), "decode", "cuda").tool_call_parser is None


# --- each model URI scheme reaches vLLM as what vLLM loads (splitserve.models.resolve_model) ---


def _scheme_kwargs(path: str, tmp_path, monkeypatch) -> dict:
    """engine_kwargs for `model.path` the way EngineHost builds them, with the pvc mount root
    and the model cache under tmp_path."""
    import pathlib

    from splitserve.models import resolve_model

    for d in ("pvc/store/llama", "cache/s3/bucket/qwen", "cache/gs/bucket/qwen", "local/m"):
        (tmp_path / d).mkdir(parents=True)
        (tmp_path / d / "config.json").write_text("{}")
    monkeypatch.setenv("SPLITSERVE_MODEL_CACHE", str(tmp_path / "cache"))
    spec = engine_spec(_cfg(path=path), "decode", "cuda")
    model = resolve_model(spec.model, spec.tiny_variant, pvc_root=pathlib.Path(tmp_path / "pvc"))
    return engine_kwargs(spec, model.model, model.revision)


@pytest.mark.parametrize(("path", "model", "revision"), [
    ("hf://Qwen/Qwen2.5-7B-Instruct@v1.0", "Qwen/Qwen2.5-7B-Instruct", "v1.0"),
    ("Qwen/Qwen2.5-7B-Instruct", "Qwen/Qwen2.5-7B-Instruct", None),
    ("pvc://store/llama", "{tmp}/pvc/store/llama", None),
    ("s3://bucket/qwen", "{tmp}/cache/s3/bucket/qwen", None),
    ("gs://bucket/qwen/", "{tmp}/cache/gs/bucket/qwen", None),
    ("{tmp}/local/m", "{tmp}/local/m", None),
])
def test_engine_kwargs_per_model_scheme(path, model, revision, tmp_path, monkeypatch) -> None:
    kw = _scheme_kwargs(path.format(tmp=tmp_path), tmp_path, monkeypatch)
    assert kw["model"] == model.format(tmp=tmp_path)
    assert kw.get("revision") == revision
    assert ("revision" in kw) == (revision is not None)  # vLLM's default branch otherwise


def test_engine_kwargs_of_an_uncached_s3_model_is_an_error(tmp_path, monkeypatch) -> None:
    with pytest.raises(FileNotFoundError, match="is not in the model cache"):
        _scheme_kwargs("s3://other/x", tmp_path, monkeypatch)


def test_vllm_accepts_every_engine_kwarg_name() -> None:
    import dataclasses

    from vllm.engine.arg_utils import AsyncEngineArgs

    kw = engine_kwargs(engine_spec(_cfg(path="org/name"), "decode", "cuda"), "org/name", "v1")
    assert set(kw) <= {f.name for f in dataclasses.fields(AsyncEngineArgs)}


def test_vllm_finds_a_cached_hub_revision_offline(tmp_path) -> None:
    """The model cache's contract with vLLM: with HF_HOME on the cache and HF_HUB_OFFLINE=1,
    vLLM (EngineArgs, offline) turns the repo id and revision the engine passes into the
    snapshot the download step wrote (the hub cache layout snapshot_download writes), and
    refuses a revision that is not there instead of looking it up."""
    import os
    import subprocess
    import sys

    repo = tmp_path / "huggingface" / "hub" / "models--org--name"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "v1").write_text("abc123")
    (repo / "snapshots" / "abc123").mkdir(parents=True)
    (repo / "snapshots" / "abc123" / "config.json").write_text("{}")
    code = ("from vllm.transformers_utils.repo_utils import get_model_path\n"
            "print(get_model_path('org/name', 'v1'))\n"
            "try:\n    get_model_path('org/name', 'v2')\n"
            "except Exception as e:\n    print(type(e).__name__)\n")
    env = {**os.environ, "HF_HOME": str(tmp_path / "huggingface"), "HF_HUB_OFFLINE": "1"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         timeout=120, check=True).stdout.split()
    assert out == [str(repo / "snapshots" / "abc123"), "LocalEntryNotFoundError"]
