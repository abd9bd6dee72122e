"""Conditional disaggregation decisions and the KV handoff object (pure, no Ray)."""

from __future__ import annotations

import pytest

from splitserve.config import DisaggregationConfig
from splitserve.kv_transfer.handoff import HandoffError, KVHandoff, prefill_request_params
from splitserve.router.policy import prefill_remotely

CFG = DisaggregationConfig(min_remote_prompt_tokens=100, max_prefill_queue=4)


@pytest.mark.parametrize(
    ("prompt", "cached", "queue", "want"),
    [
        (99, 0, 0, False),  # too short: local
        (100, 0, 0, True),  # at the threshold: remote
        (500, 450, 0, False),  # mostly cached: the uncached part is short
        (500, 0, 3, True),
        (500, 0, 4, False),  # prefill pool backed up: local
        (5000, 6000, 0, False),  # cached beyond the prompt never goes negative
    ],
)
def test_prefill_remotely(prompt, cached, queue, want):
    got = prefill_remotely(
        prompt_tokens=prompt, expected_cached_tokens=cached, prefill_in_flight=queue, cfg=CFG
    )
    assert got is want


def test_zero_threshold_sends_everything_remote():
    cfg = DisaggregationConfig(min_remote_prompt_tokens=0)
    assert prefill_remotely(
        prompt_tokens=1, expected_cached_tokens=0, prefill_in_flight=0, cfg=cfg
    )


PARAMS = {
    "do_remote_prefill": True,
    "do_remote_decode": False,
    "remote_block_ids": [[3, 4, 5]],
    "remote_engine_id": "prefill-abc",
    "remote_request_id": "cmpl-1-prefill",
    "remote_host": "127.0.0.1",
    "remote_port": 5601,
    "tp_size": 1,
    "remote_num_tokens": 300,
    "remote_blocks_expiry_time": None,
}


def test_handoff_round_trip():
    h = KVHandoff.from_params(PARAMS)
    assert (h.engine_id, h.host, h.port, h.tp_size, h.num_tokens) == (
        "prefill-abc", "127.0.0.1", 5601, 1, 300,
    )
    assert h.num_blocks == 3
    decode = h.decode_request_params()
    assert decode["do_remote_prefill"] is True and decode["do_remote_decode"] is False
    assert decode["remote_block_ids"] == [[3, 4, 5]]
    assert prefill_request_params() == {"do_remote_decode": True}


@pytest.mark.parametrize("missing", ["remote_engine_id", "remote_block_ids", "remote_host"])
def test_handoff_missing_field_is_refused(missing):
    params = {k: v for k, v in PARAMS.items() if k != missing}
    with pytest.raises(HandoffError, match=missing):
        KVHandoff.from_params(params)


def test_no_params_is_refused():
    with pytest.raises(HandoffError):
        KVHandoff.from_params(None)
