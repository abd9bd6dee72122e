"""splitserve.models.uri: one model URI scheme (hf, s3, gs, pvc, hub ids, local directories),
parsed at config load; KServe's spelling of each."""

from __future__ import annotations

import pytest

from splitserve.config import ConfigError, parse_config
from splitserve.models.uri import ModelURI, ModelURIError, kserve_uri, parse_model_uri


@pytest.mark.parametrize(("path", "want"), [
    ("hf://Qwen/Qwen2.5-7B-Instruct", ModelURI("hf", "Qwen/Qwen2.5-7B-Instruct")),
    ("hf://Qwen/Qwen2.5-7B-Instruct@v1.0", ModelURI("hf", "Qwen/Qwen2.5-7B-Instruct", "v1.0")),
    ("hf://org/m@refs/pr/12", ModelURI("hf", "org/m", "refs/pr/12")),
    ("meta-llama/Llama-3.1-8B", ModelURI("hf", "meta-llama/Llama-3.1-8B")),
    ("meta-llama/Llama-3.1-8B@main", ModelURI("hf", "meta-llama/Llama-3.1-8B", "main")),
    ("gpt2", ModelURI("hf", "gpt2")),
    ("s3://my-bucket/models/qwen/", ModelURI("s3", "my-bucket/models/qwen")),
    ("s3://my-bucket", ModelURI("s3", "my-bucket")),
    ("gs://gcs_bucket.x/llama", ModelURI("gs", "gcs_bucket.x/llama")),
    ("pvc://model-store/llama/8b", ModelURI("pvc", "model-store/llama/8b")),
    ("pvc://model-store", ModelURI("pvc", "model-store")),
    ("/models/llama", ModelURI("local", "/models/llama")),
    ("./m", ModelURI("local", "./m")),
    ("~/m", ModelURI("local", "~/m")),
])
def test_each_scheme_parses(path: str, want: ModelURI) -> None:
    assert parse_model_uri(path) == want


def test_root_and_subpath() -> None:
    uri = parse_model_uri("pvc://store/a/b")
    assert (uri.root, uri.subpath) == ("store", "a/b")
    assert (parse_model_uri("s3://b").root, parse_model_uri("s3://b").subpath) == ("b", "")
    assert str(parse_model_uri("hf://o/n@r")) == "hf://o/n@r"
    assert str(parse_model_uri("s3://b/p/")) == "s3://b/p"


@pytest.mark.parametrize(("path", "message"), [
    ("oci://reg/model:1", r"unknown scheme 'oci://'; use hf://ORG/NAME\[@REVISION\], s3://"),
    ("https://example.com/m", "unknown scheme 'https://'"),
    ("hf://", "'' is not a hub repo id"),
    ("hf://a/b/c", "'a/b/c' is not a hub repo id"),
    ("hf://org/name@", "empty or malformed revision"),
    ("hf://org/na me", "is not a hub repo id"),
    ("s3://", "'' is not a bucket name"),
    ("s3://UPPER/x", "'UPPER' is not a bucket name"),
    ("gs://bucket/a/../../etc", r"the prefix has an empty, '\.' or '\.\.' segment"),
    ("s3://bucket/a//b", "empty"),
    ("pvc://Claim/x", "'Claim' is not a PersistentVolumeClaim name"),
    ("pvc://claim/../x", r"the path in the claim has an empty, '\.' or '\.\.' segment"),
    ("", "model.path is empty"),
])
def test_malformed_paths_name_the_problem(path: str, message: str) -> None:
    with pytest.raises(ModelURIError, match=message):
        parse_model_uri(path)


def test_a_wrong_scheme_fails_config_load_naming_the_key() -> None:
    with pytest.raises(ConfigError) as err:
        parse_config({"model": {"path": "ftp://host/model"}})
    assert "model.path" in str(err.value)
    assert "unknown scheme 'ftp://'" in str(err.value)


def test_config_keeps_the_path_as_written() -> None:
    cfg = parse_config({"model": {"path": "hf://Qwen/Qwen2.5-7B-Instruct@main"}})
    assert cfg.model.path == "hf://Qwen/Qwen2.5-7B-Instruct@main"
    assert parse_config({}).model.path is None


@pytest.mark.parametrize(("path", "want"), [
    ("Qwen/Qwen2.5-7B", "hf://Qwen/Qwen2.5-7B"),
    ("hf://Qwen/Qwen2.5-7B@abc123", "hf://Qwen/Qwen2.5-7B:abc123"),  # KServe's revision syntax
    ("s3://b/p", "s3://b/p"),
    ("gs://b/p/", "gs://b/p"),
    ("pvc://claim/sub", "pvc://claim/sub"),
    ("/models/x", None),
])
def test_kserve_spelling(path: str, want: str | None) -> None:
    assert kserve_uri(parse_model_uri(path)) == want
