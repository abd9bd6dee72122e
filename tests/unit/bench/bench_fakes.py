"""Fakes shared by the bench unit tests: recorded SSE streams and an in-process fake server."""

from __future__ import annotations

import asyncio
import json

import httpx


def chunk(text: str, finish: str | None = None, token_ids: list[int] | None = None) -> bytes:
    """One completion chunk as our router sends it (with `usage: null`; with `token_ids` as
    vLLM adds them under `return_token_ids`)."""
    choice = {"index": 0, "logprobs": None, "finish_reason": finish, "text": text}
    if token_ids is not None:
        choice["token_ids"] = token_ids
    body = {
        "id": "cmpl-1", "object": "text_completion", "created": 1, "model": "m",
        "choices": [choice], "usage": None,
    }
    return f"data: {json.dumps(body, separators=(',', ':'))}\n\n".encode()


def usage(prompt: int, completion: int) -> bytes:
    """The final usage chunk (empty choices)."""
    body = {
        "id": "cmpl-1", "object": "text_completion", "created": 1, "model": "m", "choices": [],
        "usage": {"prompt_tokens": prompt, "completion_tokens": completion,
                  "total_tokens": prompt + completion},
    }
    return f"data: {json.dumps(body)}\n\n".encode()


DONE = b"data: [DONE]\n\n"


def reply_ids(prompt: list[int], max_tokens: int) -> list[int]:
    """The fake model's greedy reply: a function of the prompt, like a real one."""
    return [(sum(prompt) * 31 + 7 * i + len(prompt)) % 400 + 10 for i in range(max_tokens)]


def stream_for(prompt_tokens: int, max_tokens: int, ids: list[int] | None = None) -> list[bytes]:
    """A whole successful stream: one chunk per token (with its id when `ids`), usage, [DONE]."""
    pieces = [
        chunk(f"t{i}", "length" if i == max_tokens - 1 else None,
              None if ids is None else [ids[i]])
        for i in range(max_tokens)
    ]
    return [*pieces, usage(prompt_tokens, max_tokens), DONE]


class FakeServer:
    """An httpx handler that streams `max_tokens` chunks, `gap_s` apart, and records requests."""

    def __init__(self, gap_s: float = 0.0, first_s: float = 0.0) -> None:
        self.gap_s, self.first_s = gap_s, first_s
        self.bodies: list[dict] = []
        self.auth: list[str | None] = []  # each request's Authorization header
        self.in_flight = 0
        self.max_in_flight = 0

    async def _body(self, parts: list[bytes]):
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            await asyncio.sleep(self.first_s)
            for i, part in enumerate(parts):
                if i:
                    await asyncio.sleep(self.gap_s)
                yield part
        finally:
            self.in_flight -= 1

    async def __call__(self, request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        self.bodies.append(body)
        self.auth.append(request.headers.get("authorization"))
        ids = reply_ids(body["prompt"], body["max_tokens"]) if body.get("return_token_ids") else None
        parts = stream_for(len(body["prompt"]), body["max_tokens"], ids)
        return httpx.Response(200, content=self._body(parts),
                              headers={"content-type": "text/event-stream"})

    def transport(self) -> httpx.MockTransport:
        return httpx.MockTransport(self)
