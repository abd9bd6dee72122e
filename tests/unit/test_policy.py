"""Conditional disaggregation decisions and the KV handoff object (pure, no Ray)."""

from __future__ import annotations

import pytest

from splitserve.config import DisaggregationConfig
from splitserve.kv_transfer.handoff import HandoffError, KVHandoff, prefill_request_params
from splitserve.router.policy import PoolLoad, PrefillPath, prefill_path

# No handoff cost here: these cases compare the two backlogs alone (the cost has its own tests).
CFG = DisaggregationConfig(
    min_remote_prompt_tokens=100, max_prefill_queue=4, decode_stream_cost_tokens=50,
    handoff_cost_tokens=0,
)
IDLE = PoolLoad()


def _path(prompt, cached=0, load=IDLE, cfg=CFG) -> PrefillPath:
    return prefill_path(prompt_tokens=prompt, expected_cached_tokens=cached, load=load, cfg=cfg)


@pytest.mark.parametrize(
    ("prompt", "cached", "load", "want"),
    [
        (99, 0, IDLE, PrefillPath.SHORT),  # too short: local
        (100, 0, IDLE, PrefillPath.REMOTE),  # at the threshold: remote
        (500, 450, IDLE, PrefillPath.SHORT),  # mostly cached: the uncached part is short
        (5000, 6000, IDLE, PrefillPath.SHORT),  # cached beyond the prompt never goes negative
        # 3 prefills of 100 tokens ahead vs 8 decoding streams = 400 token-equivalents: remote
        (500, 0, PoolLoad(prefill_requests=3, prefill_tokens=300, decode_streams=8),
         PrefillPath.REMOTE),
        (500, 0, PoolLoad(prefill_requests=4), PrefillPath.QUEUE_FULL),  # backed up: local
        # one long prompt prefilling, decode idle: share the prefill work (spill)
        (1536, 0, PoolLoad(prefill_requests=1, prefill_tokens=1536), PrefillPath.SPILL),
        # ... unless decode is busier: 1536 / 1 < (1000 + 20 streams x 50) / 1
        (1536, 0, PoolLoad(prefill_requests=1, prefill_tokens=1536, local_prefill_tokens=1000,
                           decode_streams=20), PrefillPath.REMOTE),
        # equal backlogs go remote (decode steps stay free of prefill)
        (1536, 0, PoolLoad(prefill_requests=1, prefill_tokens=1536, local_prefill_tokens=1536),
         PrefillPath.REMOTE),
        # backlogs are per replica: 2 prefill replicas halve 1536 below decode's 1000
        (1536, 0, PoolLoad(prefill_requests=1, prefill_tokens=1536, prefill_replicas=2,
                           local_prefill_tokens=1000), PrefillPath.REMOTE),
        (1536, 0, PoolLoad(prefill_requests=1, prefill_tokens=1536, local_prefill_tokens=1000,
                           decode_replicas=2), PrefillPath.SPILL),
    ],
)
def test_prefill_path(prompt, cached, load, want):
    got = _path(prompt, cached, load)
    assert got is want
    assert got.remote is (want is PrefillPath.REMOTE)


def test_spill_off_sends_long_prompts_remote_until_the_queue_is_full():
    cfg = CFG.model_copy(update={"spill_to_decode": False})
    busy = PoolLoad(prefill_requests=3, prefill_tokens=10_000)
    assert _path(1536, load=busy, cfg=cfg) is PrefillPath.REMOTE
    assert _path(1536, load=PoolLoad(prefill_requests=4), cfg=cfg) is PrefillPath.QUEUE_FULL


def test_the_handoff_cost_keeps_prompts_on_a_decode_pool_with_spare_capacity():
    cfg = CFG.model_copy(update={"handoff_cost_tokens": 256})
    assert _path(1536, load=IDLE, cfg=cfg) is PrefillPath.SPILL  # both idle: no handoff wins
    # decode streaming 6 requests (6 x 50 = 300 > 256): remote keeps its steps free
    assert _path(1536, load=PoolLoad(decode_streams=6), cfg=cfg) is PrefillPath.REMOTE
    # decode already prefilling 200 tokens, the prefill pool nothing: 0 + 256 > 200, local
    assert _path(1536, load=PoolLoad(local_prefill_tokens=200), cfg=cfg) is PrefillPath.SPILL
    assert _path(1536, load=PoolLoad(local_prefill_tokens=300), cfg=cfg) is PrefillPath.REMOTE


def test_zero_threshold_sends_everything_remote():
    cfg = DisaggregationConfig(min_remote_prompt_tokens=0, spill_to_decode=False)
    assert _path(1, cfg=cfg) is PrefillPath.REMOTE


def test_alternating_arrivals_share_prefill_between_the_pools():
    """Long prompts arriving while earlier ones are still prefilling: with an idle decode pool
    the decisions alternate, so both engines prefill (what two colocated engines would do)."""
    load = {"remote": 0, "local": 0}
    paths = []
    for _ in range(6):
        path = _path(1536, load=PoolLoad(
            prefill_requests=load["remote"] // 1536, prefill_tokens=load["remote"],
            local_prefill_tokens=load["local"],
        ))
        load["remote" if path.remote else "local"] += 1536
        paths.append(path.value)
    assert paths == ["remote", "spill"] * 3


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
