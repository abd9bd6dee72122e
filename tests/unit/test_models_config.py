"""Several models in one config: `models:`, `aliases:`, `lora:`, tenants' `allowed_models`, and
what the app and the engines are built from (pure, no Ray cluster)."""

from __future__ import annotations

import json

import pytest

from splitserve.app import check_adapters, deployment_name, serve_config
from splitserve.config import ConfigError, load_config, parse_config
from splitserve.engine.args import engine_kwargs, engine_spec
from splitserve.models import build_tiny_model
from splitserve.models.tiny_lora import build_tiny_lora
from splitserve.router.replica_router import adapter_replicas
from splitserve.router.tenancy import tenants_from_config

TWO = {
    "models": [
        {"model": {"name": "tiny-v1"},
         "pools": {"prefill": {"kv_cache_gib": 1}, "decode": {"kv_cache_gib": 1}},
         "lora": {"max_loras": 1, "adapters": [{"name": "tiny-v1-sql", "path": "/a/sql"}]}},
        {"model": {"name": "tiny-v2", "tiny_variant": 1}, "mode": "colocated"},
    ],
    "aliases": [{"name": "chat", "targets": [{"model": "tiny-v1", "weight": 90},
                                             {"model": "tiny-v2", "weight": 10}]}],
    "tenants": [{"name": "acme", "allowed_models": ["tiny-v1", "chat"]}],
}


def test_one_model_config_is_its_own_only_view():
    cfg = load_config(None)
    assert cfg.model_views() == (cfg,)
    assert cfg.lora is None and cfg.models == () and cfg.aliases == ()


def test_views_take_each_models_mode_pools_and_lora():
    cfg = parse_config(TWO)
    v1, v2 = cfg.model_views()
    assert (v1.model.name, v1.mode, v1.lora.max_loras) == ("tiny-v1", "disaggregated", 1)
    assert (v2.model.name, v2.mode, v2.lora) == ("tiny-v2", "colocated", None)
    assert list(v2.deployed_pools()) == ["decode"]
    assert v1.tenants == cfg.tenants and v1.models == () and v1.aliases == ()


@pytest.mark.parametrize("change, message", [
    ({"model": {"name": "x"}}, "leave the top-level ones out"),
    ({"autoscaling": {}}, "not supported with several"),
    ({"aliases": [{"name": "tiny-v2", "targets": [{"model": "tiny-v1", "weight": 1}]}]},
     "unique"),
    ({"aliases": [{"name": "c", "targets": [{"model": "gone", "weight": 1}]}]},
     "no served model"),
    ({"aliases": [{"name": "c", "targets": []}]}, "targets"),
    ({"aliases": [{"name": "c", "targets": [{"model": "tiny-v1", "weight": 0}]}]}, "weight"),
])
def test_invalid_several_model_configs_name_the_problem(change, message):
    with pytest.raises(ConfigError, match=message):
        parse_config({**TWO, **change})


def test_overrides_keep_a_several_model_config_valid():
    cfg = parse_config(TWO).with_overrides(**{"router.port": 9001})
    assert [v.model.name for v in cfg.model_views()] == ["tiny-v1", "tiny-v2"]


def test_tenants_carry_their_access_list():
    tenants = tenants_from_config(parse_config(TWO))
    assert tenants["acme"].allowed_models == ("tiny-v1", "chat")
    assert tenants_from_config(parse_config({"tenants": [{"name": "b"}]}))["b"].allowed_models \
        is None


def test_deployment_names_and_serve_config_cover_every_model():
    cfg = parse_config(TWO)
    _, v2 = cfg.model_views()
    assert deployment_name(cfg, v2, "decode") == "decode-tiny-v2"
    one = load_config(None)
    assert deployment_name(one, one, "prefill") == "prefill"
    names = [d["name"] for d in serve_config(cfg, "cpu")["applications"][0]["deployments"]]
    assert names == ["prefill-tiny-v1", "decode-tiny-v1", "decode-tiny-v2", "router"]


def test_engine_args_turn_lora_on_with_the_models_limits():
    v1, v2 = parse_config(TWO).model_views()
    spec1, spec2 = engine_spec(v1, "prefill", "cpu"), engine_spec(v2, "decode", "cpu")
    kw = engine_kwargs(spec1, "/m")
    assert (kw["enable_lora"], kw["max_loras"], kw["max_cpu_loras"], kw["max_lora_rank"]) == (
        True, 1, 1, 16)
    assert "enable_lora" not in engine_kwargs(spec2, "/m")
    assert (spec1.tiny_variant, spec2.tiny_variant) == (0, 1)
    assert spec1.kv_transfer and not spec2.kv_transfer


def test_tiny_variants_share_shape_and_tokenizer_not_weights(tmp_path):
    from safetensors.numpy import load_file

    a = build_tiny_model(tmp_path / "a")
    b = build_tiny_model(tmp_path / "b", variant=1)
    assert (a / "config.json").read_text() == (b / "config.json").read_text()
    assert (a / "tokenizer.json").read_text() == (b / "tokenizer.json").read_text()
    wa, wb = load_file(a / "model.safetensors"), load_file(b / "model.safetensors")
    assert wa.keys() == wb.keys()
    assert not (wa["model.embed_tokens.weight"] == wb["model.embed_tokens.weight"]).all()


def test_declared_adapters_are_checked_at_deploy_time(tmp_path):
    good = build_tiny_lora(tmp_path / "good", rank=8)
    assert json.loads((good / "adapter_config.json").read_text())["r"] == 8
    lora = {"max_lora_rank": 8, "adapters": [{"name": "g", "path": str(good)}]}
    check_adapters(parse_config({"lora": lora}))
    with pytest.raises(ConfigError, match="rank 8 exceeds max_lora_rank 4"):
        check_adapters(parse_config({"lora": {**lora, "max_lora_rank": 4}}))
    with pytest.raises(ConfigError, match="cannot read"):
        check_adapters(parse_config({"lora": {"adapters": [{"name": "x", "path": "/nope"}]}}))


def test_requests_with_an_adapter_prefer_replicas_that_have_it():
    loaded = {"r1": (1,), "r2": (1, 1000), "r3": ()}
    assert adapter_replicas(loaded, None) is None
    assert adapter_replicas(loaded, 1000) == ["r2"]
    assert adapter_replicas(loaded, 1) == ["r1", "r2"]
    assert adapter_replicas(loaded, 7) is None  # nobody has it: any replica loads it
