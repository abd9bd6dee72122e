"""splitserve.models.resolve: model.path -> something the engine can load."""

from __future__ import annotations

from pathlib import Path

import pytest

from splitserve.models.resolve import resolve_model_path


def test_none_builds_tiny_into_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPLITSERVE_CACHE", str(tmp_path))
    out = resolve_model_path(None)
    assert out == str(tmp_path / "models" / "splitserve-tiny-v1")
    assert (Path(out) / "config.json").is_file()
    assert (Path(out) / "model.safetensors").is_file()


def test_existing_dir_without_config_json(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="has no config.json"):
        resolve_model_path(str(tmp_path))


def test_existing_model_dir_becomes_absolute(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text("{}")
    monkeypatch.chdir(tmp_path)
    assert resolve_model_path("./m") == str((tmp_path / "m").resolve())


def test_missing_relative_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(FileNotFoundError, match=r"model directory \./x does not exist"):
        resolve_model_path("./x")


def test_missing_absolute_path(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="does not exist"):
        resolve_model_path(str(tmp_path / "nope"))


def test_hub_id_passes_through(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert resolve_model_path("meta-llama/Llama-3.2-1B") == "meta-llama/Llama-3.2-1B"
