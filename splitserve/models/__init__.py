"""Model helpers: the deterministic built-in tiny model and model-path resolution."""

from splitserve.models.tiny import TINY_MODEL_NAME, build_tiny_model, default_tiny_model_dir
from splitserve.models.resolve import resolve_model_path

__all__ = ["TINY_MODEL_NAME", "build_tiny_model", "default_tiny_model_dir", "resolve_model_path"]
