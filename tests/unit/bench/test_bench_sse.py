"""SSE decoding of recorded streams and reading of completion chunks."""

from __future__ import annotations

import json

import pytest
from bench_fakes import DONE, chunk, stream_for, usage

from splitserve.bench.sse import SSEDecoder, error_text, parse_completion_event


def decode_all(data: bytes, step: int) -> list[str]:
    dec = SSEDecoder()
    out = []
    for i in range(0, len(data), step):
        out += dec.feed(data[i:i + step])
    return out + dec.close()


RECORDED = b"".join(stream_for(5, 3))


@pytest.mark.parametrize("step", [1, 2, 7, 64, len(RECORDED)])
def test_recorded_stream_decodes_the_same_at_any_split(step):
    payloads = decode_all(RECORDED, step)
    assert len(payloads) == 5 and payloads[-1] == "[DONE]"
    assert [json.loads(p)["choices"][0]["text"] for p in payloads[:3]] == ["t0", "t1", "t2"]


def test_crlf_multiline_comments_and_other_fields():
    data = (b": keep-alive\r\n\r\nevent: message\r\nid: 7\r\ndata: {\"a\":\r\n"
            b"data:1}\r\n\r\ndata: [DONE]\r\n\r\n")
    assert decode_all(data, 3) == ['{"a":\n1}', "[DONE]"]


def test_utf8_split_inside_a_character():
    data = 'data: {"choices":[{"text":"ü🚀"}]}\n\n'.encode()
    payloads = decode_all(data, 1)
    assert json.loads(payloads[0])["choices"][0]["text"] == "ü🚀"


def test_event_without_final_blank_line_is_flushed_on_close():
    dec = SSEDecoder()
    assert dec.feed(b"data: [DONE]") == []
    assert dec.close() == ["[DONE]"]
    assert dec.close() == []


def test_parse_content_usage_done_error():
    content = parse_completion_event(decode_all(chunk("hi", "length"), 100)[0])
    assert content.content and content.text == "hi" and content.finish_reason == "length"
    assert content.usage is None and not content.done
    empty = parse_completion_event(decode_all(chunk(""), 100)[0])
    assert empty.content and empty.text == ""  # a token step even without text
    u = parse_completion_event(decode_all(usage(5, 3), 100)[0])
    assert not u.content and u.usage["completion_tokens"] == 3
    assert parse_completion_event(decode_all(DONE, 100)[0]).done
    err = parse_completion_event('{"error": {"message": "boom", "type": "x", "code": 500}}')
    assert err.error == "boom"
    assert parse_completion_event("not json").error.startswith("bad SSE payload")
    assert parse_completion_event("[1, 2]").error.startswith("bad SSE payload")


@pytest.mark.parametrize("body, text", [
    ({"error": {"message": "too long", "code": 400}}, "too long"),
    ({"error": "plain"}, "plain"),
    ({"message": "vllm style"}, "vllm style"),
    ({"detail": "Not Found"}, "Not Found"),
    ([1], "[1]"),
])
def test_error_text(body, text):
    assert error_text(body) == text
