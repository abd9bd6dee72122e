"""An engine's step cost, fitted live from vLLM's own iteration details.

vLLM's EngineCore times every step and counts what it scheduled (`SchedulerIterationDetails`:
prefill ("context") tokens, decoding requests, elapsed ms) when the engine runs with
`enable_logging_iteration_details`; the host's stat logger hands each step to `StepCostFit`.
The fit is a least-squares line `elapsed = step_s + per_seq_s * decoding requests + per_token_s *
prefill tokens` over recent steps (older steps weigh less), so it follows the hardware it runs
on: the router's disaggregation rule (`router/policy.py`) predicts TTFT and TPOT with it.

vLLM's `elapsed` covers the model's execution only: scheduling the step, updating the requests
from its output and sending it to the front end come on top, and on a busy CPU engine that was
a quarter to a third of each step (`StepTimer`). So the host fits a second line of the same form
to that remainder, measured between back-to-back steps (the wall time from one step's record to
the next's, minus the next step's `elapsed`), and the engine's step cost is the sum of the two.
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

    def observe(
        self, seqs: int, prefill_tokens: int, elapsed_s: float, *, signed: bool = False
    ) -> None:
        """One step: `seqs` decoding requests, `prefill_tokens` prompt tokens, its duration.
        `signed`: the duration is a noisy difference (a step's overhead), kept even when it is
        0 or below, so that the fit stays an unbiased mean."""
        if (elapsed_s <= 0 and not signed) or (seqs <= 0 and prefill_tokens <= 0):
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


class StepTimer:
    """A step's cost as the engine's clock sees it: execution (`exec_fit`, vLLM's `elapsed`)
    plus the overhead around it (`overhead_fit`: scheduling, output update, sending), both
    fitted over (decoding requests, prefill tokens).

    `observe` takes each step's record as it arrives. The overhead is measured only between
    back-to-back steps: the previous record is the step just before (`iteration`) and left
    requests running or waiting, so that the engine went straight on to this one.
    """

    def __init__(self, forget: float = FORGET) -> None:
        self.exec_fit = StepCostFit(forget)
        self.overhead_fit = StepCostFit(forget)
        self._last: tuple[int, float, bool] | None = None  # iteration, arrival, busy after

    def observe(
        self, iteration: int, seqs: int, prefill_tokens: int, elapsed_s: float,
        *, arrived_s: float, busy_after: bool, prefill_requests: int = 0,
    ) -> None:
        """One step's record: vLLM's iteration index and details (`prefill_requests`: its
        requests in their prompt phase, vLLM's context requests), when it arrived (a monotonic
        clock) and whether requests were left running or waiting after it.

        A step whose prompt-phase requests schedule one token each is left out of the fits: its
        prompts were not computed here but loaded (a KV connector's handoff, which recomputes
        only the last token) or found cached. Its time is the connector's work, which the
        router measures as the handoff's latency; counted as prefill, one token would carry
        the whole of it, and a decode engine's per-token cost would come out tens of times
        its true prefill cost (CPU, 2026-12-06: 2.6 ms/token against the prefill engine's
        0.08), so that a short prompt never looked cheap to prefill on decode."""
        last, self._last = self._last, (iteration, arrived_s, busy_after)
        if prefill_requests and prefill_tokens <= prefill_requests:
            return
        self.exec_fit.observe(seqs, prefill_tokens, elapsed_s)
        if last is not None and iteration == last[0] + 1 and last[2]:
            self.overhead_fit.observe(seqs, prefill_tokens, arrived_s - last[1] - elapsed_s,
                                      signed=True)

    def coefficients(self) -> tuple[float, float | None, float | None]:
        """(step_s, per_seq_s, per_token_s) of execution plus overhead; a coefficient the
        execution fit does not determine is None, whatever the overhead fit says."""
        run = self.exec_fit.coefficients()
        extra = self.overhead_fit.coefficients()
        return (
            run[0] + extra[0],
            None if run[1] is None else run[1] + (extra[1] or 0.0),
            None if run[2] is None else run[2] + (extra[2] or 0.0),
        )


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
