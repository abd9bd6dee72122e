"""Server-sent events: decode a byte stream into `data` payloads, and read completion chunks.

Pure: no network. The client feeds it bytes as they arrive; tests feed it recorded bytes.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

DONE = "[DONE]"


class SSEDecoder:
    """Incremental text/event-stream decoder.

    `feed` takes any slice of the stream (events may be split anywhere, even inside a UTF-8
    character) and returns the `data` payloads of the events it completed, in order. Lines end
    with LF or CRLF; a blank line ends an event; several `data:` lines of one event are joined
    with newlines; comments (`:`) and other fields (`event:`, `id:`, `retry:`) are skipped.
    """

    def __init__(self) -> None:
        self._buffer = b""
        self._data: list[str] = []

    def feed(self, chunk: bytes) -> list[str]:
        """Payloads of the events completed by `chunk`."""
        self._buffer += chunk
        *lines, self._buffer = self._buffer.split(b"\n")
        payloads = []
        for raw in lines:
            line = raw.rstrip(b"\r").decode("utf-8", errors="replace")
            if not line:
                if self._data:
                    payloads.append("\n".join(self._data))
                    self._data = []
            elif line.startswith("data:"):
                value = line[5:]
                self._data.append(value[1:] if value.startswith(" ") else value)
        return payloads

    def close(self) -> list[str]:
        """Payload of a last event that the stream ended without a blank line (lenient)."""
        rest = self.feed(b"\n\n") if self._buffer or self._data else []
        self._buffer = b""
        return rest


@dataclass(frozen=True)
class CompletionEvent:
    """What one `/v1/completions` stream payload says.

    `content` is true for a chunk with choices (a token step, even if its text is empty);
    `usage` is the usage object when the chunk has one; `error` an error message; `token_ids`
    the chunk's generated ids when the request asked for them (vLLM's `return_token_ids`).
    """

    done: bool = False
    content: bool = False
    text: str = ""
    finish_reason: str | None = None
    usage: dict[str, Any] | None = None
    error: str | None = None
    token_ids: tuple[int, ...] = ()


def parse_completion_event(payload: str) -> CompletionEvent:
    """Read one payload of a completions stream (`[DONE]`, a chunk, or an error object)."""
    if payload.strip() == DONE:
        return CompletionEvent(done=True)
    try:
        body = json.loads(payload)
    except json.JSONDecodeError:
        return CompletionEvent(error=f"bad SSE payload: {payload[:200]!r}")
    if not isinstance(body, dict):
        return CompletionEvent(error=f"bad SSE payload: {payload[:200]!r}")
    if "error" in body:
        return CompletionEvent(error=error_text(body))
    choices = body.get("choices") or []
    first = choices[0] if choices else {}
    return CompletionEvent(
        content=bool(choices),
        text=first.get("text") or "",
        finish_reason=first.get("finish_reason"),
        usage=body.get("usage"),
        token_ids=tuple(first.get("token_ids") or ()),
    )


def error_text(body: Any) -> str:
    """The message of an OpenAI error body, or the body itself shortened."""
    if isinstance(body, dict):
        err = body.get("error")
        if isinstance(err, dict) and err.get("message"):
            return str(err["message"])
        if isinstance(err, str):
            return err
        if body.get("message"):  # FastAPI / vLLM variants
            return str(body["message"])
        if body.get("detail"):
            return str(body["detail"])
    return str(body)[:300]
