"""Direct streaming's pieces without a cluster: the verdict and settlement codecs
(engine/routed.py), the router's leases (router/direct.py) and the replica's front
(engine/front.py) over a stand-in ASGI app in the place of vLLM's (the real one runs in
tests/e2e/test_direct_streaming.py)."""

from __future__ import annotations

import asyncio
import dataclasses
import contextlib
import json
from typing import Any

import pytest

from splitserve.engine import front, routed, vllm_server
from splitserve.engine.messages import GenerateChunk, HTTPCall
from splitserve.engine.routed import Settlement, Verdict, VerdictError
from splitserve.router import direct, forward
from splitserve.router.tenancy.admission import Ticket
from splitserve.router.tenancy.service import RequestUsage
from splitserve.router.tenancy.vtc import VTCScheduler

# ---- the verdict header and the settlement ------------------------------------------------


@pytest.mark.parametrize("verdict", [
    Verdict("serve", endpoint="chat", request_id="r1", model='odd "model" \\ name',
            max_tokens=17, cache_salt="salt", ticket="t" * 32, settle_url="http://h:1/x",
            stream_interval=4),
    Verdict("serve", endpoint="chat", request_id="r2", ticket="t", settle_url="http://h:1/x",
            kv_transfer_params={"do_remote_prefill": True, "remote_block_ids": [1, 2],
                                "remote_engine_id": "e-1", "remote_host": "10.0.0.1"}),
    Verdict("refuse", status=429, error={"error": {"message": 'quota "x"', "code": None}},
            headers={"Retry-After": "3"}),
    Verdict("forward"),
])
def test_verdict_round_trips_through_a_header_lua_can_read(verdict: Verdict) -> None:
    value = verdict.encode()
    # HAProxy's Lua reads the router's answer with `"name":"([^"]*)"`: no quote, no backslash
    assert '"' not in value and "\\" not in value
    assert Verdict.decode(value) == verdict
    assert Verdict.decode(value.encode()) == verdict


@pytest.mark.parametrize("value", ["not base64 !", "bm90IGpzb24=", "eyJhIjoxfQ=="])
def test_an_unreadable_verdict_is_an_error(value: str) -> None:
    with pytest.raises(VerdictError):
        Verdict.decode(value)


def test_settlement_round_trips_and_refuses_other_json() -> None:
    s = Settlement("abc", prompt_tokens=5, output_tokens=9, first_token_s=0.1, decode_s=0.4,
                   status=200)
    assert Settlement.from_json(s.to_json()) == s
    for body in (b"[]", b'{"output_tokens": 3}', b"nope"):
        with pytest.raises(ValueError):
            Settlement.from_json(body)


@pytest.mark.parametrize(("payload", "endpoint"), [
    ({"messages": []}, "chat"), ({"prompt": "x"}, "completions"),
    ({"prompt": "x", "messages": []}, "chat"), ({"lora_name": "a"}, None), ([1], None),
    (None, None),
])
def test_the_endpoint_is_guessed_from_the_body(payload: Any, endpoint: str | None) -> None:
    assert routed.guess_endpoint(payload) == endpoint


# ---- the router's leases ------------------------------------------------------------------


class _Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _lease(expires_at: float, closed: list[str], settled: list[Any]) -> direct.Lease:
    stack = contextlib.AsyncExitStack()
    stack.callback(closed.append, "closed")
    ticket = Ticket("ann", 10, VTCScheduler())
    return direct.Lease(stack, RequestUsage(prompt_tokens=10), ticket, "decode", expires_at,
                        settled.append)


def test_a_settled_lease_charges_what_the_replica_reports() -> None:
    closed: list[str] = []
    settled: list[Any] = []
    leases = direct.Leases(_Clock())
    lease = _lease(200.0, closed, settled)
    key = leases.add(lease)
    assert len(key) == 32 and len(leases) == 1
    s = Settlement(key, output_tokens=7, first_token_s=0.1, decode_s=0.6)
    asyncio.run(direct.settle(leases.take(key), s))
    assert (lease.usage.prompt_tokens, lease.usage.generated_tokens) == (10, 7)
    assert lease.ticket.output_tokens == 7
    assert closed == ["closed"] and settled == [s]
    assert leases.take(key) is None  # settled once


def test_a_request_that_never_generated_is_not_charged() -> None:
    closed: list[str] = []
    lease = _lease(200.0, closed, [])
    asyncio.run(direct.settle(lease, Settlement("k", generated=False, output_tokens=99)))
    assert (lease.usage.prompt_tokens, lease.usage.generated_tokens) == (0, 0)
    assert lease.ticket.output_tokens == 0 and closed == ["closed"]


def test_leases_nobody_settles_expire_and_are_closed() -> None:
    clock = _Clock()
    leases = direct.Leases(clock)
    closed: list[str] = []
    settled: list[Any] = []
    leases.add(_lease(150.0, closed, settled))
    kept = leases.add(_lease(300.0, closed, settled))
    assert asyncio.run(direct.close_expired(leases)) == 0
    clock.now = 150.0
    assert asyncio.run(direct.close_expired(leases)) == 1
    assert closed == ["closed"] and settled == [None]  # charged its prompt only
    assert len(leases) == 1 and leases.take(kept) is not None


# ---- the replica's front ------------------------------------------------------------------


class _Client:
    """An ASGI call's sent messages."""

    def __init__(self) -> None:
        self.messages: list[dict[str, Any]] = []

    async def send(self, message: dict[str, Any]) -> None:
        self.messages.append(message)

    @property
    def status(self) -> int:
        return self.messages[0]["status"]

    @property
    def headers(self) -> dict[str, str]:
        return {k.decode(): v.decode() for k, v in self.messages[0]["headers"]}

    @property
    def body(self) -> bytes:
        return b"".join(m.get("body", b"") for m in self.messages[1:])


KEY = b"k" * 32  # the deployment's key in these tests
REPLICA = "app#decode#r1"  # the front's replica
NOW = 1_000_000.0  # the front's clock


def _seal(verdict: Verdict, body: bytes, *, key: bytes = KEY, replica: str = REPLICA,
          expires: float = NOW + routed.VERDICT_TTL_S) -> bytes:
    """`verdict` sealed as the router seals it for `replica` and `body`."""
    return dataclasses.replace(verdict, replica=replica, expires=expires,
                               body_sha256=routed.body_digest(body)).seal(key).encode()


def _scope(path: str, verdict: Verdict | None = None, method: str = "POST") -> dict[str, Any]:
    """A request's scope; `_run` seals `verdict` for the body it sends."""
    headers = [(b"authorization", b"Bearer k"), (b"content-length", b"99")]
    return {"type": "http", "method": method, "path": path, "headers": headers,
            "query_string": b"", "_verdict": verdict}


def _receive(body: bytes):
    async def connected() -> dict[str, Any]:
        await asyncio.sleep(3600)
        return {"type": "http.disconnect"}

    return vllm_server.body_then(body, connected)


class _Engine:
    """Stands in for vLLM's app: answers with the body and headers it got, and reports output
    tokens to the request's tap as `TappedEngine.generate` does."""

    def __init__(self, tokens: int = 3, status: int = 200) -> None:
        self.tokens, self.status = tokens, status
        self.seen: list[tuple[dict[str, Any], bytes]] = []
        self.intervals: list[int] = []  # each request's tap's stream interval

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        body = (await receive())["body"]
        self.seen.append((scope, body))
        tap = vllm_server.CURRENT_TAP.get()
        self.intervals.append(tap.stream_interval)
        await send({"type": "http.response.start", "status": self.status, "headers": []})
        for i in range(self.tokens):
            tap.new_tokens.append(i)
            tap.on_output()
            await send({"type": "http.response.body", "body": b"x", "more_body": True})
        tap.num_prompt_tokens, tap.finish_reason = 4, "length"
        await send({"type": "http.response.body", "body": b"", "more_body": False})


def _front(engine: Any, routed_calls: list[HTTPCall], settlements: list[tuple[str, Settlement]]):
    async def to_router(call: HTTPCall):
        routed_calls.append(call)
        yield GenerateChunk((), "", status=203, headers=(("content-type", "text/plain"),))
        yield GenerateChunk((), "", data=b"from the router")

    async def settle(url: str, s: Settlement) -> None:
        settlements.append((url, s))

    return front.EngineFront(engine, to_router, settle, key=KEY, replica=REPLICA,
                             max_body_bytes=1 << 20, clock=lambda: NOW)


def _run(app: front.EngineFront, scope: dict[str, Any], body: bytes = b"") -> _Client:
    client = _Client()
    verdict = scope.pop("_verdict", None)
    if verdict is not None:
        scope["headers"].append((routed.HEADER.encode(), _seal(verdict, body)))

    async def go() -> None:
        await app(scope, _receive(body), client.send)
        await asyncio.gather(*app._settling)

    asyncio.run(go())
    return client


SERVE = Verdict("serve", endpoint="completions", request_id="rid", model="tiny-adapter",
                max_tokens=5, cache_salt="tenant-salt", ticket="tk", settle_url="http://r/s")


def test_an_admitted_request_runs_with_the_routers_fields_and_is_settled() -> None:
    engine, calls, settlements = _Engine(tokens=3), [], []
    body = json.dumps({"model": "alias", "prompt": "hi", "kv_transfer_params": {"x": 1}}).encode()
    scope = _scope("/v1/completions", SERVE)
    scope["headers"].append((b"X-Request-Id", b"haproxy-id"))  # vLLM would take it for its id
    client = _run(_front(engine, calls, settlements), scope, body)
    assert client.status == 200 and client.body == b"xxx"
    scope, sent = engine.seen[0]
    assert json.loads(sent) == forward.call(
        forward.capped(forward.parse("completions", body), 5), model="tiny-adapter",
        request_id="rid", cache_salt="tenant-salt").json
    names = [k for k, _ in scope["headers"]]
    assert routed.HEADER.encode() not in names  # the router's header stays out of vLLM's view
    assert b"X-Request-Id" not in names  # the router's request id (in the body) is the one
    assert dict(scope["headers"])[b"content-length"] == str(len(sent)).encode()
    ((url, s),) = settlements
    assert url == "http://r/s" and s.ticket == "tk" and s.generated
    assert (s.prompt_tokens, s.output_tokens, s.status, s.cancelled) == (4, 3, 200, False)
    assert s.first_token_s is not None and s.decode_s is not None and not calls
    assert engine.intervals == [1]  # the verdict's default: every token its own event


def test_the_routers_coalescing_reaches_the_engine() -> None:
    engine = _Engine(tokens=1)
    verdict = dataclasses.replace(SERVE, stream_interval=3)
    _run(_front(engine, [], []), _scope("/v1/completions", verdict), b'{"prompt": "hi"}')
    assert engine.intervals == [3]  # TappedEngine sets it on the request's SamplingParams


def test_a_remotely_prefilled_request_carries_the_routers_handoff_not_the_clients() -> None:
    engine = _Engine(tokens=1)
    handoff = {"do_remote_prefill": True, "remote_block_ids": [7], "remote_engine_id": "p"}
    verdict = dataclasses.replace(SERVE, kv_transfer_params=handoff)
    body = json.dumps({"prompt": "hi", "kv_transfer_params": {"remote_block_ids": [1]}})
    _run(_front(engine, [], []), _scope("/v1/completions", verdict), body.encode())
    assert json.loads(engine.seen[0][1])["kv_transfer_params"] == handoff
    # without a handoff the client's own is dropped (it could read other requests' blocks)
    engine = _Engine(tokens=1)
    _run(_front(engine, [], []), _scope("/v1/completions", SERVE), body.encode())
    assert "kv_transfer_params" not in json.loads(engine.seen[0][1])


def test_a_refusal_is_the_routers_error_as_it_is() -> None:
    error = {"error": {"message": "Incorrect API key provided.", "code": "invalid_api_key"}}
    verdict = Verdict("refuse", status=401, error=error, headers={"WWW-Authenticate": "Bearer"})
    engine, calls, settlements = _Engine(), [], []
    client = _run(_front(engine, calls, settlements), _scope("/v1/chat/completions", verdict))
    assert client.status == 401 and json.loads(client.body) == error
    assert client.headers["www-authenticate"] == "Bearer"
    assert not engine.seen and not calls and not settlements


@pytest.mark.parametrize("verdict", [None, Verdict("forward")])
def test_what_the_router_answers_goes_to_the_router_whole(verdict: Verdict | None) -> None:
    engine, calls, settlements = _Engine(), [], []
    client = _run(_front(engine, calls, settlements),
                  _scope("/v1/models", verdict, method="GET"))
    assert (client.status, client.body) == (203, b"from the router")
    ((call,),) = [calls]
    assert (call.method, call.path) == ("GET", "/v1/models")
    assert ("authorization", "Bearer k") in call.headers
    assert not engine.seen and not settlements


def test_an_admission_for_another_path_is_released_and_forwarded() -> None:
    engine, calls, settlements = _Engine(), [], []
    client = _run(_front(engine, calls, settlements), _scope("/tokenize", SERVE),
                  b'{"prompt": "hi"}')
    assert client.status == 203 and calls[0].path == "/tokenize"
    assert calls[0].body == b'{"prompt": "hi"}'
    assert settlements == [("http://r/s", Settlement("tk", generated=False))]


def test_router_paths_are_not_served_and_a_bad_verdict_is_a_server_error() -> None:
    engine, calls, settlements = _Engine(), [], []
    app = _front(engine, calls, settlements)
    assert _run(app, _scope("/internal/route", Verdict("forward"))).status == 404
    payload = b"garbage!"  # sealed, but not a verdict
    bad = _scope("/v1/completions")
    bad["headers"].append((routed.HEADER.encode(),
                           f"{payload.decode()}.{routed._mac(KEY, b'verdict', payload)}".encode()))
    assert _run(app, bad).status == 500
    assert not engine.seen and not calls


BODY = b'{"prompt": "hi"}'


@pytest.mark.parametrize("header", [
    SERVE.encode().encode(),  # unsealed (what the router wrote before verdicts were sealed)
    _seal(SERVE, BODY, key=b"x" * 32),  # sealed under another key
    _seal(SERVE, BODY, expires=NOW),  # expired
    _seal(SERVE, BODY, replica="app#decode#r2"),  # for another replica
    _seal(SERVE, BODY)[:-2] + b"AA",  # a MAC changed
    _seal(dataclasses.replace(SERVE, max_tokens=None), BODY).replace(b".", b"x.", 1),
])
def test_a_verdict_the_router_did_not_seal_for_this_replica_is_refused_unread(
        header: bytes) -> None:
    engine, calls, settlements = _Engine(), [], []
    scope = _scope("/v1/completions")
    scope["headers"].append((routed.HEADER.encode(), header))
    received: list[str] = []

    async def receive() -> dict[str, Any]:
        received.append("read")
        return {"type": "http.request", "body": BODY, "more_body": False}

    client = _Client()
    asyncio.run(_front(engine, calls, settlements)(scope, receive, client.send))
    assert client.status == 403 and json.loads(client.body)["error"]["code"] == "forbidden"
    assert not received and not engine.seen and not calls and not settlements


def test_a_verdict_is_served_once_and_only_for_its_body() -> None:
    engine, calls, settlements = _Engine(tokens=1), [], []
    sealed = _seal(SERVE, BODY)

    def send(app: front.EngineFront, body: bytes) -> _Client:
        scope = _scope("/v1/completions")
        scope["headers"].append((routed.HEADER.encode(), sealed))
        return _run(app, scope, body)

    other = b'{"prompt": "other", "max_tokens": 9999}'
    assert send(_front(engine, calls, settlements), other).status == 403  # another body
    assert settlements[-1][1] == Settlement("tk", generated=False, status=403)
    assert not engine.seen
    app = _front(engine, calls, settlements)  # a replica that has not seen it: served
    assert send(app, BODY).status == 200 and len(engine.seen) == 1
    assert send(app, BODY).status == 403  # a replay
    assert len(engine.seen) == 1 and not calls


def test_a_body_over_the_limit_is_refused_before_it_is_read() -> None:
    engine, calls, settlements = _Engine(), [], []
    app = front.EngineFront(engine, _front(engine, calls, settlements).to_router,
                            _front(engine, calls, settlements).settle, key=KEY,
                            replica=REPLICA, max_body_bytes=8, clock=lambda: NOW)
    for verdict in (None, SERVE):  # no verdict (Serve's fallback proxy) or an admitted one
        scope = _scope("/v1/completions", verdict)
        client = _run(app, scope, BODY)  # Content-Length 99 > 8
        assert client.status == 413
        assert json.loads(client.body)["error"]["code"] == "request_too_large"
    scope = _scope("/v1/completions")
    scope["headers"] = [(b"authorization", b"Bearer k")]  # no Content-Length: read, then cut
    assert _run(app, scope, BODY).status == 413
    assert not engine.seen and not calls
    assert [s for _, s in settlements] == [Settlement("tk", generated=False, status=413)]


def test_a_settlements_mac_is_checked() -> None:
    body = Settlement("tk", output_tokens=3).to_json()
    mac = routed.settlement_mac(KEY, body)
    assert routed.settlement_signed(KEY, body, mac)
    assert not routed.settlement_signed(KEY, body.replace(b"3", b"0"), mac)
    assert not routed.settlement_signed(b"x" * 32, body, mac)
    assert not routed.settlement_signed(KEY, body, None)


def test_the_router_not_answering_is_a_503() -> None:
    async def to_router(call: HTTPCall):
        raise RuntimeError("no router")
        yield  # a generator

    async def settle(url: str, s: Settlement) -> None:
        pass

    app = front.EngineFront(_Engine(), to_router, settle, key=KEY, replica=REPLICA,
                            max_body_bytes=1 << 20, clock=lambda: NOW)
    client = _run(app, _scope("/health", None, "GET"))
    assert client.status == 503 and client.headers["retry-after"] == "1"
