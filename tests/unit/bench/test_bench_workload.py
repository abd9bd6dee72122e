"""Workload generation: lengths, determinism, shared prefixes, arrival processes."""

from __future__ import annotations

import math

import numpy as np
import pytest

from splitserve.bench.workload import (
    LengthSpec,
    WorkloadSpec,
    arrival_times,
    build_workload,
)


def spec(**kw) -> WorkloadSpec:
    base = dict(num_requests=50, prompt_len=LengthSpec.parse("64:16"),
                output_len=LengthSpec.parse("8-12"), rate=4.0, seed=0)
    return WorkloadSpec(**{**base, **kw})


@pytest.mark.parametrize("text, kind, a, b", [
    ("512", "constant", 512, 0.0),
    ("512:128", "normal", 512, 128.0),
    (" 256-768 ", "uniform", 256, 768.0),
])
def test_length_parse(text, kind, a, b):
    s = LengthSpec.parse(text)
    assert (s.kind, s.a, s.b) == (kind, a, b)
    assert LengthSpec.parse(str(s)) == s


@pytest.mark.parametrize("bad", ["", "abc", "0", "-5", "10:-1", "9-3", "5:2:1", "1.5"])
def test_length_parse_rejects(bad):
    with pytest.raises(ValueError):
        LengthSpec.parse(bad)


def test_normal_lengths_clipped_to_one():
    xs = LengthSpec.parse("2:50").sample(np.random.default_rng(0), 2000)
    assert xs.min() == 1 and (xs == 1).sum() > 500  # many draws were negative


def test_uniform_lengths_cover_both_ends():
    xs = LengthSpec.parse("3-5").sample(np.random.default_rng(0), 500)
    assert set(xs.tolist()) == {3, 4, 5}


def test_same_seed_same_workload_other_seed_differs():
    a, b, c = build_workload(spec()), build_workload(spec()), build_workload(spec(seed=1))
    assert a == b
    assert [r.prompt for r in a] != [r.prompt for r in c]
    assert [r.arrival_s for r in a] != [r.arrival_s for r in c]


def test_token_ids_in_range_and_lengths_as_asked():
    reqs = build_workload(spec(token_range=(100, 110), output_len=LengthSpec.parse("7")))
    ids = {t for r in reqs for t in r.prompt}
    assert ids <= set(range(100, 110)) and len(ids) > 5
    assert all(r.max_tokens == 7 for r in reqs)
    assert len({len(r.prompt) for r in reqs}) > 5  # normal lengths vary


def test_shared_prefix():
    reqs = build_workload(spec(prompt_len=LengthSpec.parse("40"), shared_prefix=32))
    assert len({r.prompt[:32] for r in reqs}) == 1
    assert len({r.prompt[32:] for r in reqs}) == len(reqs)
    assert all(len(r.prompt) == 40 for r in reqs)
    short = build_workload(spec(prompt_len=LengthSpec.parse("10"), shared_prefix=32))
    assert all(len(r.prompt) == 33 for r in short)  # prefix + at least one own token


def test_poisson_interarrival_mean_is_one_over_rate():
    t = arrival_times(20_001, 4.0, "poisson", np.random.default_rng(0))
    gaps = np.diff(t)
    assert t[0] == 0 and (gaps >= 0).all()
    assert gaps.mean() == pytest.approx(0.25, rel=0.03)
    assert gaps.std() == pytest.approx(0.25, rel=0.05)  # exponential: std == mean


def test_fixed_arrivals_are_evenly_spaced():
    t = arrival_times(5, 2.0, "fixed", np.random.default_rng(0))
    assert t.tolist() == [0.0, 0.5, 1.0, 1.5, 2.0]


def test_infinite_rate_sends_all_at_once():
    assert build_workload(spec(rate=math.inf))[-1].arrival_s == 0.0


def test_at_rate_keeps_prompts_and_scales_arrivals():
    slow, fast = build_workload(spec(rate=1.0)), build_workload(spec().at_rate(2.0))
    assert [r.prompt for r in slow] == [r.prompt for r in fast]
    assert [r.arrival_s / 2 for r in slow] == pytest.approx([r.arrival_s for r in fast])


@pytest.mark.parametrize("kw", [
    {"num_requests": 0}, {"rate": 0.0}, {"arrivals": "burst"}, {"shared_prefix": -1},
    {"token_range": (5, 5)},
])
def test_spec_validation(kw):
    with pytest.raises(ValueError):
        spec(**kw)


def test_sweep_rates_get_fresh_prompts_unless_asked_to_repeat(tmp_path):
    from splitserve.bench.client import Target
    from splitserve.bench.runner import BenchConfig, rate_workload
    from splitserve.bench.stats import SLO

    def prompts(fresh: bool, i: int) -> list[list[int]]:
        cfg = BenchConfig(Target("http://127.0.0.1:1/v1", "m"), spec(rate=1.0), SLO(1000, 100),
                          tmp_path, sweep_rates=(1.0, 2.0), fresh_prompts=fresh)
        return [list(r.prompt) for r in build_workload(rate_workload(cfg, 2.0, i))]

    assert prompts(False, 0) == prompts(False, 1)
    assert prompts(True, 0) != prompts(True, 1)
    first = {tuple(p) for p in prompts(True, 0)}
    assert not first & {tuple(p) for p in prompts(True, 1)}  # no prompt repeats across rates
