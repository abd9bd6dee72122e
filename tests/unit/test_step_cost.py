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


def _decode_engine(timer: StepTimer, rng: random.Random, *, local_every: int = 0) -> None:
    """A decode engine's back-to-back steps: decodes of 1-16 sequences (5 ms + 0.4 ms each),
    every fifth step also admitting a handed-off request (one prompt-phase request scheduling
    its last token, 3 ms of connector work), and with `local_every` a 128-token prompt
    prefilled here every that many steps (0.07 ms a token)."""
    clock = 0.0
    for i in range(800):
        seqs = rng.randint(1, 16)
        tokens, requests, extra = 0, 0, 0.0
        if i % 5 == 0:
            tokens, requests, extra = 1, 1, 0.003
        elif local_every and i % local_every == 1:
            tokens, requests = 128, 1
        run = 0.005 + 0.0004 * seqs + 7e-5 * tokens + extra
        clock += run
        timer.observe(i, seqs, tokens, run, arrived_s=clock, busy_after=True,
                      prefill_requests=requests)


def test_a_handoffs_one_token_admission_is_not_prefill_work():
    """A decode engine that only receives handed-off prompts shows no per-token cost (the
    router takes the prefill pool's), and its connector's admission work does not inflate
    one it does show: the cost of a 128-token local prefill is the one its local prefills
    took."""
    only_handoffs = StepTimer()
    _decode_engine(only_handoffs, random.Random(3))
    step, per_seq, per_token = only_handoffs.coefficients()
    assert per_token is None
    assert step == pytest.approx(0.005, rel=0.05) and per_seq == pytest.approx(4e-4, rel=0.05)

    mixed = StepTimer()
    _decode_engine(mixed, random.Random(4), local_every=7)
    step, per_seq, per_token = mixed.coefficients()
    assert per_token == pytest.approx(7e-5, rel=0.05)
    assert step == pytest.approx(0.005, rel=0.05)
