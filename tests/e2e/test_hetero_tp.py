"""Heterogeneous parallelism: prefill with tensor parallelism 2 hands its KV to a TP 1 decode.

The tiny model has 2 KV heads, so each prefill rank holds one head and the decode rank reads
both halves over NIXL. This machine has two cores and the deployment needs three ranks, so the
test sets `placement.share_cores` (development only): the decode engine shares a core with a
prefill rank. Production placement never lets engines share cores.
"""

from __future__ import annotations


import openai
import pytest
from ray import serve

from tests.conftest import direct_greedy, running_deployment, test_config

pytestmark = pytest.mark.engine


@pytest.fixture(scope="module")
def deployment():
    cfg = test_config(
        **{
            "mode": "disaggregated",
            "disaggregation.min_remote_prompt_tokens": 1,
            "disaggregation.prefill": "remote",  # the remote path, whatever the rule predicts
            # A TP-2 engine on shared cores can take long over its first prefills: no fallback
            # to a local prefill (which moves no KV) while the machine is slow.
            "disaggregation.prefill_timeout_s": 300,
            "pools.prefill.tensor_parallel_size": 2,
            "pools.decode.tensor_parallel_size": 1,
            "placement.share_cores": True,
        }
    )
    with running_deployment(cfg) as base:
        yield base


def test_prefill_tp2_to_decode_tp1_matches_local_prefill(deployment):
    import numpy as np

    client = openai.OpenAI(base_url=f"{deployment}/v1", api_key="x", max_retries=0)
    decode = serve.get_deployment_handle("decode", app_name="splitserve")
    rng = np.random.default_rng(3)
    # Warm-up: the first transfer also makes the NIXL handshake between the TP-2 and TP-1 engines.
    client.completions.create(model="splitserve-tiny", prompt=list(range(20, 220)), max_tokens=2)
    for n in (130, 700, 1500):
        ids = rng.integers(10, 500, n).tolist()
        before = decode.stats.remote().result().kv_bytes_received
        r = client.completions.create(
            model="splitserve-tiny",
            prompt=ids,
            max_tokens=12,
            temperature=0,
            extra_body={"return_token_ids": True},
        )
        moved = decode.stats.remote().result().kv_bytes_received - before
        assert moved > 0, "no KV arrived over NIXL"
        assert r.choices[0].model_extra["token_ids"] == direct_greedy(ids, 12, fresh_cache=True)
    assert decode.stats.remote().result().kv_transfer_failures == 0
