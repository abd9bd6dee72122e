"""Fault injection (splitserve/engine/faults.py) and the handoff's fetch deadline: pure, no Ray."""

from __future__ import annotations

import pytest
from splitserve.kv_transfer.handoff import (
    FETCH_BY_KEY,
    KVHandoff,
    engine_kv_params,
    fetch_deadline,
)
from splitserve.kv_transfer.nixl import nixl_transfer_config

from splitserve.config import ConfigError, FaultsConfig, load_config, parse_config
from splitserve.engine.args import engine_spec
from splitserve.engine.faults import (
    DEAD_PEER_ENGINE_ID,
    dead_peer_params,
    draw,
    hits,
    kv_load_delay_s,
    kv_load_fails,
    prefill_fails,
)

PROMPTS = [tuple(range(i, i + 200)) for i in range(1000)]


def test_faults_are_off_by_default():
    cfg = load_config(None)
    f = cfg.faults
    assert f == FaultsConfig() and not f.active
    assert not any(prefill_fails(f, p) or kv_load_fails(f, p) for p in PROMPTS[:50])
    assert engine_spec(cfg, "decode", "cpu").faults == FaultsConfig()


def test_draw_is_fixed_by_seed_kind_and_prompt():
    assert draw(0, "k", (1, 2, 3)) == draw(0, "k", (1, 2, 3))
    assert draw(0, "k", (1, 2, 3)) != draw(1, "k", (1, 2, 3))
    assert draw(0, "k", (1, 2, 3)) != draw(0, "other", (1, 2, 3))
    assert draw(0, "k", (1, 2, 3)) != draw(0, "k", (1, 2, 4))
    assert all(0 <= draw(7, "k", p) < 1 for p in PROMPTS)


def test_a_rate_hits_about_that_fraction_of_prompts():
    hit = sum(hits(3, "kv_load_failure", p, 0.2) for p in PROMPTS)
    assert 150 < hit < 250
    assert not any(hits(3, "k", p, 0.0) for p in PROMPTS)
    assert all(hits(3, "k", p, 1.0) for p in PROMPTS)


def test_kinds_are_independent():
    f = FaultsConfig(seed=1, prefill_error_rate=0.5, kv_load_failure_rate=0.5)
    assert f.active
    a = [prefill_fails(f, p) for p in PROMPTS]
    b = [kv_load_fails(f, p) for p in PROMPTS]
    assert a != b


def test_kv_load_delay_needs_both_rate_and_duration():
    p = PROMPTS[0]
    assert kv_load_delay_s(FaultsConfig(kv_load_delay_rate=1.0), p) == 0
    assert not FaultsConfig(kv_load_delay_rate=1.0).active
    assert kv_load_delay_s(FaultsConfig(kv_load_delay_rate=1.0, kv_load_delay_s=9), p) == 9
    assert kv_load_delay_s(FaultsConfig(kv_load_delay_rate=0.0, kv_load_delay_s=9), p) == 0


def test_dead_peer_params_keep_the_blocks_but_change_the_peer():
    params = {"remote_engine_id": "prefill-a", "remote_port": 5000, "remote_block_ids": [[1]]}
    dead = dead_peer_params(params, 6000)
    assert dead == {"remote_engine_id": DEAD_PEER_ENGINE_ID, "remote_port": 6000,
                    "remote_block_ids": [[1]]}
    assert params["remote_engine_id"] == "prefill-a"  # not mutated


@pytest.mark.parametrize(
    "section",
    [{"prefill_error_rate": 1.5}, {"kv_load_delay_s": -1}, {"bogus": 1}, {"seed": "x"}],
)
def test_faults_config_is_validated(section):
    with pytest.raises(ConfigError, match="faults"):
        parse_config({"faults": section})


def test_engine_spec_carries_faults_and_lease():
    cfg = parse_config(
        {"faults": {"seed": 4, "kv_load_failure_rate": 0.2}, "disaggregation": {"kv_lease_s": 9}}
    )
    spec = engine_spec(cfg, "decode", "cpu")
    assert spec.faults == FaultsConfig(seed=4, kv_load_failure_rate=0.2)
    assert spec.kv_lease_s == 9
    extra = nixl_transfer_config("e", "cpu", spec.kv_lease_s)["kv_connector_extra_config"]
    assert extra == {"kv_lease_duration": 9}


# ---- fetch deadline ---------------------------------------------------------------------------

HANDOFF = KVHandoff.from_params(
    {"remote_engine_id": "p", "remote_block_ids": [[1, 2]], "remote_host": "h", "remote_port": 1}
)


def test_fetch_deadline_keeps_a_margin_inside_the_lease():
    assert 100 < fetch_deadline(100.0, 30) < 130


def test_engine_kv_params_strips_the_deadline_before_it_expires():
    params = HANDOFF.decode_request_params(fetch_by=200.0)
    assert params[FETCH_BY_KEY] == 200.0
    got, expired = engine_kv_params(params, now=199.0)
    assert not expired and FETCH_BY_KEY not in got
    assert got["do_remote_prefill"] is True and got["remote_engine_id"] == "p"


def test_an_expired_handoff_is_recomputed_not_pulled():
    assert engine_kv_params(HANDOFF.decode_request_params(fetch_by=200.0), now=201.0) == (
        None,
        True,
    )


def test_params_without_deadline_pass_through():
    plain = HANDOFF.decode_request_params()
    assert engine_kv_params(plain, now=1e12) == (plain, False)
    assert engine_kv_params(None, now=0) == (None, False)
