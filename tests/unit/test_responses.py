"""splitserve.router.responses: whole and streamed (SSE) OpenAI response bodies."""

from __future__ import annotations

import json
from typing import Any

import pytest

from splitserve.engine.messages import GenerateChunk, TokenLogprob
from splitserve.router.responses import SSE_DONE, Renderer, sse
from splitserve.router.tools import ToolSpec

CHUNKS = [
    GenerateChunk(token_ids=(10, 11), text="Hel"),
    GenerateChunk(token_ids=(12,), text="lo"),
    GenerateChunk(token_ids=(13,), text=" there", finish_reason="length", num_cached_tokens=4),
]


def _renderer(kind: str, **kw: Any) -> Renderer:
    return Renderer(kind=kind, request_id="req-1", model="tiny", prompt_tokens=5, created=123, **kw)


def _stream(r: Renderer, chunks=CHUNKS) -> list[bytes]:
    events = list(r.first_events())
    for c in chunks:
        r.add(c)
        events += r.chunk_events(c)
    events += r.last_events()
    return events


def _parse(events: list[bytes]) -> list[Any]:
    out = []
    for e in events:
        assert e.startswith(b"data: ") and e.endswith(b"\n\n"), e
        payload = e[len(b"data: ") : -2].decode()
        assert "\n" not in payload
        out.append(payload if payload == "[DONE]" else json.loads(payload))
    return out


def _whole(kind: str, **kw: Any) -> dict:
    r = _renderer(kind, **kw)
    for c in CHUNKS:
        r.add(c)
    return r.whole()


def test_sse_format() -> None:
    assert sse({"a": 1, "b": [1, 2]}) == b'data: {"a":1,"b":[1,2]}\n\n'
    assert SSE_DONE == b"data: [DONE]\n\n"


def test_whole_completion() -> None:
    body = _whole("completion")
    assert body == {
        "id": "req-1",
        "object": "text_completion",
        "created": 123,
        "model": "tiny",
        "choices": [{"index": 0, "logprobs": None, "finish_reason": "length", "text": "Hello there"}],
        "usage": {
            "prompt_tokens": 5,
            "completion_tokens": 4,
            "total_tokens": 9,
            "prompt_tokens_details": {"cached_tokens": 4},
        },
    }


def test_whole_chat() -> None:
    body = _whole("chat")
    assert body["object"] == "chat.completion"
    assert body["choices"] == [
        {
            "index": 0,
            "logprobs": None,
            "finish_reason": "length",
            "message": {"role": "assistant", "content": "Hello there"},
        }
    ]
    assert body["usage"]["completion_tokens"] == 4
    assert body["usage"]["total_tokens"] == 9


def test_usage_without_cache_has_no_details() -> None:
    r = _renderer("completion")
    r.add(GenerateChunk(token_ids=(1,), text="a", finish_reason="stop"))
    assert r.usage() == {"prompt_tokens": 5, "completion_tokens": 1, "total_tokens": 6}


@pytest.mark.parametrize("kind", ["completion", "chat"])
def test_whole_token_ids(kind: str) -> None:
    assert _whole(kind, return_token_ids=True)["choices"][0]["token_ids"] == [10, 11, 12, 13]
    assert "token_ids" not in _whole(kind)["choices"][0]


def test_stream_completion() -> None:
    events = _parse(_stream(_renderer("completion")))
    assert events[-1] == "[DONE]"
    chunks = events[:-1]
    assert len(chunks) == 3
    assert all(c["object"] == "text_completion" and c["id"] == "req-1" for c in chunks)
    assert [c["choices"][0]["text"] for c in chunks] == ["Hel", "lo", " there"]
    assert [c["choices"][0]["finish_reason"] for c in chunks] == [None, None, "length"]
    assert all("usage" not in c for c in chunks)


def test_stream_chat() -> None:
    events = _parse(_stream(_renderer("chat")))
    assert events[-1] == "[DONE]"
    chunks = events[:-1]
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert chunks[0]["choices"][0]["finish_reason"] is None
    assert chunks[-1]["choices"][0]["delta"] == {}
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"
    assert [c["choices"][0]["finish_reason"] for c in chunks[:-1]] == [None] * (len(chunks) - 1)


@pytest.mark.parametrize("kind", ["completion", "chat"])
def test_streamed_text_equals_whole(kind: str) -> None:
    key = "text" if kind == "completion" else "delta"
    streamed = ""
    for c in _parse(_stream(_renderer(kind)))[:-1]:
        part = c["choices"][0][key]
        streamed += part if kind == "completion" else part.get("content", "")
    whole = _whole(kind)["choices"][0]
    assert streamed == (whole["text"] if kind == "completion" else whole["message"]["content"])
    assert streamed == "Hello there"


@pytest.mark.parametrize("kind", ["completion", "chat"])
def test_include_usage_chunk(kind: str) -> None:
    events = _parse(_stream(_renderer(kind, include_usage=True)))
    assert events[-1] == "[DONE]"
    usage_chunk = events[-2]
    assert usage_chunk["choices"] == []
    assert usage_chunk["usage"] == {
        "prompt_tokens": 5,
        "completion_tokens": 4,
        "total_tokens": 9,
        "prompt_tokens_details": {"cached_tokens": 4},
    }
    for c in events[:-2]:
        assert c["usage"] is None
        assert len(c["choices"]) == 1


@pytest.mark.parametrize("kind", ["completion", "chat"])
def test_stream_token_ids(kind: str) -> None:
    chunks = _parse(_stream(_renderer(kind, return_token_ids=True)))[:-1]
    ids = [t for c in chunks for t in c["choices"][0]["token_ids"]]
    assert ids == [10, 11, 12, 13]


def test_empty_chunk_emits_nothing() -> None:
    r = _renderer("chat")
    empty = GenerateChunk(token_ids=(), text="")
    r.add(empty)
    assert r.chunk_events(empty) == []


def test_completion_has_no_first_events() -> None:
    assert _renderer("completion").first_events() == []


def test_chat_finish_only_chunk_is_single_event() -> None:
    r = _renderer("chat")
    fin = GenerateChunk(token_ids=(), text="", finish_reason="stop")
    r.add(fin)
    (event,) = _parse(r.chunk_events(fin))
    assert event["choices"][0] == {"index": 0, "logprobs": None, "finish_reason": "stop", "delta": {}}


# ---- n choices, logprobs, tool calls -----------------------------------------------------------

LP = TokenLogprob(10, "Hel", -0.5, (("Hel", -0.5), ("Bye", -1.5)))


def test_n_choices_render_by_index() -> None:
    r = _renderer("completion", n=2)
    r.add(GenerateChunk((1,), "a", index=1))
    r.add(GenerateChunk((2,), "b", finish_reason="length", index=0))
    r.add(GenerateChunk((3,), "c", finish_reason="stop", index=1))
    body = r.whole()
    assert [(c["index"], c["text"], c["finish_reason"]) for c in body["choices"]] == [
        (0, "b", "length"), (1, "ac", "stop")]
    assert body["usage"]["completion_tokens"] == 3


def test_streamed_chat_announces_every_choice() -> None:
    events = _parse(_renderer("chat", n=2).first_events())
    assert [e["choices"][0]["index"] for e in events] == [0, 1]


def test_chat_logprobs_shape() -> None:
    r = _renderer("chat", logprobs=True)
    r.add(GenerateChunk((10,), "Hel", finish_reason="length", logprobs=(LP,)))
    lp = r.whole()["choices"][0]["logprobs"]["content"]
    assert lp == [{"token": "Hel", "logprob": -0.5, "bytes": list(b"Hel"),
                   "top_logprobs": [{"token": "Hel", "logprob": -0.5, "bytes": list(b"Hel")},
                                    {"token": "Bye", "logprob": -1.5, "bytes": list(b"Bye")}]}]


def test_completion_logprobs_shape_and_stream() -> None:
    r = _renderer("completion", logprobs=True)
    chunk = GenerateChunk((10,), "Hel", finish_reason="length", logprobs=(LP,))
    r.add(chunk)
    assert r.whole()["choices"][0]["logprobs"] == {
        "tokens": ["Hel"], "token_logprobs": [-0.5],
        "top_logprobs": [{"Hel": -0.5, "Bye": -1.5}], "text_offset": [0]}
    streamed = _parse(r.chunk_events(chunk))[0]["choices"][0]["logprobs"]
    assert streamed["tokens"] == ["Hel"]


def test_tool_calls_whole_and_streamed() -> None:
    spec = ToolSpec(functions=({"name": "now"},), mode="required")
    text = '[{"name": "now", "arguments": {}}]'
    chunk = GenerateChunk((1, 2), text, finish_reason="stop")
    r = _renderer("chat", tools=spec)
    r.add(chunk)
    choice = r.whole()["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    assert choice["message"]["content"] is None
    assert choice["message"]["tool_calls"][0]["function"] == {"name": "now", "arguments": "{}"}
    events = _parse(r.chunk_events(chunk))
    delta = events[0]["choices"][0]["delta"]
    assert delta["tool_calls"][0]["index"] == 0
    assert delta["tool_calls"][0]["function"]["name"] == "now"
    assert events[1]["choices"][0]["finish_reason"] == "tool_calls"


def test_tool_output_is_held_back_until_the_choice_ends() -> None:
    r = _renderer("chat", tools=ToolSpec(functions=({"name": "now"},), mode="auto"))
    chunk = GenerateChunk((1,), "plain")
    r.add(chunk)
    assert r.chunk_events(chunk) == []
    end = GenerateChunk((2,), " text", finish_reason="stop")
    r.add(end)
    assert _parse(r.chunk_events(end))[0]["choices"][0]["delta"] == {"content": "plain text"}
