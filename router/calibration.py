"""What the disaggregation rule knows of the hardware, measured while serving (no hand tuning).

- Each pool's step cost: the engines fit it from vLLM's own step timings and send it on each
  request's last chunk (`GenerateChunk.engine_cost`); a term one pool never shows (a prefill
  engine's per-sequence cost, a decode engine's per-token prefill cost) is taken from the other
  pool, which runs the same model.
- The handoff: from the remote prefill's return to the decode engine's first token (the second
  hop, the KV pull, decode's first step), against the tokens decode pulls; a line fitted over the
  recent handoffs, robust to the first pull of a new engine pair (NIXL's handshake).
- The hop: what a call to an engine adds to the engine's own time to first token (Serve, vLLM's
  server, rendering), paid by every path.

`Calibration.costs()` is None until both pools and a handoff have been measured: until then the
dispatcher takes the remote path, the deployment's configured intent, and so measures it.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

import numpy as np
from splitserve.router.policy import EngineCost, HandoffCost

from splitserve.engine.messages import StepCost

# Recent handoffs a fit uses; and the weight of a new sample in a running mean.
WINDOW = 64
EWMA = 0.1


class LineFit:
    """y = a + b x over the last `window` samples, a, b >= 0; samples whose residual is far from
    the others' (more than 4 median absolute deviations) are left out of the final fit."""

    def __init__(self, window: int = WINDOW) -> None:
        self._xs: deque[float] = deque(maxlen=window)
        self._ys: deque[float] = deque(maxlen=window)

    def __len__(self) -> int:
        return len(self._xs)

    def add(self, x: float, y: float) -> None:
        self._xs.append(float(x))
        self._ys.append(float(y))

    def fit(self) -> tuple[float, float] | None:
        """(a, b), or None without samples."""
        if not self._xs:
            return None
        x, y = np.array(self._xs), np.array(self._ys)
        a, b = _line(x, y)
        if len(x) >= 4:
            resid = np.abs(y - (a + b * x))
            mad = float(np.median(resid))
            keep = resid <= 4 * mad + 1e-9
            if keep.sum() >= 2:
                a, b = _line(x[keep], y[keep])
        return a, b


def _line(x: np.ndarray, y: np.ndarray) -> tuple[float, float]:
    if len(x) < 2 or float(np.ptp(x)) == 0.0:
        return float(np.median(y)), 0.0
    b, a = np.polyfit(x, y, 1)
    if b < 0:
        return float(np.median(y)), 0.0
    if a < 0:
        return 0.0, float(np.sum(x * y) / np.sum(x * x))
    return float(a), float(b)


@dataclass
class _Running:
    value: float | None = None

    def add(self, sample: float) -> None:
        self.value = sample if self.value is None else (1 - EWMA) * self.value + EWMA * sample


class Calibration:
    """The live figures the dispatcher's rule needs, per router replica."""

    def __init__(self) -> None:
        self._steps: dict[str, StepCost] = {}
        self.handoff = LineFit()
        self._hop = _Running()
        self._output = _Running()

    def engine_reported(self, pool: str, cost: StepCost | None) -> None:
        """An engine of `pool` reported its step cost (the last chunk of a request)."""
        if cost is not None:
            self._steps[pool] = cost

    def handoff_measured(self, pulled_tokens: int, seconds: float) -> None:
        """A remote request's first decode token came `seconds` after its prefill returned."""
        self.handoff.add(pulled_tokens, max(seconds, 0.0))

    def hop_measured(self, seconds: float) -> None:
        """A hop's first token came `seconds` later than the engine's own TTFT says."""
        self._hop.add(max(seconds, 0.0))

    def output_measured(self, tokens: int) -> None:
        """A stream ended after `tokens` output tokens."""
        if tokens > 0:
            self._output.add(float(tokens))

    @property
    def stream_tokens(self) -> int | None:
        """The streams' mean output length so far (None before one ended)."""
        return None if self._output.value is None else max(round(self._output.value), 1)

    @property
    def hop_s(self) -> float:
        """The mean overhead of one hop to an engine (0 before one was measured)."""
        return self._hop.value or 0.0

    def engine_cost(self, pool: str, other: str) -> EngineCost | None:
        """`pool`'s step cost, its unknown terms from `other`'s; None while a term is unknown."""
        own, peer = self._steps.get(pool), self._steps.get(other)
        if own is None:
            return None
        per_seq = own.per_seq_s if own.per_seq_s is not None else (
            peer.per_seq_s if peer is not None else None)
        per_token = own.per_token_s if own.per_token_s is not None else (
            peer.per_token_s if peer is not None else None)
        if per_seq is None or per_token is None:
            return None
        return EngineCost(own.step_s, per_seq, per_token, own.chunk_tokens)

    def handoff_cost(self) -> HandoffCost | None:
        """The handoff's fitted cost; None before the first handoff was measured."""
        fit = self.handoff.fit()
        return None if fit is None else HandoffCost(*fit)
