"""Workload generation: seeded prompts of token ids and their arrival times (pure, no I/O).

Length syntax (`--prompt-len`, `--output-len`):

    512        every request has 512 tokens
    512:128    normal distribution, mean 512, standard deviation 128, rounded, clipped to >= 1
    256-768    uniform over the integers 256..768, both ends included

Prompts and arrivals come from two numpy Generators derived from one seed: the same seed at
another rate (`at_rate`) gives the same prompts, with Poisson arrivals keeping their shape (only
scaled). A sweep gives each rate its own seed unless told to repeat the prompts
(`BenchConfig.fresh_prompts`), so that no rate is served from an earlier rate's prefix cache.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import numpy as np

Arrivals = Literal["poisson", "fixed"]
# The tiny model's vocabulary has 512 ids; the lowest ids are special and byte tokens.
DEFAULT_TOKEN_RANGE = (10, 500)


@dataclass(frozen=True)
class LengthSpec:
    """A distribution of token counts: constant, normal (mean:std) or uniform (low-high)."""

    kind: Literal["constant", "normal", "uniform"]
    a: int
    b: float = 0.0

    @classmethod
    def parse(cls, text: str) -> LengthSpec:
        """`512`, `512:128` or `256-768` (see the module docstring); ValueError otherwise."""
        s = text.strip()
        try:
            if ":" in s:
                mean, std = s.split(":")
                spec = cls("normal", int(mean), float(std))
            elif "-" in s[1:]:
                low, high = s.split("-")
                spec = cls("uniform", int(low), float(int(high)))
            else:
                spec = cls("constant", int(s))
        except ValueError:
            raise ValueError(f"bad length {text!r}: use N, MEAN:STD or LOW-HIGH") from None
        spec.check()
        return spec

    def check(self) -> None:
        """Raise ValueError when the distribution cannot give lengths >= 1."""
        if self.a < 1:
            raise ValueError(f"length {self} must be >= 1")
        if self.kind == "normal" and self.b < 0:
            raise ValueError(f"length {self}: standard deviation must be >= 0")
        if self.kind == "uniform" and self.b < self.a:
            raise ValueError(f"length {self}: high must be >= low")

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        """`n` lengths, each an int >= 1."""
        if self.kind == "constant":
            return np.full(n, self.a, dtype=np.int64)
        if self.kind == "uniform":
            return rng.integers(self.a, int(self.b) + 1, size=n, dtype=np.int64)
        drawn = np.rint(rng.normal(self.a, self.b, size=n)).astype(np.int64)
        return np.maximum(drawn, 1)

    @property
    def mean(self) -> float:
        """The distribution's nominal mean (before clipping)."""
        return (self.a + self.b) / 2 if self.kind == "uniform" else float(self.a)

    def __str__(self) -> str:
        if self.kind == "normal":
            return f"{self.a}:{self.b:g}"
        if self.kind == "uniform":
            return f"{self.a}-{int(self.b)}"
        return str(self.a)


@dataclass(frozen=True)
class WorkloadSpec:
    """What to send: how many requests, how long, how often; the seed fixes all of it."""

    num_requests: int
    prompt_len: LengthSpec
    output_len: LengthSpec
    rate: float  # requests per second; math.inf sends every request at once
    arrivals: Arrivals = "poisson"
    shared_prefix: int = 0  # every prompt starts with the same ids
    token_range: tuple[int, int] = DEFAULT_TOKEN_RANGE  # ids drawn from [low, high)
    seed: int = 0

    def __post_init__(self) -> None:
        if self.num_requests < 1:
            raise ValueError("num_requests must be >= 1")
        if not self.rate > 0:
            raise ValueError("rate must be > 0 (inf: all at once)")
        if self.arrivals not in ("poisson", "fixed"):
            raise ValueError(f"arrivals must be poisson or fixed, not {self.arrivals!r}")
        if self.shared_prefix < 0:
            raise ValueError("shared_prefix must be >= 0")
        low, high = self.token_range
        if not 0 <= low < high:
            raise ValueError(f"token_range {self.token_range} must satisfy 0 <= low < high")

    def at_rate(self, rate: float) -> WorkloadSpec:
        """The same workload (same prompts) at another request rate."""
        return WorkloadSpec(**{**self.__dict__, "rate": rate})


@dataclass(frozen=True)
class BenchRequest:
    """One request of a workload: when to send it and what to ask for."""

    index: int
    arrival_s: float  # offset from the start of the run
    prompt: tuple[int, ...]
    max_tokens: int


def arrival_times(n: int, rate: float, arrivals: Arrivals, rng: np.random.Generator) -> np.ndarray:
    """Send offsets in seconds, the first at 0: exponential gaps of mean 1/rate, or fixed gaps."""
    if math.isinf(rate):
        return np.zeros(n)
    if arrivals == "fixed":
        gaps = np.full(n - 1, 1.0 / rate)
    else:
        gaps = rng.standard_exponential(n - 1) / rate
    return np.concatenate([[0.0], np.cumsum(gaps)])


def build_prompts(spec: WorkloadSpec) -> list[tuple[int, ...]]:
    """The prompts: a shared prefix (if any) then random ids; total length >= prefix + 1."""
    rng = np.random.default_rng([spec.seed, 0])
    low, high = spec.token_range
    prefix = rng.integers(low, high, size=spec.shared_prefix, dtype=np.int64)
    lengths = spec.prompt_len.sample(rng, spec.num_requests)
    prompts = []
    for length in lengths:
        tail = rng.integers(low, high, size=max(int(length) - spec.shared_prefix, 1))
        prompts.append(tuple(int(t) for t in np.concatenate([prefix, tail])))
    return prompts


def build_workload(spec: WorkloadSpec) -> list[BenchRequest]:
    """The whole workload, in send order; identical for identical specs."""
    prompts = build_prompts(spec)
    out_rng = np.random.default_rng([spec.seed, 1])
    outputs = spec.output_len.sample(out_rng, spec.num_requests)
    arrival_rng = np.random.default_rng([spec.seed, 2])
    times = arrival_times(spec.num_requests, spec.rate, spec.arrivals, arrival_rng)
    return [
        BenchRequest(i, float(times[i]), prompts[i], int(outputs[i]))
        for i in range(spec.num_requests)
    ]
