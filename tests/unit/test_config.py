"""splitserve.config: defaults, strict validation with key-naming messages, overrides, dumps."""

from __future__ import annotations

import re

import pytest

from splitserve.config import (
    ConfigError,
    SplitserveConfig,
    dump_config,
    load_config,
    parse_config,
)


def test_default_config_loads() -> None:
    cfg = load_config(None)
    assert isinstance(cfg, SplitserveConfig)
    assert cfg.model.name == "splitserve-tiny"
    assert cfg.model.path is None
    assert cfg.model.max_model_len == 2048
    assert cfg.mode == "disaggregated"
    assert cfg.deployed_pools().keys() == {"prefill", "decode"}
    assert cfg.disaggregation.prefill == "auto" and cfg.disaggregation.min_remote_prompt_tokens == 0
    assert cfg.device == "auto"
    assert cfg.router.host == "127.0.0.1"
    assert cfg.router.port == 8000
    assert cfg.router.max_body_bytes == 1 << 20
    assert cfg.pools.decode.replicas == 1
    assert cfg.tenants == ()


def test_empty_document_is_defaults() -> None:
    assert parse_config(None) == SplitserveConfig()
    assert parse_config({}) == SplitserveConfig()


def test_unknown_key_named_with_dotted_path() -> None:
    with pytest.raises(ConfigError) as exc:
        parse_config({"pools": {"decode": {"replicaz": 2}}}, "deploy.yaml")
    msg = str(exc.value)
    assert "deploy.yaml" in msg
    assert "pools.decode.replicaz: unknown key" in msg


def test_unknown_top_level_key() -> None:
    with pytest.raises(ConfigError, match=r"modle: unknown key"):
        parse_config({"modle": {}})


def test_wrong_type_names_key_and_value() -> None:
    with pytest.raises(ConfigError) as exc:
        parse_config({"router": {"port": "abc"}})
    msg = str(exc.value)
    assert "router.port:" in msg
    assert "valid integer" in msg
    assert "'abc'" in msg


@pytest.mark.parametrize(
    ("doc", "key"),
    [
        ({"router": {"port": 70000}}, "router.port"),
        ({"router": {"port": 0}}, "router.port"),
        ({"pools": {"prefill": {"replicas": 0}}}, "pools.prefill.replicas"),
        ({"pools": {"decode": {"gpu_memory_utilization": 1.5}}}, "pools.decode.gpu_memory_utilization"),
        ({"model": {"max_model_len": 0}}, "model.max_model_len"),
        ({"ray": {"object_store_mb": 10}}, "ray.object_store_mb"),
        ({"mode": "split"}, "mode"),
        ({"device": "tpu"}, "device"),
    ],
)
def test_out_of_range_values_named(doc: dict, key: str) -> None:
    with pytest.raises(ConfigError, match=rf"\n  {re.escape(key)}: "):
        parse_config(doc)


def test_index_bound_is_auto_by_default_and_an_integer_overrides_it() -> None:
    assert load_config(None).router.routing.index_max_blocks == "auto"
    cfg = parse_config({"router": {"routing": {"index_max_blocks": 50000}}})
    assert cfg.router.routing.index_max_blocks == 50000


@pytest.mark.parametrize("bad", [0, -5, "Auto", "lots", 1.5, True, None])
def test_bad_index_bound_gets_one_message(bad) -> None:
    with pytest.raises(ConfigError) as exc:
        parse_config({"router": {"routing": {"index_max_blocks": bad}}})
    assert str(exc.value) == (
        "invalid config <dict>:\n  router.routing.index_max_blocks: Value error, must be 'auto' "
        f"or a whole number of blocks >= 1 (got {bad!r})"
    )


def test_duplicate_tenant_names_rejected() -> None:
    with pytest.raises(ConfigError, match=r"duplicate tenant names in \['a', 'b', 'a'\]"):
        parse_config({"tenants": [{"name": "a"}, {"name": "b"}, {"name": "a"}]})


def test_distinct_tenants_accepted() -> None:
    cfg = parse_config({"tenants": [{"name": "a"}, {"name": "b", "weight": 2}]})
    assert [t.name for t in cfg.tenants] == ["a", "b"]
    assert cfg.tenants[1].weight == 2.0


def test_top_level_must_be_mapping() -> None:
    with pytest.raises(ConfigError, match="top level must be a mapping"):
        parse_config([1, 2])


def test_config_is_frozen() -> None:
    cfg = load_config(None)
    with pytest.raises(Exception):
        cfg.router.port = 1  # type: ignore[misc]


def test_with_overrides_dotted_keys() -> None:
    cfg = load_config(None).with_overrides(
        **{"router.port": 9000, "mode": "disaggregated", "pools.decode.replicas": 3}
    )
    assert cfg.router.port == 9000
    assert cfg.mode == "disaggregated"
    assert cfg.pools.decode.replicas == 3
    assert cfg.pools.prefill.replicas == 1


def test_with_overrides_skips_none() -> None:
    base = load_config(None)
    cfg = base.with_overrides(**{"router.port": None, "mode": None, "router.host": "0.0.0.0"})
    assert cfg.router.port == 8000
    assert cfg.mode == "disaggregated"
    assert cfg.router.host == "0.0.0.0"
    assert base.router.host == "127.0.0.1"  # the original is untouched


def test_with_overrides_invalid_value_is_config_error() -> None:
    with pytest.raises(ConfigError, match="router.port"):
        load_config(None).with_overrides(**{"router.port": 0})


@pytest.mark.parametrize("mode", ["colocated", "disaggregated"])
def test_deployed_pools_per_mode(mode: str) -> None:
    cfg = parse_config({"mode": mode, "pools": {"prefill": {"replicas": 2}, "decode": {"replicas": 3}}})
    pools = cfg.deployed_pools()
    if mode == "colocated":
        assert list(pools) == ["decode"]
    else:
        assert list(pools) == ["prefill", "decode"]
        assert pools["prefill"].replicas == 2
    assert pools["decode"].replicas == 3


def test_pool_ranks() -> None:
    cfg = parse_config({"pools": {"decode": {"tensor_parallel_size": 2, "pipeline_parallel_size": 3}}})
    assert cfg.pools.decode.ranks == 6


def test_dump_round_trips() -> None:
    import yaml

    cfg = parse_config(
        {
            "mode": "disaggregated",
            "model": {"path": "/models/x", "dtype": "bfloat16"},
            "pools": {"decode": {"replicas": 4, "tensor_parallel_size": 2}},
            "router": {"port": 9001},
            "tenants": [{"name": "a", "weight": 0.5}, {"name": "b"}],
        }
    )
    text = dump_config(cfg)
    assert "port: 9001" in text
    assert parse_config(yaml.safe_load(text)) == cfg


def test_dump_default_round_trips() -> None:
    import yaml

    cfg = load_config(None)
    assert parse_config(yaml.safe_load(dump_config(cfg))) == cfg


def test_load_config_from_file(tmp_path) -> None:
    p = tmp_path / "deploy.yaml"
    p.write_text("mode: disaggregated\nrouter:\n  port: 9100\n")
    cfg = load_config(p)
    assert cfg.mode == "disaggregated"
    assert cfg.router.port == 9100


def test_load_config_error_names_file(tmp_path) -> None:
    p = tmp_path / "deploy.yaml"
    p.write_text("pools:\n  decode:\n    replicaz: 2\n")
    with pytest.raises(ConfigError) as exc:
        load_config(p)
    assert f"invalid config {p}:" in str(exc.value)
    assert "pools.decode.replicaz: unknown key" in str(exc.value)


def test_invalid_yaml_names_path(tmp_path) -> None:
    p = tmp_path / "bad.yaml"
    p.write_text("router: [unclosed\n")
    with pytest.raises(ConfigError, match=rf"invalid YAML in {re.escape(str(p))}"):
        load_config(p)


def test_missing_file_names_path(tmp_path) -> None:
    p = tmp_path / "nope.yaml"
    with pytest.raises(ConfigError) as exc:
        load_config(p)
    assert str(exc.value) == f"cannot read config {p}: No such file or directory"


def test_embedded_default_yaml_equals_model_defaults() -> None:
    # the YAML users copy must describe exactly what runs when no file is given
    assert load_config(None) == SplitserveConfig()


def test_override_switches_on_an_optional_section_with_defaults() -> None:
    from splitserve.config import load_config

    base = load_config(None)
    assert base.autoscaling is None
    cfg = base.with_overrides(**{"autoscaling.policy": "queue", "autoscaling.max_replicas": 3})
    assert cfg.autoscaling is not None
    assert (cfg.autoscaling.policy, cfg.autoscaling.max_replicas) == ("queue", 3)
    assert cfg.autoscaling.control_period_s == 5.0  # the rest are defaults
    with pytest.raises(ConfigError, match="no config section 'nosuch'"):
        base.with_overrides(**{"router.nosuch.x": 1})
