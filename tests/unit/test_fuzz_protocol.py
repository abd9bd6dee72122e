"""Fuzz of request parsing and prompt building (no Ray, no engine): every malformed request is
an `APIError` with an OpenAI error body, never another exception. The same seeded cases go
through the real HTTP API in tests/e2e/test_fuzz.py."""

from __future__ import annotations

import pytest

from splitserve.models import resolve_model_path
from splitserve.router.errors import APIError
from splitserve.router.prompts import PromptBuilder
from splitserve.router.protocol import ChatCompletionRequest, CompletionRequest, parse_request
from tests.fuzz_requests import cases

MAX_BODY = 1 << 20


@pytest.fixture(scope="module")
def prompts() -> PromptBuilder:
    return PromptBuilder(resolve_model_path(None), 2048)


def _prepare(path: str, body: bytes, prompts: PromptBuilder) -> None:
    """What the router does with a body before any worker sees it."""
    model = ChatCompletionRequest if path.endswith("chat/completions") else CompletionRequest
    req = parse_request(body, model)
    if isinstance(req, ChatCompletionRequest):
        ids = prompts.encode_chat([{"role": m.role, "content": m.text()} for m in req.messages])
        prompts.fit(ids, req.output_limit(), param="messages")
    else:
        prompts.fit(prompts.encode_completion(req.prompt), req.max_tokens, param="prompt")
    req.stops()


@pytest.mark.parametrize("seed", [0, 1, 2])
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
