"""KV-event routing end to end: two colocated decode replicas (one core each), the kv_events
policy, the real `openai` client.

Each engine publishes vLLM's KV events; the router subscribes and routes on what the engines
report they hold. After a conversation's first turn its next turn must land on the replica
holding its blocks (the `x-splitserve-replica` header) and the engine must report them cached
(`usage.prompt_tokens_details.cached_tokens`). The engines' events must carry exactly the
block hashes the router computes for the prompt (vLLM's hash, the tenant's cache salt).
"""

from __future__ import annotations

import msgspec
import numpy as np
import openai
import pytest
import ray
import zmq
from splitserve.router.forward import Forwarded, estimate_prompt
from splitserve.router.prompts import PromptBuilder
from splitserve.router.routing.kv_feed import EventSource
from splitserve.router.routing.vllm_hash import PromptHasher
from splitserve.router.tenancy.cache_salt import cache_salt_for
from splitserve.router.tenancy.tenants import DEFAULT_TENANT
from vllm.distributed.kv_events import BlockStored, KVEventBatch

from splitserve.models import resolve_model
from tests.conftest import running_deployment, test_config

pytestmark = pytest.mark.engine

CONVERSATIONS = 3  # odd: a policy blind to the caches would rotate turn 2 off turn 1's replica
TURN_TOKENS = 40
OUTPUT_TOKENS = 8


@pytest.fixture(scope="module")
def deployment():
    cfg = test_config(**{"mode": "colocated", "pools.decode.replicas": 2,
                         "router.routing.decode": "kv_events"})
    with running_deployment(cfg) as base:
        yield base


@pytest.fixture(scope="module")
def client(deployment):
    return openai.OpenAI(base_url=f"{deployment}/v1", api_key="none", timeout=120)


def _turn(client: openai.OpenAI, ids: list[int]) -> tuple[str, int, list[int]]:
    """One greedy completion: (the replica that served it, cached prompt tokens, output ids)."""
    raw = client.completions.with_raw_response.create(
        model="splitserve-tiny", prompt=ids, max_tokens=OUTPUT_TOKENS, temperature=0,
        extra_body={"return_token_ids": True, "ignore_eos": True},
    )
    resp = raw.parse()
    details = resp.usage.prompt_tokens_details
    out = resp.choices[0].model_extra.get("token_ids") or []
    replica = raw.headers["x-splitserve-replica"].rsplit("#", 1)[-1]  # Serve's replica id
    return replica, (details.cached_tokens or 0) if details else 0, out


def _replica_sources() -> dict[str, EventSource]:
    """Each decode replica's advertised KV-event endpoints (its routing stats)."""
    out = {}
    for e in ray.util.list_named_actors(all_namespaces=True):
        if e["name"].startswith("SERVE_REPLICA::splitserve#decode#"):
            actor = ray.get_actor(e["name"], namespace="serve")
            stats = ray.get(actor.record_routing_stats.remote(), timeout=30)
            source = EventSource.from_stats(stats)
            assert source is not None, f"{e['name']} advertises no KV events"
            out[e["name"].rsplit("#", 1)[-1]] = source
    return out


def _stored_hashes(source: EventSource) -> set[int]:
    """Every block hash the replica's events stored so far (its publisher's replay buffer)."""
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.connect(source.replay_endpoint)
    sock.send_multipart([b"", (0).to_bytes(8, "big")])
    decoder = msgspec.msgpack.Decoder(type=KVEventBatch)
    hashes: set[int] = set()
    try:
        while sock.poll(30_000):
            frames = sock.recv_multipart()
            if int.from_bytes(frames[-2], "big", signed=True) == -1:
                return hashes
            for event in decoder.decode(frames[-1]).events:
                if isinstance(event, BlockStored):
                    hashes.update(event.block_hashes)
        raise AssertionError("the replica's replay endpoint did not answer")
    finally:
        sock.close(linger=0)
        ctx.term()


def test_next_turn_lands_on_the_replica_holding_the_conversation(client) -> None:
    rng = np.random.default_rng(28)
    prompts = [rng.integers(10, 500, 300 + TURN_TOKENS).tolist() for _ in range(CONVERSATIONS)]
    homes = []
    for ids in prompts:  # every conversation's first turn, then every second turn
        replica, cached, out = _turn(client, ids)
        assert cached == 0
        homes.append(replica)
        ids += out
    assert len(set(homes)) == 2  # new conversations spread over the idle replicas
    (block_size,) = {s.block_size for s in _replica_sources().values()}
    for turn in (2, 3):
        for ids, home in zip(prompts, homes):
            held = len(ids) // block_size * block_size  # its full blocks so far
            ids += rng.integers(10, 500, TURN_TOKENS).tolist()
            replica, cached, out = _turn(client, ids)
            assert replica == home, f"turn {turn} left the replica holding the conversation"
            assert cached >= held > 0
            ids += out


def _chat(client: openai.OpenAI, messages: list[dict]) -> tuple[str, int, str]:
    raw = client.chat.completions.with_raw_response.create(
        model="splitserve-tiny", messages=messages, max_tokens=OUTPUT_TOKENS, temperature=0,
        extra_body={"ignore_eos": True},
    )
    resp = raw.parse()
    details = resp.usage.prompt_tokens_details
    replica = raw.headers["x-splitserve-replica"].rsplit("#", 1)[-1]
    return replica, (details.cached_tokens or 0) if details else 0, resp.choices[0].message.content


def test_chat_turns_stay_with_their_conversation(client) -> None:
    """The same through the chat API: the router's token ids of the rendered conversation (its
    tokenizer and chat template, `forward.estimate_prompt`) hash to blocks the serving engine
    reports it stored, and turn 2 finds turn 1's replica and its cached blocks."""
    rng = np.random.default_rng(11)
    words = ["alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel"]
    prompts = PromptBuilder(resolve_model(None).model, 2048)
    sources = _replica_sources()
    salt = cache_salt_for(DEFAULT_TENANT, None)
    for _ in range(CONVERSATIONS):
        messages = [{"role": "system", "content": " ".join(rng.choice(words, 200))},
                    {"role": "user", "content": " ".join(rng.choice(words, 20))}]
        home, cached, text = _chat(client, messages)
        assert cached == 0
        hasher = PromptHasher(sources[home].block_size, sources[home].hash_algo)
        ids = estimate_prompt(Forwarded("chat", {"messages": messages}), prompts)
        expected = set(hasher.hashes(ids, salt))
        assert expected and expected <= _stored_hashes(sources[home])
        messages += [{"role": "assistant", "content": text},
                     {"role": "user", "content": " ".join(rng.choice(words, 20))}]
        replica, cached, _ = _chat(client, messages)
        assert replica == home
        assert cached >= len(expected) * hasher.block_size


def test_engine_events_carry_the_routers_block_hashes(client) -> None:
    """The hashes the router computes for a prompt (vLLM's function, the engine's block size,
    the open-mode tenant's cache salt) are the ones the serving engine's events report, and
    the other engine reports none of them."""
    rng = np.random.default_rng(7)
    ids = rng.integers(10, 500, 520).tolist()
    home, _, _ = _turn(client, ids)
    sources = _replica_sources()
    assert home in sources and len(sources) == 2
    hasher = PromptHasher(sources[home].block_size, sources[home].hash_algo)
    expected = set(hasher.hashes(ids, cache_salt_for(DEFAULT_TENANT, None)))
    assert len(expected) == 520 // sources[home].block_size
    assert expected <= _stored_hashes(sources[home])
    (other,) = set(sources) - {home}
    assert not expected & _stored_hashes(sources[other])
    unsalted = set(hasher.hashes(ids, None))
    assert not unsalted & _stored_hashes(sources[home])  # the tenant's salt scopes them
