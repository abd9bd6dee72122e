"""Where a model URI lives on disk: the shared model cache and PVC mounts (pure, no I/O).

One layout, used by the download step (`models/download.py`, which fills the cache), the
resolver (`models/resolve.py`, which reads it) and the Helm chart (which mounts the cache and
sets the environment below in every Ray pod and in the download Job):

    $SPLITSERVE_MODEL_CACHE/huggingface/    HF_HOME: hub repos in the hub's own cache layout
    $SPLITSERVE_MODEL_CACHE/s3/BUCKET/PREFIX/   an s3:// model directory, copied as it is
    $SPLITSERVE_MODEL_CACHE/gs/BUCKET/PREFIX/   a gs:// one
    /mnt/pvc/CLAIM/                         where the chart mounts a pvc:// model's claim

Without the variable the cache is `~/.cache/splitserve/model-cache` (under `SPLITSERVE_CACHE`
when that is set), so `python -m splitserve.models.download s3://...` on a laptop fills the
directory `splitserve serve` then reads.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from splitserve.models.uri import ModelURI

MODEL_CACHE_ENV = "SPLITSERVE_MODEL_CACHE"
# The chart mounts the cache volume here (a fixed path: the resolver and the Job agree on it).
MODEL_CACHE_MOUNT = "/mnt/model-cache"
HF_HOME_DIR = "huggingface"  # HF_HOME under the cache root
PVC_MOUNT_ROOT = "/mnt/pvc"  # the chart mounts a pvc:// model's claim at PVC_MOUNT_ROOT/CLAIM


def cache_root(env: Mapping[str, str] | None = None) -> Path:
    """The model cache's root directory, from `SPLITSERVE_MODEL_CACHE` or the user's cache."""
    env = os.environ if env is None else env
    if env.get(MODEL_CACHE_ENV):
        return Path(env[MODEL_CACHE_ENV])
    base = Path(env.get("SPLITSERVE_CACHE") or Path.home() / ".cache" / "splitserve")
    return base / "model-cache"


def hf_home(root: Path) -> Path:
    """HF_HOME inside the cache: hub downloads keep the hub's layout (revisions, refs)."""
    return root / HF_HOME_DIR


def object_dir(uri: ModelURI, root: Path) -> Path:
    """The cache directory of an s3:// or gs:// model: ROOT/SCHEME/BUCKET/PREFIX."""
    if uri.scheme not in ("s3", "gs"):
        raise ValueError(f"{uri} is not an object-store URI")
    return root / uri.scheme / uri.location


def pvc_dir(uri: ModelURI, mount_root: Path = Path(PVC_MOUNT_ROOT)) -> Path:
    """The model directory of a pvc:// URI where the chart mounts its claim."""
    if uri.scheme != "pvc":
        raise ValueError(f"{uri} is not a pvc:// URI")
    return mount_root / uri.location


def cache_env(root: str = MODEL_CACHE_MOUNT, *, offline: bool = True) -> dict[str, str]:
    """Environment of a pod that uses the cache at `root`. Engines (`offline`): hub repos are
    found under HF_HOME with no hub lookup (HF_HUB_OFFLINE=1), s3/gs ones under the root. The
    download Job (not offline) fills the same places. The chart sets the same (tested)."""
    env = {MODEL_CACHE_ENV: root, "HF_HOME": f"{root}/{HF_HOME_DIR}"}
    if offline:
        env["HF_HUB_OFFLINE"] = "1"
    return env
