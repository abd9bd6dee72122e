"""The multi-turn routing comparison's configurations and tables (pure: no Ray, no network).

Four configurations of one deployment, differing only in how the routed pool chooses a replica
and whether engines keep a second KV tier:

    round_robin      replicas in turn
    prefix_aware     the router's approximate index (what it sent where)
    kv_events        the index built from the engines' KV events
    kv_events+tier   the same, with a KV tier in host memory (`kv_tier.medium: cpu`, of
                     `tier_gib` GiB per engine)

`check_configurations` applies each one's overrides to the base config; one that does not
validate (a policy or section this build does not have yet) is reported as skipped with the
config's own message instead of failing the run. `combine` pools every round's turns per
configuration; the issue's figure is `ttft_ratio(..., "kv_events+tier", "round_robin")`
(goal <= 1/3).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from splitserve.config import SplitserveConfig

CONFIGURATIONS: dict[str, dict[str, Any]] = {
    "round_robin": {"policy": "round_robin"},
    "prefix_aware": {"policy": "prefix_aware"},
    "kv_events": {"policy": "kv_events"},
    "kv_events+tier": {"policy": "kv_events", "kv_tier.medium": "cpu"},
}
GOAL = ("kv_events+tier", "round_robin")  # the ratio of mean TTFT, goal <= 1/3


def configuration_overrides(
    name: str, pool: str, block_size: int, tier_gib: float
) -> dict[str, Any]:
    """Dotted config overrides of configuration `name` with routing in `pool` (`block_size`:
    prefix_aware's hashed block, the engine's KV block; `tier_gib`: a tier's host memory per
    engine)."""
    spec = dict(CONFIGURATIONS[name])
    policy = spec.pop("policy")
    out: dict[str, Any] = {f"router.routing.{pool}": policy, **spec}
    if policy == "prefix_aware":
        out["router.routing.block_size"] = block_size
    if "kv_tier.medium" in spec:
        out["kv_tier.size_gib"] = tier_gib
    return out


def check_configurations(
    base: SplitserveConfig, names: Sequence[str], pool: str, block_size: int, tier_gib: float
) -> tuple[dict[str, SplitserveConfig], dict[str, str]]:
    """(configs that validate, by name; reasons for the others, by name)."""
    ok: dict[str, SplitserveConfig] = {}
    skipped: dict[str, str] = {}
    for name in names:
        overrides = configuration_overrides(name, pool, block_size, tier_gib)
        try:
            ok[name] = base.with_overrides(**overrides)
        except ValueError as err:  # ConfigError and pydantic's ValidationError
            skipped[name] = " ".join(str(err).split())[:300]
    return ok, skipped


def combine(runs: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """One configuration's rounds (each a `run` dict with `ttft_ms_all`, a list of TTFTs, and
    `cache`, `engine_cache_delta`-shaped) pooled: TTFT mean/p90 over every turn of every round,
    the engines' hit rate over all rounds, and each round's mean for the spread."""
    from splitserve.bench.stats import percentiles

    ttfts = [x for r in runs for x in r["ttft_ms_all"]]
    follow = [x for r in runs for x in r["ttft_ms_follow_up"]]
    hits = sum(r["cache"]["hit_tokens"] for r in runs)
    queried = sum(r["cache"]["queried_tokens"] for r in runs)
    loaded = sum(n for r in runs for n in r["cache"].get("loaded_tokens", {}).values())
    return {
        "rounds": len(runs),
        "turns": len(ttfts),
        "failed": sum(r["failed"] for r in runs),
        "ttft_ms": percentiles(ttfts),
        "ttft_follow_up_ms": percentiles(follow),
        "round_mean_ttft_ms": [r["ttft_ms"]["mean"] for r in runs],
        "hit_rate": hits / queried if queried else None,
        # prompt tokens a KV connector (the tier, colocated) supplied: part of neither hits
        # nor computed tokens in the engine's own prefix-cache counters
        "loaded_rate": loaded / queried if queried else None,
    }


def ttft_ratio(combined: Mapping[str, Mapping[str, Any]], num: str, den: str) -> float | None:
    """Mean TTFT of configuration `num` over that of `den`; None when either is missing."""
    a, b = combined.get(num), combined.get(den)
    if not a or not b or a["ttft_ms"]["mean"] is None or not b["ttft_ms"]["mean"]:
        return None
    return a["ttft_ms"]["mean"] / b["ttft_ms"]["mean"]


def _ms(x: float | None) -> str:
    return "-" if x is None else f"{x:.1f}"


def format_comparison(
    combined: Mapping[str, Mapping[str, Any]], skipped: Mapping[str, str]
) -> str:
    """The table: per configuration TTFT mean/p90 (all turns, follow-up turns), hit rate, the
    per-round means, then the ratios to round_robin and the skipped configurations."""
    header = (f"{'configuration':<16}{'turns':>6}{'failed':>7}{'TTFT mean':>10}{'p90':>8}"
              f"{'follow-up mean':>15}{'p90':>8}{'hit rate':>10}{'from tier':>10}"
              "  per-round mean TTFT")
    lines = [header]
    for name, c in combined.items():
        hit = "-" if c["hit_rate"] is None else f"{c['hit_rate']:.1%}"
        tier = "-" if c.get("loaded_rate") is None else f"{c['loaded_rate']:.1%}"
        rounds = " ".join(_ms(x) for x in c["round_mean_ttft_ms"])
        lines.append(
            f"{name:<16}{c['turns']:>6}{c['failed']:>7}{_ms(c['ttft_ms']['mean']):>10}"
            f"{_ms(c['ttft_ms']['p90']):>8}{_ms(c['ttft_follow_up_ms']['mean']):>15}"
            f"{_ms(c['ttft_follow_up_ms']['p90']):>8}{hit:>10}{tier:>10}  {rounds}"
        )
    for name in combined:
        if name != "round_robin":
            r = ttft_ratio(combined, name, "round_robin")
            if r is not None:
                goal = "  (issue 28 goal: <= 0.333)" if name == GOAL[0] else ""
                lines.append(f"mean TTFT {name} / round_robin: {r:.3f}{goal}")
    lines += [f"skipped {name}: {why}" for name, why in skipped.items()]
    return "\n".join(lines)
