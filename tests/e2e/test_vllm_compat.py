"""splitserve as a drop-in for a vLLM server: every request parameter of vLLM's own request
models, sent to a plain vLLM OpenAI server on the same model and to splitserve in both modes.

The parameters are enumerated from vLLM's pydantic models (`CompletionRequest`,
`ChatCompletionRequest`), so a parameter a vLLM upgrade adds is sent without a code change: its
value comes from `VALUES` when the table has one, else from its type. For each: the same HTTP
status, and for 200 the same output (text, token ids, logprobs, finish reason, usage) as the
plain server, greedy or seeded. The plain server runs the tiny model as splitserve's engines do
(float32, one compute thread, the same structured-output settings), or its tokens would differ.

Also here: vLLM's own benchmark client against the disaggregated deployment (every request
completes), and `/tokenize` then `/detokenize` as on vLLM.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import time
import types
import typing
from typing import Any

import httpx
import pytest

from splitserve.engine.args import STRUCTURED_OUTPUTS, TINY_TOOL_CALL_PARSER
from splitserve.models import build_tiny_model
from tests.conftest import disagg_reasons, free_port, shared_deployment, test_config

pytestmark = pytest.mark.engine

MODEL = "splitserve-tiny"
THRESHOLD = 128  # test_disaggregated's: prompts this long or longer prefill remotely
# test_disaggregated's config (the deployment is shared): every long prompt takes the remote path
DISAGGREGATED = {
    "mode": "disaggregated",
    "disaggregation.min_remote_prompt_tokens": THRESHOLD,
    "disaggregation.prefill": "remote",  # the remote path, whatever the rule predicts
}
MODES = {"disaggregated": DISAGGREGATED, "colocated": {"mode": "colocated"}}

PROMPT = "The quick brown fox jumps over the lazy dog, and then the dog " * 12 + "Next:"
TOOL = {"type": "function", "function": {
    "name": "lookup", "description": "Look a word up.",
    "parameters": {"type": "object", "properties": {"word": {"type": "string"}},
                   "required": ["word"]}}}

# Not sent: the request's own body, and what is not JSON (prompt embeddings are bytes).
BODY_FIELDS = {"model", "prompt", "messages", "stream", "stream_options", "prompt_embeds"}
# Deliberate differences (README, "vLLM compatibility"): the router sets these itself. A client's
# KV or encoder-cache transfer parameters are dropped (they would read other requests' blocks);
# `request_id` and `cache_salt` are replaced (the router's id; the tenant-scoped salt). The
# request is still answered, with the same output.
ROUTER_FIELDS = {"kv_transfer_params", "ec_transfer_params", "request_id", "cache_salt"}
assert ROUTER_FIELDS.isdisjoint(BODY_FIELDS)  # sent, and compared like any other

# A meaningful value per known parameter (anything else: `_value_for` its type).
VALUES: dict[str, Any] = {
    "echo": True, "frequency_penalty": 0.8, "presence_penalty": 0.8, "logit_bias": {"300": 8},
    "max_tokens": 5, "max_completion_tokens": 5, "n": 2, "best_of": 2, "seed": 11,
    "stop": ["e"], "suffix": "tail", "temperature": 0.8, "top_p": 0.5, "top_k": 3, "min_p": 0.3,
    "user": "someone", "use_beam_search": True, "repetition_penalty": 1.4, "length_penalty": 0.7,
    "stop_token_ids": [300], "include_stop_str_in_output": True, "ignore_eos": True,
    "min_tokens": 6, "skip_special_tokens": False, "spaces_between_special_tokens": False,
    "truncate_prompt_tokens": 40, "truncation_side": "left", "allowed_token_ids": [300, 301, 302],
    "prompt_logprobs": 1, "logprob_token_ids": [300, 301], "bad_words": ["the"],
    "add_special_tokens": False, "response_format": {"type": "json_object"},
    "structured_outputs": {"regex": "[a-z]{4}"}, "priority": 1, "session_id": "s-1",
    "return_tokens_as_token_ids": True, "return_token_ids": True, "return_token_offsets": True,
    "return_prompt_text": True, "vllm_xargs": {"k": 1}, "thinking_token_budget": 4,
    "stream_interval": 2, "watermarking": True,
    "tools": [TOOL], "tool_choice": "required", "parallel_tool_calls": False,
    "reasoning_effort": "low", "include_reasoning": False,
    "add_generation_prompt": False, "continue_final_message": True,
    "documents": [{"title": "doc", "text": "some text"}],
    "chat_template": "{{ messages[0]['content'] }}", "chat_template_kwargs": {"flag": True},
    "mm_processor_kwargs": {}, "media_io_kwargs": {}, "mm_payload": "none",
    "return_mm_kwargs": True, "routed_experts_prompt_start": 1,
    "repetition_detection": {"max_pattern_size": 4, "min_count": 3},
}
# Parameters that only mean something with another one.
WITH: dict[str, dict[str, Any]] = {
    "include_stop_str_in_output": {"stop": ["e"]},
    "return_tokens_as_token_ids": {"logprobs": 2},
    "top_logprobs": {"logprobs": True},
    "temperature": {"seed": 5}, "top_p": {"temperature": 1.0, "seed": 5},
    "top_k": {"temperature": 1.0, "seed": 5}, "min_p": {"temperature": 1.0, "seed": 5},
    "n": {"temperature": 1.0, "seed": 5}, "best_of": {"temperature": 1.0, "seed": 5},
    "use_beam_search": {"n": 2},
}


def _value_for(field: Any) -> Any:
    """A non-default value of `field`'s type (a parameter with no entry in `VALUES`)."""
    kinds = [a for a in typing.get_args(field.annotation) or (field.annotation,)
             if a is not types.NoneType]
    kind = typing.get_origin(kinds[0]) or kinds[0] if kinds else None
    if kind is bool:
        return not bool(field.default)
    if kind is int:
        return 2 if field.default in (None, 0, 1) else field.default + 1
    if kind is float:
        return 0.5
    if kind is str:
        return "x"
    if kind in (list, tuple):
        return []
    if kind is dict:
        return {}
    if kind is typing.Literal:
        options = typing.get_args(kinds[0])
        return next((o for o in options if o != field.default), options[0])
    return None


def _parameters(model: Any) -> list[tuple[str, Any]]:
    """(name, value) for every request field of vLLM's request `model` that a client sends."""
    out = []
    for name, field in model.model_fields.items():
        if name in BODY_FIELDS:
            continue
        value = VALUES[name] if name in VALUES else _value_for(field)
        if value is not None:
            out.append((name, value))
    return out


def _requests() -> list[tuple[str, str, dict[str, Any]]]:
    """(endpoint, parameter, body): one request per parameter, on both endpoints."""
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
    from vllm.entrypoints.openai.completion.protocol import CompletionRequest

    base = {"completions": {"model": MODEL, "prompt": PROMPT, "max_tokens": 8, "temperature": 0},
            "chat": {"model": MODEL, "max_tokens": 8, "temperature": 0,
                     "messages": [{"role": "user", "content": PROMPT}]}}
    out = []
    for endpoint, model in (("completions", CompletionRequest), ("chat", ChatCompletionRequest)):
        for name, value in _parameters(model):
            body = {**base[endpoint], **WITH.get(name, {}), name: value}
            out.append((endpoint, name, body))
    return out


PATHS = {"completions": "/v1/completions", "chat": "/v1/chat/completions"}
# Not compared: ids and timestamps, and the cached prompt tokens (a remote prefill's tokens
# arrive over NIXL, which vLLM counts as cached; a plain server computed or cached them itself).
VOLATILE = {"id", "created", "system_fingerprint", "prompt_tokens_details"}


def _normalized(body: Any) -> Any:
    """A response body without what differs between two servers by design (ids, timestamps),
    floats rounded (the same engine, but logprobs summed in another order may differ last bit)."""
    if isinstance(body, dict):
        return {k: _normalized(v) for k, v in body.items() if k not in VOLATILE}
    if isinstance(body, list):
        return [_normalized(v) for v in body]
    if isinstance(body, float):
        return round(body, 3)
    return body


def _collect(base: str) -> dict[tuple[str, str], tuple[int, Any]]:
    out = {}
    with httpx.Client(base_url=base, timeout=120) as http:
        for endpoint, name, body in _requests():
            r = http.post(PATHS[endpoint], json=body)
            try:
                payload = r.json()
            except ValueError:
                payload = r.text
            out[(endpoint, name)] = (r.status_code, _normalized(payload))
    return out


@contextlib.contextmanager
def plain_vllm_server() -> typing.Iterator[str]:
    """vLLM's own OpenAI server on the tiny model, as splitserve runs it: float32, one core,
    the engines' structured-output settings and tool-call parser, the tiny model's served name,
    cached prompt tokens reported in `usage`."""
    port = free_port()
    env = {**os.environ, "VLLM_CPU_OMP_THREADS_BIND": "0", "VLLM_CPU_KVCACHE_SPACE": "1"}
    cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server",
           "--model", str(build_tiny_model()), "--served-model-name", MODEL,
           "--host", "127.0.0.1", "--port", str(port), "--dtype", "float32",
           "--max-model-len", "2048", "--enforce-eager", "--seed", "0",
           "--enable-prompt-tokens-details",
           "--tool-call-parser", TINY_TOOL_CALL_PARSER, "--enable-auto-tool-choice",
           "--structured-outputs-config", json.dumps(STRUCTURED_OUTPUTS)]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            assert proc.poll() is None, "the plain vLLM server exited at start"
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{base}/health", timeout=5).status_code == 200:
                    break
            time.sleep(1)
        else:
            pytest.fail("the plain vLLM server did not start")
        yield base
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()


@pytest.fixture(scope="module")
def reference() -> dict[tuple[str, str], tuple[int, Any]]:
    with plain_vllm_server() as base:
        return _collect(base)


@pytest.fixture(scope="module")
def answers(reference) -> dict[str, dict[tuple[str, str], tuple[int, Any]]]:
    """splitserve's answers per mode (the disaggregated deployment first: it is
    test_disaggregated's, still up), and the disaggregation decisions they took."""
    out = {}
    for mode, overrides in MODES.items():
        with shared_deployment(test_config(**overrides)) as base:
            before = disagg_reasons(base)
            out[mode] = _collect(base)
            after = disagg_reasons(base)
            out[mode]["reasons"] = {k: v - before.get(k, 0) for k, v in after.items()
                                    if v != before.get(k, 0)}  # the deployment is shared
            if mode == "disaggregated":
                out[mode]["bench"] = _bench(base)
                out[mode]["tokens"] = _tokenize_round_trip(base)
    return out


def test_the_prompt_is_long_enough_to_prefill_remotely() -> None:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(build_tiny_model())
    assert len(tok(PROMPT)["input_ids"]) >= THRESHOLD


def test_every_vllm_parameter_is_enumerated(reference) -> None:
    # the newer parameters the issue names are among them (a vLLM upgrade adds more)
    sent = {name for _, name in reference}
    assert {"min_p", "repetition_penalty", "length_penalty", "stop_token_ids",
            "truncate_prompt_tokens", "prompt_logprobs", "allowed_token_ids", "bad_words",
            "echo", "priority", "chat_template_kwargs", "continue_final_message"} <= sent
    assert len(reference) >= 100
    # and most of them are accepted by vLLM itself: the comparison is not only of refusals
    assert sum(status == 200 for status, _ in reference.values()) >= 60


@pytest.mark.parametrize("mode", list(MODES))
def test_every_parameter_answers_as_the_plain_vllm_server(reference, answers, mode) -> None:
    got = answers[mode]
    differ = []
    for key, (status, body) in reference.items():
        if got[key] != (status, body):
            differ.append((key, (status, str(body)[:300]), (got[key][0], str(got[key][1])[:300])))
    assert not differ, "\n".join(map(str, differ))


def test_disaggregated_requests_took_the_remote_path(answers) -> None:
    reasons = answers["disaggregated"]["reasons"]
    # every request of one prompt prefilled remotely (n > 1 too: one pull, then the samples);
    # beam search and prompt logprobs run whole on one engine
    assert reasons.get("remote", 0) >= 80, reasons
    assert reasons.get("multi_sequence", 0) >= 2, reasons
    assert set(reasons) <= {"remote", "multi_sequence"}, reasons


def _bench(base: str) -> dict[str, dict[str, Any]]:
    """vLLM's benchmark client (`vllm bench serve`), both OpenAI backends, random prompts."""
    from vllm.benchmarks.serve import add_cli_args, main

    out = {}
    for backend, endpoint in (("openai", "/v1/completions"),
                              ("openai-chat", "/v1/chat/completions")):
        parser = argparse.ArgumentParser()
        add_cli_args(parser)
        args = parser.parse_args([
            "--backend", backend, "--base-url", base, "--endpoint", endpoint,
            "--model", MODEL, "--tokenizer", str(build_tiny_model()),
            "--dataset-name", "random", "--random-input-len", "200", "--random-output-len", "12",
            "--num-prompts", "24", "--max-concurrency", "8", "--seed", "1",
            "--disable-tqdm", "--ignore-eos",
        ])
        out[backend] = main(args)
    return out


@pytest.mark.parametrize("backend", ["openai", "openai-chat"])
def test_vllm_bench_client_completes_every_request(answers, backend) -> None:
    result = answers["disaggregated"]["bench"][backend]
    assert (result["completed"], result["failed"]) == (24, 0)
    assert result["total_output_tokens"] == 24 * 12


def _tokenize_round_trip(base: str) -> dict[str, Any]:
    text = "Hello there, tokenizer! 123"
    with httpx.Client(base_url=base, timeout=60) as http:
        tokens = http.post("/tokenize", json={"model": MODEL, "prompt": text,
                                              "add_special_tokens": False}).json()
        back = http.post("/detokenize", json={"model": MODEL, "tokens": tokens["tokens"]}).json()
        version = http.get("/version").json()
        models = http.get("/v1/models").json()
    return {"text": text, "tokens": tokens, "back": back, "version": version, "models": models}


def test_tokenize_then_detokenize_round_trips(answers) -> None:
    import vllm

    got = answers["disaggregated"]["tokens"]
    assert got["back"]["prompt"] == got["text"]
    assert got["tokens"]["count"] == len(got["tokens"]["tokens"]) > 0
    assert got["tokens"]["max_model_len"] == 2048
    assert got["version"] == {"version": vllm.__version__}
    (card,) = [m for m in got["models"]["data"] if m["id"] == MODEL]
    assert card["max_model_len"] == 2048
