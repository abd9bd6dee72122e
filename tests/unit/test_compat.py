"""Deploy-time prefill/decode compatibility rules."""

from __future__ import annotations

import dataclasses

import pytest

from splitserve.config import load_config
from splitserve.engine.args import engine_spec
from splitserve.kv_transfer.compat import (
    CompatibilityError,
    ModelShape,
    check_pd_compatible,
    nixl_pp_problems,
    read_model_shape,
)

SHAPE = ModelShape(num_kv_heads=8, num_layers=32)


def _specs(device="cpu", **pool_overrides):
    cfg = load_config(None).with_overrides(**pool_overrides)
    return engine_spec(cfg, "prefill", device), engine_spec(cfg, "decode", device)


def test_default_pools_are_compatible():
    check_pd_compatible(*_specs(), SHAPE)


@pytest.mark.parametrize(
    ("overrides", "needle"),
    [
        ({"pools.prefill.block_size": 16, "pools.decode.block_size": 32}, "block sizes"),
        ({"pools.decode.kv_cache_dtype": "fp8"}, "KV-cache dtypes"),
        ({"pools.prefill.tensor_parallel_size": 3, "pools.decode.tensor_parallel_size": 2},
         "do not divide"),
        ({"pools.prefill.pipeline_parallel_size": 2}, "pipeline parallelism"),
    ],
)
def test_mismatch_names_both_sides(overrides, needle):
    with pytest.raises(CompatibilityError) as exc:
        check_pd_compatible(*_specs(**overrides), SHAPE)
    msg = str(exc.value)
    assert needle in msg
    assert "Prefill: prefill(" in msg and "Decode: decode(" in msg


def test_tp_must_split_kv_heads():
    p, d = _specs(**{"pools.decode.tensor_parallel_size": 3})
    with pytest.raises(CompatibilityError, match="decode TP 3 does not split 8 KV heads"):
        check_pd_compatible(p, d, SHAPE)


def test_heterogeneous_tp_that_divides_is_allowed_on_gpu():
    p, d = _specs("cuda", **{"pools.prefill.tensor_parallel_size": 4,
                             "pools.decode.tensor_parallel_size": 2})
    check_pd_compatible(p, d, SHAPE)


@pytest.mark.parametrize(("pool", "needle"), [
    ("decode", r"refuses pipeline parallelism on a decode \(kv_consumer\) engine"),
    ("prefill", "first pipeline stage only"),
])
def test_pp_with_nixl_is_refused_on_gpu(pool, needle):
    # vLLM 0.32's NIXL connector: PP on a kv_consumer raises; the pull connector reads only a
    # producer's first PP stage (kv_transfer/compat.py nixl_pp_problems, with the vLLM lines).
    p, d = _specs("cuda", **{f"pools.{pool}.pipeline_parallel_size": 2})
    with pytest.raises(CompatibilityError, match=needle):
        check_pd_compatible(p, d, SHAPE)


def test_nixl_pp_problems_name_each_pool():
    assert nixl_pp_problems(1, 1) == []
    both = nixl_pp_problems(2, 4)
    assert [m.split(":")[0] for m in both] == ["decode PP 4", "prefill PP 2"]


def test_pp_without_disaggregation_is_not_a_pd_question():
    # Colocated engines carry no connector: check_pd_compatible is not called for them, and
    # the preflight accepts PP on a colocated GPU pool (tests/k8s/test_preflight.py).
    cfg = load_config(None).with_overrides(**{"mode": "colocated", "device": "cuda",
                                              "pools.decode.pipeline_parallel_size": 2})
    assert engine_spec(cfg, "decode", "cuda").kv_transfer is False


def test_unknown_shape_skips_head_rule():
    p, d = _specs("cuda", **{"pools.decode.tensor_parallel_size": 3,
                             "pools.prefill.tensor_parallel_size": 3})
    check_pd_compatible(p, d, None)


def test_different_models_refused():
    p, d = _specs()
    with pytest.raises(CompatibilityError, match="different models"):
        check_pd_compatible(p, dataclasses.replace(d, model="/other"), SHAPE)


def test_read_model_shape(tiny_model_dir):
    shape = read_model_shape(str(tiny_model_dir))
    assert shape == ModelShape(num_kv_heads=2, num_layers=4)
    assert read_model_shape("/nonexistent-hub-id") is None
