"""The model catalog: served models, adapters and weighted aliases; per-tenant access (pure)."""

from __future__ import annotations

from collections import Counter

import pytest

from splitserve.config import parse_config
from splitserve.router.adapters import AdapterRegistry
from splitserve.router.catalog import ModelCatalog, Target, is_allowed, pick_target
from splitserve.router.errors import APIError

CANARY = [("tiny-v1", 90.0), ("tiny-v2", 10.0)]


def _cfg():
    return parse_config({
        "models": [
            {"model": {"name": "tiny-v1"}, "mode": "disaggregated",
             "lora": {"adapters": [{"name": "tiny-v1-sql", "path": "/adapters/sql"}]}},
            {"model": {"name": "tiny-v2", "tiny_variant": 1}, "mode": "colocated"},
        ],
        "aliases": [{"name": "chat", "targets": [{"model": "tiny-v1", "weight": 90},
                                                 {"model": "tiny-v2", "weight": 10}]}],
    })


def _catalog() -> ModelCatalog:
    cfg = _cfg()
    return ModelCatalog.from_config(cfg, AdapterRegistry.from_config(cfg))


def test_pick_target_is_a_pure_function_of_key_and_seed():
    assert pick_target(CANARY, "user-1") == pick_target(CANARY, "user-1")
    picks = [pick_target(CANARY, f"user-{i}") for i in range(200)]
    assert picks != [pick_target(CANARY, f"user-{i}", seed=1) for i in range(200)]


@pytest.mark.parametrize("n, tolerance", [(200, 0.05), (20_000, 0.01)])
def test_pick_target_splits_keys_by_weight(n, tolerance):
    counts = Counter(pick_target(CANARY, f"req-{i}") for i in range(n))
    assert set(counts) == {"tiny-v1", "tiny-v2"}
    assert abs(counts["tiny-v2"] / n - 0.10) <= tolerance


def test_pick_target_edge_cases():
    assert {pick_target([("only", 1.0)], str(i)) for i in range(50)} == {"only"}
    with pytest.raises(ValueError):
        pick_target([], "k")


def test_is_allowed_takes_ids_and_patterns():
    assert is_allowed("tiny-v1", None)
    assert is_allowed("tiny-v1", ["tiny-v1"])
    assert is_allowed("ft-sql", ["tiny-v1", "ft-*"])
    assert not is_allowed("tiny-v2", ["tiny-v1"])
    assert not is_allowed("tiny-v1", [])


def test_resolve_models_adapters_and_aliases():
    cat = _catalog()
    assert cat.resolve("tiny-v2", allowed=None, key="k") == Target("tiny-v2", "tiny-v2")
    sql = cat.resolve("tiny-v1-sql", allowed=None, key="k")
    assert (sql.model, sql.base, sql.adapter.name, sql.adapter.lora_id) == (
        "tiny-v1-sql", "tiny-v1", "tiny-v1-sql", 1)
    chosen = cat.resolve("chat", allowed=None, key="user-7")
    assert chosen.model == pick_target(CANARY, "user-7")  # the response names the version


@pytest.mark.parametrize("requested, allowed", [
    ("nope", None),               # unknown
    ("tiny-v2", ["tiny-v1"]),     # not on the tenant's list
    ("tiny-v1-sql", ["tiny-v1"]),  # adapters need their own entry
    ("chat", ["tiny-v1", "tiny-v2"]),  # the alias itself must be allowed
])
def test_resolve_refuses_with_openai_404(requested, allowed):
    with pytest.raises(APIError) as exc:
        _catalog().resolve(requested, allowed=allowed, key="k")
    err = exc.value
    assert err.status == 404
    assert err.body()["error"] == {
        "message": f"The model `{requested}` does not exist or you do not have access to it.",
        "type": "invalid_request_error", "param": "model", "code": "model_not_found",
    }


def test_an_allowed_alias_reaches_targets_not_on_the_list():
    cat = _catalog()
    got = {cat.resolve("chat", allowed=["chat"], key=f"u{i}").model for i in range(100)}
    assert got == {"tiny-v1", "tiny-v2"}


def test_cards_list_models_adapters_aliases_filtered_by_access():
    cat = _catalog()
    cards = {c["id"]: c for c in cat.cards(allowed=None, created=1)}
    assert list(cards) == ["tiny-v1", "tiny-v2", "tiny-v1-sql", "chat"]
    assert cards["tiny-v1-sql"]["parent"] == "tiny-v1" and cards["tiny-v1-sql"]["root"] == "tiny-v1"
    assert cards["tiny-v1"]["parent"] is None and cards["tiny-v1"]["object"] == "model"
    assert cards["chat"]["targets"] == [{"model": "tiny-v1", "weight": 90.0},
                                        {"model": "tiny-v2", "weight": 10.0}]
    assert [c["id"] for c in cat.cards(allowed=["tiny-v2", "chat"], created=1)] == [
        "tiny-v2", "chat"]
