"""Render worker chunks as OpenAI response bodies: whole objects or SSE chunks.

One `Renderer` per request. `kind` is "completion" or "chat"; the two differ in object names,
where the text goes (`text` vs `message`/`delta`) and the shape of `logprobs`. A request with `n`
choices renders one choice per index (chunks carry their choice's index). With tools (chat), a
choice's text is parsed into `tool_calls` when it is complete: a streamed choice then sends its
content or calls as one delta at its end.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any, Literal

from splitserve.engine.messages import GenerateChunk, TokenLogprob
from splitserve.router.tools import ToolSpec

Kind = Literal["completion", "chat"]


def sse(data: dict[str, Any] | str) -> bytes:
    """One server-sent event line."""
    payload = data if isinstance(data, str) else json.dumps(data, separators=(",", ":"))
    return f"data: {payload}\n\n".encode()


SSE_DONE = sse("[DONE]")


@dataclass
class Choice:
    """One choice's output so far."""

    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[TokenLogprob] = field(default_factory=list)
    finish_reason: str | None = None


def chat_logprobs(tokens: list[TokenLogprob]) -> dict[str, Any]:
    """Chat `logprobs`: `{"content": [{token, logprob, bytes, top_logprobs}]}`."""

    def entry(token: str, logprob: float) -> dict[str, Any]:
        return {"token": token, "logprob": logprob, "bytes": list(token.encode())}

    return {
        "content": [
            {**entry(t.token, t.logprob), "top_logprobs": [entry(a, lp) for a, lp in t.top]}
            for t in tokens
        ],
        "refusal": None,
    }


def completion_logprobs(tokens: list[TokenLogprob], offset: int = 0) -> dict[str, Any]:
    """Completions `logprobs`: parallel lists; each `top_logprobs` entry holds the top
    alternatives and the sampled token; `text_offset` counts characters from `offset`."""
    offsets = []
    for t in tokens:
        offsets.append(offset)
        offset += len(t.token)
    return {
        "tokens": [t.token for t in tokens],
        "token_logprobs": [t.logprob for t in tokens],
        "top_logprobs": [{**dict(t.top), t.token: t.logprob} for t in tokens],
        "text_offset": offsets,
    }


@dataclass
class Renderer:
    """Accumulates a request's chunks and renders them in the endpoint's format.

    `logprobs`: render each choice's logprobs (the chunks carry them); `tools`: parse chat
    output into `tool_calls` (None: plain content).
    """

    kind: Kind
    request_id: str
    model: str
    prompt_tokens: int
    include_usage: bool = False
    return_token_ids: bool = False
    n: int = 1
    logprobs: bool = False
    tools: ToolSpec | None = None
    created: int = field(default_factory=lambda: int(time.time()))
    choices: list[Choice] = field(init=False)
    cached_tokens: int = 0
    replica: str = ""

    def __post_init__(self) -> None:
        self.choices = [Choice() for _ in range(self.n)]

    @property
    def text(self) -> str:
        """The first choice's text."""
        return self.choices[0].text

    @property
    def finish_reason(self) -> str | None:
        """The first choice's finish reason."""
        return self.choices[0].finish_reason

    @property
    def token_ids(self) -> list[int]:
        """Every choice's output token ids (the first choice's first)."""
        return [t for c in self.choices for t in c.token_ids]

    @property
    def _parses_tools(self) -> bool:
        return self.kind == "chat" and self.tools is not None and self.tools.parses

    def add(self, chunk: GenerateChunk) -> None:
        """Fold a worker chunk into its choice's totals."""
        c = self.choices[chunk.index]
        c.text += chunk.text
        c.token_ids.extend(chunk.token_ids)
        if chunk.logprobs:
            c.logprobs.extend(chunk.logprobs)
        self.replica = self.replica or chunk.replica
        if chunk.finish_reason is not None:
            c.finish_reason = chunk.finish_reason
            self.cached_tokens = max(self.cached_tokens, chunk.num_cached_tokens)

    def usage(self) -> dict[str, Any]:
        """The `usage` object (completion tokens of every choice)."""
        n = len(self.token_ids)
        usage: dict[str, Any] = {
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": n,
            "total_tokens": self.prompt_tokens + n,
        }
        if self.cached_tokens:
            usage["prompt_tokens_details"] = {"cached_tokens": self.cached_tokens}
        return usage

    def _object(self, streaming: bool) -> str:
        if self.kind == "completion":
            return "text_completion"
        return "chat.completion.chunk" if streaming else "chat.completion"

    def _envelope(self, choices: list[dict[str, Any]], streaming: bool) -> dict[str, Any]:
        return {
            "id": self.request_id,
            "object": self._object(streaming),
            "created": self.created,
            "model": self.model,
            "choices": choices,
        }

    def _logprobs(self, tokens: list[TokenLogprob]) -> dict[str, Any] | None:
        if not self.logprobs:
            return None
        if self.kind == "chat":
            return chat_logprobs(tokens)
        return completion_logprobs(tokens)

    def _message(self, c: Choice) -> tuple[dict[str, Any], str | None]:
        """A finished chat choice's message and finish reason (tool calls parsed)."""
        if not self._parses_tools or self.tools is None:
            return {"role": "assistant", "content": c.text}, c.finish_reason
        content, calls = self.tools.parse(c.text)
        message: dict[str, Any] = {"role": "assistant", "content": content}
        if calls:
            message["tool_calls"] = calls
        return message, self.tools.finish_reason(c.finish_reason, calls)

    def whole(self) -> dict[str, Any]:
        """The non-streamed response body."""
        choices = []
        for i, c in enumerate(self.choices):
            choice: dict[str, Any] = {
                "index": i, "logprobs": self._logprobs(c.logprobs), "finish_reason": c.finish_reason
            }
            if self.kind == "completion":
                choice["text"] = c.text
            else:
                choice["message"], choice["finish_reason"] = self._message(c)
            if self.return_token_ids:
                choice["token_ids"] = list(c.token_ids)
            choices.append(choice)
        body = self._envelope(choices, streaming=False)
        body["usage"] = self.usage()
        return body

    def first_events(self) -> list[bytes]:
        """Events sent before any token (chat announces the assistant role, per choice)."""
        if self.kind != "chat":
            return []
        return [self._event(i, {"role": "assistant", "content": ""}) for i in range(self.n)]

    def _event(
        self,
        index: int,
        delta: Any,
        finish: str | None = None,
        token_ids: tuple[int, ...] = (),
        logprobs: list[TokenLogprob] | None = None,
    ) -> bytes:
        choice: dict[str, Any] = {
            "index": index,
            "logprobs": self._logprobs(logprobs or []) if logprobs else None,
            "finish_reason": finish,
        }
        if self.kind == "completion":
            choice["text"] = delta
        else:
            choice["delta"] = delta if isinstance(delta, dict) else {"content": delta}
        if self.return_token_ids:
            choice["token_ids"] = list(token_ids)
        body = self._envelope([choice], streaming=True)
        if self.include_usage:
            body["usage"] = None
        return sse(body)

    def chunk_events(self, chunk: GenerateChunk) -> list[bytes]:
        """Events for one worker chunk (the chunk must already be `add`ed)."""
        if not chunk.token_ids and not chunk.text and chunk.finish_reason is None:
            return []
        i, logprobs = chunk.index, list(chunk.logprobs or ())
        if self._parses_tools:  # the choice's text is parsed once it is complete
            if chunk.finish_reason is None:
                return []
            c = self.choices[i]
            message, finish = self._message(c)
            delta = {k: v for k, v in message.items() if k != "role" and v is not None}
            calls = delta.get("tool_calls")
            if calls:
                delta["tool_calls"] = [{"index": k, **call} for k, call in enumerate(calls)]
            return [
                self._event(i, delta, None, tuple(c.token_ids), c.logprobs),
                self._event(i, {}, finish),
            ]
        if chunk.finish_reason is not None and self.kind == "chat":
            events = []
            if chunk.text or chunk.token_ids:
                events.append(self._event(i, chunk.text, None, chunk.token_ids, logprobs))
            events.append(self._event(i, {}, chunk.finish_reason))
            return events
        return [self._event(i, chunk.text, chunk.finish_reason, chunk.token_ids, logprobs)]

    def last_events(self) -> list[bytes]:
        """The usage chunk (if asked for) and the `[DONE]` marker."""
        events = []
        if self.include_usage:
            body = self._envelope([], streaming=True)
            body["usage"] = self.usage()
            events.append(sse(body))
        events.append(SSE_DONE)
        return events
