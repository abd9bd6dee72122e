"""From a request body to a worker's `GenerateRequest`: parse, check, tokenize, fit the context.

Pure (no Ray, no network): everything that can make a request invalid is checked here, before
any worker sees it, so that a bad request is a 4xx with an OpenAI error body and never reaches an
engine as something vLLM would refuse (a 500 after the fact). Used by the router's endpoints and,
with the same seeded malformed bodies, by the fuzz tests.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass

from splitserve.engine.messages import GenerateRequest, Sampling
from splitserve.router.errors import bad_request, model_not_found
from splitserve.router.prompts import PromptBuilder
from splitserve.router.protocol import ChatCompletionRequest, CompletionRequest, parse_request


@dataclass(frozen=True)
class Prepared:
    """A checked request: the parsed body and the worker request built from it."""

    request: CompletionRequest | ChatCompletionRequest
    generate: GenerateRequest


def prepare(
    endpoint: str,
    body: bytes,
    prompts: PromptBuilder,
    *,
    model_name: str,
) -> Prepared:
    """Parse and check `body` for `endpoint` ("chat" or "completions"); raises `APIError`.

    The worker request's `cache_salt` is the client's own (`cache_salt` field, or None); the
    router replaces it with the tenant-scoped salt.
    """
    model = ChatCompletionRequest if endpoint == "chat" else CompletionRequest
    req = parse_request(body, model)
    if req.model != model_name:
        raise model_not_found(req.model)
    if isinstance(req, ChatCompletionRequest):
        ids = prompts.encode_chat([{"role": m.role, "content": m.text()} for m in req.messages])
        fitted = prompts.fit(ids, req.output_limit(), param="messages")
    else:
        ids = prompts.encode_completion(req.prompt)
        fitted = prompts.fit(ids, req.max_tokens, param="prompt")
    if req.min_tokens > fitted.max_tokens:
        raise bad_request(
            f"min_tokens ({req.min_tokens}) must not exceed the output limit "
            f"({fitted.max_tokens} tokens)",
            param="min_tokens",
        )
    generate = GenerateRequest(
        request_id=f"{'chatcmpl' if endpoint == 'chat' else 'cmpl'}-{uuid.uuid4().hex}",
        prompt_token_ids=fitted.token_ids,
        sampling=Sampling(
            max_tokens=fitted.max_tokens,
            temperature=req.temperature,
            top_p=req.top_p,
            top_k=req.top_k,
            seed=req.seed,
            stop=req.stops(),
            presence_penalty=req.presence_penalty,
            frequency_penalty=req.frequency_penalty,
            min_tokens=req.min_tokens,
            ignore_eos=req.ignore_eos,
        ),
        cache_salt=req.cache_salt,
    )
    return Prepared(req, generate)
