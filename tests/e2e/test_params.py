"""The enterprise API surface in both modes: structured output, tool calls and the OpenAI sampling
parameters, through the real `openai` client.

The module runs one fixed set of requests against a colocated deployment (one decode engine),
then against a disaggregated one (a prefill and a decode engine; every prompt is long enough to
prefill remotely, and the spill rule is off), never more than two engines at a time. The tests
then check each mode's answers and that the disaggregated answers equal the colocated ones. The
tiny model has random weights: valid JSON can only come from the constraint, which the decode
engine applies from the first output token on (a remote prefill's own token is discarded).
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
import jsonschema
import openai
import pytest
from transformers import AutoTokenizer

from splitserve.models import build_tiny_model
from tests.conftest import shared_deployment, test_config

pytestmark = pytest.mark.engine

MODEL = "splitserve-tiny"
MODES = ("colocated", "disaggregated")
THRESHOLD = 128  # disaggregated: prompts of this many tokens or more prefill remotely
STRUCTURED_REQUESTS = 50
SCHEMA = {
    "type": "object",
    "properties": {
        "ok": {"type": "boolean"},
        "color": {"enum": ["red", "green", "blue"]},
        "size": {"type": "integer", "minimum": 0, "maximum": 9},
    },
    "required": ["ok", "color", "size"],
    "additionalProperties": False,
}
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"enum": ["Oslo", "Lima", "Pune"]},
                           "celsius": {"type": "boolean"}},
            "required": ["city", "celsius"],
            "additionalProperties": False,
        },
    },
}
BIAS_TOKENS = (300, 301)  # ordinary BPE merges (not special, not single bytes)
CLOCK = {"type": "function", "function": {"name": "get_time"}}
# Every prompt is over THRESHOLD tokens, so that every disaggregated request prefills remotely.
CONTEXT = "A serving platform takes requests from many tenants and answers each one. " * 12


def _prompt(i: int) -> str:
    return f"{CONTEXT}Request {i}: describe item {i * 7 % 13}."


def _chat(i: int) -> list[dict[str, str]]:
    return [{"role": "user", "content": _prompt(i)}]


async def _json_requests(client: openai.AsyncOpenAI) -> list[Any]:
    fmt = {"type": "json_schema", "json_schema": {"name": "item", "schema": SCHEMA}}

    async def one(i: int) -> Any:
        r = await client.chat.completions.create(
            model=MODEL, messages=_chat(i), max_tokens=64, seed=i, response_format=fmt
        )
        return r.choices[0].message.content, r.choices[0].finish_reason

    return list(await asyncio.gather(*(one(i) for i in range(STRUCTURED_REQUESTS))))


async def _structured_extras(client: openai.AsyncOpenAI) -> dict[str, Any]:
    async def complete(**kw: Any) -> str:
        r = await client.completions.create(model=MODEL, prompt=_prompt(1), max_tokens=24,
                                            temperature=0, **kw)
        return r.choices[0].text

    async def chat(**kw: Any) -> tuple[str, str]:
        r = await client.chat.completions.create(model=MODEL, messages=_chat(2), max_tokens=64,
                                                 temperature=0, **kw)
        return r.choices[0].message.content, r.choices[0].finish_reason

    names = ("choice", "regex", "json_object")
    results = await asyncio.gather(
        complete(extra_body={"structured_outputs": {"choice": ["alpha", "beta", "gamma"]}}),
        chat(extra_body={"structured_outputs": {"regex": "[a-z]{3}-[0-9]{2}"}}),
        chat(response_format={"type": "json_object"}),
    )
    return dict(zip(names, results, strict=True))


async def _tools(client: openai.AsyncOpenAI) -> dict[str, Any]:
    messages = [{"role": "user", "content": _prompt(3) + " What is the weather in Oslo?"}]

    async def call(max_tokens: int = 128, **kw: Any) -> Any:
        r = await client.chat.completions.create(
            model=MODEL, messages=messages, tools=[WEATHER, CLOCK], max_tokens=max_tokens,
            temperature=0, **kw,
        )
        return r.model_dump()["choices"][0]

    async def streamed() -> Any:
        stream = await client.chat.completions.create(
            model=MODEL, messages=messages, tools=[WEATHER, CLOCK], max_tokens=128,
            temperature=0, stream=True,
            tool_choice={"type": "function", "function": {"name": "get_weather"}},
        )
        deltas = [c.choices[0].model_dump() async for c in stream if c.choices]
        return deltas

    named = {"type": "function", "function": {"name": "get_weather"}}
    keys = ("named", "required", "single", "auto", "streamed")
    results = await asyncio.gather(
        # parallel calls: the random model decides how many, so leave room for several
        call(tool_choice=named), call(tool_choice="required", max_tokens=512),
        call(tool_choice="required", parallel_tool_calls=False), call(), streamed(),
    )
    return dict(zip(keys, results, strict=True))


async def _params(client: openai.AsyncOpenAI, tok) -> dict[str, Any]:
    """One request per point-4 parameter (plus the references they are checked against)."""
    prompt = _prompt(4)

    async def complete(**kw: Any) -> dict[str, Any]:
        kw.setdefault("max_tokens", 12)
        r = await client.completions.create(
            model=MODEL, prompt=prompt, extra_body={"return_token_ids": True}, **kw
        )
        return r.model_dump()

    async def chat(**kw: Any) -> dict[str, Any]:
        r = await client.chat.completions.create(model=MODEL, messages=_chat(4), **kw)
        return r.model_dump()

    greedy = await complete(temperature=0, max_tokens=24)
    text, ids = greedy["choices"][0]["text"], greedy["choices"][0]["token_ids"]
    stop = text[8:11]
    bias_token = BIAS_TOKENS[0] if ids[0] != BIAS_TOKENS[0] else BIAS_TOKENS[1]
    out: dict[str, Any] = {"greedy": greedy, "stop_string": stop}
    tasks = {
        "seed": complete(temperature=1.0, seed=1234),
        "seed_again": complete(temperature=1.0, seed=1234),
        "n": complete(temperature=1.0, seed=99, n=3),
        "n_1": complete(temperature=1.0, seed=100),  # choice 1 of "n" (seed + 1)
        "stop": complete(temperature=0, max_tokens=24, stop=[stop]),
        "logprobs_chat": chat(temperature=0, max_tokens=8, logprobs=True, top_logprobs=3),
        "logprobs_completion": complete(temperature=0, max_tokens=8, logprobs=2),
        "penalties": complete(temperature=0, max_tokens=24, presence_penalty=1.5,
                              frequency_penalty=2.0),
        "bias_up": complete(temperature=0, max_tokens=6, logit_bias={str(bias_token): 100}),
        "bias_down": complete(temperature=0, max_tokens=6, logit_bias={str(ids[0]): -100}),
        "user": complete(temperature=0, max_tokens=24, user="tenant-user-42"),
        "max_completion_tokens": chat(temperature=0, max_completion_tokens=5, max_tokens=50),
    }
    values = await asyncio.gather(*tasks.values())
    out.update(dict(zip(tasks, values, strict=True)))
    out["bias_token"] = bias_token
    out["echo"] = await complete(temperature=0, max_tokens=4, echo=True)
    return out


async def _collect(base: str, tok) -> dict[str, Any]:
    client = openai.AsyncOpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0)
    out: dict[str, Any] = {}
    before = _decisions(base)  # the deployment is shared: count this module's requests only
    out["json"] = await _json_requests(client)
    out["structured"] = await _structured_extras(client)
    out["tools"] = await _tools(client)
    out["params"] = await _params(client, tok)
    out["decisions"] = {
        path: n - before.get(path, 0) for path, n in _decisions(base).items()
    }
    return out


def _decisions(base: str) -> dict[str, float]:
    out = {}
    for line in httpx.get(f"{base}/metrics").text.splitlines():
        if line.startswith("splitserve_disagg_decisions_total{"):
            path = line.split('path="')[1].split('"')[0]
            out[path] = float(line.rsplit(" ", 1)[1])
    return out


@pytest.fixture(scope="module")
def tok():
    return AutoTokenizer.from_pretrained(build_tiny_model())


@pytest.fixture(scope="module")
def results(tok) -> dict[str, dict[str, Any]]:
    """Every mode's answers: the colocated deployment first, then the disaggregated one."""
    overrides = {
        "colocated": {"mode": "colocated"},
        "disaggregated": {  # test_disaggregated's config: the deployment is shared
            "mode": "disaggregated",
            "disaggregation.min_remote_prompt_tokens": THRESHOLD,
            "disaggregation.prefill": "remote",  # the remote path, whatever the rule predicts
        },
    }
    out = {}
    for mode in MODES:
        with shared_deployment(test_config(**overrides[mode])) as base:
            out[mode] = asyncio.run(_collect(base, tok))
    return out


def test_prompts_are_long_enough_to_prefill_remotely(tok) -> None:
    assert len(tok(_prompt(0))["input_ids"]) >= THRESHOLD


def test_every_disaggregated_request_prefilled_remotely(results) -> None:
    decisions = results["disaggregated"]["decisions"]
    assert decisions.get("local", 0) == 0  # n = 3 too: its three samples share one pull
    assert decisions.get("remote", 0) >= STRUCTURED_REQUESTS


# ---- structured output ---------------------------------------------------------------------


@pytest.mark.parametrize("mode", MODES)
def test_json_schema_requests_all_match_the_schema(results, mode) -> None:
    answers = results[mode]["json"]
    assert len(answers) == STRUCTURED_REQUESTS
    for content, _ in answers:
        jsonschema.validate(json.loads(content), SCHEMA)


@pytest.mark.parametrize("mode", MODES)
def test_choice_regex_and_json_object(results, mode) -> None:
    got = results[mode]["structured"]
    assert got["choice"] in ("alpha", "beta", "gamma")
    regex, _ = got["regex"]
    assert len(regex) == 6 and regex[3] == "-" and regex[4:].isdigit()
    # Any object: nothing bounds its length, so the random model may still be inside it at
    # max_tokens; a finished one must parse.
    content, finish = got["json_object"]
    assert content.startswith("{")
    if finish == "stop":
        assert isinstance(json.loads(content), dict)


def test_structured_output_is_the_same_in_both_modes(results) -> None:
    assert results["disaggregated"]["json"] == results["colocated"]["json"]
    assert results["disaggregated"]["structured"] == results["colocated"]["structured"]


# ---- tools ---------------------------------------------------------------------------------


def _calls(choice: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    calls = choice["message"]["tool_calls"] or []
    return [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls]


@pytest.mark.parametrize("mode", MODES)
def test_forced_tool_calls_parse(results, mode) -> None:
    got = results[mode]["tools"]
    params = WEATHER["function"]["parameters"]
    (name, args), = _calls(got["named"])
    assert name == "get_weather" and got["named"]["finish_reason"] == "stop"
    jsonschema.validate(args, params)
    required = _calls(got["required"])
    assert required and got["required"]["finish_reason"] == "tool_calls"
    for name, args in required:
        assert name in ("get_weather", "get_time")
        if name == "get_weather":
            jsonschema.validate(args, params)
    assert len(_calls(got["single"])) == 1
    assert got["auto"]["finish_reason"] in ("length", "stop", "tool_calls")


@pytest.mark.parametrize("mode", MODES)
def test_streamed_tool_call(results, mode) -> None:
    deltas = results[mode]["tools"]["streamed"]
    # vLLM streams a call as deltas of one index: the name first, then pieces of arguments
    pieces = [c for d in deltas for c in (d["delta"].get("tool_calls") or [])]
    assert {c["index"] for c in pieces} == {0}
    assert [c["function"]["name"] for c in pieces if c["function"].get("name")] == [
        "get_weather"]
    arguments = "".join(c["function"].get("arguments") or "" for c in pieces)
    jsonschema.validate(json.loads(arguments), WEATHER["function"]["parameters"])
    assert deltas[-1]["finish_reason"] == "stop"


def test_tool_calls_are_the_same_in_both_modes(results) -> None:
    for key in ("named", "required", "single", "auto"):
        assert _calls(results["disaggregated"]["tools"][key]) == _calls(
            results["colocated"]["tools"][key]), key


# ---- point 4: parameters, each checked in both modes and against the colocated engine --------


def _p(results, mode: str, key: str) -> Any:
    return results[mode]["params"][key]


def _text(body: dict[str, Any], i: int = 0) -> str:
    return body["choices"][i]["text"]


@pytest.mark.parametrize("mode", MODES)
def test_seed_is_reproducible(results, mode) -> None:
    assert _text(_p(results, mode, "seed")) == _text(_p(results, mode, "seed_again"))


@pytest.mark.parametrize("mode", MODES)
def test_n_choices_follow_vllm_seeding(results, mode) -> None:
    body = _p(results, mode, "n")
    assert [c["index"] for c in body["choices"]] == [0, 1, 2]
    assert _text(body, 1) == _text(_p(results, mode, "n_1"))
    assert body["usage"]["completion_tokens"] == 3 * 12


@pytest.mark.parametrize("mode", MODES)
def test_stop(results, mode) -> None:
    body, stop = _p(results, mode, "stop"), _p(results, mode, "stop_string")
    greedy = _text(_p(results, mode, "greedy"))
    assert body["choices"][0]["finish_reason"] == "stop"
    assert _text(body) == greedy[: greedy.index(stop)]


@pytest.mark.parametrize("mode", MODES)
def test_logprobs(results, mode) -> None:
    chat = _p(results, mode, "logprobs_chat")["choices"][0]["logprobs"]["content"]
    assert len(chat) == 8
    for entry in chat:  # greedy: the chosen token is the most likely one
        assert len(entry["top_logprobs"]) == 3
        assert entry["top_logprobs"][0]["logprob"] == pytest.approx(entry["logprob"])
    comp = _p(results, mode, "logprobs_completion")["choices"][0]["logprobs"]
    assert len(comp["tokens"]) == len(comp["token_logprobs"]) == 8
    assert all(len(top) <= 3 for top in comp["top_logprobs"])


@pytest.mark.parametrize("mode", MODES)
def test_logit_bias(results, mode) -> None:
    up = _p(results, mode, "bias_up")["choices"][0]["token_ids"]
    assert up == [_p(results, mode, "bias_token")] * 6
    down = _p(results, mode, "bias_down")["choices"][0]["token_ids"]
    assert down[0] != _p(results, mode, "greedy")["choices"][0]["token_ids"][0]


@pytest.mark.parametrize("mode", MODES)
def test_user_changes_nothing_and_max_completion_tokens_limits(results, mode) -> None:
    assert _text(_p(results, mode, "user")) == _text(_p(results, mode, "greedy"))
    body = _p(results, mode, "max_completion_tokens")
    assert body["usage"]["completion_tokens"] == 5
    assert body["choices"][0]["finish_reason"] == "length"


COMPARED = ("greedy", "seed", "n", "stop", "penalties", "bias_up", "bias_down", "user",
            "max_completion_tokens", "echo")


@pytest.mark.parametrize("key", COMPARED)
def test_disaggregated_equals_colocated(results, key) -> None:
    def essence(body: dict[str, Any]) -> list[Any]:
        return [(c.get("text") or c.get("message", {}).get("content"), c.get("token_ids"),
                 c["finish_reason"]) for c in body["choices"]]

    assert essence(_p(results, "disaggregated", key)) == essence(_p(results, "colocated", key))


def test_logprobs_equal_colocated(results) -> None:
    def values(mode: str) -> list[tuple[str, float]]:
        content = _p(results, mode, "logprobs_chat")["choices"][0]["logprobs"]["content"]
        return [(e["token"], e["logprob"]) for e in content]

    colocated, disaggregated = values("colocated"), values("disaggregated")
    assert [t for t, _ in disaggregated] == [t for t, _ in colocated]
    assert [lp for _, lp in disaggregated] == pytest.approx([lp for _, lp in colocated], abs=1e-3)
    comp = {m: _p(results, m, "logprobs_completion")["choices"][0]["logprobs"] for m in MODES}
    assert comp["disaggregated"]["tokens"] == comp["colocated"]["tokens"]
    assert comp["disaggregated"]["token_logprobs"] == pytest.approx(
        comp["colocated"]["token_logprobs"], abs=1e-3)
