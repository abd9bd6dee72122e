"""Request translation for the OpenAI parameters and structured output: body -> `Sampling` (the
router's `prepare`) -> vLLM `SamplingParams` (the worker's `to_sampling_params`). No engine."""

from __future__ import annotations

import json
from typing import Any

import pytest

from splitserve.engine.host import to_sampling_params
from splitserve.engine.messages import Sampling, StructuredOutput
from splitserve.models import resolve_model_path
from splitserve.router.errors import APIError
from splitserve.router.prepare import Prepared, prepare
from splitserve.router.prompts import PromptBuilder

MODEL = "splitserve-tiny"
MSGS = [{"role": "user", "content": "hi"}]
SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
WEATHER = {
    "type": "function",
    "function": {
        "name": "weather",
        "description": "The weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}


@pytest.fixture(scope="module")
def prompts() -> PromptBuilder:
    return PromptBuilder(resolve_model_path(None), 2048)


def _chat(prompts: PromptBuilder, **fields: Any) -> Prepared:
    body = {"model": MODEL, "messages": MSGS, "max_tokens": 8, **fields}
    return prepare("chat", json.dumps(body).encode(), prompts, model_name=MODEL)


def _completion(prompts: PromptBuilder, **fields: Any) -> Prepared:
    body = {"model": MODEL, "prompt": "hi", "max_tokens": 8, **fields}
    return prepare("completions", json.dumps(body).encode(), prompts, model_name=MODEL)


def _error(fn, prompts: PromptBuilder, **fields: Any) -> APIError:
    with pytest.raises(APIError) as exc:
        fn(prompts, **fields)
    assert exc.value.status == 400
    return exc.value


# ---- point 4: the plain parameters ---------------------------------------------------------


def test_sampling_parameters_reach_vllm(prompts) -> None:
    p = _chat(prompts, seed=7, stop=["x", "y"], presence_penalty=0.5, frequency_penalty=-0.5,
              max_completion_tokens=5, user="alice", temperature=0.7)
    s = p.generate.sampling
    v = to_sampling_params(s)
    assert (v.seed, v.stop, v.max_tokens) == (7, ["x", "y"], 5)
    assert (v.presence_penalty, v.frequency_penalty, v.temperature) == (0.5, -0.5, 0.7)
    assert v.logprobs is None and v.logit_bias is None and v.structured_outputs is None


def test_max_completion_tokens_wins_over_max_tokens(prompts) -> None:
    assert _chat(prompts, max_tokens=9, max_completion_tokens=3).generate.sampling.max_tokens == 3


@pytest.mark.parametrize(
    ("fields", "expected"),
    [({}, None), ({"logprobs": False}, None), ({"logprobs": True}, 0),
     ({"logprobs": True, "top_logprobs": 5}, 5)],
)
def test_chat_logprobs(prompts, fields, expected) -> None:
    s = _chat(prompts, **fields).generate.sampling
    assert s.logprobs == expected
    assert to_sampling_params(s).logprobs == expected


def test_completion_logprobs(prompts) -> None:
    assert _completion(prompts, logprobs=3).generate.sampling.logprobs == 3
    assert _error(_completion, prompts, logprobs=6).param == "logprobs"


def test_top_logprobs_needs_logprobs(prompts) -> None:
    assert _error(_chat, prompts, top_logprobs=2).param == "top_logprobs"
    assert _error(_chat, prompts, logprobs=True, top_logprobs=21).param == "top_logprobs"


def test_logit_bias(prompts) -> None:
    s = _chat(prompts, logit_bias={"42": 100, "7": -5.5}).generate.sampling
    assert s.logit_bias == ((7, -5.5), (42, 100.0))
    assert to_sampling_params(s).logit_bias == {7: -5.5, 42: 100.0}
    assert _chat(prompts, logit_bias={}).generate.sampling.logit_bias == ()


@pytest.mark.parametrize("bias", [{"a": 1}, {"-1": 1}, {"1": 101}, {"999999": 1}])
def test_bad_logit_bias_is_400(prompts, bias) -> None:
    assert _error(_chat, prompts, logit_bias=bias).param == "logit_bias"


def test_n(prompts) -> None:
    assert _chat(prompts, n=3).n == 3
    assert _completion(prompts).n == 1
    assert _error(_chat, prompts, n=0).param == "n"


@pytest.mark.parametrize(
    ("fields", "param"),
    [({"best_of": 2}, "best_of"), ({"echo": True}, "echo"), ({"suffix": "x"}, "suffix")],
)
def test_unsupported_completion_parameters_are_400(prompts, fields, param) -> None:
    e = _error(_completion, prompts, **fields)
    assert (e.param, e.code) == (param, "unsupported_parameter")


def test_prefill_sampling_drops_what_only_decode_needs() -> None:
    s = Sampling(max_tokens=9, min_tokens=3, logprobs=2, seed=1,
                 structured=StructuredOutput(json_object=True))
    p = s.for_prefill()
    assert (p.max_tokens, p.min_tokens, p.logprobs, p.structured) == (1, 0, None, None)
    assert p.seed == 1


# ---- point 3: structured output ------------------------------------------------------------


def test_json_schema_response_format(prompts) -> None:
    rf = {"type": "json_schema", "json_schema": {"name": "a", "schema": SCHEMA, "strict": True}}
    s = _chat(prompts, response_format=rf).generate.sampling
    assert json.loads(s.structured.json) == SCHEMA
    assert json.loads(to_sampling_params(s).structured_outputs.json) == SCHEMA


def test_json_object_response_format(prompts) -> None:
    s = _chat(prompts, response_format={"type": "json_object"}).generate.sampling
    assert s.structured == StructuredOutput(json_object=True)
    assert to_sampling_params(s).structured_outputs.json_object is True
    assert _completion(prompts, response_format={"type": "json_object"}).generate.sampling.structured


def test_text_response_format_has_no_constraint(prompts) -> None:
    assert _chat(prompts, response_format={"type": "text"}).generate.sampling.structured is None


@pytest.mark.parametrize(
    ("so", "field", "value"),
    [({"choice": ["yes", "no"]}, "choice", ["yes", "no"]),
     ({"regex": "[0-9]{3}"}, "regex", "[0-9]{3}"),
     ({"grammar": 'root ::= "a" | "b"'}, "grammar", 'root ::= "a" | "b"'),
     ({"json": json.dumps(SCHEMA)}, "json", json.dumps(SCHEMA))],
)
def test_structured_outputs_extension(prompts, so, field, value) -> None:
    for fn in (_chat, _completion):
        v = to_sampling_params(fn(prompts, structured_outputs=so).generate.sampling)
        assert getattr(v.structured_outputs, field) == value


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"response_format": {"type": "json_schema"}}, "response_format"),
        ({"response_format": {"type": "yaml"}}, "response_format.type"),
        ({"response_format": {"type": "json_schema",
                              "json_schema": {"name": "a", "schema": {"type": "nope"}}}},
         "response_format.json_schema"),
        ({"structured_outputs": {"regex": "("}}, "structured_outputs.regex"),
        ({"structured_outputs": {"choice": []}}, "structured_outputs.choice"),
        ({"structured_outputs": {"regex": "a", "choice": ["a"]}}, "structured_outputs"),
        ({"structured_outputs": {"json": "{"}}, "structured_outputs.json"),
        ({"structured_outputs": {"regex": "a"}, "response_format": {"type": "json_object"}},
         "structured_outputs"),
    ],
)
def test_bad_structured_output_is_400(prompts, fields, param) -> None:
    assert _error(_chat, prompts, **fields).param == param


# ---- point 3: tools ------------------------------------------------------------------------


def test_tools_auto_is_unconstrained_and_offered_in_the_prompt(prompts) -> None:
    p = _chat(prompts, tools=[WEATHER])
    assert p.tools is not None and p.tools.mode == "auto"
    assert p.generate.sampling.structured is None
    prompt = prompts.tokenizer.decode(p.generate.prompt_token_ids)
    assert "<tools>" in prompt and '"weather"' in prompt


def test_named_tool_choice_constrains_to_its_parameters(prompts) -> None:
    choice = {"type": "function", "function": {"name": "weather"}}
    p = _chat(prompts, tools=[WEATHER], tool_choice=choice)
    assert (p.tools.mode, p.tools.named) == ("named", "weather")
    assert json.loads(p.generate.sampling.structured.json) == WEATHER["function"]["parameters"]


def test_required_tool_choice_constrains_to_a_call_list(prompts) -> None:
    p = _chat(prompts, tools=[WEATHER], tool_choice="required", parallel_tool_calls=False)
    schema = json.loads(p.generate.sampling.structured.json)
    assert schema["type"] == "array" and schema["maxItems"] == 1


def test_tool_choice_none_parses_nothing(prompts) -> None:
    p = _chat(prompts, tools=[WEATHER], tool_choice="none")
    assert not p.tools.parses and p.generate.sampling.structured is None


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"tool_choice": "auto"}, "tool_choice"),
        ({"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "x"}}},
         "tool_choice"),
        ({"tools": [WEATHER], "tool_choice": "sometimes"}, "tool_choice"),
        ({"tools": [{"type": "custom", "custom": {"name": "x"}}]}, "tools[0].type"),
        ({"tools": [{"type": "function", "function": {"name": "a b"}}]},
         "tools[0].function.name"),
        ({"tools": [{"type": "function", "function": {"name": "f",
                                                      "parameters": {"type": 3}}}]},
         "tools[0].function.parameters"),
        ({"tools": [WEATHER], "tool_choice": "required",
          "response_format": {"type": "json_object"}}, "tool_choice"),
    ],
)
def test_bad_tools_are_400(prompts, fields, param) -> None:
    assert _error(_chat, prompts, **fields).param == param


def test_earlier_tool_calls_and_results_are_rendered(prompts) -> None:
    call = {"id": "call_1", "type": "function",
            "function": {"name": "weather", "arguments": '{"city": "Oslo"}'}}
    messages = [
        {"role": "user", "content": "weather in Oslo?"},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
    ]
    p = _chat(prompts, messages=messages, tools=[WEATHER])
    prompt = prompts.tokenizer.decode(p.generate.prompt_token_ids)
    assert '<tool_call>{"name": "weather", "arguments": {"city": "Oslo"}}</tool_call>' in prompt
    assert "sunny" in prompt


def test_engines_produce_compact_json() -> None:
    from vllm.config import StructuredOutputsConfig

    from splitserve.engine.args import STRUCTURED_OUTPUTS

    cfg = StructuredOutputsConfig(**STRUCTURED_OUTPUTS)
    assert cfg.disable_any_whitespace and cfg.backend == "xgrammar"
