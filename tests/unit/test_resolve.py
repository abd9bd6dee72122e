"""splitserve.models.resolve: model.path -> what the engine loads, for each model URI scheme."""

from __future__ import annotations

from pathlib import Path

import pytest

from splitserve.models.resolve import resolve_model, resolve_model_path


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


# --- model URIs: what the engine loads for each scheme (splitserve.models.resolve_model) ---


def _model_dir(path: Path) -> Path:
    path.mkdir(parents=True)
    (path / "config.json").write_text("{}")
    return path


@pytest.mark.parametrize(("path", "model", "revision"), [
    ("meta-llama/Llama-3.2-1B", "meta-llama/Llama-3.2-1B", None),
    ("hf://Qwen/Qwen2.5-7B-Instruct", "Qwen/Qwen2.5-7B-Instruct", None),
    ("hf://Qwen/Qwen2.5-7B-Instruct@a1b2c3", "Qwen/Qwen2.5-7B-Instruct", "a1b2c3"),
    ("hf://org/name@refs/pr/1", "org/name", "refs/pr/1"),
    ("gpt2", "gpt2", None),
])
def test_hub_models_load_by_id_and_revision(path, model, revision, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert resolve_model(path) == (type(resolve_model(path))(model, revision))


def test_pvc_loads_from_where_the_chart_mounts_the_claim(tmp_path: Path) -> None:
    _model_dir(tmp_path / "models" / "llama" / "8b")
    got = resolve_model("pvc://models/llama/8b", pvc_root=tmp_path)
    assert (got.model, got.revision) == (str(tmp_path / "models" / "llama" / "8b"), None)


def test_pvc_claim_not_mounted_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError,
                       match=r"claim 'models' is not mounted at .*/models \(the Helm chart"):
        resolve_model("pvc://models/llama", pvc_root=tmp_path)


def test_pvc_mounted_without_the_model_directory(tmp_path: Path) -> None:
    (tmp_path / "models").mkdir()
    with pytest.raises(FileNotFoundError, match=r"model directory .*/models/llama does not exist"):
        resolve_model("pvc://models/llama", pvc_root=tmp_path)


@pytest.mark.parametrize("scheme", ["s3", "gs"])
def test_object_store_models_load_from_the_filled_cache(scheme, tmp_path: Path) -> None:
    _model_dir(tmp_path / scheme / "bucket" / "qwen" / "7b")
    got = resolve_model(f"{scheme}://bucket/qwen/7b/", cache=tmp_path)
    assert got.model == str(tmp_path / scheme / "bucket" / "qwen" / "7b")
    assert got.revision is None


@pytest.mark.parametrize("scheme", ["s3", "gs"])
def test_object_store_model_without_a_cache_is_an_error_not_a_hub_lookup(
        scheme, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPLITSERVE_MODEL_CACHE", str(tmp_path))
    with pytest.raises(FileNotFoundError) as err:
        resolve_model(f"{scheme}://bucket/qwen")
    assert str(err.value) == (
        f"model.path {scheme}://bucket/qwen is not in the model cache ({tmp_path}/{scheme}/"
        "bucket/qwen has no config.json): on Kubernetes turn on the chart's modelCache, whose "
        "Job downloads it once; elsewhere run `python -m splitserve.models.download "
        f"{scheme}://bucket/qwen` first")


def test_relative_directory_without_dot_slash_is_still_a_directory(tmp_path, monkeypatch):
    _model_dir(tmp_path / "models" / "m")
    monkeypatch.chdir(tmp_path)
    assert resolve_model("models/m").model == str(tmp_path / "models" / "m")


def test_unknown_scheme_is_refused(tmp_path: Path) -> None:
    from splitserve.models.uri import ModelURIError

    with pytest.raises(ModelURIError, match=r"unknown scheme 'oci://'"):
        resolve_model("oci://registry/model:1")
