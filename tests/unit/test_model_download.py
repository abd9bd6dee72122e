"""splitserve.models.download: the download step fills the model cache where the resolver reads
it. S3, GCS and the Hugging Face hub cannot be reached here: an in-memory object store
(`FakeStore`) and a recording stand-in for `snapshot_download` take their place."""

from __future__ import annotations

from pathlib import Path

import pytest

from splitserve.models import download as dl
from splitserve.models.resolve import resolve_model
from splitserve.models.uri import parse_model_uri


class FakeStore:
    """An object store in memory: {bucket: {key: bytes}}; counts fetches."""

    def __init__(self, objects: dict[str, dict[str, bytes]]) -> None:
        self.objects = objects
        self.fetched: list[str] = []

    def list(self, bucket, prefix):
        return [(k, len(v)) for k, v in self.objects.get(bucket, {}).items()
                if k.startswith(prefix)]

    def fetch(self, bucket, key, dest: Path) -> None:
        self.fetched.append(key)
        dest.write_bytes(self.objects[bucket][key])


MODEL = {"models/qwen/config.json": b"{}", "models/qwen/model.safetensors": b"w" * 10,
         "models/qwen/tok/tokenizer.json": b"t", "models/qwen/": b"",
         "models/qwen2/config.json": b"other"}


@pytest.mark.parametrize("scheme", ["s3", "gs"])
def test_object_store_model_lands_where_the_resolver_reads_it(scheme, tmp_path: Path) -> None:
    store = FakeStore({"bucket": dict(MODEL)})
    where = dl.download(f"{scheme}://bucket/models/qwen", tmp_path, store)
    assert where == tmp_path / scheme / "bucket" / "models" / "qwen"
    files = sorted(str(p.relative_to(where)) for p in where.rglob("*") if p.is_file())
    assert files == ["config.json", "model.safetensors", "tok/tokenizer.json"]  # not qwen2/
    assert resolve_model(f"{scheme}://bucket/models/qwen", cache=tmp_path).model == str(where)


def test_a_second_run_fetches_only_what_changed(tmp_path: Path) -> None:
    store = FakeStore({"bucket": dict(MODEL)})
    dl.download("s3://bucket/models/qwen", tmp_path, store)
    store.fetched.clear()
    store.objects["bucket"]["models/qwen/model.safetensors"] = b"w" * 11
    dl.download("s3://bucket/models/qwen", tmp_path, store)
    assert store.fetched == ["models/qwen/model.safetensors"]
    assert not list(tmp_path.rglob("*.part"))


def test_an_empty_prefix_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=r"no objects under s3://bucket/nothing"):
        dl.download("s3://bucket/nothing", tmp_path, FakeStore({"bucket": dict(MODEL)}))


def test_plan_refuses_keys_that_leave_the_cache(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="does not map to a file"):
        dl.plan_copy([("p/../../etc/x", 1)], "p", tmp_path)
    assert dl.plan_copy([("p/a", 1), ("pa/b", 1)], "p", tmp_path) == [("p/a", tmp_path / "a", 1)]
    assert dl.plan_copy([("a/b", 2)], "", tmp_path) == [("a/b", tmp_path / "a" / "b", 2)]


def test_hub_models_go_to_the_caches_hf_home(tmp_path: Path, monkeypatch) -> None:
    calls = []

    def fake_snapshot_download(**kw):  # stands in for the hub, unreachable here
        calls.append(kw)
        return str(tmp_path / "snap")

    import huggingface_hub

    monkeypatch.setattr(huggingface_hub, "snapshot_download", fake_snapshot_download)
    assert dl.download("hf://org/name@v1", tmp_path) == tmp_path / "snap"
    assert calls == [{"repo_id": "org/name", "revision": "v1",
                      "cache_dir": tmp_path / "huggingface" / "hub",
                      "ignore_patterns": ["original/*"]}]
    dl.download("org/other", tmp_path)
    assert (calls[-1]["repo_id"], calls[-1]["revision"]) == ("org/other", None)


@pytest.mark.parametrize("path", [None, "pvc://claim/m", "/models/m"])
def test_nothing_to_download(path, tmp_path: Path) -> None:
    assert dl.download(path, tmp_path) is None


def test_cli_reports_errors_with_status_1(tmp_path: Path, capsys) -> None:
    assert dl.main(["oci://x/y", "--cache", str(tmp_path)]) == 1
    assert "unknown scheme 'oci://'" in capsys.readouterr().err
    assert dl.main(["pvc://claim/m", "--cache", str(tmp_path)]) == 0
    assert "nothing to download" in capsys.readouterr().out


def test_uri_parts_feed_the_store() -> None:
    uri = parse_model_uri("gs://bucket/a/b")
    assert (uri.root, uri.subpath) == ("bucket", "a/b")
