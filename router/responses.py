"""Render worker chunks as OpenAI response bodies: whole objects or SSE chunks.

One `Renderer` per request. `kind` is "completion" or "chat"; the two differ only in object
names and where the text goes (`text` vs `message`/`delta`).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any, Literal

from splitserve.engine.messages import GenerateChunk

Kind = Literal["completion", "chat"]


def sse(data: dict[str, Any] | str) -> bytes:
    """One server-sent event line."""
    payload = data if isinstance(data, str) else json.dumps(data, separators=(",", ":"))
    return f"data: {payload}\n\n".encode()


SSE_DONE = sse("[DONE]")


@dataclass
class Renderer:
    """Accumulates a request's chunks and renders them in the endpoint's format."""

    kind: Kind
    request_id: str
    model: str
    prompt_tokens: int
    include_usage: bool = False
    return_token_ids: bool = False
    created: int = field(default_factory=lambda: int(time.time()))
    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    finish_reason: str | None = None
    cached_tokens: int = 0
    replica: str = ""

    def add(self, chunk: GenerateChunk) -> None:
        """Fold a worker chunk into the totals."""
        self.text += chunk.text
        self.token_ids.extend(chunk.token_ids)
        self.replica = self.replica or chunk.replica
        if chunk.finish_reason is not None:
            self.finish_reason = chunk.finish_reason
            self.cached_tokens = chunk.num_cached_tokens

    def usage(self) -> dict[str, Any]:
        """The `usage` object."""
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

    def whole(self) -> dict[str, Any]:
        """The non-streamed response body."""
        choice: dict[str, Any] = {"index": 0, "logprobs": None, "finish_reason": self.finish_reason}
        if self.kind == "completion":
            choice["text"] = self.text
        else:
            choice["message"] = {"role": "assistant", "content": self.text}
        if self.return_token_ids:
            choice["token_ids"] = list(self.token_ids)
        body = self._envelope([choice], streaming=False)
        body["usage"] = self.usage()
        return body

    def first_events(self) -> list[bytes]:
        """Events sent before any token (chat announces the assistant role)."""
        if self.kind != "chat":
            return []
        return [self._event({"role": "assistant", "content": ""}, None, ())]

    def _event(self, delta_text: Any, finish: str | None, token_ids: tuple[int, ...]) -> bytes:
        choice: dict[str, Any] = {"index": 0, "logprobs": None, "finish_reason": finish}
        if self.kind == "completion":
            choice["text"] = delta_text
        else:
            choice["delta"] = (
                delta_text if isinstance(delta_text, dict) else {"content": delta_text}
            )
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
        if chunk.finish_reason is not None and self.kind == "chat":
            events = []
            if chunk.text or chunk.token_ids:
                events.append(self._event(chunk.text, None, chunk.token_ids))
            events.append(self._event({}, chunk.finish_reason, ()))
            return events
        return [self._event(chunk.text, chunk.finish_reason, chunk.token_ids)]

    def last_events(self) -> list[bytes]:
        """The usage chunk (if asked for) and the `[DONE]` marker."""
        events = []
        if self.include_usage:
            body = self._envelope([], streaming=True)
            body["usage"] = self.usage()
            events.append(sse(body))
        events.append(SSE_DONE)
        return events
