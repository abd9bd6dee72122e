"""Several models, aliases, tenant access and LoRA adapters end to end (real engines, NIXL, Ray,
and the real `openai` client).

One cluster for the module, three engines on two cores: `tiny-v1` disaggregated (one prefill,
one decode worker, LoRA on with `max_loras: 1` and one declared adapter) and `tiny-v2` (the same
architecture with other weights) colocated on one decode worker. Every output is compared with
the greedy token ids of the same model (and adapter) called directly on its engine.
"""

from __future__ import annotations

import asyncio
from collections import Counter

import httpx
import openai
import pytest
from ray import serve
from splitserve.router.catalog import pick_target
from splitserve.router.tenancy import generate_api_key, hash_api_key

from splitserve.engine.messages import LoraRef
from splitserve.models import build_tiny_model
from splitserve.models.tiny_lora import build_tiny_lora
from tests.conftest import direct_greedy, running_deployment, stream_token_ids, test_config

pytestmark = pytest.mark.engine

KEYS = {name: generate_api_key() for name in ("all", "v2only", "chatonly")}
ADMIN = generate_api_key()
CANARY = [("tiny-v1", 90.0), ("tiny-v2", 10.0)]
LONG = "Every tenant has a key, a quota, and a fair share of the machines. " * 12  # > 128 tokens
SHORT = "Once upon a time"


@pytest.fixture(scope="module")
def adapters(tmp_path_factory):
    root = tmp_path_factory.mktemp("adapters")
    return {"a": str(build_tiny_lora(root / "a", seed=1)),
            "b": str(build_tiny_lora(root / "b", seed=2))}


@pytest.fixture(scope="module")
def deployment(adapters):
    pools = {"prefill": {"kv_cache_gib": 1, "max_num_seqs": 16},
             "decode": {"kv_cache_gib": 1, "max_num_seqs": 16}}
    cfg = test_config(**{
        "models": [
            {"model": {"name": "tiny-v1"}, "mode": "disaggregated", "pools": pools,
             "lora": {"max_loras": 1, "max_lora_rank": 8,
                      "adapters": [{"name": "tiny-v1-a", "path": adapters["a"]}]}},
            {"model": {"name": "tiny-v2", "tiny_variant": 1}, "mode": "colocated",
             "pools": pools},
        ],
        "aliases": [{"name": "chat", "targets": [{"model": m, "weight": w} for m, w in CANARY]}],
        "tenants": [
            {"name": "all", "api_key_hashes": [hash_api_key(KEYS["all"])]},
            {"name": "v2only", "api_key_hashes": [hash_api_key(KEYS["v2only"])],
             "allowed_models": ["tiny-v2"]},
            {"name": "chatonly", "api_key_hashes": [hash_api_key(KEYS["chatonly"])],
             "allowed_models": ["chat"]},
        ],
        "tenancy.admin_key_hashes": [hash_api_key(ADMIN)],
        "placement.share_cores": True,
        "disaggregation.min_remote_prompt_tokens": 128,
        "disaggregation.prefill": "remote",  # the remote path, whatever the rule predicts
    })
    build_tiny_model(variant=1)
    with running_deployment(cfg) as base:
        yield base


def _client(base: str, tenant: str = "all") -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{base}/v1", api_key=KEYS[tenant], max_retries=0)


def _aclient(base: str, tenant: str = "all") -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=f"{base}/v1", api_key=KEYS[tenant], max_retries=0)


def _ids(text: str) -> list[int]:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(build_tiny_model())(text)["input_ids"]


def _greedy(client: openai.OpenAI, model: str, prompt: list[int], n: int = 12) -> list[int]:
    r = client.completions.create(model=model, prompt=prompt, max_tokens=n, temperature=0,
                                  extra_body={"return_token_ids": True})
    assert r.model == model
    return r.choices[0].model_extra["token_ids"]


def _kv_received() -> int:
    h = serve.get_deployment_handle("decode-tiny-v1", app_name="splitserve")
    return h.stats.remote().result().kv_bytes_received


def _loaded(deployment: str) -> list[int]:
    return serve.get_deployment_handle(deployment, app_name="splitserve").loras.remote().result()


def _admin(base: str) -> httpx.Client:
    return httpx.Client(base_url=base, headers={"authorization": f"Bearer {ADMIN}"}, timeout=120)


def test_models_lists_models_adapters_and_aliases_per_tenant(deployment):
    data = _client(deployment).models.list().data
    assert [m.id for m in data] == ["tiny-v1", "tiny-v2", "tiny-v1-a", "chat"]
    adapter = data[2].model_extra
    assert (adapter["parent"], adapter["root"]) == ("tiny-v1", "tiny-v1")
    assert [m.id for m in _client(deployment, "v2only").models.list().data] == ["tiny-v2"]


def test_each_model_answers_as_its_engine_called_directly(deployment):
    client = _client(deployment)
    long_ids, short_ids = _ids(LONG), _ids(SHORT)
    before = _kv_received()
    v1_long = _greedy(client, "tiny-v1", long_ids)
    assert _kv_received() > before, "tiny-v1's long prompt did not come over NIXL"
    got = {("tiny-v1", "long"): v1_long,
           ("tiny-v1", "short"): _greedy(client, "tiny-v1", short_ids),
           ("tiny-v2", "long"): _greedy(client, "tiny-v2", long_ids),
           ("tiny-v2", "short"): _greedy(client, "tiny-v2", short_ids)}
    for (model, kind), ids in got.items():
        prompt = long_ids if kind == "long" else short_ids
        assert ids == direct_greedy(prompt, 12, fresh_cache=True, deployment=f"decode-{model}"), (
            model, kind)
    assert got[("tiny-v1", "long")] != got[("tiny-v2", "long")]  # different weights


def test_tenant_access_rules_hold(deployment):
    with pytest.raises(openai.NotFoundError) as exc:
        _greedy(_client(deployment, "v2only"), "tiny-v1", _ids(SHORT), 2)
    assert exc.value.status_code == 404
    assert exc.value.response.json()["error"] == {
        "message": "The model `tiny-v1` does not exist or you do not have access to it.",
        "type": "invalid_request_error", "param": "model", "code": "model_not_found",
    }
    with pytest.raises(openai.NotFoundError):  # an adapter of a model it may not use
        _greedy(_client(deployment, "v2only"), "tiny-v1-a", _ids(SHORT), 2)
    with pytest.raises(openai.NotFoundError):  # the alias's targets are not on its own list
        _greedy(_client(deployment, "chatonly"), "tiny-v2", _ids(SHORT), 2)
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=f"{deployment}/v1", api_key="sk-wrong", max_retries=0) \
            .models.list()
    assert len(_greedy(_client(deployment, "v2only"), "tiny-v2", _ids(SHORT), 2)) == 2


def test_canary_alias_splits_200_requests_90_10(deployment):
    async def run() -> list[str]:
        client, gate = _aclient(deployment, "chatonly"), asyncio.Semaphore(16)

        async def one(i: int) -> str:
            async with gate:
                r = await client.completions.create(model="chat", prompt=SHORT, max_tokens=1,
                                                    user=f"user-{i}")
                return r.model

        return await asyncio.gather(*(one(i) for i in range(200)))

    got = asyncio.run(run())
    # sticky per user: exactly the pure split function's choice for every request...
    assert got == [pick_target(CANARY, f"user-{i}") for i in range(200)]
    # ...which splits 200 users 90/10 within tolerance
    share = Counter(got)["tiny-v2"] / 200
    assert 0.05 <= share <= 0.15, share


def test_declared_adapter_matches_a_direct_engine_run_in_disaggregated_mode(
    deployment, adapters
):
    client = _client(deployment)
    long_ids = _ids(LONG)
    before = _kv_received()
    with_adapter = _greedy(client, "tiny-v1-a", long_ids)
    assert _kv_received() > before, "the adapter request did not prefill remotely"
    ref = LoraRef("tiny-v1-a", 1, adapters["a"])
    assert with_adapter == direct_greedy(long_ids, 12, fresh_cache=True,
                                         deployment="decode-tiny-v1", lora=ref)
    assert with_adapter != direct_greedy(long_ids, 12, fresh_cache=True,
                                         deployment="decode-tiny-v1")


async def _first_tokens(started: asyncio.Event, tasks: list[asyncio.Task]) -> None:
    """Wait until a stream has its first tokens; a stream that failed first raises here."""
    waiter = asyncio.create_task(started.wait())
    await asyncio.wait([waiter, *tasks], timeout=120, return_when=asyncio.FIRST_COMPLETED)
    waiter.cancel()
    for t in tasks:
        if t.done():
            t.result()
    assert started.is_set(), "no stream produced a token"


def test_load_and_unload_at_run_time_with_requests_in_flight(deployment, adapters):
    long_ids, n = _ids(LONG), 40
    ref_a = direct_greedy(long_ids, n, fresh_cache=True, deployment="decode-tiny-v1",
                          lora=LoraRef("tiny-v1-a", 1, adapters["a"]))

    async def run():
        client = _aclient(deployment)
        started = asyncio.Event()
        in_flight = [asyncio.create_task(stream_token_ids(
            client, long_ids, n, model="tiny-v1-a", on_tokens=lambda _: started.set()))
            for _ in range(3)]
        await _first_tokens(started, in_flight)
        async with httpx.AsyncClient(base_url=deployment, timeout=120,
                                     headers={"authorization": f"Bearer {ADMIN}"}) as admin:
            loaded = await admin.post("/v1/admin/lora_adapters", json={
                "lora_name": "tiny-v1-b", "lora_path": adapters["b"], "base_model": "tiny-v1"})
            b_first = await stream_token_ids(client, long_ids, n, model="tiny-v1-b")
            a_done = await asyncio.gather(*in_flight)
            # unload b while three requests with it are running
            started.clear()
            b_flight = [asyncio.create_task(stream_token_ids(
                client, long_ids, n, model="tiny-v1-b", on_tokens=lambda _: started.set()))
                for _ in range(3)]
            await _first_tokens(started, b_flight)
            unloaded = await admin.delete("/v1/admin/lora_adapters/tiny-v1-b")
            b_done = await asyncio.gather(*b_flight)
        return loaded, b_first, a_done, unloaded, b_done

    loaded, b_first, a_done, unloaded, b_done = asyncio.run(run())
    assert loaded.status_code == 200, loaded.text
    assert loaded.json()["parent"] == "tiny-v1"
    assert a_done == [ref_a] * 3  # a's requests finished exactly, across b's load
    b_id = 1000
    ref_b = direct_greedy(long_ids, n, fresh_cache=True, deployment="decode-tiny-v1",
                          lora=LoraRef("tiny-v1-b", b_id, adapters["b"]))
    assert b_first == ref_b != ref_a
    assert unloaded.status_code == 200 and unloaded.json()["drained"] >= 1
    assert b_done == [ref_b] * 3  # in flight during the unload: finished exactly
    with pytest.raises(openai.NotFoundError):
        _greedy(_client(deployment), "tiny-v1-b", long_ids, 2)
    assert "tiny-v1-b" not in [m.id for m in _client(deployment).models.list().data]
    for pool in ("prefill-tiny-v1", "decode-tiny-v1"):  # max_loras: 1
        assert len(_loaded(pool)) <= 1


def test_admin_load_errors_are_openai_errors(deployment, adapters):
    with _admin(deployment) as admin:
        r = admin.post("/v1/admin/lora_adapters", json={
            "lora_name": "x", "lora_path": "/nowhere", "base_model": "tiny-v1"})
        assert r.status_code == 400 and r.json()["error"]["param"] == "lora_path"
        r = admin.post("/v1/admin/lora_adapters", json={
            "lora_name": "x", "lora_path": adapters["b"], "base_model": "tiny-v2"})
        assert r.status_code == 400 and "no LoRA support" in r.json()["error"]["message"]
    r = httpx.post(f"{deployment}/v1/admin/lora_adapters", json={},
                   headers={"authorization": f"Bearer {KEYS['all']}"})
    assert r.status_code == 401
