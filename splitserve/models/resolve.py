"""Turn the config's `model.path` into what the engine (and the router's tokenizer) loads.

    model.path                  vLLM loads                          from
    null                        the built-in tiny model's directory  built on first use
    /dir, ./dir, ~/dir          that directory (absolute)            this machine's disk
    ORG/NAME, hf://ORG/NAME@R   model ORG/NAME, revision R           the hub, or HF_HOME's cache
    pvc://CLAIM/PATH            /mnt/pvc/CLAIM/PATH                  the claim the chart mounts
    s3://B/P, gs://B/P          $SPLITSERVE_MODEL_CACHE/s3/B/P       the cache the download step
                                                                     filled (models/download.py)

A URI the machine cannot serve is a FileNotFoundError that says what to do, never a hub lookup
of a URI. vLLM can stream s3:// itself (Run:ai streamer); splitserve does not depend on it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from splitserve.models.cache import PVC_MOUNT_ROOT, cache_root, object_dir, pvc_dir
from splitserve.models.tiny import build_tiny_model
from splitserve.models.uri import parse_model_uri


@dataclass(frozen=True)
class ResolvedModel:
    """What vLLM loads: `model` (a directory or a hub repo id) at `revision` (hub repos only;
    None: the default branch). vLLM's `revision`; its tokenizer follows the same revision."""

    model: str
    revision: str | None = None


def _model_dir(path: Path, shown: str) -> str:
    if not path.exists():
        raise FileNotFoundError(f"model directory {shown} does not exist")
    if not (path / "config.json").exists():
        raise FileNotFoundError(f"model directory {path} has no config.json")
    return str(path.resolve())


def resolve_model(path: str | None, tiny_variant: int = 0, *, cache: Path | None = None,
                  pvc_root: Path = Path(PVC_MOUNT_ROOT)) -> ResolvedModel:
    """What to load for `model.path` (table in the module docstring).

    `cache`: the model cache's root (default: `SPLITSERVE_MODEL_CACHE`, see models/cache.py);
    `pvc_root`: where pvc:// claims are mounted. Raises FileNotFoundError when a directory,
    a claim's mount or a cache entry is missing, ModelURIError for a malformed path.
    """
    if path is None:
        return ResolvedModel(str(build_tiny_model(variant=tiny_variant)))
    local = Path(path).expanduser()
    if "://" not in path and local.exists():  # a directory, also one written without ./
        return ResolvedModel(_model_dir(local, path))
    uri = parse_model_uri(path)
    if uri.scheme == "local":
        return ResolvedModel(_model_dir(local, path))
    if uri.scheme == "hf":
        return ResolvedModel(uri.location, uri.revision)
    if uri.scheme == "pvc":
        where = pvc_dir(uri, pvc_root)
        mount = pvc_root / uri.root
        if not mount.is_dir():
            raise FileNotFoundError(
                f"model.path {path}: claim {uri.root!r} is not mounted at {mount} (the Helm chart "
                "mounts a pvc:// model's claim there; elsewhere use a local directory)")
        return ResolvedModel(_model_dir(where, str(where)))
    where = object_dir(uri, cache or cache_root())
    if not (where / "config.json").is_file():
        raise FileNotFoundError(
            f"model.path {path} is not in the model cache ({where} has no config.json): on "
            "Kubernetes turn on the chart's modelCache, whose Job downloads it once; elsewhere "
            f"run `python -m splitserve.models.download {path}` first")
    return ResolvedModel(str(where))


def resolve_model_path(path: str | None, tiny_variant: int = 0) -> str:
    """`resolve_model(path, tiny_variant).model`: a directory or a hub repo id."""
    return resolve_model(path, tiny_variant).model
