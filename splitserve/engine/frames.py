"""The byte frames of a response streamed from an engine replica to the router over HTTP.

A forwarded request's response (`GenerateRequest.http_stream`) leaves the engine replica as one
HTTP response per request (`engine/stream_server.py`), not as one Ray object per chunk: its
body is a sequence of frames, each a fixed header and a payload:

- `START`: the response's status and headers (JSON), once, before any body byte;
- `DATA`: output token ids (unsigned 32-bit, little-endian) made since the last frame, the bytes
  vLLM's server wrote meanwhile, and the engine's first-token latency on the first frame with
  tokens;
- `END`: the response is complete. A body that stops without it was cut (the replica failed or
  the request was cancelled): the request's Ray call then says why.

The request's figures (KV transfer, step cost, finish reason) still come through the Ray call,
once, after `END`. Pure functions and a decoder: no I/O.
"""

from __future__ import annotations

import json
import math
import struct
from array import array
from dataclasses import dataclass

from splitserve.engine.messages import GenerateChunk

START, DATA, END = 1, 2, 3
# kind, output tokens, body bytes, engine first-token latency (NaN: none)
HEADER = struct.Struct("<BIId")
_NAN = float("nan")


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


def encode_end() -> bytes:
    """The frame that says the response is complete."""
    return HEADER.pack(END, 0, 0, _NAN)


def encode_chunk(chunk: GenerateChunk) -> bytes:
    """A worker's chunk as frames: its start (if it has one), then its tokens and bytes."""
    out = b""
    if chunk.status is not None:
        out = encode_start(chunk.status, chunk.headers)
    if chunk.token_ids or chunk.data or chunk.engine_ttft_s is not None:
        out += encode_data(chunk.token_ids, chunk.data, chunk.engine_ttft_s)
    return out


class FrameError(ValueError):
    """The stream's bytes are not frames (a different server answered, or the stream was
    corrupted)."""


@dataclass
class Decoded:
    """What a read of the stream gave: the chunks complete so far (consecutive `DATA` frames
    merged into one chunk), and whether `END` came."""

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
            end = pos + size + 4 * n_tokens + n_data
            if len(buf) < end:
                break
            start = pos + size
            if kind == DATA:
                ids.frombytes(buf[start:start + 4 * n_tokens])
                body.extend(buf[start + 4 * n_tokens:end])
                if ttft is None and not math.isnan(frame_ttft):
                    ttft = frame_ttft
                pending = True
            elif kind in (START, END):
                if pending:
                    chunks.append(self._chunk(ids, body, ttft))
                    ids, body, ttft, pending = array("I"), bytearray(), None, False
                if kind == START:
                    head = json.loads(bytes(buf[start:end]))
                    chunks.append(GenerateChunk(
                        (), "", status=int(head["status"]),
                        headers=tuple((str(k), str(v)) for k, v in head["headers"]),
                        replica=self.replica))
                else:
                    self.ended = True
            else:
                raise FrameError(f"unknown frame kind {kind}")
            pos = end
        if pending:
            chunks.append(self._chunk(ids, body, ttft))
        del buf[:pos]
        return Decoded(chunks, self.ended)

    def _chunk(self, ids: array, body: bytearray, ttft: float | None) -> GenerateChunk:
        return GenerateChunk(tuple(ids), "", data=bytes(body), engine_ttft_s=ttft,
                             replica=self.replica)
