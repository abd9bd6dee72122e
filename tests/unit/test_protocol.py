"""splitserve.router.protocol: request bodies -> typed requests, or a 400 APIError naming the param."""

from __future__ import annotations

import json
from typing import Any

import pytest

from splitserve.router.errors import APIError
from splitserve.router.protocol import (
    MAX_N,
    ChatCompletionRequest,
    CompletionRequest,
    parse_request,
)

MSGS = [{"role": "user", "content": "hi"}]


def _body(**fields: Any) -> bytes:
    return json.dumps(fields).encode()


def _err(body: bytes, model: type = CompletionRequest) -> APIError:
    with pytest.raises(APIError) as exc:
        parse_request(body, model)
    assert exc.value.status == 400
    assert exc.value.type == "invalid_request_error"
    return exc.value


def test_valid_completion() -> None:
    req = parse_request(_body(model="m", prompt="hello", max_tokens=5, stop="\n"), CompletionRequest)
    assert req.model == "m"
    assert req.prompt == "hello"
    assert req.max_tokens == 5
    assert req.stops() == ("\n",)
    assert req.include_usage is False


def test_completion_defaults() -> None:
    req = parse_request(_body(model="m", prompt=[1, 2, 3]), CompletionRequest)
    assert req.max_tokens == 16
    assert req.temperature == 1.0
    assert req.stops() == ()


def test_include_usage() -> None:
    req = parse_request(
        _body(model="m", prompt="x", stream=True, stream_options={"include_usage": True}),
        CompletionRequest,
    )
    assert req.include_usage is True


def test_malformed_json() -> None:
    e = _err(b'{"model": "m",')
    assert e.message.startswith("The request body is not valid JSON")
    assert e.param is None


def test_non_utf8_body() -> None:
    assert _err(b"\xff\xfe\xfd").message.startswith("The request body is not valid JSON")


@pytest.mark.parametrize("body", [b"[1, 2]", b'"text"', b"3", b"null"])
def test_non_object_json(body: bytes) -> None:
    assert _err(body).message == "The request body must be a JSON object."


def test_unknown_field() -> None:
    e = _err(_body(model="m", prompt="x", foo=1))
    assert e.message == "Unrecognized request argument supplied: foo"
    assert e.param == "foo"


def test_missing_model() -> None:
    e = _err(_body(prompt="x"))
    assert e.message == "Missing required parameter: 'model'."
    assert e.param == "model"


def test_missing_messages() -> None:
    assert _err(_body(model="m"), ChatCompletionRequest).param == "messages"


@pytest.mark.parametrize("value", [0, -1])
def test_max_tokens_below_one(value: int) -> None:
    e = _err(_body(model="m", prompt="x", max_tokens=value))
    assert e.param == "max_tokens"
    assert e.code == "invalid_value"
    assert "greater than or equal to 1" in e.message


def test_chat_max_completion_tokens_zero() -> None:
    e = _err(_body(model="m", messages=MSGS, max_completion_tokens=0), ChatCompletionRequest)
    assert e.param == "max_completion_tokens"


def test_temperature_out_of_range() -> None:
    e = _err(_body(model="m", prompt="x", temperature=3))
    assert e.param == "temperature"
    assert e.code == "invalid_value"
    assert e.message.startswith("Invalid value for 'temperature':")


def test_n_up_to_max_accepted() -> None:
    assert parse_request(_body(model="m", prompt="x", n=4), CompletionRequest).choices() == 4
    e = _err(_body(model="m", prompt="x", n=MAX_N + 1))
    assert (e.param, e.code) == ("n", "invalid_value")


def test_n_at_default_accepted() -> None:
    assert parse_request(_body(model="m", prompt="x", n=1), CompletionRequest).n == 1
    assert parse_request(_body(model="m", prompt="x", n=None), CompletionRequest).choices() == 1


def test_tools_on_chat_accepted() -> None:
    tools = [{"type": "function", "function": {"name": "f", "parameters": {}}}]
    req = parse_request(_body(model="m", messages=MSGS, tools=tools), ChatCompletionRequest)
    assert req.tools[0].function.name == "f"


def test_tools_on_completion_is_unknown_field() -> None:
    e = _err(_body(model="m", prompt="x", tools=[]))
    assert e.message == "Unrecognized request argument supplied: tools"


def test_response_format_text_accepted() -> None:
    req = parse_request(
        _body(model="m", messages=MSGS, response_format={"type": "text"}), ChatCompletionRequest
    )
    assert req.response_format.type == "text"


def test_response_format_json_accepted() -> None:
    req = parse_request(
        _body(model="m", messages=MSGS, response_format={"type": "json_object"}),
        ChatCompletionRequest,
    )
    assert req.response_format.type == "json_object"


def test_functions_rejected_as_unsupported() -> None:
    body = _body(model="m", messages=MSGS, functions=[{"name": "f"}])
    e = _err(body, ChatCompletionRequest)
    assert (e.param, e.code) == ("functions", "unsupported_parameter")


def test_echo_true_rejected() -> None:
    e = _err(_body(model="m", prompt="x", echo=True))
    assert (e.param, e.code) == ("echo", "unsupported_parameter")


def test_five_stop_sequences_rejected() -> None:
    e = _err(_body(model="m", prompt="x", stop=["a", "b", "c", "d", "e"]))
    assert e.param == "stop"
    assert "at most 4 stop sequences" in e.message


def test_four_stop_sequences_accepted() -> None:
    req = parse_request(_body(model="m", prompt="x", stop=["a", "b", "c", "d"]), CompletionRequest)
    assert req.stops() == ("a", "b", "c", "d")


def test_empty_stop_sequence_rejected() -> None:
    assert _err(_body(model="m", prompt="x", stop=[""])).param == "stop"


def test_empty_messages_rejected() -> None:
    assert _err(_body(model="m", messages=[]), ChatCompletionRequest).param == "messages"


def test_chat_text_parts_joined() -> None:
    content = [{"type": "text", "text": "Hello, "}, {"type": "text", "text": "world"}]
    req = parse_request(_body(model="m", messages=[{"role": "user", "content": content}]), ChatCompletionRequest)
    assert req.messages[0].text() == "Hello, world"


def test_chat_string_and_null_content() -> None:
    req = parse_request(
        _body(model="m", messages=[{"role": "system", "content": "s"}, {"role": "assistant", "content": None}]),
        ChatCompletionRequest,
    )
    assert [m.text() for m in req.messages] == ["s", ""]


def test_chat_image_part_rejected() -> None:
    content = [
        {"type": "text", "text": "what is this?"},
        {"type": "image_url", "image_url": {"url": "http://x/y.png"}},
    ]
    req = parse_request(_body(model="m", messages=[{"role": "user", "content": content}]), ChatCompletionRequest)
    with pytest.raises(APIError) as exc:
        req.messages[0].text()
    assert exc.value.status == 400
    assert exc.value.param == "messages"
    assert "'image_url' is not supported" in exc.value.message


def test_chat_bad_role() -> None:
    e = _err(_body(model="m", messages=[{"role": "robot", "content": "x"}]), ChatCompletionRequest)
    assert e.param == "messages[0].role"


def test_output_limit_prefers_max_completion_tokens() -> None:
    req = parse_request(
        _body(model="m", messages=MSGS, max_tokens=10, max_completion_tokens=3), ChatCompletionRequest
    )
    assert req.output_limit() == 3
    assert parse_request(_body(model="m", messages=MSGS), ChatCompletionRequest).output_limit() is None


def test_chat_logprobs_false_accepted() -> None:
    req = parse_request(_body(model="m", messages=MSGS, logprobs=False), ChatCompletionRequest)
    assert not req.logprobs


@pytest.mark.parametrize(("field", "value"), [("prompt", 5), ("stop", 5)])
def test_union_field_error_names_the_field(field: str, value: Any) -> None:
    body = {"model": "m", "prompt": "x", field: value}
    assert _err(json.dumps(body).encode()).param == field
