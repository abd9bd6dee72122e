"""The measurement of one request (a plain record; filled by the client, read by the stats)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass
class RequestResult:
    """What happened to one request. Times are in seconds.

    Offsets (`scheduled_s`, `sent_s`) count from the start of the run; latencies from the moment
    the request was sent. A request succeeded when `error` is None: HTTP 200, a stream that
    ended with `[DONE]` and no error event.
    """

    index: int
    scheduled_s: float
    prompt_tokens: int
    max_tokens: int
    sent_s: float | None = None
    ttft_s: float | None = None  # to the first chunk with choices
    itl_s: list[float] = field(default_factory=list)  # gaps between consecutive such chunks
    e2e_s: float | None = None
    output_tokens: int | None = None  # usage.completion_tokens
    chunks: int = 0
    status_code: int | None = None
    error: str | None = None

    @property
    def ok(self) -> bool:
        """True when the request completed without error."""
        return self.error is None

    @property
    def tpot_s(self) -> float | None:
        """(e2e - TTFT) / (output tokens - 1); None with fewer than two output tokens."""
        if not self.ok or self.ttft_s is None or self.e2e_s is None:
            return None
        if self.output_tokens is None or self.output_tokens < 2:
            return None
        return (self.e2e_s - self.ttft_s) / (self.output_tokens - 1)

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict (one line of `requests.jsonl`), with `ok` and `tpot_s` added."""
        return {**asdict(self), "ok": self.ok, "tpot_s": self.tpot_s}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> RequestResult:
        """Inverse of `to_json` (derived fields are ignored)."""
        fields = {k: v for k, v in data.items() if k not in ("ok", "tpot_s")}
        return cls(**fields)
