"""From a request body to a worker's `GenerateRequest`: parse, check, tokenize, fit the context.

Pure (no Ray, no network): everything that can make a request invalid is checked here, before
any worker sees it, so that a bad request is a 4xx with an OpenAI error body and never reaches an
engine as something vLLM would refuse (a 500 after the fact). Used by the router's endpoints and,
with the same seeded malformed bodies, by the fuzz tests.
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass
from typing import Any

from splitserve.engine.messages import GenerateRequest, Sampling, StructuredOutput
from splitserve.router.errors import bad_request, model_not_found
from splitserve.router.prompts import PromptBuilder
from splitserve.router.protocol import (
    ChatCompletionRequest,
    CompletionRequest,
    NamedToolChoice,
    parse_request,
)
from splitserve.router.tools import ToolSpec, render_messages


@dataclass(frozen=True)
class Prepared:
    """A checked request: the parsed body and the worker request built from it.

    `n`: choices to generate (one worker request each, see `router/choices.py`); `tools`: how
    the output calls the request's tools (None without `tools`).
    """

    request: CompletionRequest | ChatCompletionRequest
    generate: GenerateRequest
    n: int = 1
    tools: ToolSpec | None = None


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
    req = parse_body(endpoint, body)
    if req.model != model_name:
        raise model_not_found(req.model)
    return prepare_request(endpoint, req, prompts)


def parse_body(endpoint: str, body: bytes) -> CompletionRequest | ChatCompletionRequest:
    """The request `body` of `endpoint` ("chat" or "completions") parsed and checked on its own
    (400 on a bad field); its `model` is for the caller to resolve."""
    return parse_request(body, ChatCompletionRequest if endpoint == "chat" else CompletionRequest)


def prepare_request(
    endpoint: str, req: CompletionRequest | ChatCompletionRequest, prompts: PromptBuilder
) -> Prepared:
    """`prepare` after the model is resolved: tokenize with the model's `prompts`, fit its
    context, build the worker request (raises `APIError`)."""
    tools = None
    if isinstance(req, ChatCompletionRequest):
        tools = tool_spec(req)
        ids = _encode_chat(req, tools, prompts)
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
            logprobs=req.top_logprobs_count(),
            logit_bias=logit_bias(req.logit_bias, prompts.vocab_size),
            structured=structured_output(req, tools),
        ),
        cache_salt=req.cache_salt,
    )
    return Prepared(req, generate, n=req.choices(), tools=tools)


def tool_spec(req: ChatCompletionRequest) -> ToolSpec | None:
    """The request's tools and tool choice (None without `tools`). OpenAI's default choice is
    "auto" when tools are given."""
    if not req.tools:
        return None
    for i, t in enumerate(req.tools):
        if t.function.parameters is not None:
            _checked_schema(t.function.parameters, f"tools[{i}].function.parameters")
    choice = req.tool_choice or "auto"
    named = choice.function.name if isinstance(choice, NamedToolChoice) else None
    return ToolSpec(
        functions=tuple(t.function.model_dump(exclude_none=True) for t in req.tools),
        mode="named" if named else choice,  # type: ignore[arg-type]
        named=named,
        parallel=req.parallel_tool_calls is not False,
    )


def _encode_chat(
    req: ChatCompletionRequest, tools: ToolSpec | None, prompts: PromptBuilder
) -> list[int]:
    messages: list[dict[str, Any]] = []
    for m in req.messages:
        message: dict[str, Any] = {"role": m.role, "content": m.text()}
        if m.tool_calls:
            message["tool_calls"] = [c.model_dump() for c in m.tool_calls]
        if m.tool_call_id is not None:
            message["tool_call_id"] = m.tool_call_id
        messages.append(message)
    if prompts.renders_tools:
        offered = [t.model_dump(exclude_none=True) for t in req.tools or ()] or None
        return prompts.encode_chat(messages, tools=offered)
    return prompts.encode_chat(render_messages(messages, tools))


def logit_bias(bias: dict[str, float] | None, vocab_size: int) -> tuple[tuple[int, float], ...]:
    """`logit_bias` as (token id, bias) pairs; a token id outside the vocabulary is a 400."""
    out = []
    for key, value in (bias or {}).items():
        token = int(key)
        if token >= vocab_size:
            raise bad_request(
                f"logit_bias names token id {token}, outside the vocabulary (0..{vocab_size - 1}).",
                param="logit_bias", code="invalid_value",
            )
        out.append((token, float(value)))
    return tuple(sorted(out))


def structured_output(
    req: CompletionRequest | ChatCompletionRequest, tools: ToolSpec | None
) -> StructuredOutput | None:
    """The one constraint on the request's output: `structured_outputs`, a JSON
    `response_format`, or a forced tool call (`protocol` already refused combinations)."""
    so = req.structured_outputs
    if so is not None:
        if so.json_ is not None:
            schema = so.json_
            if isinstance(schema, str):
                try:
                    schema = json.loads(schema)
                except ValueError as err:
                    raise bad_request(f"structured_outputs.json is not valid JSON: {err}",
                                      param="structured_outputs.json") from None
            return StructuredOutput(json=_checked_schema(schema, "structured_outputs.json"))
        if so.regex is not None:
            try:
                re.compile(so.regex)
            except re.error as err:
                raise bad_request(f"structured_outputs.regex is not a valid regex: {err}",
                                  param="structured_outputs.regex") from None
        return StructuredOutput(
            json_object=bool(so.json_object), regex=so.regex,
            choice=tuple(so.choice) if so.choice is not None else None, grammar=so.grammar,
        )
    rf = req.response_format
    if rf is not None and rf.type == "json_object":
        return StructuredOutput(json_object=True)
    if rf is not None and rf.type == "json_schema" and rf.json_schema is not None:
        schema = rf.json_schema.schema_
        if schema is None:  # a schema-less json_schema format: any JSON object
            return StructuredOutput(json_object=True)
        return StructuredOutput(json=_checked_schema(schema, "response_format.json_schema"))
    return tools.constraint() if tools is not None else None


def _checked_schema(schema: Any, param: str) -> str:
    """The schema serialized, after checking that it is a JSON schema at all (the engine's
    grammar compiler may still refuse features it does not support)."""
    from jsonschema import SchemaError
    from jsonschema.validators import validator_for

    if not isinstance(schema, dict):
        raise bad_request(f"{param} must be a JSON schema object.", param=param)
    try:
        validator_for(schema).check_schema(schema)
    except SchemaError as err:
        raise bad_request(f"{param} is not a valid JSON schema: {err.message}",
                          param=param, code="invalid_value") from None
    return json.dumps(schema)
