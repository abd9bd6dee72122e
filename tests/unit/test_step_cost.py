"""The engine's step-cost fit (splitserve/engine/step_cost.py) from vLLM's iteration details."""

from __future__ import annotations

import random

import pytest

from splitserve.engine.stats import LatestStats
from splitserve.engine.step_cost import StepCostFit, StepTimer


def test_the_fit_recovers_the_step_cost_of_mixed_steps():
    rng = random.Random(0)
    fit = StepCostFit()
    for _ in range(500):
        seqs, tokens = rng.randint(0, 32), rng.choice([0, 0, 0, 128, 512, 2048])
        fit.observe(seqs, tokens, 0.01 + 0.0005 * seqs + 2e-5 * tokens + rng.gauss(0, 2e-4))
    step, per_seq, per_token = fit.coefficients()
    assert step == pytest.approx(0.01, rel=0.05)
    assert per_seq == pytest.approx(0.0005, rel=0.05)
    assert per_token == pytest.approx(2e-5, rel=0.05)


def test_a_term_the_steps_never_show_is_unknown():
    fit = StepCostFit()
    for n in (100, 500, 2000, 700):
        fit.observe(0, n, 0.005 + 1e-4 * n)  # a prefill engine: no decoding sequences
    _step, per_seq, per_token = fit.coefficients()
    assert per_seq is None and per_token == pytest.approx(1e-4, rel=1e-3)
    assert StepCostFit().coefficients() == (0.0, None, None)
    assert LatestStats().step_cost(2048) is None  # nothing timed yet: nothing reported


def test_a_cost_the_steps_contradict_is_zero_not_negative():
    fit = StepCostFit()
    for seqs, seconds in ((1, 0.05), (2, 0.04), (3, 0.03), (4, 0.02)):  # noise on a busy core
        fit.observe(seqs, 0, seconds)
    step, per_seq, per_token = fit.coefficients()
    assert per_seq == 0.0 and step > 0 and per_token is None


def _run_steps(timer: StepTimer, rng: random.Random, *, overhead_s, idle_every: int = 0) -> None:
    """Back-to-back steps whose wall time is execution + `overhead_s(seqs)` (with jitter in
    when their records arrive); every `idle_every`-th step the engine idles a while first."""
    clock = 0.0
    for i in range(600):
        seqs, tokens = rng.randint(1, 32), rng.choice([0, 0, 0, 128, 512])
        run = 0.004 + 0.0002 * seqs + 1e-5 * tokens
        idle = idle_every and i % idle_every == 0
        clock += run + overhead_s(seqs) + (1.0 if idle else 0.0)
        timer.observe(i, seqs, tokens, run, arrived_s=clock + rng.gauss(0, 1e-4),
                      busy_after=not (idle_every and (i + 1) % idle_every == 0))


def test_the_step_cost_adds_the_overhead_measured_between_back_to_back_steps():
    timer = StepTimer()
    _run_steps(timer, random.Random(1), overhead_s=lambda seqs: 0.001 + 0.0001 * seqs,
               idle_every=10)
    step, per_seq, per_token = timer.coefficients()
    # execution 4 ms + 0.2 ms a sequence, overhead 1 ms + 0.1 ms a sequence; the idle second
    # before every tenth step is not counted as overhead (the step before it left none busy)
    assert step == pytest.approx(0.005, rel=0.1)
    assert per_seq == pytest.approx(0.0003, rel=0.1)
    assert per_token == pytest.approx(1e-5, rel=0.1)
    exec_step, exec_seq, _ = timer.exec_fit.coefficients()
    assert exec_step == pytest.approx(0.004, rel=0.1) and exec_seq == pytest.approx(0.0002, rel=0.1)


def test_without_back_to_back_steps_the_cost_is_the_execution_alone():
    timer = StepTimer()
    _run_steps(timer, random.Random(2), overhead_s=lambda seqs: 0.002, idle_every=1)
    assert timer.coefficients() == timer.exec_fit.coefficients()
