"""The engine's step-cost fit (splitserve/engine/step_cost.py) from vLLM's iteration details."""

from __future__ import annotations

import random

import pytest

from splitserve.engine.stats import LatestStats
from splitserve.engine.step_cost import StepCostFit


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
    step, per_seq, per_token = fit.coefficients()
    assert per_seq is None and per_token == pytest.approx(1e-4, rel=1e-3)
    assert StepCostFit().coefficients() == (0.0, None, None)
    assert LatestStats().step_cost(2048) is None  # nothing timed yet: nothing reported


def test_a_cost_the_steps_contradict_is_zero_not_negative():
    fit = StepCostFit()
    for seqs, seconds in ((1, 0.05), (2, 0.04), (3, 0.03), (4, 0.02)):  # noise on a busy core
        fit.observe(seqs, 0, seconds)
    step, per_seq, per_token = fit.coefficients()
    assert per_seq == 0.0 and step > 0 and per_token is None
