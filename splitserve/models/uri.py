"""Model URIs: one scheme for `model.path`, from the config to vLLM and KServe (pure, no I/O).

    hf://ORG/NAME[@REVISION]   a Hugging Face hub repo; a plain ORG/NAME (or NAME) is the same
    s3://BUCKET/PREFIX         a model directory under an S3 prefix
    gs://BUCKET/PREFIX         the same on Google Cloud Storage
    pvc://CLAIM/SUB/PATH       a model directory on a Kubernetes PersistentVolumeClaim
    /abs, ./rel, ~/dir         a local directory

`parse_model_uri` turns each into a `ModelURI` (scheme, location, revision). The config calls it
when it loads, so a wrong scheme or a malformed location fails there, naming `model.path`.
Who uses the result: `models/resolve.py` (what the engine loads), `models/cache.py` (where the
download step puts it), `k8s/kserve.py` (`kserve_uri`: KServe's storageUri / model.uri) and
`k8s/preflight.py`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

Scheme = Literal["hf", "s3", "gs", "pvc", "local"]
URI_SCHEMES: tuple[Scheme, ...] = ("hf", "s3", "gs", "pvc")
LOCAL_PREFIXES = ("/", ".", "~")

# A hub repo id: NAME or ORG/NAME of letters, digits, '-', '_', '.' (the hub's own rule, minus
# its length limit). A revision is a branch, tag or commit; it may contain '/' (refs/pr/1).
_REPO_ID = re.compile(r"^[\w.-]+(/[\w.-]+)?$")
# S3 and GCS bucket names: lowercase letters, digits, '.', '-', '_' (GCS allows '_'); the store
# itself enforces the rest (length 3-63 on S3).
_BUCKET = re.compile(r"^[a-z0-9][a-z0-9._-]{0,221}$")
# A PersistentVolumeClaim name: a DNS-1123 subdomain.
_CLAIM = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$")

# JSON-schema pattern of model.path in the chart's values schema (Go regexp: no lookahead): a
# known scheme, or no ':' at all (a hub id or a directory).
MODEL_PATH_PATTERN = r"^((hf|s3|gs|pvc)://.+|[^:]*)$"
USAGE = ("hf://ORG/NAME[@REVISION], s3://BUCKET/PREFIX, gs://BUCKET/PREFIX, pvc://CLAIM/PATH, "
         "a hub id ORG/NAME or a local directory")


class ModelURIError(ValueError):
    """`model.path` is not a model URI splitserve knows; the message says which part and why."""


@dataclass(frozen=True)
class ModelURI:
    """A parsed `model.path`.

    `location`: hf: the repo id (ORG/NAME); s3/gs: BUCKET/PREFIX; pvc: CLAIM/SUB/PATH (no
    leading or trailing '/'); local: the path as written. `revision`: hf only (None: the
    default branch).
    """

    scheme: Scheme
    location: str
    revision: str | None = None

    @property
    def root(self) -> str:
        """The bucket (s3/gs) or the claim (pvc): the location's first segment."""
        return self.location.split("/", 1)[0]

    @property
    def subpath(self) -> str:
        """The prefix (s3/gs) or the path inside the claim (pvc); "" for the root itself."""
        return self.location.partition("/")[2]

    def __str__(self) -> str:
        if self.scheme == "local":
            return self.location
        rev = f"@{self.revision}" if self.revision else ""
        return f"{self.scheme}://{self.location}{rev}"


def _segments_ok(path: str) -> bool:
    """No empty, '.' or '..' segment: a location maps onto directories (cache, mounts)."""
    return all(s not in ("", ".", "..") for s in path.split("/"))


def _hub(text: str, original: str) -> ModelURI:
    repo, at, revision = text.partition("@")
    if not _REPO_ID.match(repo) or "--" in repo or ".." in repo:
        raise ModelURIError(f"model.path {original!r}: {repo!r} is not a hub repo id "
                            "(ORG/NAME of letters, digits, '-', '_', '.')")
    if at and (not revision or not _segments_ok(revision)):
        raise ModelURIError(f"model.path {original!r}: empty or malformed revision after '@'")
    return ModelURI("hf", repo, revision or None)


def _rooted(scheme: Scheme, rest: str, original: str, root: re.Pattern[str], root_is: str,
            path_is: str) -> ModelURI:
    """A `ROOT/PATH` location (a bucket and its prefix, a claim and a path in it)."""
    rest = rest.rstrip("/")
    name, _, sub = rest.partition("/")
    if not root.match(name):
        raise ModelURIError(f"model.path {original!r}: {name!r} is not {root_is}")
    if sub and not _segments_ok(sub):
        raise ModelURIError(f"model.path {original!r}: {path_is} has an empty, '.' or '..' "
                            "segment")
    return ModelURI(scheme, rest)


def _bucket(scheme: Scheme, rest: str, original: str) -> ModelURI:
    return _rooted(scheme, rest, original, _BUCKET,
                   "a bucket name (lowercase letters, digits, '.', '-', '_')", "the prefix")


def _claim(rest: str, original: str) -> ModelURI:
    return _rooted("pvc", rest, original, _CLAIM,
                   "a PersistentVolumeClaim name (lowercase letters, digits, '-', '.')",
                   "the path in the claim")


def parse_model_uri(path: str) -> ModelURI:
    """Parse `model.path` (see the module docstring); raises ModelURIError naming the problem.

    >>> parse_model_uri("hf://Qwen/Qwen2.5-7B-Instruct@main")
    ModelURI(scheme='hf', location='Qwen/Qwen2.5-7B-Instruct', revision='main')
    >>> parse_model_uri("pvc://models/llama-3/8b").subpath
    'llama-3/8b'
    """
    if not path:
        raise ModelURIError("model.path is empty: leave it out (null) for the built-in tiny model")
    scheme, sep, rest = path.partition("://")
    if not sep:
        if path.startswith(LOCAL_PREFIXES):
            return ModelURI("local", path)
        return _hub(path, path)
    if scheme == "hf":
        return _hub(rest, path)
    if scheme in ("s3", "gs"):
        return _bucket(scheme, rest, path)  # type: ignore[arg-type]
    if scheme == "pvc":
        return _claim(rest, path)
    raise ModelURIError(f"model.path {path!r}: unknown scheme {scheme + '://'!r}; use {USAGE}")


def kserve_uri(uri: ModelURI) -> str | None:
    """The URI KServe fetches (InferenceService `storageUri`, LLMInferenceService `model.uri`):
    hf as KServe spells a revision (`hf://ORG/NAME:REVISION`), s3/gs/pvc as they are, None for
    a local directory (KServe cannot fetch it)."""
    if uri.scheme == "local":
        return None
    if uri.scheme == "hf":
        return f"hf://{uri.location}" + (f":{uri.revision}" if uri.revision else "")
    return str(uri)
