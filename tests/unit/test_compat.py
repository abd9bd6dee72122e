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


def test_pp_allowed_on_gpu():
    p, d = _specs("cuda", **{"pools.prefill.pipeline_parallel_size": 2})
    check_pd_compatible(p, d, SHAPE)


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
