"""The built-in tiny model: a small Llama-architecture checkpoint made deterministically.

`build_tiny_model(out)` writes `config.json`, `model.safetensors`, `tokenizer.json` and
`tokenizer_config.json` (with a chat template). The same version on any machine writes
byte-identical files: weights come from NumPy's PCG64 generator (platform-independent), the
tokenizer is a byte-level BPE trained on the corpus shipped next to this file, and every JSON file
is written with sorted keys.

Random weights at the usual init scale give one repeated token for every prompt, so a parity
test could never fail. The weights here are drawn at a larger scale, which makes greedy
continuations depend on the prompt; the end-of-sequence row of the output head is zeroed so
that generations run to `max_tokens` unless a stop condition is asked for.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from importlib import resources
from pathlib import Path

import numpy as np

TINY_MODEL_NAME = "splitserve-tiny"
TINY_MODEL_VERSION = 1  # bump when anything below changes the bytes written

VOCAB_SIZE = 512
HIDDEN = 128
INTERMEDIATE = 384
LAYERS = 4
HEADS = 4
KV_HEADS = 2
HEAD_DIM = HIDDEN // HEADS
MAX_POSITIONS = 2048
SEED = 20261202
# Std of every weight matrix. 0.02 (the usual init) collapses to one token; this keeps logits
# spread wide enough that the argmax changes with the context.
WEIGHT_STD = 0.5

SPECIAL_TOKENS = ["<s>", "</s>", "<|system|>", "<|user|>", "<|assistant|>", "<|end|>"]
BOS, EOS = "<s>", "</s>"
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}<|end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)


def default_tiny_model_dir(variant: int = 0) -> Path:
    """Where `serve` builds the tiny model (weight `variant`) when the config names none (per
    user cache)."""
    root = Path(os.environ.get("SPLITSERVE_CACHE", Path.home() / ".cache" / "splitserve"))
    suffix = f"-w{variant}" if variant else ""
    return root / "models" / f"{TINY_MODEL_NAME}-v{TINY_MODEL_VERSION}{suffix}"


def _train_tokenizer():  # -> tokenizers.Tokenizer
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    corpus = resources.files("splitserve.models").joinpath("corpus.txt").read_text()
    tok.train_from_iterator(corpus.splitlines(), trainer=trainer)
    bos_id = tok.token_to_id(BOS)
    tok.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A", pair=f"{BOS} $A {BOS} $B", special_tokens=[(BOS, bos_id)]
    )
    return tok


def _weights(bos_id: int, eos_id: int, variant: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.Generator(np.random.PCG64(SEED + variant))

    def mat(rows: int, cols: int) -> np.ndarray:
        return (rng.standard_normal((rows, cols)) * WEIGHT_STD).astype(np.float32)

    w: dict[str, np.ndarray] = {"model.embed_tokens.weight": mat(VOCAB_SIZE, HIDDEN)}
    for i in range(LAYERS):
        p = f"model.layers.{i}."
        w[p + "self_attn.q_proj.weight"] = mat(HEADS * HEAD_DIM, HIDDEN)
        w[p + "self_attn.k_proj.weight"] = mat(KV_HEADS * HEAD_DIM, HIDDEN)
        w[p + "self_attn.v_proj.weight"] = mat(KV_HEADS * HEAD_DIM, HIDDEN)
        w[p + "self_attn.o_proj.weight"] = mat(HIDDEN, HEADS * HEAD_DIM)
        w[p + "mlp.gate_proj.weight"] = mat(INTERMEDIATE, HIDDEN)
        w[p + "mlp.up_proj.weight"] = mat(INTERMEDIATE, HIDDEN)
        w[p + "mlp.down_proj.weight"] = mat(HIDDEN, INTERMEDIATE)
        w[p + "input_layernorm.weight"] = np.ones(HIDDEN, np.float32)
        w[p + "post_attention_layernorm.weight"] = np.ones(HIDDEN, np.float32)
    w["model.norm.weight"] = np.ones(HIDDEN, np.float32)
    head = mat(VOCAB_SIZE, HIDDEN)
    head[[bos_id, eos_id]] = 0.0  # logit 0 is far below the usual max: no early stop, no BOS
    w["lm_head.weight"] = head
    return w


def _model_config(bos_id: int, eos_id: int) -> dict:
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": VOCAB_SIZE,
        "hidden_size": HIDDEN,
        "intermediate_size": INTERMEDIATE,
        "num_hidden_layers": LAYERS,
        "num_attention_heads": HEADS,
        "num_key_value_heads": KV_HEADS,
        "head_dim": HEAD_DIM,
        "hidden_act": "silu",
        "max_position_embeddings": MAX_POSITIONS,
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "attention_bias": False,
        "mlp_bias": False,
        "tie_word_embeddings": False,
        "torch_dtype": "float32",
        "bos_token_id": bos_id,
        "eos_token_id": eos_id,
    }


def _tokenizer_config() -> dict:
    return {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": BOS,
        "eos_token": EOS,
        "pad_token": EOS,
        "model_max_length": MAX_POSITIONS,
        "chat_template": CHAT_TEMPLATE,
        "clean_up_tokenization_spaces": False,
    }


def _write_json(path: Path, obj: dict) -> None:
    path.write_text(json.dumps(obj, indent=2, sort_keys=True) + "\n")


def build_tiny_model(
    out: str | Path | None = None, *, force: bool = False, variant: int = 0
) -> Path:
    """Write the tiny model into `out` (default: the user cache) and return its directory.

    `variant` 0 is the built-in model; another number draws other weights from another seed
    (same architecture and tokenizer): a second model with different outputs.

    Idempotent: an existing complete build is left alone unless `force`. The directory appears
    atomically (built in a temporary sibling, then renamed), so concurrent callers on one machine
    never see a half-written model.
    """
    from safetensors.numpy import save_file

    out = Path(out) if out is not None else default_tiny_model_dir(variant)
    if (out / "model.safetensors").exists() and not force:
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}-", dir=out.parent))
    try:
        tok = _train_tokenizer()
        bos_id, eos_id = tok.token_to_id(BOS), tok.token_to_id(EOS)
        tok.save(str(tmp / "tokenizer.json"), pretty=True)
        _write_json(tmp / "tokenizer_config.json", _tokenizer_config())
        _write_json(tmp / "config.json", _model_config(bos_id, eos_id))
        _write_json(
            tmp / "generation_config.json", {"bos_token_id": bos_id, "eos_token_id": eos_id}
        )
        save_file(
            _weights(bos_id, eos_id, variant), str(tmp / "model.safetensors"),
            metadata={"format": "pt"},
        )
        tmp.chmod(0o755)
        for f in tmp.iterdir():
            f.chmod(0o644)
        if out.exists():
            shutil.rmtree(out)
        try:
            os.replace(tmp, out)
        except OSError:
            if not (out / "model.safetensors").exists():
                raise
            shutil.rmtree(tmp)  # another process finished the same build first
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out
