"""Request models for the OpenAI endpoints, and their validation into typed errors.

The models follow the public OpenAI spec (`/completions`, `/chat/completions`). Unknown fields
are rejected as OpenAI rejects them; fields of the spec that splitserve does not implement yet are
accepted only at their default value, otherwise the request gets a 400 naming the parameter (never
silently ignored). `top_k`, `min_tokens`, `ignore_eos`, `return_token_ids`, `cache_salt` and
`structured_outputs` are vLLM extensions (`extra_body`); so is `response_format` on completions.
"""

from __future__ import annotations

import json
from typing import Any, Literal, TypeVar

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from splitserve.router.errors import APIError, bad_request

# Spec fields accepted only at these values (None: absent). Issue-tracked work adds support.
_UNSUPPORTED_DEFAULTS: dict[str, Any] = {
    "best_of": 1,
    "echo": False,
    "suffix": None,
    "functions": None,
    "function_call": None,
    "audio": None,
    "modalities": None,
    "prediction": None,
    "web_search_options": None,
    "reasoning_effort": None,
    "verbosity": None,
    "moderation": None,
    "prompt_cache_options": None,
    "prompt_cache_retention": None,
}


class StreamOptions(BaseModel):
    """`stream_options`: only `include_usage` is defined."""

    model_config = ConfigDict(extra="forbid")
    include_usage: bool = False
    include_obfuscation: bool | None = None


# Each choice of `n` is an engine request of its own (fanned out by the router).
MAX_N = 16
MAX_LOGIT_BIAS = 300  # entries; OpenAI's own limit


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class JSONSchemaFormat(_Strict):
    """`response_format.json_schema`: a named JSON schema the output must match."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)
    name: str = Field(max_length=64, pattern=r"^[A-Za-z0-9_-]+$")
    description: str | None = None
    schema_: dict[str, Any] | None = Field(None, alias="schema")
    strict: bool | None = None


class ResponseFormat(_Strict):
    """`response_format`: plain text, any JSON object, or JSON matching a schema."""

    type: Literal["text", "json_object", "json_schema"]
    json_schema: JSONSchemaFormat | None = None

    @model_validator(mode="after")
    def _schema_given(self) -> ResponseFormat:
        if self.type == "json_schema" and self.json_schema is None:
            raise ValueError("'json_schema' is required when type is 'json_schema'")
        return self


class StructuredOutputs(_Strict):
    """`structured_outputs` (vLLM extension): exactly one constraint on the output."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)
    json_: dict[str, Any] | str | None = Field(None, alias="json")
    json_object: Literal[True] | None = None
    regex: str | None = Field(None, min_length=1)
    choice: list[str] | None = Field(None, min_length=1, max_length=256)
    grammar: str | None = Field(None, min_length=1)

    @model_validator(mode="after")
    def _exactly_one(self) -> StructuredOutputs:
        given = [k for k in ("json_", "json_object", "regex", "choice", "grammar")
                 if getattr(self, k) is not None]
        if len(given) != 1:
            raise ValueError("exactly one of json, json_object, regex, choice, grammar is required")
        return self


class FunctionDefinition(_Strict):
    """A function the model may call."""

    name: str = Field(pattern=r"^[A-Za-z0-9_-]{1,64}$")
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class Tool(_Strict):
    """One entry of `tools` (only function tools)."""

    type: Literal["function"]
    function: FunctionDefinition


class _FunctionName(_Strict):
    name: str


class NamedToolChoice(_Strict):
    """`tool_choice` forcing one function."""

    type: Literal["function"]
    function: _FunctionName


class _CalledFunction(_Strict):
    name: str
    arguments: str


class ToolCall(_Strict):
    """A call in an earlier assistant message."""

    id: str
    type: Literal["function"]
    function: _CalledFunction


class _Common(BaseModel):
    """Sampling and streaming fields shared by both endpoints."""

    model_config = ConfigDict(extra="forbid")

    model: str
    stream: bool = False
    stream_options: StreamOptions | None = None
    temperature: float = Field(1.0, ge=0.0, le=2.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    seed: int | None = Field(None, ge=-(2**63), le=2**63 - 1)  # a torch.long, as in vLLM
    stop: str | list[str] | None = None
    presence_penalty: float = Field(0.0, ge=-2.0, le=2.0)
    frequency_penalty: float = Field(0.0, ge=-2.0, le=2.0)
    user: str | None = None
    # vLLM extensions
    top_k: int = Field(0, ge=-1)
    min_tokens: int = Field(0, ge=0)
    ignore_eos: bool = False
    return_token_ids: bool = False
    cache_salt: str | None = Field(None, max_length=256)  # namespaced under the tenant
    structured_outputs: StructuredOutputs | None = None
    response_format: ResponseFormat | None = None
    n: int | None = Field(1, ge=1, le=MAX_N)
    logit_bias: dict[str, float] | None = Field(None, max_length=MAX_LOGIT_BIAS)

    @field_validator("logit_bias")
    @classmethod
    def _bias_entries(cls, v: dict[str, float] | None) -> dict[str, float] | None:
        for key, bias in (v or {}).items():
            if not key.isdigit():
                raise ValueError(f"keys must be token ids, got {key!r}")
            if not -100 <= bias <= 100:
                raise ValueError(f"biases must be between -100 and 100, got {bias}")
        return v

    @field_validator("stop")
    @classmethod
    def _stop_limits(cls, v: str | list[str] | None) -> str | list[str] | None:
        stops = [v] if isinstance(v, str) else (v or [])
        if len(stops) > 4:
            raise ValueError("at most 4 stop sequences are allowed")
        if any(s == "" for s in stops):
            raise ValueError("stop sequences must not be empty")
        return v

    def choices(self) -> int:
        """How many choices (`n`; null means 1)."""
        return self.n or 1

    def stops(self) -> tuple[str, ...]:
        """Stop sequences as a tuple."""
        if self.stop is None:
            return ()
        return (self.stop,) if isinstance(self.stop, str) else tuple(self.stop)

    @property
    def include_usage(self) -> bool:
        """Whether a streamed response ends with a usage chunk."""
        return bool(self.stream_options and self.stream_options.include_usage)


class CompletionRequest(_Common):
    """POST /v1/completions."""

    prompt: str | list[int] | list[str] | list[list[int]]
    max_tokens: int | None = Field(16, ge=1)
    echo: bool | None = False
    suffix: str | None = None
    best_of: int | None = Field(1, ge=1)
    logprobs: int | None = Field(None, ge=0, le=5)

    def top_logprobs_count(self) -> int | None:
        """Alternatives per token to return (None: no logprobs)."""
        return self.logprobs


class ChatMessage(BaseModel):
    """One chat message; content may be a string or a list of text parts."""

    model_config = ConfigDict(extra="allow")
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[dict[str, Any]] | None = None
    name: str | None = None
    tool_calls: list[ToolCall] | None = None
    tool_call_id: str | None = None

    def text(self) -> str:
        """The message content as one string (text parts joined)."""
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        parts = []
        for part in self.content:
            if part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise bad_request(
                    f"content part of type {part.get('type')!r} is not supported; only 'text'",
                    param="messages",
                )
            parts.append(part["text"])
        return "".join(parts)


class ChatCompletionRequest(_Common):
    """POST /v1/chat/completions."""

    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    logprobs: bool | None = False
    top_logprobs: int | None = Field(None, ge=0, le=20)
    tools: list[Tool] | None = Field(None, max_length=128)
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    functions: Any = None
    function_call: Any = None
    parallel_tool_calls: bool | None = None
    audio: Any = None
    modalities: list[str] | None = None
    prediction: Any = None
    web_search_options: Any = None
    reasoning_effort: Any = None
    verbosity: Any = None
    moderation: Any = None
    metadata: dict[str, str] | None = None
    store: bool | None = None
    service_tier: str | None = None
    safety_identifier: str | None = None
    prompt_cache_key: str | None = None
    prompt_cache_options: Any = None
    prompt_cache_retention: Any = None

    def output_limit(self) -> int | None:
        """`max_completion_tokens` wins over the deprecated `max_tokens`."""
        return self.max_completion_tokens or self.max_tokens

    def top_logprobs_count(self) -> int | None:
        """Alternatives per token to return (None: no logprobs)."""
        return (self.top_logprobs or 0) if self.logprobs else None


def _check_supported(req: BaseModel) -> None:
    for name, default in _UNSUPPORTED_DEFAULTS.items():
        if name not in type(req).model_fields:
            continue
        value = getattr(req, name)
        if value is None or value == default:
            continue
        if name == "modalities" and value == ["text"]:
            continue
        raise bad_request(
            f"Parameter '{name}' is not supported by this server (value {value!r}).",
            param=name,
            code="unsupported_parameter",
        )


def _param_name(loc: tuple[Any, ...]) -> str | None:
    """`messages[0].content` from a pydantic location, without union-member names like `str`."""
    fields = {
        name
        for m in (CompletionRequest, ChatCompletionRequest, ChatMessage, StreamOptions,
                  ResponseFormat, JSONSchemaFormat, StructuredOutputs, Tool, FunctionDefinition,
                  NamedToolChoice, ToolCall)
        for name in m.model_fields
    }
    out = ""
    for i, part in enumerate(loc):
        if isinstance(part, int):
            out += f"[{part}]"
        elif i == 0 or part in fields:
            out += f".{part}" if out else str(part)
    return out or None


def _validation_error(err: ValidationError) -> APIError:
    first = err.errors()[0]
    param = _param_name(first["loc"])
    if first["type"] == "extra_forbidden":
        return bad_request(f"Unrecognized request argument supplied: {param}", param=param)
    if first["type"] == "missing":
        return bad_request(f"Missing required parameter: '{param}'.", param=param)
    return bad_request(
        f"Invalid value for '{param}': {first['msg']}.", param=param, code="invalid_value"
    )


T = TypeVar("T", bound=BaseModel)


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON value")


def parse_request(body: bytes, model: type[T]) -> T:
    """Decode and validate a request body, raising an `APIError` (400) on any problem."""
    try:
        data = json.loads(body, parse_constant=_no_constant)
    except RecursionError:  # deeply nested arrays or objects
        raise bad_request("The request body is nested too deeply.") from None
    except ValueError as err:  # JSONDecodeError, UnicodeDecodeError, NaN/Infinity
        raise bad_request(f"The request body is not valid JSON: {err}") from None
    if not isinstance(data, dict):
        raise bad_request("The request body must be a JSON object.")
    try:
        req = model.model_validate(data)
    except ValidationError as err:
        raise _validation_error(err) from None
    _check_supported(req)
    _check_combinations(req)
    return req


def _check_combinations(req: CompletionRequest | ChatCompletionRequest) -> None:
    """Cross-field rules OpenAI enforces (and one output constraint at a time)."""
    constrained = [
        name for name, on in (
            ("response_format", req.response_format is not None
             and req.response_format.type != "text"),
            ("structured_outputs", req.structured_outputs is not None),
        ) if on
    ]
    if not isinstance(req, ChatCompletionRequest):
        if len(constrained) > 1:
            raise _conflict(constrained[1], constrained[0])
        return
    if req.top_logprobs is not None and not req.logprobs:
        raise bad_request("'top_logprobs' requires 'logprobs' to be true.", param="top_logprobs")
    choice = req.tool_choice
    if choice is not None and not req.tools:
        raise bad_request("'tool_choice' is only allowed when 'tools' are specified.",
                          param="tool_choice")
    if isinstance(choice, NamedToolChoice):
        names = {t.function.name for t in req.tools or ()}
        if choice.function.name not in names:
            raise bad_request(f"tool_choice names function {choice.function.name!r}, which is "
                              "not in 'tools'.", param="tool_choice")
    if req.tools and (choice == "required" or isinstance(choice, NamedToolChoice)):
        constrained.append("tool_choice")
    if len(constrained) > 1:
        raise _conflict(constrained[1], constrained[0])


def _conflict(param: str, other: str) -> APIError:
    return bad_request(
        f"'{param}' cannot be combined with '{other}': the output can follow one constraint.",
        param=param, code="invalid_value",
    )
