"""An engine's step cost, fitted live from vLLM's own iteration details.

vLLM's EngineCore times every step and counts what it scheduled (`SchedulerIterationDetails`:
prefill ("context") tokens, decoding requests, elapsed ms) when the engine runs with
`enable_logging_iteration_details`; the host's stat logger hands each step to `StepCostFit`.
The fit is a least-squares line `elapsed = step_s + per_seq_s * decoding requests + per_token_s *
prefill tokens` over recent steps (older steps weigh less), so it follows the hardware it runs
on: the router's disaggregation rule (`router/policy.py`) predicts TTFT and TPOT with it.
"""

from __future__ import annotations

import logging

import numpy as np

# Weight kept by a step per newer step: about the last thousand steps count (seconds of a busy
# GPU engine, a few of a CPU one).
FORGET = 0.999
# A coefficient needs this much spread in its input before it is reported (else it is unknown).
MIN_SAMPLES = 3


class StepCostFit:
    """Weighted least squares over (decoding requests, prefill tokens) -> step seconds."""

    def __init__(self, forget: float = FORGET) -> None:
        self.forget = forget
        self._xtx = np.zeros((3, 3))
        self._xty = np.zeros(3)
        self._seq_steps = 0  # steps with decoding requests
        self._prefill_steps = 0  # steps with prefill tokens

    def observe(self, seqs: int, prefill_tokens: int, elapsed_s: float) -> None:
        """One step: `seqs` decoding requests, `prefill_tokens` prompt tokens, its duration."""
        if elapsed_s <= 0 or (seqs <= 0 and prefill_tokens <= 0):
            return
        x = np.array([1.0, float(seqs), float(prefill_tokens)])
        self._xtx = self.forget * self._xtx + np.outer(x, x)
        self._xty = self.forget * self._xty + x * elapsed_s
        self._seq_steps += seqs > 0
        self._prefill_steps += prefill_tokens > 0

    def coefficients(self) -> tuple[float, float | None, float | None]:
        """(step_s, per_seq_s, per_token_s); a coefficient its steps do not determine is None
        (a prefill-only engine never shows its per-sequence cost, a decode-only one its
        per-token cost). All are >= 0: a term whose fit is negative is 0 (refitted without it)."""
        known = [0]
        if self._seq_steps >= MIN_SAMPLES:
            known.append(1)
        if self._prefill_steps >= MIN_SAMPLES:
            known.append(2)
        if len(known) == 1 and not (self._seq_steps or self._prefill_steps):
            return (0.0, None, None)
        fitted = list(known)
        while True:
            coef = _solve(self._xtx, self._xty, fitted)
            negative = [k for k, c in zip(fitted, coef, strict=True) if c < 0 and k != 0]
            if not negative:
                break
            fitted.remove(negative[0])  # its steps show no cost of it: 0
        out: list[float | None] = [0.0, None, None]
        for k in known:
            out[k] = 0.0
        for k, c in zip(fitted, coef, strict=True):
            out[k] = max(float(c), 0.0)
        return (out[0] or 0.0, out[1], out[2])


def _solve(xtx: np.ndarray, xty: np.ndarray, idx: list[int]) -> np.ndarray:
    a = xtx[np.ix_(idx, idx)] + 1e-12 * np.eye(len(idx))
    try:
        return np.linalg.solve(a, xty[idx])
    except np.linalg.LinAlgError:
        return np.linalg.lstsq(a, xty[idx], rcond=None)[0]


class DropIterationLines(logging.Filter):
    """Keeps vLLM's per-step "Iteration(...)" INFO lines out of the logs: the host turns the
    details on for the fit, not for a log line per step."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "Iteration(" not in str(record.msg)
