"""The engine replica's in-process vLLM server (`splitserve/engine/vllm_server.py`) without an
engine: the ASGI call (streaming, disconnect), the tapped engine client, and pins on the vLLM
internals it relies on (each fails when a vLLM upgrade changes them)."""

from __future__ import annotations

import asyncio
import inspect
from types import SimpleNamespace

import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, StreamingResponse
from starlette.routing import Route

from splitserve.engine import vllm_server as vs


def _app(events: list[str]) -> Starlette:
    async def echo(request: Request) -> JSONResponse:
        return JSONResponse({"got": await request.json()}, status_code=201)

    async def stream(request: Request) -> StreamingResponse:
        async def parts():
            try:
                for i in range(1000):
                    yield f"data: {i}\n\n"
                    await asyncio.sleep(0.01)
            finally:
                events.append("closed")
        return StreamingResponse(parts(), media_type="text/event-stream")

    return Starlette(routes=[Route("/echo", echo, methods=["POST"]),
                             Route("/stream", stream, methods=["POST"])])


def test_call_asgi_returns_the_status_headers_and_body():
    async def run():
        return [p async for p in vs.call_asgi(_app([]), "POST", "/echo",
                                              (("content-type", "application/json"),),
                                              b'{"a": 1}')]

    start, *body = asyncio.run(run())
    assert isinstance(start, vs.HTTPResponseStart) and start.status == 201
    assert ("content-type", "application/json") in start.headers
    assert b"".join(body) == b'{"got":{"a":1}}'


def test_closing_a_streamed_call_early_tells_the_app_its_client_left():
    events: list[str] = []

    async def run():
        parts = vs.call_asgi(_app(events), "POST", "/stream", (), b"")
        got = []
        async for part in parts:
            got.append(part)
            if len(got) == 4:
                break
        await parts.aclose()
        return got

    got = asyncio.run(run())
    assert got[0].status == 200 and got[1:] == [b"data: 0\n\n", b"data: 1\n\n", b"data: 2\n\n"]
    assert events == ["closed"]  # the app's stream was wound down, not left running


class _Output(SimpleNamespace):
    pass


class _Engine:
    """An `AsyncLLM` stand-in: records what `generate` got, yields scripted outputs."""

    def __init__(self) -> None:
        self.calls = []
        self.model_config = "the engine's"

    async def generate(self, prompt, params, request_id, **kwargs):
        self.calls.append((params, request_id))
        for i, finished in ((1, False), (2, True)):
            await asyncio.sleep(0.01)  # an engine step
            yield _Output(
                outputs=[SimpleNamespace(token_ids=[i], finish_reason="length" if finished else None)],
                finished=finished, prompt_token_ids=[0, 1, 2], num_cached_tokens=2,
                kv_transfer_params={"remote_engine_id": "p"} if finished else None,
                metrics=SimpleNamespace(first_token_latency=0.25),
            )


def test_the_tapped_engine_applies_the_request_hooks_and_records_its_outputs():
    engine = _Engine()
    client = vs.TappedEngine(engine)
    params = SimpleNamespace(extra_args={"kv_transfer_params": {"splitserve_fetch_by": 1}},
                             stream_interval=1)
    tap = vs.RequestTap(stream_interval=3, kv_params=lambda p: None)  # e.g. an expired handoff

    async def run():
        token = vs.CURRENT_TAP.set(tap)
        try:
            return [o async for o in client.generate("prompt", params, "cmpl-1")]
        finally:
            vs.CURRENT_TAP.reset(token)

    outs = asyncio.run(run())
    assert len(outs) == 2 and client.model_config == "the engine's"  # the rest is the engine's
    assert params.stream_interval == 3 and params.extra_args is None  # KV params dropped
    assert tap.take_tokens() == (1, 2) and tap.take_tokens() == ()
    assert (tap.finish_reason, tap.engine_ttft_s, tap.num_cached_tokens) == ("length", 0.25, 2)
    assert tap.kv_transfer_params == {"remote_engine_id": "p"} and tap.request_ids == ["cmpl-1"]


def test_the_tap_is_finished_once_every_engine_request_of_the_call_finished():
    """A completion of several prompts makes one engine request each: the response ends (and
    the host holds its last bytes for the figures) only when all of them finished."""
    client = vs.TappedEngine(_Engine())
    params = SimpleNamespace(extra_args=None, stream_interval=1)
    tap, seen = vs.RequestTap(), []

    async def one(rid: str) -> None:
        async for out in client.generate("p", params, rid):
            seen.append((rid, out.finished, tap.finished))

    async def run():
        token = vs.CURRENT_TAP.set(tap)
        try:
            assert not tap.finished  # nothing began yet
            await asyncio.gather(one("a"), one("b"))
        finally:
            vs.CURRENT_TAP.reset(token)

    asyncio.run(run())
    assert seen == [("a", False, False), ("b", False, False), ("a", True, False),
                    ("b", True, True)]
    assert tap.finished and tap.generating == 0


def test_without_a_tap_the_engine_is_called_as_it_is():
    engine = _Engine()
    params = SimpleNamespace(extra_args=None, stream_interval=1)

    async def run():
        return [o async for o in vs.TappedEngine(engine).generate("p", params, "r")]

    assert len(asyncio.run(run())) == 2 and params.stream_interval == 1


# ---- pins: what vllm_server relies on in vLLM 0.32 ----------------------------------------


@pytest.mark.parametrize("module", [
    "vllm.entrypoints.openai.completion.serving",
    "vllm.entrypoints.openai.chat_completion.serving",
])
def test_pin_vllms_serving_layer_generates_through_its_engine_client(module):
    import importlib

    source = inspect.getsource(importlib.import_module(module))
    assert "self.engine_client.generate(" in source  # so TappedEngine sees every request


def test_pin_vllms_app_builders_and_adapter_registry():
    from vllm.entrypoints.launchers.api_server.app_state import init_app_state
    from vllm.entrypoints.launchers.app import build_app
    from vllm.entrypoints.launchers.cli_args import make_arg_parser
    from vllm.entrypoints.openai.models.serving import OpenAIServingModels

    assert list(inspect.signature(init_app_state).parameters)[:4] == [
        "engine_client", "state", "args", "supported_tasks"]
    assert list(inspect.signature(build_app).parameters)[:3] == [
        "args", "supported_tasks", "model_config"]
    assert callable(make_arg_parser)
    # the host registers adapters by name, with splitserve's ids, in this dict
    assert "self.lora_requests: dict[str, LoRARequest]" in inspect.getsource(OpenAIServingModels)


def test_body_parts_waiting_together_go_out_as_one():
    async def burst(scope, receive, send):
        await send({"type": "http.response.start", "status": 200, "headers": []})
        for i in range(5):
            await send({"type": "http.response.body", "body": b"%d," % i, "more_body": True})
        await send({"type": "http.response.body", "body": b"end", "more_body": False})

    async def run():
        parts = vs.call_asgi(burst, "POST", "/", (), b"")
        start = await anext(parts)
        await asyncio.sleep(0.05)  # a slow consumer: every part is waiting by now
        return start, [p async for p in parts]

    start, body = asyncio.run(run())
    assert start.status == 200 and body == [b"0,1,2,3,4,end"]


def test_the_models_parsers_and_template_become_vllms_server_options():
    from splitserve.engine.args import EngineSpec

    spec = EngineSpec(
        role="decode", model=None, served_name="m", max_model_len=4096, dtype="float32", seed=0,
        device="cpu", tensor_parallel_size=1, pipeline_parallel_size=1, max_num_seqs=8,
        kv_cache_gib=1, gpu_memory_utilization=0.9, tool_call_parser="hermes",
        reasoning_parser="qwen3", chat_template="{{ messages }}",
    )
    args = vs.frontend_args(spec, {"model": "/models/m", "max_model_len": 4096})
    assert (args.tool_call_parser, args.enable_auto_tool_choice) == ("hermes", True)
    assert args.reasoning_parser == "qwen3" and args.chat_template == "{{ messages }}"
    assert args.served_model_name == ["m"] and args.max_model_len == 4096
    plain = vs.frontend_args(EngineSpec(**{**spec.__dict__, "tool_call_parser": None,
                                           "reasoning_parser": None, "chat_template": None}),
                             {"model": "/models/m"})
    assert (plain.tool_call_parser, plain.enable_auto_tool_choice) == (None, False)


def test_the_reasoning_parser_reaches_the_servers_structured_output_config():
    # vLLM's server reads the reasoning parser from the structured-output config (init_app_state)
    from vllm.config import StructuredOutputsConfig

    from splitserve.engine.args import STRUCTURED_OUTPUTS, EngineSpec

    spec = EngineSpec(
        role="decode", model=None, served_name="m", max_model_len=4096, dtype="float32", seed=0,
        device="cpu", tensor_parallel_size=1, pipeline_parallel_size=1, max_num_seqs=8,
        kv_cache_gib=1, gpu_memory_utilization=0.9, reasoning_parser="qwen3",
    )
    config = StructuredOutputsConfig(**STRUCTURED_OUTPUTS, reasoning_parser="qwen3")
    args = vs.frontend_args(spec, {"model": "/m", "structured_outputs_config": config})
    assert args.structured_outputs_config.reasoning_parser == "qwen3"
    import inspect

    from vllm.entrypoints.launchers.api_server import app_state
    assert "args.structured_outputs_config.reasoning_parser" in inspect.getsource(app_state)


def test_a_response_that_is_not_streamed_still_reports_its_tokens_as_they_come():
    """vLLM's server writes a whole response at its end: the tapped call tells the host of each
    engine output before (None), so the router sees the first token when it is made."""
    engine = _Engine()
    client = vs.TappedEngine(engine)

    async def whole(scope, receive, send):  # like vLLM's non-streamed handler
        params = SimpleNamespace(extra_args=None, stream_interval=1)
        outs = [o async for o in client.generate("p", params, "cmpl-2")]
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"%d" % len(outs)})

    async def run():
        tap = vs.RequestTap()
        got = []
        async for part in vs.tapped_call(whole, "POST", "/", (), b"", "", tap):
            got.append(tap.take_tokens() if part is None else part)
        return got

    got = asyncio.run(run())
    assert got[0] == (1,)  # the first token, before the response began
    assert isinstance(got[-2], vs.HTTPResponseStart) and got[-1] == b"2"
