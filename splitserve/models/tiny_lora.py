"""A tiny LoRA adapter for the built-in tiny model, written directly in PEFT's file format.

`build_tiny_lora(out, seed=1)` writes `adapter_config.json` and `adapter_model.safetensors`
(the two files vLLM's LoRA loader reads) with rank-`rank` A/B matrices on the attention
projections of every layer. Deterministic: the same seed writes the same bytes. The B matrices
are drawn large enough that greedy continuations change, so a test can tell that the adapter
was applied (and applied the same way) from the token ids.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from splitserve.models import tiny

TARGET_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj")
LORA_STD = 0.5  # std of A and B; alpha / rank = 1, so the delta is of the order of the weights


def _shapes() -> dict[str, tuple[int, int]]:
    """(out, in) of each targeted projection."""
    q = tiny.HEADS * tiny.HEAD_DIM
    kv = tiny.KV_HEADS * tiny.HEAD_DIM
    return {"q_proj": (q, tiny.HIDDEN), "k_proj": (kv, tiny.HIDDEN),
            "v_proj": (kv, tiny.HIDDEN), "o_proj": (tiny.HIDDEN, q)}


def build_tiny_lora(out: str | Path, *, seed: int = 1, rank: int = 8) -> Path:
    """Write a LoRA adapter for the tiny model into `out` and return the directory."""
    from safetensors.numpy import save_file

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    rng = np.random.Generator(np.random.PCG64(seed))
    tensors: dict[str, np.ndarray] = {}
    for layer in range(tiny.LAYERS):
        for name, (rows, cols) in _shapes().items():
            prefix = f"base_model.model.model.layers.{layer}.self_attn.{name}"
            a = rng.standard_normal((rank, cols)) * LORA_STD
            b = rng.standard_normal((rows, rank)) * LORA_STD
            tensors[f"{prefix}.lora_A.weight"] = a.astype(np.float32)
            tensors[f"{prefix}.lora_B.weight"] = b.astype(np.float32)
    save_file(tensors, str(out / "adapter_model.safetensors"), metadata={"format": "pt"})
    config = {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "r": rank,
        "lora_alpha": rank,
        "lora_dropout": 0.0,
        "bias": "none",
        "fan_in_fan_out": False,
        "target_modules": list(TARGET_MODULES),
        "base_model_name_or_path": tiny.TINY_MODEL_NAME,
        "inference_mode": True,
    }
    (out / "adapter_config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    return out
