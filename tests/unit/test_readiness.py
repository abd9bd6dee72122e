"""The readiness decision (router/readiness.py): ready while the decode pool answers, degraded
when the prefill pool is short, not ready without decode; short words only."""

from __future__ import annotations

import pytest

from splitserve.router.readiness import POOL_STATES, decide, model_status

DISAGG = {"m": "disaggregated"}


def test_every_pool_answering_is_ok() -> None:
    r = decide({"m": {"prefill": "ok", "decode": "ok"}}, DISAGG)
    assert (r.ready, r.status, r.http_status) == (True, "ok", 200)
    assert r.body() == {"status": "ok", "pools": {"prefill": "ok", "decode": "ok"},
                        "models": {"m": "ok"}}


@pytest.mark.parametrize("prefill", ["timeout", "unavailable"])
def test_a_short_prefill_pool_is_ready_and_degraded(prefill: str) -> None:
    # the decode pool prefills locally: every request still completes
    r = decide({"m": {"prefill": prefill, "decode": "ok"}}, DISAGG)
    assert (r.ready, r.status, r.http_status) == (True, "degraded", 200)
    assert r.pools == {"prefill": prefill, "decode": "ok"}
    assert r.models == {"m": "degraded"}


@pytest.mark.parametrize("decode", ["timeout", "unavailable"])
@pytest.mark.parametrize("prefill", POOL_STATES)
def test_a_short_decode_pool_is_not_ready(decode: str, prefill: str) -> None:
    r = decide({"m": {"prefill": prefill, "decode": decode}}, DISAGG)
    assert (r.ready, r.status, r.http_status) == (False, "unavailable", 503)
    assert r.models == {"m": "unavailable"}


def test_colocated_needs_only_decode() -> None:
    assert decide({"m": {"decode": "ok"}}, {"m": "colocated"}).status == "ok"
    assert not decide({"m": {"decode": "timeout"}}, {"m": "colocated"}).ready


def test_a_disaggregated_model_without_a_prefill_result_is_degraded() -> None:
    assert model_status({"decode": "ok"}, "disaggregated") == "degraded"
    assert model_status({}, "disaggregated") == "unavailable"


def test_several_models_ready_while_one_can_be_served() -> None:
    modes = {"a": "disaggregated", "b": "colocated"}
    ok = decide({"a": {"prefill": "ok", "decode": "ok"}, "b": {"decode": "ok"}}, modes)
    assert (ok.ready, ok.status) == (True, "ok")
    assert ok.pools == {"a/prefill": "ok", "a/decode": "ok", "b/decode": "ok"}
    # b cannot be served, a can: still ready (b's requests get the router's 503), degraded
    one = decide({"a": {"prefill": "ok", "decode": "ok"}, "b": {"decode": "unavailable"}}, modes)
    assert (one.ready, one.status, one.models) == (True, "degraded",
                                                   {"a": "ok", "b": "unavailable"})
    short = decide({"a": {"prefill": "timeout", "decode": "ok"}, "b": {"decode": "ok"}}, modes)
    assert (short.ready, short.status, short.models) == (True, "degraded",
                                                         {"a": "degraded", "b": "ok"})
    none = decide({"a": {"prefill": "ok", "decode": "timeout"}, "b": {"decode": "timeout"}},
                  modes)
    assert (none.ready, none.status) == (False, "unavailable")


def test_no_model_is_not_ready() -> None:
    assert decide({}, {}).ready is False


def test_only_short_words_are_accepted() -> None:
    with pytest.raises(ValueError, match="not one of"):
        decide({"m": {"decode": "ActorDiedError('boom')"}}, DISAGG)
