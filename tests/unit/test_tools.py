"""splitserve.router.tools: the output constraint of forced calls and the tool-call parser."""

from __future__ import annotations

import json

import jsonschema

from splitserve.router.tools import NO_PARAMETERS, ToolSpec, render_messages

CITY = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
FUNCS = ({"name": "weather", "parameters": CITY}, {"name": "now"})


def _spec(mode, named=None, parallel=True) -> ToolSpec:
    return ToolSpec(functions=FUNCS, mode=mode, named=named, parallel=parallel)


def test_named_constraint_is_the_parameters_schema() -> None:
    assert json.loads(_spec("named", "weather").constraint().json) == CITY
    assert json.loads(_spec("named", "now").constraint().json) == NO_PARAMETERS


def test_required_constraint_accepts_exactly_the_parseable_call_lists() -> None:
    schema = json.loads(_spec("required").constraint().json)
    ok = [{"name": "weather", "arguments": {"city": "Oslo"}}, {"name": "now", "arguments": {}}]
    jsonschema.validate(ok, schema)
    for bad in ([], [{"name": "other", "arguments": {}}], [{"name": "weather", "arguments": {}}]):
        assert not jsonschema.Draft202012Validator(schema).is_valid(bad)
    single = json.loads(_spec("required", parallel=False).constraint().json)
    assert not jsonschema.Draft202012Validator(single).is_valid(ok)


def test_free_modes_have_no_constraint() -> None:
    assert _spec("auto").constraint() is None
    assert _spec("none").constraint() is None


def _args(call) -> dict:
    assert call["type"] == "function" and call["id"].startswith("call_")
    return json.loads(call["function"]["arguments"])


def test_parse_named() -> None:
    content, calls = _spec("named", "weather").parse('{"city": "Oslo"}')
    assert content is None and calls[0]["function"]["name"] == "weather"
    assert _args(calls[0]) == {"city": "Oslo"}
    assert _spec("named", "weather").parse('{"city": "Os') == ('{"city": "Os', [])


def test_parse_required() -> None:
    text = '[{"name": "weather", "arguments": {"city": "Oslo"}}, {"name": "now", "arguments": {}}]'
    content, calls = _spec("required").parse(text)
    assert content is None
    assert [c["function"]["name"] for c in calls] == ["weather", "now"]
    assert _spec("required").parse("[]") == ("[]", [])


def test_parse_auto_spans_and_keeps_the_text_around_them() -> None:
    text = 'Let me check. <tool_call>{"name": "weather", "arguments": {"city": "Oslo"}}</tool_call>'
    content, calls = _spec("auto").parse(text)
    assert content == "Let me check."
    assert _args(calls[0]) == {"city": "Oslo"}
    assert _spec("auto").parse("just text") == ("just text", [])
    bad = '<tool_call>{"name": "unknown", "arguments": {}}</tool_call>'
    assert _spec("auto").parse(bad) == (bad, [])


def test_none_never_parses() -> None:
    text = '<tool_call>{"name": "now", "arguments": {}}</tool_call>'
    assert _spec("none").parse(text) == (text, [])


def test_finish_reason() -> None:
    call = [{"id": "x"}]
    assert _spec("auto").finish_reason("stop", call) == "tool_calls"
    assert _spec("required").finish_reason("stop", call) == "tool_calls"
    assert _spec("named", "now").finish_reason("stop", call) == "stop"
    assert _spec("auto").finish_reason("length", []) == "length"


def test_render_messages() -> None:
    call = {"id": "c", "type": "function", "function": {"name": "now", "arguments": "{}"}}
    out = render_messages(
        [{"role": "assistant", "content": "", "tool_calls": [call]},
         {"role": "tool", "content": "12:00"}],
        _spec("auto"),
    )
    assert out[0]["role"] == "system" and "<tools>" in out[0]["content"]
    assert out[1] == {"role": "assistant",
                      "content": '<tool_call>{"name": "now", "arguments": {}}</tool_call>'}
    assert out[2] == {"role": "tool", "content": "12:00"}
    assert render_messages([{"role": "user", "content": "hi"}], None) == [
        {"role": "user", "content": "hi"}
    ]
