"""The router with several models, aliases, access lists and run-time LoRA adapters, over fake
pools (router_fakes.py): the real request path, catalog, tenancy and admin endpoints."""

from __future__ import annotations

import asyncio
import json
from types import SimpleNamespace

import pytest
from router_fakes import DECODE_OK, PREFILL_OK, Pool, build_router, drain, http_request

from splitserve.config import parse_config
from splitserve.engine.messages import RequestRejected
from splitserve.models.tiny_lora import build_tiny_lora
from splitserve.router.catalog import pick_target
from splitserve.router.errors import APIError
from splitserve.router.lora_admin import LoadAdapter, load_adapter, unload_adapter
from splitserve.router.tenancy import generate_api_key, hash_api_key

KEY, LIMITED = generate_api_key(), generate_api_key()
ADMIN = generate_api_key()


def _cfg():
    return parse_config({
        "models": [
            {"model": {"name": "tiny-v1"}, "lora": {"max_loras": 2}},
            {"model": {"name": "tiny-v2", "tiny_variant": 1}, "mode": "colocated"},
        ],
        "disaggregation": {"prefill": "remote"},
        "aliases": [{"name": "chat", "targets": [{"model": "tiny-v1", "weight": 9},
                                                 {"model": "tiny-v2", "weight": 1}]}],
        "tenants": [{"name": "all", "api_key_hashes": [hash_api_key(KEY)]},
                    {"name": "limited", "api_key_hashes": [hash_api_key(LIMITED)],
                     "allowed_models": ["tiny-v2"]}],
        "tenancy": {"admin_key_hashes": [hash_api_key(ADMIN)]},
    })


def _router():
    pools = {"tiny-v1": {"prefill": Pool(PREFILL_OK), "decode": Pool(DECODE_OK)},
             "tiny-v2": {"decode": Pool(DECODE_OK)}}
    return build_router(_cfg(), None, None, pools=pools), pools


def _body(model: str, **extra) -> dict:
    return {"model": model, "prompt": list(range(300)), "max_tokens": 2, "stream": False,
            **extra}


async def _send(router, body, key=KEY):
    response = await router._serve("completions",
                                   http_request(body, {"authorization": f"Bearer {key}"}))
    if hasattr(response, "body_iterator"):
        await drain(response)
    return response.status_code, json.loads(response.body) if hasattr(response, "body") else None


def test_each_model_goes_to_its_own_pools():
    async def run():
        router, pools = _router()
        s1, b1 = await _send(router, _body("tiny-v1"))
        s2, b2 = await _send(router, _body("tiny-v2"))
        return pools, (s1, b1["model"]), (s2, b2["model"])

    pools, one, two = asyncio.run(run())
    assert one == (200, "tiny-v1") and two == (200, "tiny-v2")
    assert len(pools["tiny-v1"]["prefill"].requests) == 1  # 300 tokens: remote prefill
    assert len(pools["tiny-v1"]["decode"].requests) == 1
    assert len(pools["tiny-v2"]["decode"].requests) == 1


def test_alias_sends_each_user_to_its_pick():
    async def run():
        router, pools = _router()
        got = [(await _send(router, _body("chat", user=f"u{i}")))[1]["model"] for i in range(40)]
        return got, pools

    got, pools = asyncio.run(run())
    targets = [("tiny-v1", 9.0), ("tiny-v2", 1.0)]
    assert got == [pick_target(targets, f"u{i}") for i in range(40)]
    assert len(pools["tiny-v2"]["decode"].requests) == got.count("tiny-v2") > 0


def test_a_model_off_the_tenants_list_is_404_model_not_found():
    async def run():
        router, pools = _router()
        refused = await _send(router, _body("tiny-v1"), key=LIMITED)
        served = await _send(router, _body("tiny-v2"), key=LIMITED)
        listing = await type(router).models(router, http_request({}, {
            "authorization": f"Bearer {LIMITED}"}))
        return refused, served[0], json.loads(listing.body), pools

    (status, body), served, listing, pools = asyncio.run(run())
    assert status == 404 and body["error"]["code"] == "model_not_found"
    assert body["error"]["param"] == "model"
    assert served == 200
    assert [m["id"] for m in listing["data"]] == ["tiny-v2"]
    assert pools["tiny-v1"]["decode"].requests == []


class _Engine:
    """A fake pool handle with the LoRA methods over `n` replicas: each call goes to the first
    replica not in the op's `avoid_replicas` (or the first one), like the pool's router."""

    def __init__(self, fail: bool = False, n: int = 1) -> None:
        self.fail = fail
        self.replicas: dict[str, set[int]] = {f"r{i}": set() for i in range(n)}

    @property
    def loaded(self) -> set[int]:
        """Adapter ids loaded on every replica."""
        return set.intersection(*self.replicas.values())

    def _pick(self, op) -> str:
        free = [r for r in self.replicas if r not in op.avoid_replicas]
        return (free or list(self.replicas))[0]

    def _method(self, apply):
        async def run(op):
            rid = self._pick(op)
            apply(rid, op)
            return {"replica": rid, "loras": sorted(self.replicas[rid])}
        return SimpleNamespace(remote=run)

    @property
    def load_lora(self):
        def apply(rid, op):
            if self.fail:
                raise RequestRejected(rid, "cannot load adapter 'x': bad rank", "lora_path")
            self.replicas[rid].add(op.ref.lora_id)
        return self._method(apply)

    @property
    def unload_lora(self):
        return self._method(lambda rid, op: self.replicas[rid].discard(op.ref.lora_id))


def _routes(prefill: _Engine, decode: _Engine):
    router, _ = _router()
    router.routes["tiny-v1"].pools = {"prefill": prefill, "decode": decode}
    return router


def test_load_registers_only_after_every_replica_of_every_pool_loaded(tmp_path):
    path = str(build_tiny_lora(tmp_path / "a"))

    async def run():
        prefill, decode = _Engine(n=2), _Engine(fail=True, n=3)
        router = _routes(prefill, decode)
        router.routes["tiny-v1"].dispatcher.replicas.update(prefill=2, decode=3)
        body = LoadAdapter(lora_name="ft", lora_path=path, base_model="tiny-v1")
        with pytest.raises(APIError) as exc:
            await load_adapter(router.routes, router.adapters, body, 1)
        assert router.adapters.get("ft") is None and prefill.loaded == set()  # undone
        decode.fail = False
        adapter = await load_adapter(router.routes, router.adapters, body, 1)
        return exc.value, adapter, prefill, decode, router

    err, adapter, prefill, decode, router = asyncio.run(run())
    assert (err.status, err.param) == (400, "lora_path") and "bad rank" in err.message
    assert adapter.base == "tiny-v1" and prefill.loaded == decode.loaded == {adapter.ref.lora_id}
    assert [len(ids) for ids in (*prefill.replicas.values(), *decode.replicas.values())] == [1] * 5
    card = router._card("ft")
    assert (card["parent"], card["root"]) == ("tiny-v1", "tiny-v1")


@pytest.mark.parametrize("body, replicas, status, code", [
    ({"lora_name": "x", "lora_path": "{good}", "base_model": "nope"}, 1, 404, "model_not_found"),
    ({"lora_name": "x", "lora_path": "{good}", "base_model": "tiny-v2"}, 1, 400, None),
    ({"lora_name": "x", "lora_path": "{good}"}, 1, 400, None),  # two models: base needed
    ({"lora_name": "tiny-v2", "lora_path": "{good}", "base_model": "tiny-v1"}, 1, 409, "conflict"),
    ({"lora_name": "x", "lora_path": "/nowhere", "base_model": "tiny-v1"}, 1, 400, None),
    ({"lora_name": "x", "lora_path": "{good}", "base_model": "tiny-v1"}, 2, 409, "conflict"),
])
def test_load_refusals(tmp_path, body, replicas, status, code):
    good = str(build_tiny_lora(tmp_path / "a"))
    body = {k: v.replace("{good}", good) for k, v in body.items()}

    async def run():
        router = _routes(_Engine(), _Engine())
        await load_adapter(router.routes, router.adapters, LoadAdapter(**body), replicas)

    with pytest.raises(APIError) as exc:
        asyncio.run(run())
    assert (exc.value.status, exc.value.code) == (status, code)


def test_load_body_errors_are_400_naming_the_field():
    with pytest.raises(APIError) as exc:
        LoadAdapter.parse(b'{"lora_path": "/x"}')
    assert (exc.value.status, exc.value.param) == (400, "lora_name")
    with pytest.raises(APIError):
        LoadAdapter.parse(b"not json")


def test_unload_waits_for_requests_in_flight(tmp_path):
    path = str(build_tiny_lora(tmp_path / "a"))

    async def run():
        prefill, decode = _Engine(), _Engine(n=2)
        router = _routes(prefill, decode)
        router.routes["tiny-v1"].dispatcher.replicas["decode"] = 2
        body = LoadAdapter(lora_name="ft", lora_path=path, base_model="tiny-v1")
        adapter = await load_adapter(router.routes, router.adapters, body, 1)
        router.adapters.acquire("ft")  # a request is running with it
        unloading = asyncio.create_task(unload_adapter(router.routes, router.adapters, "ft", 5))
        await asyncio.sleep(0.01)
        still = (decode.loaded.copy(), unloading.done())
        with pytest.raises(APIError) as exc:  # new requests no longer find it
            router.catalog.resolve("ft", allowed=None, key="k")
        router.adapters.release("ft")
        drained = await unloading
        with pytest.raises(APIError) as gone:
            await unload_adapter(router.routes, router.adapters, "ft", 5)
        left = set().union(*decode.replicas.values())
        return adapter, still, exc.value.status, drained, left, gone.value.status

    adapter, still, status, drained, after, gone = asyncio.run(run())
    assert still == ({adapter.ref.lora_id}, False)
    assert (status, drained, after, gone) == (404, 1, set(), 404)


def test_lora_ops_are_steered_away_from_replicas_done_already():
    from splitserve.engine.messages import GenerateRequest, LoraOp, LoraRef, Sampling
    from splitserve.router.replica_router import avoid_failed

    replicas = [SimpleNamespace(replica_id=SimpleNamespace(unique_id=r)) for r in ("a", "b")]
    ref = LoraRef("x", 1000, "/x")

    def pending(arg):
        return SimpleNamespace(args=[arg])

    assert avoid_failed(replicas, pending(LoraOp(ref, ("a",)))) == replicas[1:]
    assert avoid_failed(replicas, pending(LoraOp(ref, ("a", "b")))) == replicas  # none left
    gen = GenerateRequest("r", (1,), Sampling(max_tokens=1), avoid_replicas=("b",))
    assert avoid_failed(replicas, pending(gen)) == replicas[:1]
