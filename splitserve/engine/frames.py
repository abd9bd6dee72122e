"""The byte frames of a response streamed from an engine replica to the router over HTTP.

A forwarded request's response (`GenerateRequest.http_stream`) leaves the engine replica as one
HTTP response per request (`engine/stream_server.py`), not as one Ray object per chunk: its
body is a sequence of frames, each a fixed header and a payload:

- `START`: the response's status and headers (JSON), once, before any body byte;
- `DATA`: output token ids (unsigned 32-bit, little-endian) made since the last frame, the bytes
  vLLM's server wrote meanwhile, and the engine's first-token latency on the first frame with
  tokens;
- `END`: the response is complete: the last tokens and bytes, as `DATA` has them, and the
  request's figures (finish reason, token counts, KV transfer, step cost; JSON, its size after
  the header). A body that stops without it was cut (the replica failed or the request was
  cancelled): the request's Ray call then says why.

The engine holds the bytes its server writes once the request finished (the last token's
event, `[DONE]`) for `END`, so the router has the figures with the response's last bytes,
before its client reads them: a client that hangs up at `[DONE]` cuts nothing off. Pure
functions and a decoder: no I/O.
"""

from __future__ import annotations

import dataclasses
import json
import math
import struct
from array import array
from dataclasses import dataclass
from typing import Any

from splitserve.engine.messages import GenerateChunk, StepCost

START, DATA, END = 1, 2, 3
# kind, output tokens, body bytes, engine first-token latency (NaN: none)
HEADER = struct.Struct("<BIId")
# after an `END` header: the size of the figures (JSON) that follow its tokens and bytes
FIGURES_SIZE = struct.Struct("<I")
_NAN = float("nan")


class FrameError(ValueError):
    """The stream's bytes are not frames (a different server answered, or the stream was
    corrupted)."""


def _ids(token_ids: tuple[int, ...]) -> bytes:
    out = array("I", token_ids)
    if out.itemsize != 4:  # pragma: no cover - every platform vLLM runs on has 32-bit unsigned
        raise RuntimeError("array('I') is not 32-bit here")
    return out.tobytes()


def encode_start(status: int, headers: tuple[tuple[str, str], ...]) -> bytes:
    """The frame of a response's start."""
    payload = json.dumps({"status": status, "headers": headers}).encode()
    return HEADER.pack(START, 0, len(payload), _NAN) + payload


def encode_data(token_ids: tuple[int, ...], data: bytes, engine_ttft_s: float | None) -> bytes:
    """The frame of the tokens and bytes a response made since its last frame."""
    ttft = _NAN if engine_ttft_s is None else engine_ttft_s
    return HEADER.pack(DATA, len(token_ids), len(data), ttft) + _ids(token_ids) + data


# The last chunk's fields that `END` carries.
FIGURES = ("finish_reason", "num_prompt_tokens", "num_cached_tokens", "kv_transfer_params",
           "kv_bytes", "kv_transfer_s", "kv_recomputed", "engine_cost")


def encode_end(last: GenerateChunk | None = None) -> bytes:
    """The frame that ends the response: the tokens, bytes and figures of its `last` chunk in
    one frame (a start `last` has goes in a frame before it), so that no reader sees the
    response's last bytes without its figures."""
    if last is None:
        return HEADER.pack(END, 0, 0, _NAN) + FIGURES_SIZE.pack(0)
    figures: dict[str, Any] = {k: getattr(last, k) for k in FIGURES}
    if last.engine_cost is not None:
        figures["engine_cost"] = dataclasses.asdict(last.engine_cost)
    payload = json.dumps(figures).encode()
    ttft = _NAN if last.engine_ttft_s is None else last.engine_ttft_s
    start = b"" if last.status is None else encode_start(last.status, last.headers)
    return (start + HEADER.pack(END, len(last.token_ids), len(last.data), ttft)
            + FIGURES_SIZE.pack(len(payload)) + _ids(last.token_ids) + last.data + payload)


def _figures(payload: bytes) -> dict[str, Any]:
    if not payload:
        return {}
    try:
        figures = {k: v for k, v in json.loads(payload).items() if k in FIGURES}
        if figures.get("engine_cost") is not None:
            figures["engine_cost"] = StepCost(**figures["engine_cost"])
    except (ValueError, TypeError) as err:
        raise FrameError(f"the end frame's figures are not readable ({err})") from None
    return figures


def encode_chunk(chunk: GenerateChunk) -> bytes:
    """A worker's chunk as frames: its start (if it has one), then its tokens and bytes."""
    out = b""
    if chunk.status is not None:
        out = encode_start(chunk.status, chunk.headers)
    if chunk.token_ids or chunk.data or chunk.engine_ttft_s is not None:
        out += encode_data(chunk.token_ids, chunk.data, chunk.engine_ttft_s)
    return out


@dataclass
class Decoded:
    """What a read of the stream gave: the chunks complete so far (consecutive `DATA` frames,
    and an `END` after them, merged into one chunk; `END`'s figures on it), and whether `END`
    came."""

    chunks: list[GenerateChunk]
    ended: bool


class FrameDecoder:
    """Turns the stream's bytes, as they arrive in pieces of any size, back into chunks.

    `replica`: the replica that streams them (set on every chunk). Frames that arrive together
    become one chunk per run of `DATA` frames, so that a reader that fell behind catches up in
    one step instead of one per frame.
    """

    def __init__(self, replica: str = "") -> None:
        self.replica = replica
        self._buf = bytearray()
        self.ended = False

    def feed(self, data: bytes) -> Decoded:
        """Decode what `data` completes; bytes after `END` are an error."""
        buf = self._buf
        buf.extend(data)
        chunks: list[GenerateChunk] = []
        ids: array = array("I")
        body = bytearray()
        ttft: float | None = None
        pending = False
        pos, size = 0, HEADER.size
        while len(buf) - pos >= size:
            if self.ended:
                raise FrameError("bytes after the end of the stream")
            kind, n_tokens, n_data, frame_ttft = HEADER.unpack_from(buf, pos)
            start = pos + size
            n_figures = 0
            if kind == END:
                if len(buf) < start + FIGURES_SIZE.size:
                    break
                (n_figures,) = FIGURES_SIZE.unpack_from(buf, start)
                start += FIGURES_SIZE.size
            elif kind not in (START, DATA):
                raise FrameError(f"unknown frame kind {kind}")
            end = start + 4 * n_tokens + n_data + n_figures
            if len(buf) < end:
                break
            if kind == START:
                if pending:
                    chunks.append(self._chunk(ids, body, ttft))
                    ids, body, ttft, pending = array("I"), bytearray(), None, False
                head = json.loads(bytes(buf[start:end]))
                chunks.append(GenerateChunk(
                    (), "", status=int(head["status"]),
                    headers=tuple((str(k), str(v)) for k, v in head["headers"]),
                    replica=self.replica))
            else:  # DATA, or END with the last tokens and bytes: merged into the run
                ids.frombytes(buf[start:start + 4 * n_tokens])
                body.extend(buf[start + 4 * n_tokens:end - n_figures])
                if ttft is None and not math.isnan(frame_ttft):
                    ttft = frame_ttft
                pending = True
                if kind == END:
                    self.ended = True
                    figures = _figures(bytes(buf[end - n_figures:end]))
                    if figures or ids or body or ttft is not None:
                        chunks.append(self._chunk(ids, body, ttft, **figures))
                    ids, body, ttft, pending = array("I"), bytearray(), None, False
            pos = end
        if pending:
            chunks.append(self._chunk(ids, body, ttft))
        del buf[:pos]
        return Decoded(chunks, self.ended)

    def _chunk(self, ids: array, body: bytearray, ttft: float | None,
               **figures: Any) -> GenerateChunk:
        return GenerateChunk(tuple(ids), "", data=bytes(body), engine_ttft_s=ttft,
                             replica=self.replica, **figures)
