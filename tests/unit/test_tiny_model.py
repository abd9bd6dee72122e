"""splitserve.models.tiny: the built-in tiny model is deterministic, idempotent and loadable."""

from __future__ import annotations

import hashlib
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from splitserve.models.tiny import build_tiny_model

EXPECTED_FILES = {
    "config.json",
    "generation_config.json",
    "model.safetensors",
    "tokenizer.json",
    "tokenizer_config.json",
}


def _hashes(d: Path) -> dict[str, str]:
    return {f.name: hashlib.sha256(f.read_bytes()).hexdigest() for f in sorted(d.iterdir())}


def test_build_writes_expected_files(tiny_model_dir: Path) -> None:
    assert {f.name for f in tiny_model_dir.iterdir()} == EXPECTED_FILES


def test_two_builds_are_byte_identical(tmp_path: Path) -> None:
    a = build_tiny_model(tmp_path / "a")
    b = build_tiny_model(tmp_path / "b")
    ha, hb = _hashes(a), _hashes(b)
    assert set(ha) == EXPECTED_FILES
    assert ha == hb


def test_fresh_interpreter_build_is_byte_identical(tmp_path: Path, tiny_model_dir: Path) -> None:
    out = tmp_path / "sub"
    env = dict(os.environ, PYTHONHASHSEED="12345")
    subprocess.run(
        [sys.executable, "-c", "import sys; from splitserve.models.tiny import build_tiny_model; "
         "build_tiny_model(sys.argv[1])", str(out)],
        check=True,
        env=env,
        timeout=120,
    )
    assert _hashes(out) == _hashes(tiny_model_dir)


def test_build_is_idempotent(tmp_path: Path) -> None:
    out = build_tiny_model(tmp_path / "m")
    weights = out / "model.safetensors"
    os.utime(weights, ns=(1_000_000_000, 1_000_000_000))
    assert build_tiny_model(out) == out
    assert weights.stat().st_mtime_ns == 1_000_000_000


def test_force_rebuilds(tmp_path: Path) -> None:
    out = build_tiny_model(tmp_path / "m")
    before = _hashes(out)
    weights = out / "model.safetensors"
    os.utime(weights, ns=(1_000_000_000, 1_000_000_000))
    (out / "stray.txt").write_text("left over")
    assert build_tiny_model(out, force=True) == out
    assert weights.stat().st_mtime_ns != 1_000_000_000
    assert not (out / "stray.txt").exists()
    assert _hashes(out) == before


def test_incomplete_dir_is_rebuilt(tmp_path: Path) -> None:
    out = tmp_path / "m"
    out.mkdir()
    (out / "config.json").write_text("{}")
    build_tiny_model(out)
    assert {f.name for f in out.iterdir()} == EXPECTED_FILES


def test_no_temp_dirs_left_behind(tmp_path: Path) -> None:
    build_tiny_model(tmp_path / "m")
    build_tiny_model(tmp_path / "m", force=True)
    assert [p.name for p in tmp_path.iterdir()] == ["m"]


def test_files_world_readable(tiny_model_dir: Path) -> None:
    assert stat.S_IMODE(tiny_model_dir.stat().st_mode) & 0o555 == 0o555
    for f in tiny_model_dir.iterdir():
        assert stat.S_IMODE(f.stat().st_mode) & 0o444 == 0o444, f.name


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir: Path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(tiny_model_dir))


def test_tokenizer_special_tokens(tokenizer) -> None:
    assert tokenizer.bos_token == "<s>"
    assert tokenizer.eos_token == "</s>"
    assert len(tokenizer) == 512


def test_tokenizer_encodes_bos_first(tokenizer) -> None:
    ids = tokenizer("hello world")["input_ids"]
    assert ids[0] == tokenizer.bos_token_id
    assert ids.count(tokenizer.bos_token_id) == 1
    assert len(ids) > 2
    assert tokenizer.decode(ids, skip_special_tokens=True) == "hello world"


def test_chat_template_ends_with_generation_prompt(tokenizer) -> None:
    text = tokenizer.apply_chat_template(
        [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}],
        add_generation_prompt=True,
        tokenize=False,
    )
    assert text == "<s><|system|>\nbe brief<|end|>\n<|user|>\nhi<|end|>\n<|assistant|>\n"
    assert text.endswith("<|assistant|>\n")


def test_model_config_matches_tokenizer(tiny_model_dir: Path, tokenizer) -> None:
    import json

    cfg = json.loads((tiny_model_dir / "config.json").read_text())
    assert cfg["architectures"] == ["LlamaForCausalLM"]
    assert cfg["vocab_size"] == 512
    assert cfg["bos_token_id"] == tokenizer.bos_token_id
    assert cfg["eos_token_id"] == tokenizer.eos_token_id
