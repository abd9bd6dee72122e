"""Parallelism planner: TP, PP and replicas per pool for a request rate under TTFT/TPOT SLOs.

A DistServe-style search (OSDI '24, Alg. 1): for each pool, enumerate intra-op (TP, inside one
node) and inter-op (PP, across nodes; colocated pools only, since vLLM 0.32's NIXL connector
refuses PP) parallelism, predict each candidate's goodput per device with the roofline cost
model of `profiles.ReplicaCost`, and replicate the cheapest candidate to the target rate. The
first-order check is the capacity formula (memory = weights + concurrency x per-request KV);
queueing turns per-request latency into a p90. A remote prefill's KV handoff is priced over the
config's `kv_transfer.fabric` (`profiles.kv_fabric_link`).

    plan = plan_deployment(shape, acc, workload, slo, mode="disaggregated")
    print(format_plan(plan))

Pure: no Ray, no vLLM. `PlanError` means no plan exists, with a message that says why.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from splitserve.controller.profiles import AcceleratorProfile, ModelShape, ReplicaCost

# The p90 of a queue's waiting time, approximated as an exponential tail with the M/D/1 mean:
# P(W > w) = exp(-w / mean) gives p90 = ln(10) x mean.
P90_WAIT_FACTOR = math.log(10)
# Highest planned prefill utilization: M/D/1 waiting grows as 1/(1-rho); above ~0.8 a burst
# inside one control period already breaks the TTFT SLO.
MAX_PREFILL_UTILIZATION = 0.8
# Share of the TPOT SLO a planned decode step may use: step time grows with context length
# inside the batch and with batch jitter, so 10% is held back.
TPOT_HEADROOM = 0.9
# Fraction of the SLO-limited decode batch planned as steady concurrency: in-flight requests
# fluctuate (Poisson arrivals, varied output lengths); 15% absorbs that without queueing.
DECODE_FILL = 0.85
# Largest decode batch considered: vLLM's CUDA-graph capture sizes stop at 512 sequences.
MAX_DECODE_BATCH = 512
# How many nodes one replica may span with PP when the cluster size is not given: beyond 4,
# pipeline bubbles and cross-node hops dominate (DistServe searches PP up to the node count).
MAX_REPLICA_NODES = 4
MAX_SEARCH_REPLICAS = 100_000  # a search bound, not a policy: a plan this large is refused
MAX_NOTES = 4  # runners-up shown by `format_plan`


# Coefficient of variation of output lengths. Chat traces (ShareGPT-like) have 0.6-1; the
# simulator's traces have ~0.95. It matters because the sequences in flight are length-biased:
# a long output stays in the batch longer, so in-flight sequences average E[o^2]/E[o] =
# mean x (1 + CV^2) output tokens, not the mean.
OUTPUT_CV = 0.9


@dataclass(frozen=True)
class Workload:
    """What the plan is sized for: arrival rate and mean prompt / output lengths."""

    rate: float
    prompt_tokens: int = 1024
    output_tokens: int = 256
    output_cv: float = OUTPUT_CV

    def __post_init__(self) -> None:
        if self.rate <= 0 or self.prompt_tokens < 1 or self.output_tokens < 1:
            raise ValueError("workload: rate, prompt_tokens and output_tokens must be positive")

    @property
    def inflight_output(self) -> float:
        """Mean output length of the sequences in flight (length-biased)."""
        return self.output_tokens * (1 + self.output_cv**2)

    @property
    def inflight_kv_tokens(self) -> int:
        """KV one in-flight sequence reserves: its prompt and its whole (biased) output."""
        return math.ceil(self.prompt_tokens + self.inflight_output)

    @property
    def inflight_context(self) -> float:
        """Mean context of an in-flight sequence: prompt + half its (biased) output."""
        return self.prompt_tokens + self.inflight_output / 2


@dataclass(frozen=True)
class Slo:
    """Latency targets in seconds (p90 TTFT, mean TPOT per request)."""

    ttft_s: float
    tpot_s: float


@dataclass(frozen=True)
class PoolPlan:
    """One pool's plan and the figures that justify it."""

    role: str  # "prefill" | "decode" | "colocated"
    tp: int
    pp: int
    replicas: int
    weights_gib: float  # per device
    kv_gib: float  # per device, after weights
    max_concurrency: int  # requests whose whole KV fits one replica
    batch: float  # planned in-flight requests per replica (decode / colocated)
    ttft_s: float | None  # predicted p90 TTFT contribution (prefill / colocated)
    tpot_s: float | None  # predicted TPOT (decode / colocated)
    utilization: float  # planned busy fraction (prefill) or batch fill (decode)
    capacity: float  # per replica at the SLO: prompt tokens/s (prefill), sequences (decode)
    out_tokens_per_s: float = 0.0  # per replica at `capacity` sequences (decode / colocated)
    handoff_s: float = 0.0  # predicted KV handoff of one prompt, in ttft_s (prefill)

    @property
    def devices(self) -> int:
        """Devices the whole pool holds."""
        return self.tp * self.pp * self.replicas


@dataclass(frozen=True)
class Plan:
    """A whole deployment plan: pools, the request it was sized for, rejected alternatives."""

    model: str
    accelerator: str
    mode: str
    workload: Workload
    slo: Slo
    pools: tuple[PoolPlan, ...]
    alternatives: tuple[str, ...]

    @property
    def devices(self) -> int:
        """Devices of all pools together."""
        return sum(p.devices for p in self.pools)

    def pool(self, role: str) -> PoolPlan:
        """The plan of pool `role`."""
        return next(p for p in self.pools if p.role == role)


class PlanError(ValueError):
    """No plan satisfies memory, SLO or cluster-size constraints; the message says which."""


@dataclass(frozen=True)
class Cluster:
    """Where replicas can go: the device kind and, optionally, how many nodes exist."""

    acc: AcceleratorProfile
    nodes: int | None = None
    memory_utilization: float = 0.9
    kv_cache_bytes: float | None = None  # fixed KV budget per device (CPU engines)

    @property
    def max_replica_devices(self) -> int:
        """The most devices one replica may hold (TP inside a node, PP across nodes)."""
        return self.acc.devices_per_node * (self.nodes or MAX_REPLICA_NODES)


def _pow2_upto(n: int) -> list[int]:
    return [1 << i for i in range(n.bit_length()) if (1 << i) <= n]


def candidates(shape: ModelShape, cluster: Cluster, mode: str) -> list[ReplicaCost]:
    """Every (TP, PP) worth evaluating: TP a power of two dividing the heads, inside one node;
    PP a power of two up to the layer count, with TP x PP inside the replica span (PP 1 where
    the engine has no PP on that device, and for the pools of a disaggregated deployment:
    vLLM 0.32's NIXL connector refuses PP, `kv_transfer.compat.nixl_pp_problems`)."""
    out = []
    pipeline = cluster.acc.pipeline_parallel and mode == "colocated"
    for tp in _pow2_upto(cluster.acc.devices_per_node):
        if shape.heads % tp:
            continue
        max_pp = cluster.max_replica_devices // tp if pipeline else 1
        for pp in _pow2_upto(min(shape.layers, max_pp)):
            out.append(ReplicaCost(shape, cluster.acc, tp, pp, cluster.memory_utilization,
                                   cluster.kv_cache_bytes))
    return out


def _pool_plan(role: str, c: ReplicaCost, replicas: int, per_request_tokens: int,
               **figures: float | None) -> PoolPlan:
    return PoolPlan(
        role=role, tp=c.tp, pp=c.pp, replicas=replicas,
        weights_gib=c.weights_per_device / 2**30, kv_gib=max(0.0, c.kv_per_device) / 2**30,
        max_concurrency=c.kv_capacity_tokens // per_request_tokens, **figures,
    )


def _p90_wait(service_s: float, rho: float) -> float:
    return P90_WAIT_FACTOR * rho * service_s / (2 * (1 - rho))


def plan_prefill(c: ReplicaCost, w: Workload, ttft_budget_s: float) -> PoolPlan | str:
    """The prefill pool on replicas shaped `c`, or why not. TTFT = prefill + p90 M/D/1 wait
    + KV handoff must fit `ttft_budget_s` (the SLO minus the decode pool's first step)."""
    if c.kv_capacity_tokens < w.prompt_tokens:
        return f"KV for one {w.prompt_tokens}-token prompt does not fit"
    prefill, handoff = c.prefill_s(w.prompt_tokens), c.kv_transfer_s(w.prompt_tokens)
    slack = ttft_budget_s - prefill - handoff
    if slack <= 0:
        return (f"prefill + handoff take {1e3 * (prefill + handoff):.0f} ms (handoff "
                f"{1e3 * handoff:.0f} ms) > TTFT budget")
    service = prefill / c.pp  # a pipelined replica starts a prompt every stage time
    # Largest rho with p90 wait <= slack: P90 * rho * D / (2 (1 - rho)) <= slack.
    rho_max = min(MAX_PREFILL_UTILIZATION, 2 * slack / (P90_WAIT_FACTOR * service + 2 * slack))
    per_replica = rho_max / service
    replicas = math.ceil(w.rate / per_replica - 1e-9)
    rho = w.rate * service / replicas
    ttft = prefill + _p90_wait(service, rho) + handoff
    return _pool_plan("prefill", c, replicas, w.prompt_tokens, batch=0.0, ttft_s=ttft,
                      tpot_s=None, utilization=rho, capacity=per_replica * w.prompt_tokens,
                      handoff_s=handoff)


def _max_batch(c: ReplicaCost, w: Workload, limit: int, tpot_s: float) -> int:
    """Largest batch <= limit whose step fits `tpot_s` (0: not even one sequence)."""
    ctx = w.inflight_context
    lo, hi = 0, limit
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if c.decode_step_s(mid, mid * ctx) <= tpot_s:
            lo = mid
        else:
            hi = mid - 1
    return lo


def plan_decode(c: ReplicaCost, w: Workload, slo: Slo) -> PoolPlan | str:
    """The decode pool on replicas shaped `c`, or why not: the largest batch whose step fits
    the TPOT SLO (and whose KV fits), filled to DECODE_FILL, replicated by Little's law."""
    per_request = w.inflight_kv_tokens
    fit = min(c.kv_capacity_tokens // per_request, MAX_DECODE_BATCH)
    if fit < 1:
        return f"KV for one {per_request}-token request does not fit"
    bmax = _max_batch(c, w, fit, slo.tpot_s * TPOT_HEADROOM)
    if bmax < 1:
        step = c.decode_step_s(1, w.prompt_tokens)
        return f"one decode step takes {1e3 * step:.1f} ms > TPOT budget"
    ctx = w.inflight_context
    target = bmax * DECODE_FILL
    tpot = c.decode_step_s(target, target * ctx)
    replicas = max(1, math.ceil(w.rate * w.output_tokens * tpot / target - 1e-9))
    batch = w.rate * w.output_tokens * tpot / replicas
    tpot = c.decode_step_s(batch, batch * ctx)
    out_rate = target / c.decode_step_s(target, target * ctx)
    return _pool_plan("decode", c, replicas, per_request, batch=batch, ttft_s=None, tpot_s=tpot,
                      utilization=batch / bmax, capacity=target, out_tokens_per_s=out_rate)


def _colocated_at(c: ReplicaCost, w: Workload, replicas: int) -> tuple[float, float, float, float]:
    """(rho_prefill, batch, tpot, p90 ttft) of a colocated pool of `replicas`: prefill has
    priority, so decode advances only in the (1 - rho) of the time left (DistServe's baseline).
    A colocated PP replica is not pipelined: its decode pauses for each whole prefill, so it
    starts the next prompt only after the last stage (as the simulator runs it)."""
    prefill = c.prefill_s(w.prompt_tokens)
    rho = w.rate * prefill / replicas
    if rho >= 1:
        return rho, math.inf, math.inf, math.inf
    ctx, batch, tpot = w.inflight_context, 1.0, 0.0
    for _ in range(20):  # fixed point of batch = rate x output x tpot / replicas
        tpot = c.decode_step_s(batch, batch * ctx) / (1 - rho)
        batch = max(1.0, w.rate * w.output_tokens * tpot / replicas)
    ttft = prefill + _p90_wait(prefill, rho) + tpot
    return rho, batch, tpot, ttft


def plan_colocated(c: ReplicaCost, w: Workload, slo: Slo) -> PoolPlan | str:
    """One pool doing both phases on replicas shaped `c`, or why not."""
    per_request = w.inflight_kv_tokens
    fit = min(c.kv_capacity_tokens // per_request, MAX_DECODE_BATCH)
    if fit < 1:
        return f"KV for one {per_request}-token request does not fit"
    replicas = max(1, math.ceil(w.rate * c.prefill_s(w.prompt_tokens)))
    while replicas <= MAX_SEARCH_REPLICAS:
        rho, batch, tpot, ttft = _colocated_at(c, w, replicas)
        if (rho <= MAX_PREFILL_UTILIZATION and batch <= fit * DECODE_FILL
                and tpot <= slo.tpot_s * TPOT_HEADROOM and ttft <= slo.ttft_s):
            cap = _max_batch(c, w, fit, slo.tpot_s * TPOT_HEADROOM) * DECODE_FILL
            ctx = w.inflight_context
            out_rate = cap / c.decode_step_s(cap, cap * ctx) if cap else 0.0
            return _pool_plan("colocated", c, replicas, per_request, batch=batch, ttft_s=ttft,
                              tpot_s=tpot, utilization=rho, capacity=cap, out_tokens_per_s=out_rate)
        if replicas > 1 and rho < 0.05 and batch < 2:  # more replicas no longer help
            break
        replicas = replicas + max(1, replicas // 8)
    return "no replica count meets both SLOs with prefill interference"


def _rank(role: str, p: PoolPlan) -> tuple[float, ...]:
    """Fewest devices; then most capacity per device (DistServe's goodput per GPU); then latency."""
    latency = p.ttft_s if role == "prefill" else p.tpot_s
    return (p.devices, -p.capacity / (p.tp * p.pp), latency or 0.0)


def _best(role: str, results: list[tuple[ReplicaCost, PoolPlan | str]]) -> tuple[PoolPlan, list[str]]:
    """The winning plan and one line per alternative: the runners-up, then grouped refusals."""
    plans = sorted((p for _, p in results if isinstance(p, PoolPlan)), key=lambda p: _rank(role, p))
    refused: dict[str, list[str]] = {}
    for c, p in results:
        if isinstance(p, str):
            refused.setdefault(p, []).append(f"TP{c.tp}xPP{c.pp}")
    notes = [f"{role} TP{p.tp}xPP{p.pp}: {p.replicas} x {p.tp * p.pp} = {p.devices} devices"
             + (" (chosen)" if i == 0 else "") for i, p in enumerate(plans[:MAX_NOTES])]
    notes += [f"{role} {', '.join(cs)}: {why}" for why, cs in refused.items()]
    if not plans:
        raise PlanError(f"no {role} parallelism meets the SLO:\n  " + "\n  ".join(notes))
    return plans[0], notes


def _refuse_if_unfit(shape: ModelShape, cluster: Cluster, tokens: int, mode: str) -> None:
    """PlanError when even the largest replica cannot hold the weights and one request's KV."""
    biggest = max(candidates(shape, cluster, mode),
                  key=lambda c: (c.devices, c.kv_capacity_tokens))
    if biggest.kv_capacity_tokens >= tokens:
        return
    usable = biggest.usable_per_device / 1e9
    if mode != "colocated" and cluster.acc.pipeline_parallel:
        span = ("a disaggregated replica is one node: vLLM 0.32's NIXL connector refuses "
                "pipeline parallelism; colocated mode may span nodes with PP")
    else:
        span = f"at most {cluster.nodes or MAX_REPLICA_NODES} node(s) per replica"
    raise PlanError(
        f"{shape.name} does not fit on {cluster.acc.name}: {shape.weight_bytes / 1e9:.1f} GB of "
        f"weights plus KV for one {tokens}-token request need more than the largest replica "
        f"gives: TP {biggest.tp} x PP {biggest.pp} = {biggest.devices} device(s) x {usable:.1f} GB "
        f"usable = {biggest.devices * usable:.1f} GB ({cluster.acc.devices_per_node} device(s) "
        f"per node, {span}). Use a larger accelerator, more devices or nodes, or a quantized "
        f"model."
    )


def plan_deployment(shape: ModelShape, cluster: Cluster, w: Workload, slo: Slo,
                    mode: str = "disaggregated") -> Plan:
    """The cheapest plan (fewest devices, then lowest latency) that serves `w` within `slo`.

    Raises PlanError when the model does not fit, no parallelism meets the SLO, or the plan
    needs more devices than `cluster.nodes` hold.
    """
    _refuse_if_unfit(shape, cluster, w.prompt_tokens + w.output_tokens, mode)
    cands = candidates(shape, cluster, mode)
    if mode == "colocated":
        pool, notes = _best("colocated", [(c, plan_colocated(c, w, slo)) for c in cands])
        pools: tuple[PoolPlan, ...] = (pool,)
    else:
        decode, notes = _best("decode", [(c, plan_decode(c, w, slo)) for c in cands])
        budget = slo.ttft_s - (decode.tpot_s or 0.0)  # decode computes the first token
        prefill, pnotes = _best("prefill", [(c, plan_prefill(c, w, budget)) for c in cands])
        pools, notes = (prefill, decode), pnotes + notes
    plan = Plan(shape.name, cluster.acc.name, mode, w, slo, pools, tuple(notes))
    if cluster.nodes is not None and plan.devices > cluster.nodes * cluster.acc.devices_per_node:
        raise PlanError(
            f"{w.rate:g} req/s needs {plan.devices} devices but the cluster has "
            f"{cluster.nodes * cluster.acc.devices_per_node}; lower the rate or add nodes"
        )
    return plan


def _pool_lines(p: PoolPlan) -> list[str]:
    lines = [
        f"{p.role} pool: {p.replicas} replica(s) x TP {p.tp} x PP {p.pp} = {p.devices} device(s)",
        (f"  memory per device: weights {p.weights_gib:.3g} GiB + KV {p.kv_gib:.3g} GiB "
         f"-> {p.max_concurrency} concurrent request(s) per replica"),
    ]
    if p.role == "prefill":
        lines.append(f"  predicted: p90 TTFT {1e3 * (p.ttft_s or 0):.0f} ms (prefill + queue + "
                     f"handoff {1e3 * p.handoff_s:.0f} ms) at utilization {p.utilization:.2f}; "
                     f"capacity {p.capacity:,.0f} prompt tokens/s per replica")
    else:
        ttft = f"p90 TTFT {1e3 * p.ttft_s:.0f} ms, " if p.ttft_s is not None else ""
        lines.append(f"  predicted: {ttft}TPOT {1e3 * (p.tpot_s or 0):.1f} ms at batch "
                     f"{p.batch:.1f} per replica (SLO-limited capacity {p.capacity:.0f})")
    return lines


def format_plan(plan: Plan) -> str:
    """The plan and why, as `splitserve plan` prints it."""
    w, s = plan.workload, plan.slo
    out = [
        (f"plan: {plan.model} on {plan.accelerator}, {plan.mode}, {w.rate:g} req/s, "
         f"prompt {w.prompt_tokens} / output {w.output_tokens} tokens, "
         f"SLO TTFT {1e3 * s.ttft_s:.0f} ms p90, TPOT {1e3 * s.tpot_s:.0f} ms"),
    ]
    for p in plan.pools:
        out += _pool_lines(p)
    if plan.mode != "colocated":
        ttft = (plan.pool("prefill").ttft_s or 0) + (plan.pool("decode").tpot_s or 0)
        out.append(f"end to end: p90 TTFT {1e3 * ttft:.0f} ms (incl. the first decode step)")
    out.append(f"total: {plan.devices} device(s)")
    out.append("why (fewest devices, then most capacity per device, then lowest latency):")
    out += [f"  {a}" for a in plan.alternatives]
    return "\n".join(out)


def default_accelerator(cfg) -> str:
    """The config's `accelerator.name`; else `cpu` for a CPU device or the built-in tiny
    model; else `h100-80gb`."""
    if getattr(cfg, "accelerator", None) is not None:
        return cfg.accelerator.name
    return "cpu" if cfg.device == "cpu" or cfg.model.path is None else "h100-80gb"


def config_inputs(cfg, accelerator: str | None = None, *, rate: float = 1.0,
                  prompt_tokens: int = 1024, output_tokens: int = 256, nodes: int | None = None,
                  devices_per_node: int | None = None) -> tuple[ModelShape, Cluster, Workload, Slo]:
    """What the planner needs from a `SplitserveConfig`: its model's shape, the cluster (the
    accelerator section, memory utilization and, on the CPU, the per-engine KV budget), the
    workload and the SLO. Lengths are clipped to the model's context; arguments given here
    override the config."""
    from splitserve.controller.profiles import GIB, model_shape
    from splitserve.controller.profiles import accelerator as lookup

    shape = model_shape(cfg.model.path, cfg.model.name, cfg.model.dtype)
    section = getattr(cfg, "accelerator", None)
    if section is not None:
        nodes = nodes or section.nodes
        devices_per_node = devices_per_node or section.devices_per_node
    acc = lookup(accelerator or default_accelerator(cfg)).with_node(devices_per_node)
    fabric = getattr(cfg, "kv_transfer", None)
    if fabric is not None:  # the handoff is priced over the configured fabric (TCP unless set)
        acc = acc.with_kv_fabric(fabric.fabric, fabric.bandwidth_gbps)
    output_tokens = min(output_tokens, cfg.model.max_model_len // 2)
    prompt_tokens = min(prompt_tokens, cfg.model.max_model_len - output_tokens)
    pool = cfg.pools.decode
    cluster = Cluster(acc, nodes, pool.gpu_memory_utilization,
                      pool.kv_cache_gib * GIB if acc.name == "cpu" else None)
    slo = Slo(cfg.slo.ttft_ms / 1e3, cfg.slo.tpot_ms / 1e3)
    return shape, cluster, Workload(rate, prompt_tokens, output_tokens), slo


def plan_for_config(cfg, accelerator: str | None = None, **kwargs) -> Plan:
    """`plan_deployment` for a `SplitserveConfig` (inputs as `config_inputs` reads them)."""
    shape, cluster, w, slo = config_inputs(cfg, accelerator, **kwargs)
    return plan_deployment(shape, cluster, w, slo, cfg.mode)


def apply_plan(cfg, plan: Plan):
    """`cfg` with each pool's replicas, TP and PP taken from `plan` (pure).

    A colocated plan's single pool is the config's decode pool (the one colocated mode deploys).
    """
    overrides: dict[str, int] = {}
    for pool in plan.pools:
        role = "decode" if pool.role == "colocated" else pool.role
        overrides[f"pools.{role}.replicas"] = pool.replicas
        overrides[f"pools.{role}.tensor_parallel_size"] = pool.tp
        overrides[f"pools.{role}.pipeline_parallel_size"] = pool.pp
    return cfg.with_overrides(**overrides)


def replan(plan: Plan, shape: ModelShape, cluster: Cluster, rate: float) -> Plan:
    """The same plan's parallelism re-sized for another rate (the simulator's fixed-peak and
    initial sizes): one cost evaluation per pool, no search."""
    w = replace(plan.workload, rate=rate)
    pools = []
    for p in plan.pools:
        c = ReplicaCost(shape, cluster.acc, p.tp, p.pp, cluster.memory_utilization,
                        cluster.kv_cache_bytes)
        if p.role == "prefill":
            budget = plan.slo.ttft_s - (plan.pool("decode").tpot_s or 0.0)
            new = plan_prefill(c, w, budget)
        elif p.role == "decode":
            new = plan_decode(c, w, plan.slo)
        else:
            new = plan_colocated(c, w, plan.slo)
        if isinstance(new, str):
            raise PlanError(f"{p.role} TP{p.tp} PP{p.pp} at {rate:g} req/s: {new}")
        pools.append(new)
    return replace(plan, workload=w, pools=tuple(pools))
