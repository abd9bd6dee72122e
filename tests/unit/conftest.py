"""Shared fixtures for the fast unit tests (no Ray cluster, no vLLM engine)."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The built-in tiny model, built once per session into a temporary directory."""
    from splitserve.models.tiny import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("tiny") / "model")


@pytest.fixture(autouse=True)
def _no_otel_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """No OTEL_* variable of the caller's shell reaches a unit test: tracing takes every key its
    config leaves out from them (router/tracing.py), e.g. an exporter or OTEL_SDK_DISABLED."""
    import os

    for var in [v for v in os.environ if v.startswith("OTEL_")]:
        monkeypatch.delenv(var)
