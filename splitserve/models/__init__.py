"""Model helpers: the deterministic built-in tiny model, model URIs (`uri.py`), where they live
on disk (`cache.py`), what the engine loads (`resolve.py`) and the download step (`download.py`)."""

from splitserve.models.resolve import ResolvedModel, resolve_model, resolve_model_path
from splitserve.models.tiny import TINY_MODEL_NAME, build_tiny_model, default_tiny_model_dir
from splitserve.models.uri import ModelURI, ModelURIError, kserve_uri, parse_model_uri

__all__ = ["TINY_MODEL_NAME", "ModelURI", "ModelURIError", "ResolvedModel", "build_tiny_model",
           "default_tiny_model_dir", "kserve_uri", "parse_model_uri", "resolve_model",
           "resolve_model_path"]
