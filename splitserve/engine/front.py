"""The engine replica's HTTP front with direct streaming (`router.direct_streaming`).

The decode pool is then the Serve application's HTTP ingress: each replica serves HTTP itself
(Ray Serve's direct ingress, behind HAProxy) with this ASGI app, and the router is the
application's ingress request router (`router/direct.py`). For a generation request HAProxy
has asked the router first and set its `Verdict` header (`engine/routed.py`):
- "serve": the request was admitted here. The front writes the router's fields into the body
  (model, request id, cache salt, an output limit the router set, and the KV handoff of a
  request the router had prefilled on the prefill pool) as the router's own path does
  (`router/forward.py`), runs it through vLLM's OpenAI app in-process with the tokens per
  streamed event the router's coalescing chose (`router/coalescing.py`), which writes its
  response straight to the client (no Ray object, no router, no frame per chunk), and then
  settles with the router: the tokens used (read from the engine's outputs, `RequestTap`), the
  first token's and the last one's times (the controller's TTFT and TPOT signals).
Every verdict is sealed by the router (`Verdict.seal`): a header the router did not seal for
this replica, an expired one, or a "serve" verdict seen before (its ticket) or for another body
(its SHA-256) gets 403 before the body is read or the engine sees anything; a body over the
router's limit (`router.max_body_bytes`) gets 413, from its Content-Length before it is read.
- "refuse": the router's OpenAI error, returned as it is (vLLM never sees the request).
- "forward", or no verdict (a GET, which HAProxy does not route through the router): the
  request goes whole to the router deployment (`Router.http`, a Ray call) and its answer back.
  Paths under `/internal/` are the router's own and are not served to clients (404).
The client's disconnect reaches vLLM's app directly, which aborts the request and frees its KV.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from splitserve.engine import routed, vllm_server
from splitserve.engine.messages import GenerateChunk, HTTPCall
from splitserve.engine.routed import ForgedVerdict, Settlement, Verdict, VerdictError
from splitserve.router import forward

log = logging.getLogger("splitserve.engine.front")

GENERATION_PATHS = {"/v1/chat/completions": "chat", "/v1/completions": "completions"}
_PREFIX = routed.PREFIX.encode()
# Request headers the front does not pass to vLLM's app: the length of a body it rewrote, and
# the request id HAProxy (or a client) sets, which vLLM would prefer to the router's id in the
# body (the response's `id` and the engine request's, as on the relay path).
_REWRITTEN = (b"content-length", b"x-request-id")

ToRouter = Callable[[HTTPCall], AsyncIterator[GenerateChunk]]
Settle = Callable[[str, Settlement], Awaitable[None]]


def _error_body(message: str, type_: str, code: str | None = None) -> bytes:
    return json.dumps({"error": {"message": message, "type": type_, "param": None,
                                 "code": code}}).encode()


async def _respond(send: Any, status: int, body: bytes,
                   headers: dict[str, str] | None = None) -> None:
    """A whole JSON response."""
    raw = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    raw += [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in (headers or {}).items()]
    await send({"type": "http.response.start", "status": status, "headers": raw})
    await send({"type": "http.response.body", "body": body, "more_body": False})


class BodyTooLarge(Exception):
    """A request body over the limit."""


async def _read_body(headers: list[tuple[bytes, bytes]], receive: Any, limit: int) -> bytes:
    """The request body; `BodyTooLarge` unread when its Content-Length is over `limit`, or as
    soon as what is read passes it."""
    length = next((v for k, v in headers if k.lower() == b"content-length"), b"")
    if length.isdigit() and int(length) > limit:
        raise BodyTooLarge
    parts = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            break
        part = message.get("body", b"")
        size += len(part)
        if size > limit:
            raise BodyTooLarge
        parts.append(part)
        if not message.get("more_body", False):
            break
    return b"".join(parts)


async def _forbidden(send: Any) -> None:
    await _respond(send, 403, _error_body(
        "This request did not come through the router of this deployment.",
        "invalid_request_error", "forbidden"))


async def _lifespan(receive: Any, send: Any) -> None:
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await send({"type": "lifespan.shutdown.complete"})
            return


def verdict_of(headers: list[tuple[bytes, bytes]], key: bytes, *, replica: str,
               now: float) -> Verdict | None:
    """The router's sealed verdict among a request's headers, opened for `replica` at `now`
    (None: none was set); `ForgedVerdict` / `VerdictError` as `Verdict.open`."""
    raw = next((v for k, v in headers if k.lower() == routed.HEADER.encode()), None)
    return None if raw is None else Verdict.open(raw, key, replica=replica, now=now)


def engine_body(verdict: Verdict, body: bytes) -> bytes:
    """Pure: the body vLLM's server gets for an admitted request, the router's fields written
    as its own path writes them (`forward.call`)."""
    fwd = forward.parse(verdict.endpoint, body)
    if verdict.max_tokens is not None:
        fwd = forward.capped(fwd, verdict.max_tokens)
    return forward.call(fwd, model=verdict.model, request_id=verdict.request_id,
                        cache_salt=verdict.cache_salt,
                        kv_transfer_params=verdict.kv_transfer_params).encoded()


class EngineFront:
    """The ASGI app of a decode replica that answers clients itself (see the module doc).

    `app`: vLLM's OpenAI app over the replica's engine; `to_router`: a request handed to the
    router whole (`Router.http`); `settle`: posts a `Settlement` to a router URL; `key`: the
    deployment's key the router seals verdicts with; `replica`: this replica's full id (the
    one verdicts for it name); `max_body_bytes`: the router's body limit; `clock`: Unix time.
    """

    def __init__(self, app: Any, to_router: ToRouter, settle: Settle, *, key: bytes,
                 replica: str, max_body_bytes: int,
                 clock: Callable[[], float] = time.time) -> None:
        self.app = app
        self.to_router = to_router
        self.settle = settle
        self.key = key
        self.replica = replica
        self.max_body_bytes = max_body_bytes
        self.clock = clock
        self._settling: set[asyncio.Task] = set()
        # tickets of "serve" verdicts taken, to their expiry, in the order they came
        self._used: OrderedDict[str, float] = OrderedDict()

    def _first_use(self, verdict: Verdict, now: float) -> bool:
        """Record `verdict`'s ticket as used; False when it was already (a replay). Tickets
        are forgotten once their verdict expired (it is refused then anyway), oldest first:
        amortised O(1) per request (arrival order is expiry order up to the routers' clocks,
        and a ticket kept a little longer is still safe)."""
        while self._used and next(iter(self._used.values())) <= now:
            self._used.popitem(last=False)
        if verdict.ticket in self._used:
            return False
        self._used[verdict.ticket] = verdict.expires
        return True

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            await _lifespan(receive, send)
            return
        if scope["type"] != "http":
            return
        path = scope.get("path", "")
        if path.startswith("/internal/"):
            await _respond(send, 404, _error_body("Not found.", "invalid_request_error",
                                                  "not_found"))
            return
        now = self.clock()
        try:
            verdict = verdict_of(scope["headers"], self.key, replica=self.replica, now=now)
        except ForgedVerdict as err:
            log.warning("front: refused %s %s: %s", scope.get("method"), path, err)
            await _forbidden(send)
            return
        except VerdictError as err:
            log.error("front: %s", err)
            await _respond(send, 500, _error_body("The router's verdict is unreadable.",
                                                  "server_error"))
            return
        if verdict is not None and verdict.kind == "refuse":  # the body is not needed
            await _respond(send, verdict.status, json.dumps(verdict.error).encode(),
                           verdict.headers)
            return
        if verdict is not None and verdict.kind == "serve" and not self._first_use(verdict, now):
            log.warning("front: refused a verdict used before (%s %s)", scope.get("method"), path)
            await _forbidden(send)
            return
        try:
            body = await _read_body(scope["headers"], receive, self.max_body_bytes)
        except BodyTooLarge:
            if verdict is not None and verdict.kind == "serve":
                self._settle_later(verdict.settle_url,
                                   Settlement(verdict.ticket, generated=False, status=413))
            await _respond(send, 413, _error_body(
                f"Request body is larger than {self.max_body_bytes} bytes.",
                "invalid_request_error", "request_too_large"))
            return
        if verdict is None or verdict.kind == "forward":
            await self._forward(scope, body, send)
            return
        if routed.body_digest(body) != verdict.body_sha256:
            log.warning("front: refused a verdict for another body (%s %s)",
                        scope.get("method"), path)
            self._settle_later(verdict.settle_url,
                               Settlement(verdict.ticket, generated=False, status=403))
            await _forbidden(send)
            return
        if scope.get("method") != "POST" or GENERATION_PATHS.get(path) != verdict.endpoint:
            # admitted as a generation, but its path says otherwise (`/tokenize` has a prompt)
            self._settle_later(verdict.settle_url, Settlement(verdict.ticket, generated=False))
            await self._forward(scope, body, send)
            return
        await self._serve(scope, receive, send, verdict, body)

    async def _serve(self, scope: dict[str, Any], receive: Any, send: Any, verdict: Verdict,
                     body: bytes) -> None:
        """An admitted generation request through vLLM's app, straight to the client."""
        new_body = engine_body(verdict, body)
        headers = [(k, v) for k, v in scope["headers"]
                   if k.lower() not in _REWRITTEN and not k.lower().startswith(_PREFIX)]
        headers.append((b"content-length", str(len(new_body)).encode()))
        inner = {**scope, "headers": headers}
        inner_receive = vllm_server.body_then(new_body, receive)  # then the client's disconnect
        status = 500
        ended = False

        async def inner_send(message: dict[str, Any]) -> None:
            nonlocal status, ended
            if message["type"] == "http.response.start":
                status = int(message["status"])
            elif message["type"] == "http.response.body" and not message.get("more_body"):
                ended = True
            await send(message)

        # the router's coalescing: one event (one write to the client) per this many tokens
        tap = vllm_server.RequestTap(stream_interval=verdict.stream_interval)
        start = time.perf_counter()
        first: float | None = None  # when the first token came, and the latest one
        last: float | None = None

        def on_output() -> None:
            nonlocal first, last
            if tap.new_tokens:
                last = time.perf_counter()
                if first is None:
                    first = last

        tap.on_output = on_output
        token = vllm_server.CURRENT_TAP.set(tap)
        try:
            await self.app(inner, inner_receive, inner_send)
        finally:
            vllm_server.CURRENT_TAP.reset(token)
            self._settle_later(verdict.settle_url, Settlement(
                verdict.ticket, generated=True, prompt_tokens=tap.num_prompt_tokens,
                output_tokens=len(tap.new_tokens),
                first_token_s=None if first is None else first - start,
                decode_s=None if first is None or last is None else last - first, status=status,
                cancelled=not ended or (status < 400 and tap.finish_reason is None),
                finish_reason=tap.finish_reason, cached_tokens=tap.num_cached_tokens,
            ))

    def _settle_later(self, url: str, settlement: Settlement) -> None:
        """Post `settlement` without holding the response's end for it."""
        task = asyncio.ensure_future(self.settle(url, settlement))
        self._settling.add(task)
        task.add_done_callback(self._settling.discard)

    async def _forward(self, scope: dict[str, Any], body: bytes, send: Any) -> None:
        """The request to the router whole, its answer back as it comes."""
        call = HTTPCall(
            scope.get("method", "GET"), scope.get("path", "/"), body=body,
            headers=tuple((k.decode("latin-1"), v.decode("latin-1"))
                          for k, v in scope["headers"]
                          if k.lower() != b"content-length"),
            query=scope.get("query_string", b"").decode("latin-1"),
        )
        started = False
        try:
            async for chunk in self.to_router(call):
                if chunk.status is not None:
                    await send({"type": "http.response.start", "status": chunk.status,
                                "headers": [(k.encode("latin-1"), v.encode("latin-1"))
                                            for k, v in chunk.headers]})
                    started = True
                elif chunk.data:
                    await send({"type": "http.response.body", "body": chunk.data,
                                "more_body": True})
        except Exception as err:  # noqa: BLE001 - the router could not answer
            log.warning("front: the router did not answer %s %s: %r", call.method, call.path,
                        err)
        if not started:
            await _respond(send, 503, _error_body(
                "The router is unavailable; retry later.", "service_unavailable"),
                {"Retry-After": "1"})
            return
        await send({"type": "http.response.body", "body": b"", "more_body": False})


class SettlementPoster:
    """Posts settlements to the routers' URLs over one kept-alive HTTP session (made in the
    serving loop on first use); a failed post is tried once more, then logged (the router's
    lease then expires: `router/direct.py`)."""

    ATTEMPTS = 2

    def __init__(self, key: bytes, timeout_s: float = 10.0) -> None:
        self.key = key
        self.timeout_s = timeout_s
        self._session: Any = None

    async def __call__(self, url: str, settlement: Settlement) -> None:
        import aiohttp

        if self._session is None:
            self._session = aiohttp.ClientSession(
                timeout=aiohttp.ClientTimeout(total=self.timeout_s))
        body = settlement.to_json()
        headers = {"content-type": "application/json",
                   routed.SETTLEMENT_MAC: routed.settlement_mac(self.key, body)}
        for attempt in range(1, self.ATTEMPTS + 1):
            try:
                async with self._session.post(url, data=body, headers=headers) as resp:
                    if resp.status not in (204, 404):
                        log.warning("front: settlement refused by %s: %d", url, resp.status)
                    return
            except (aiohttp.ClientError, TimeoutError) as err:
                if attempt == self.ATTEMPTS:
                    log.warning("front: cannot settle with %s: %r", url, err)
