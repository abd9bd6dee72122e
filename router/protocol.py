"""Request models for the OpenAI endpoints, and their validation into typed errors.

The models follow the public OpenAI spec (`/completions`, `/chat/completions`). Unknown fields
are rejected as OpenAI rejects them; fields of the spec that splitserve does not implement yet are
accepted only at their default value, otherwise the request gets a 400 naming the parameter (never
silently ignored). `top_k`, `min_tokens` and `ignore_eos` are vLLM extensions (`extra_body`).
"""

from __future__ import annotations

import json
from typing import Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from splitserve.router.errors import APIError, bad_request

# Spec fields accepted only at these values (None: absent). Issue-tracked work adds support.
_UNSUPPORTED_DEFAULTS: dict[str, Any] = {
    "n": 1,
    "best_of": 1,
    "echo": False,
    "suffix": None,
    "logprobs": None,
    "top_logprobs": None,
    "logit_bias": None,
    "tools": None,
    "tool_choice": None,
    "functions": None,
    "function_call": None,
    "response_format": None,
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
    # spec fields supported only at their defaults (see _UNSUPPORTED_DEFAULTS)
    n: int | None = Field(1, ge=1, le=128)
    logprobs: Any = None
    logit_bias: Any = None

    @field_validator("stop")
    @classmethod
    def _stop_limits(cls, v: str | list[str] | None) -> str | list[str] | None:
        stops = [v] if isinstance(v, str) else (v or [])
        if len(stops) > 4:
            raise ValueError("at most 4 stop sequences are allowed")
        if any(s == "" for s in stops):
            raise ValueError("stop sequences must not be empty")
        return v

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


class ChatMessage(BaseModel):
    """One chat message; content may be a string or a list of text parts."""

    model_config = ConfigDict(extra="allow")
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[dict[str, Any]] | None = None
    name: str | None = None

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
    top_logprobs: int | None = None
    tools: Any = None
    tool_choice: Any = None
    functions: Any = None
    function_call: Any = None
    parallel_tool_calls: bool | None = None
    response_format: Any = None
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


def _check_supported(req: BaseModel) -> None:
    for name, default in _UNSUPPORTED_DEFAULTS.items():
        if name not in type(req).model_fields:
            continue
        value = getattr(req, name)
        if value is None or value == default:
            continue
        if name == "response_format" and value == {"type": "text"}:
            continue
        if (name == "logprobs" and value is False) or (name == "logit_bias" and value == {}):
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
        for m in (CompletionRequest, ChatCompletionRequest, ChatMessage, StreamOptions)
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
    return req
