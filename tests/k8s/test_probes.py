"""Kubernetes probes with the router's meaning (router/readiness.py): where splitserve's own
container serves the API (KServe's ServingRuntime), readiness is `/health/ready` and liveness
`/health/live`; the RayService's head keeps KubeRay's probes (see rayservice.yaml)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from splitserve.config import parse_config
from splitserve.k8s import kserve
from splitserve.k8s.render import render
from tests.k8s.conftest import CHART, VALUES_FILES

RAYSERVICE_VALUES = [None, *(p for p in VALUES_FILES if not p.stem.startswith("kserve"))]


def _container(runtime: dict) -> dict:
    (container,) = runtime["spec"]["containers"]
    return container


def test_serving_runtime_probes_use_readiness_and_liveness() -> None:
    c = _container(kserve.serving_runtime(name="s", image="i"))
    assert c["readinessProbe"]["httpGet"] == {"path": "/health/ready", "port": 8080}
    assert c["startupProbe"]["httpGet"] == {"path": "/health/ready", "port": 8080}
    assert c["livenessProbe"]["httpGet"] == {"path": "/health/live", "port": 8080}
    # a probe must outlast the router's own pool pings, or a slow pool reads as not ready
    timeout = parse_config({}).router.health_timeout_s
    for probe in ("readinessProbe", "livenessProbe", "startupProbe"):
        assert c[probe]["timeoutSeconds"] > timeout
    # liveness tolerates a minute without an answer; startup gives engines 30 minutes
    assert c["livenessProbe"]["periodSeconds"] * c["livenessProbe"]["failureThreshold"] >= 60
    assert c["startupProbe"]["periodSeconds"] * c["startupProbe"]["failureThreshold"] >= 1800


def test_chart_serving_runtime_has_the_same_probes(render_chart) -> None:
    objs = render_chart(CHART / "ci" / "kserve-isvc-values.yaml")
    (runtime,) = [o for o in objs if o["kind"] == "ServingRuntime"]
    want = _container(kserve.serving_runtime(name="s", image="i"))
    got = _container(runtime)
    for probe in ("readinessProbe", "livenessProbe", "startupProbe"):
        assert got[probe] == want[probe]


def test_render_target_kserve_carries_the_probes() -> None:
    text = render(parse_config({"device": "cuda", "model": {"path": "s3://b/m"}}), "kserve")
    (runtime,) = yaml.safe_load_all(text["servingruntime.yaml"])
    assert _container(runtime)["readinessProbe"]["httpGet"]["path"] == "/health/ready"


@pytest.mark.parametrize("values", RAYSERVICE_VALUES,
                         ids=["default", *(p.stem for p in RAYSERVICE_VALUES[1:])])
def test_rayservice_head_leaves_probes_to_kuberay(render_chart, values: Path | None) -> None:
    # KubeRay submits the Serve config only once the head pod is ready: a readiness probe on
    # the router would never pass. A probe of ours would also replace KubeRay's GCS/raylet ones.
    (rs,) = [d for d in render_chart(values) if d["kind"] == "RayService"]
    cluster = rs["spec"]["rayClusterConfig"]
    pods = [cluster["headGroupSpec"]["template"]] + [
        g["template"] for g in cluster["workerGroupSpecs"]]
    for pod in pods:
        for container in pod["spec"]["containers"]:
            assert not {"readinessProbe", "livenessProbe", "startupProbe"} & set(container)
