"""vLLM's own OpenAI server, in the engine replica, called in-process.

Each engine replica builds vLLM's FastAPI application (`vllm.entrypoints.launchers.build_app`
with the state `init_app_state` makes) over its `AsyncLLM`, exactly as `vllm serve` does, and
the router forwards each client request to it as an HTTP call (method, path, headers, body).
So every request parameter, validation message, endpoint (`/tokenize`, `/detokenize`,
`/version`, ...) and tool-call or reasoning parser is vLLM's own: splitserve adds the gateway
around it (tenancy, admission, the disaggregation decision, replica choice) and nothing to it.

Per-request hooks the engine needs and vLLM's server has no place for (the KV handoff's fetch
deadline, injected faults in tests, the stream interval the router asks for under load, and what
the router reads back: new token ids, first-token latency, the KV pull's measurement) go through
`TappedEngine`, a thin proxy of the engine client whose `generate` consults the current
request's `RequestTap` (a context variable set by the host around each call).
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import contextvars
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

from splitserve.engine.args import EngineSpec

# How long an abandoned call may take to abort its request after the disconnect, before it is
# cancelled outright.
DISCONNECT_GRACE_S = 5.0



def frontend_args(spec: EngineSpec, engine_kwargs: dict[str, Any]) -> argparse.Namespace:
    """vLLM's server arguments for this engine, as `vllm serve` would parse them: the defaults of
    vLLM's own argument parser, then the engine's arguments and the model's parsers (tool-call
    parser, reasoning parser, chat template) from the spec."""
    from vllm.entrypoints.launchers.cli_args import make_arg_parser
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    argv = ["--model", str(engine_kwargs["model"])]
    if spec.tool_call_parser:
        argv += ["--tool-call-parser", spec.tool_call_parser, "--enable-auto-tool-choice"]
    if spec.reasoning_parser:
        argv += ["--reasoning-parser", spec.reasoning_parser]
    if spec.chat_template:
        argv += ["--chat-template", spec.chat_template]
    args = make_arg_parser(FlexibleArgumentParser()).parse_args(argv)
    for key, value in engine_kwargs.items():
        setattr(args, key, value)
    args.served_model_name = [spec.served_name]
    args.disable_log_requests = True
    # usage.prompt_tokens_details.cached_tokens: the prefix-cache (or KV transfer) hits that
    # tenants and routing tests read (vLLM's --enable-prompt-tokens-details)
    args.enable_prompt_tokens_details = True
    return args


@dataclass
class RequestTap:
    """What one forwarded call's engine requests did, as the host reads it back.

    Filled by `TappedEngine.generate` from the engine's outputs; read and reset by the host
    after each piece of the response (`take_tokens`).
    """

    stream_interval: int = 1
    # hooks: the KV params to use instead of the request's (expired, or faults), by request
    kv_params: Callable[[dict[str, Any] | None], dict[str, Any] | None] | None = None
    request_ids: list[str] = field(default_factory=list)
    new_tokens: list[int] = field(default_factory=list)
    num_prompt_tokens: int = 0
    num_cached_tokens: int = 0
    finish_reason: str | None = None
    engine_ttft_s: float | None = None
    kv_transfer_params: dict[str, Any] | None = None
    remote_kv: dict[str, Any] | None = None  # the KV params the engine ran with
    on_output: Callable[[], None] | None = None  # called after each engine output
    generating: int = 0  # engine requests begun and not finished

    @property
    def finished(self) -> bool:
        """Whether every engine request the call made has finished (what the server writes
        from then on is the response's end)."""
        return bool(self.request_ids) and self.generating == 0

    def take_tokens(self) -> tuple[int, ...]:
        """The output token ids since the last call."""
        out, self.new_tokens = tuple(self.new_tokens), []
        return out


CURRENT_TAP: contextvars.ContextVar[RequestTap | None] = contextvars.ContextVar(
    "splitserve_request_tap", default=None
)


def first_token_latency(out: Any) -> float | None:
    """vLLM's first-token latency of a `RequestOutput` (seconds from the request's arrival in
    the engine to its first token's output), or None when the engine keeps no request stats."""
    stats = getattr(out, "metrics", None)
    latency = getattr(stats, "first_token_latency", 0.0) if stats is not None else 0.0
    return float(latency) if latency and latency > 0 else None


class TappedEngine:
    """The engine client vLLM's server talks to: the real `AsyncLLM` with `generate` wrapped.

    Every attribute but `generate` is the engine's own (vLLM's serving objects read its config,
    renderer, LoRA and health methods through it).
    """

    def __init__(self, engine: Any) -> None:
        self._engine = engine

    def __getattr__(self, name: str) -> Any:
        return getattr(self._engine, name)

    async def generate(self, prompt: Any, sampling_params: Any, request_id: str, **kwargs: Any):
        """`AsyncLLM.generate` under the current request's tap: its stream interval and KV
        params applied, its outputs' tokens and figures recorded."""
        tap = CURRENT_TAP.get()
        if tap is None:
            async for out in self._engine.generate(prompt, sampling_params, request_id, **kwargs):
                yield out
            return
        if tap.stream_interval > 1:
            sampling_params.stream_interval = tap.stream_interval
        extra = dict(sampling_params.extra_args or {})
        params = extra.get("kv_transfer_params")
        if tap.kv_params is not None:
            params = tap.kv_params(params)
            if params is None:
                extra.pop("kv_transfer_params", None)
            else:
                extra["kv_transfer_params"] = params
            sampling_params.extra_args = extra or None
        tap.remote_kv = params
        tap.request_ids.append(request_id)
        first, running = True, True
        tap.generating += 1
        try:
            async for out in self._engine.generate(prompt, sampling_params, request_id, **kwargs):
                for comp in out.outputs:
                    tap.new_tokens.extend(comp.token_ids)
                    if out.finished and comp.finish_reason:
                        tap.finish_reason = comp.finish_reason
                if first and any(c.token_ids for c in out.outputs):
                    first = False
                    tap.engine_ttft_s = first_token_latency(out)
                tap.num_prompt_tokens = len(out.prompt_token_ids or ())
                tap.num_cached_tokens = out.num_cached_tokens or 0
                if out.finished and out.kv_transfer_params:
                    tap.kv_transfer_params = out.kv_transfer_params
                if out.finished and running:
                    running, tap.generating = False, tap.generating - 1
                if tap.on_output is not None:
                    tap.on_output()
                yield out
        finally:
            if running:
                tap.generating -= 1


async def build_app(engine: Any, args: argparse.Namespace):
    """vLLM's OpenAI FastAPI application over `engine` (an `AsyncLLM`), with its state."""
    import types

    from starlette.datastructures import State
    from vllm.entrypoints.launchers.api_server.app_state import init_app_state
    from vllm.entrypoints.launchers.app import build_app as vllm_build_app

    client = TappedEngine(engine)
    tasks = await engine.get_supported_tasks()
    state = State()
    await init_app_state(client, state, args, supported_tasks=tasks)
    app = vllm_build_app(args, supported_tasks=tasks, model_config=engine.model_config)
    app.state._state.update(state._state)
    # vLLM's handler of a dead engine flips `state.server.should_exit` (the uvicorn server of
    # `vllm serve`); Serve restarts a replica through its health check instead.
    app.state.server = types.SimpleNamespace()
    return app


class _Mailbox:
    """Items put without waiting (from a sender that must not block) and taken in order,
    with a look at the next one: the hand-over between an in-process call and its reader."""

    def __init__(self) -> None:
        self._items: collections.deque[Any] = collections.deque()
        self._arrived = asyncio.Event()

    def put(self, item: Any) -> None:
        self._items.append(item)
        self._arrived.set()

    async def take(self) -> Any:
        while not self._items:
            self._arrived.clear()
            await self._arrived.wait()
        return self._items.popleft()

    def take_while(self, pred: Callable[[Any], bool]) -> list[Any]:
        """The items waiting at the front that satisfy `pred`, taken now."""
        out = []
        while self._items and pred(self._items[0]):
            out.append(self._items.popleft())
        return out


def body_then(body: bytes, after: Callable[[], Any]) -> Callable[[], Any]:
    """An ASGI `receive` that gives `body` whole first, then whatever `after()` gives (the
    client's disconnect, when it comes)."""
    delivered = False

    async def receive() -> dict[str, Any]:
        nonlocal delivered
        if not delivered:
            delivered = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await after()

    return receive


@dataclass(frozen=True)
class HTTPResponseStart:
    """The status line and headers of a response from vLLM's server."""

    status: int
    headers: tuple[tuple[str, str], ...]


async def call_asgi(
    app: Any, method: str, path: str, headers: tuple[tuple[str, str], ...], body: bytes,
    query: str = "",
) -> AsyncIterator[HTTPResponseStart | bytes]:
    """Call ASGI `app` in-process: yields the response start, then each body part as it comes.

    Closing the iterator early tells the app the client disconnected (vLLM then aborts the
    request in the engine) and cancels it.
    """
    box = _Mailbox()
    disconnected = asyncio.Event()

    async def left() -> dict[str, Any]:
        await disconnected.wait()
        return {"type": "http.disconnect"}

    receive = body_then(body, left)

    async def send(message: dict[str, Any]) -> None:
        box.put(message)

    scope = {
        "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1",
        "method": method, "scheme": "http", "path": path, "raw_path": path.encode(),
        "root_path": "", "query_string": query.encode(),
        "headers": [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in headers],
        "client": ("127.0.0.1", 0), "server": ("127.0.0.1", 0),
    }
    done = object()

    async def run() -> None:
        try:
            await app(scope, receive, send)
        finally:
            box.put({"type": done})

    task = asyncio.create_task(run())
    try:
        while True:
            message = await box.take()
            kind = message["type"]
            if kind is done:
                break
            if kind == "http.response.start":
                yield HTTPResponseStart(
                    int(message["status"]),
                    tuple((k.decode("latin-1"), v.decode("latin-1"))
                          for k, v in message.get("headers", ())),
                )
            elif kind == "http.response.body":
                # Body parts that are already waiting go out as one: under load a stream's
                # events coalesce (one message to the router instead of several), idle ones
                # still go at once.
                data, more = bytearray(message.get("body", b"")), message.get("more_body", False)
                if more:
                    for message in box.take_while(lambda m: m["type"] == kind):
                        data.extend(message.get("body", b""))
                        more = message.get("more_body", False)
                        if not more:
                            break
                if data:
                    yield bytes(data)
                if not more:
                    break
        await task  # an exception the app did not turn into a response surfaces here
    finally:
        if not task.done():
            # Tell the app its client left and let it wind down: vLLM's handlers run the
            # request in a task of their own that only a disconnect aborts (`with_cancellation`),
            # so cancelling the app call alone would leave the request running in the engine.
            disconnected.set()
            await asyncio.wait({task}, timeout=DISCONNECT_GRACE_S)
            if not task.done():
                task.cancel()
            with contextlib.suppress(BaseException):
                await task


async def call_chunks(app: Any, call: Any, replica: str = "") -> AsyncIterator[Any]:
    """`call_asgi` of an `HTTPCall`, as `GenerateChunk`s: the response's start (status and
    headers), then its body parts; `replica` names the replica that answered."""
    from splitserve.engine.messages import GenerateChunk

    async for part in call_asgi(app, call.method, call.path, call.headers, call.encoded(),
                                call.query):
        if isinstance(part, HTTPResponseStart):
            yield GenerateChunk((), "", status=part.status, headers=part.headers,
                                replica=replica)
        else:
            yield GenerateChunk((), "", data=part, replica=replica)


_END = object()


async def tapped_call(
    app: Any, method: str, path: str, headers: tuple[tuple[str, str], ...], body: bytes,
    query: str, tap: RequestTap,
) -> AsyncIterator[HTTPResponseStart | bytes | None]:
    """`call_asgi` with `tap` as the call's request tap, and None whenever the engine made
    output tokens before the response began: a response that is not streamed writes nothing
    until its end, and the router still needs its progress (first token, pace, load).

    Closing the iterator early closes the call as `call_asgi` does.
    """
    box = _Mailbox()
    push = box.put

    async def pump() -> None:
        try:
            async with contextlib.aclosing(
                call_asgi(app, method, path, headers, body, query)
            ) as parts:
                async for part in parts:
                    push(part)
            push(_END)
        except Exception as err:  # noqa: BLE001 - handed to the consumer
            push(err)

    tap.on_output = lambda: push(None)
    token = CURRENT_TAP.set(tap)  # the pump task runs in a copy of this context
    task = asyncio.create_task(pump())
    CURRENT_TAP.reset(token)
    started = False
    try:
        while True:
            item = await box.take()
            if item is _END:
                break
            if isinstance(item, Exception):
                raise item
            if item is None:
                box.take_while(lambda i: i is None)  # one notice for outputs waiting together
                if not started and tap.new_tokens:
                    yield None
                continue
            started = started or isinstance(item, HTTPResponseStart)
            yield item
    finally:
        tap.on_output = None
        if not task.done():
            task.cancel()
            with contextlib.suppress(BaseException):
                await task
