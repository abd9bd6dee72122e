"""The download step: fetch `model.path` into the model cache, once, before engines start.

    python -m splitserve.models.download URI [--cache DIR]

The Helm chart's model-cache Job runs it (a pre-install/pre-upgrade hook, so the engines start
on a filled cache); on a laptop, run it before `splitserve serve` with an s3:// or gs:// model.
Where each URI goes is `models/cache.py`:

- hf://ORG/NAME[@REV] (or a plain hub id): `huggingface_hub.snapshot_download` into the cache's
  HF_HOME, with HF_TOKEN from the environment (gated models); the engines then load the repo id
  and revision offline.
- s3://BUCKET/PREFIX (boto3) and gs://BUCKET/PREFIX (google-cloud-storage): every object under
  the prefix into CACHE/SCHEME/BUCKET/PREFIX, credentials from the environment (IRSA, workload
  identity, AWS_* or GOOGLE_APPLICATION_CREDENTIALS; AWS_ENDPOINT_URL for S3-compatible stores).
- pvc://, a local directory, null: nothing to download.

Idempotent: an object already in the cache with the same size is not fetched again, and the hub
client skips files it has. Each object lands under a temporary name and is renamed when whole.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Protocol

from splitserve.models.cache import cache_root, hf_home, object_dir
from splitserve.models.uri import ModelURI, ModelURIError, parse_model_uri

# Hub repos of Meta's models carry the original (non-HF) checkpoint under original/: as large
# as the weights vLLM loads, and never read by it.
HF_IGNORE_PATTERNS = ["original/*"]


class ObjectStore(Protocol):
    """An object store's two calls the copy needs (S3Store, GCSStore; a fake in tests)."""

    def list(self, bucket: str, prefix: str) -> Iterable[tuple[str, int]]:
        """(key, size in bytes) of every object whose key starts with `prefix`."""
        ...

    def fetch(self, bucket: str, key: str, dest: Path) -> None:
        """Write object `key` to the file `dest`."""
        ...


class S3Store:
    """S3 (or an S3-compatible store: boto3 honours AWS_ENDPOINT_URL) through boto3."""

    def __init__(self) -> None:
        import boto3

        self._s3 = boto3.client("s3")

    def list(self, bucket: str, prefix: str) -> Iterable[tuple[str, int]]:
        pages = self._s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
        for page in pages:
            for obj in page.get("Contents", []):
                yield obj["Key"], int(obj["Size"])

    def fetch(self, bucket: str, key: str, dest: Path) -> None:
        self._s3.download_file(bucket, key, str(dest))


class GCSStore:
    """Google Cloud Storage through google-cloud-storage."""

    def __init__(self) -> None:
        from google.cloud import storage

        self._gcs = storage.Client()

    def list(self, bucket: str, prefix: str) -> Iterable[tuple[str, int]]:
        for blob in self._gcs.list_blobs(bucket, prefix=prefix):
            yield blob.name, int(blob.size or 0)

    def fetch(self, bucket: str, key: str, dest: Path) -> None:
        self._gcs.bucket(bucket).blob(key).download_to_filename(str(dest))


def plan_copy(objects: Iterable[tuple[str, int]], prefix: str,
              dest: Path) -> list[tuple[str, Path, int]]:
    """(key, file, size) for each object under `prefix` (as a directory: `p/` matches `p/x`,
    not `p2/x`), its file at the same relative path under `dest`. Directory markers (keys
    ending in '/') are skipped; a key that would leave `dest` ('..' segments) is a ValueError."""
    base = prefix.rstrip("/") + "/" if prefix else ""
    plan = []
    for key, size in objects:
        if not key.startswith(base) or key.endswith("/"):
            continue
        rel = key[len(base):]
        if any(part in ("", ".", "..") for part in rel.split("/")):
            raise ValueError(f"object key {key!r} does not map to a file under {dest}")
        plan.append((key, dest / rel, size))
    return plan


def copy_objects(store: ObjectStore, uri: ModelURI, dest: Path) -> int:
    """Copy every object under the URI's prefix into `dest`; returns how many were fetched
    (objects already there with the same size are kept). Raises FileNotFoundError when the
    prefix holds no object."""
    plan = plan_copy(store.list(uri.root, uri.subpath), uri.subpath, dest)
    if not plan:
        raise FileNotFoundError(f"no objects under {uri}")
    fetched = 0
    for key, path, size in plan:
        if path.is_file() and path.stat().st_size == size:
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        part = path.with_name(path.name + ".part")
        store.fetch(uri.root, key, part)
        part.replace(path)
        fetched += 1
    return fetched


def _store(uri: ModelURI) -> ObjectStore:
    return S3Store() if uri.scheme == "s3" else GCSStore()


def download(path: str | None, cache: Path, store: ObjectStore | None = None) -> Path | None:
    """Fetch `model.path` into the cache at `cache`; returns the model's directory there (the
    hub snapshot for hf), or None when there is nothing to download."""
    if path is None:
        return None
    uri = parse_model_uri(path)
    if uri.scheme == "hf":
        from huggingface_hub import snapshot_download

        return Path(snapshot_download(repo_id=uri.location, revision=uri.revision,
                                      cache_dir=hf_home(cache) / "hub",
                                      ignore_patterns=HF_IGNORE_PATTERNS))
    if uri.scheme in ("s3", "gs"):
        dest = object_dir(uri, cache)
        copy_objects(store or _store(uri), uri, dest)
        return dest
    return None


def main(argv: list[str] | None = None) -> int:
    """The command line (module docstring); prints where the model is, exits 1 on failure."""
    p = argparse.ArgumentParser(prog="python -m splitserve.models.download",
                                description="Fetch a model URI into splitserve's model cache.")
    p.add_argument("uri", help="model.path: hf://ORG/NAME[@REV], ORG/NAME, s3://..., gs://...")
    p.add_argument("--cache", type=Path, default=None,
                   help="cache root (default: $SPLITSERVE_MODEL_CACHE or ~/.cache/splitserve/"
                   "model-cache)")
    args = p.parse_args(argv)
    try:
        where = download(args.uri, args.cache or cache_root())
    except (ModelURIError, FileNotFoundError) as err:
        print(f"splitserve: {err}", file=sys.stderr)
        return 1
    print(f"splitserve: {args.uri}: " + (f"in {where}" if where else "nothing to download"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
