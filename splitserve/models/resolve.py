"""Turn the config's model reference into something the engine can load."""

from __future__ import annotations

from pathlib import Path

from splitserve.models.tiny import build_tiny_model


def resolve_model_path(path: str | None, tiny_variant: int = 0) -> str:
    """Return a loadable model reference for `model.path`.

    None builds (once) and returns the built-in tiny model (weights `tiny_variant`). An existing directory is returned as
    an absolute path. Anything else is passed through as a Hugging Face hub id, which works only
    where the network allows it.
    """
    if path is None:
        return str(build_tiny_model(variant=tiny_variant))
    p = Path(path).expanduser()
    if p.exists():
        if not (p / "config.json").exists():
            raise FileNotFoundError(f"model directory {p} has no config.json")
        return str(p.resolve())
    if path.startswith((".", "/", "~")):
        raise FileNotFoundError(f"model directory {path} does not exist")
    return path
