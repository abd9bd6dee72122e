"""Fuzz of request preparation (no Ray, no engine): every malformed request is an `APIError` with
an OpenAI error body, never another exception, and every accepted one passes vLLM's own checks of
its sampling parameters. The same seeded cases go through the real HTTP API in
tests/e2e/test_fuzz.py (seed 42)."""

from __future__ import annotations

import pytest

from splitserve.models import resolve_model_path
from splitserve.router.errors import APIError
from splitserve.router.prompts import PromptBuilder
from splitserve.router.prepare import prepare
from splitserve.router.protocol import CompletionRequest, parse_request
from tests.fuzz_requests import MODEL, cases

MAX_BODY = 1 << 20


@pytest.fixture(scope="module")
def prompts() -> PromptBuilder:
    return PromptBuilder(resolve_model_path(None), 2048)


def _prepare(path: str, body: bytes, prompts: PromptBuilder) -> None:
    """What the router does with a body before any worker sees it, then vLLM's own checks of the
    sampling parameters: an accepted request must be one that the engine accepts too."""
    from splitserve.engine.host import to_sampling_params

    endpoint = "chat" if path.endswith("chat/completions") else "completions"
    prepared = prepare(endpoint, body, prompts, model_name=MODEL)
    to_sampling_params(prepared.generate.sampling)


@pytest.mark.parametrize("seed", [0, 1, 2, 42])
def test_malformed_requests_only_raise_api_errors(seed, prompts):
    outcomes = {"ok": 0, "error": 0}
    for path, _, body in cases(seed, 1000, max_body=MAX_BODY):
        if len(body) > MAX_BODY:
            continue  # 413 before parsing (tested over HTTP)
        try:
            _prepare(path, body, prompts)
            outcomes["ok"] += 1
        except APIError as err:
            assert 400 <= err.status < 500, (err.status, body[:200])
            error = err.body()["error"]
            assert set(error) == {"message", "type", "param", "code"} and error["message"]
            outcomes["error"] += 1
    assert outcomes["ok"] > 10 and outcomes["error"] > 500, outcomes


@pytest.mark.parametrize(
    "body",
    [b"[" * 100_000, b'{"a":' * 50_000, b'{"model": NaN}', b'{"max_tokens": Infinity}',
     b"\xff\xfe", b"\xef\xbb\xbf{}"],
)
def test_pathological_json_is_a_400(body):
    with pytest.raises(APIError) as info:
        parse_request(body, CompletionRequest)
    assert info.value.status == 400


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"max_tokens": 2, "min_tokens": 3}, "min_tokens"),  # vLLM refuses min > max
        ({"min_tokens": 5000}, "min_tokens"),  # over what fits when max_tokens is absent
        ({"max_tokens": 2, "seed": 2**63}, "seed"),  # not a torch.long
        ({"max_tokens": 2, "seed": -(2**63) - 1}, "seed"),
    ],
)
def test_values_the_engine_would_refuse_are_a_400_naming_the_parameter(extra, param, prompts):
    import json

    body = json.dumps({"model": MODEL, "prompt": "hi", **extra}).encode()
    with pytest.raises(APIError) as info:
        prepare("completions", body, prompts, model_name=MODEL)
    assert (info.value.status, info.value.param) == (400, param)
