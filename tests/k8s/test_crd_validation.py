"""The CRD validator itself: strict enough to catch the mistakes it is there for."""

from __future__ import annotations

import copy

import pytest

from tests.k8s.conftest import CHART
from tests.k8s.crds import convert


def test_convert_rules() -> None:
    node = {"type": "object", "properties": {
        "port": {"x-kubernetes-int-or-string": True},
        "maybe": {"type": "string", "nullable": True},
        "free": {"type": "object", "x-kubernetes-preserve-unknown-fields": True},
        "labels": {"type": "object", "additionalProperties": {"type": "string"}},
    }}
    out = convert(node)
    assert out["additionalProperties"] is False
    assert out["properties"]["port"] == {"x-kubernetes-int-or-string": True,
                                         "anyOf": [{"type": "integer"}, {"type": "string"}]}
    assert out["properties"]["maybe"]["type"] == ["string", "null"]
    assert "additionalProperties" not in out["properties"]["free"]
    assert out["properties"]["labels"]["additionalProperties"] == {"type": "string"}


@pytest.fixture(scope="module")
def rayservice(render_chart) -> dict:
    return next(d for d in render_chart(CHART / "ci" / "gpu-8-tp4-values.yaml")
                if d["kind"] == "RayService")


def test_valid_rayservice_passes(crds, rayservice) -> None:
    assert crds.errors(rayservice) == []


@pytest.mark.parametrize("mutate", [
    lambda o: o["spec"].__setitem__("serveConfig", "x"),  # unknown field (a typo)
    lambda o: o["spec"]["rayClusterConfig"]["workerGroupSpecs"][0].__setitem__("replicas", "2"),
    lambda o: o["spec"]["rayClusterConfig"]["headGroupSpec"]["template"]["spec"]["containers"][0]
    .__setitem__("imagePullPolicy", 3),
    lambda o: o["spec"]["rayClusterConfig"]["headGroupSpec"].pop("template"),  # required
], ids=["unknown-field", "wrong-type", "nested-pod-type", "missing-required"])
def test_mistakes_are_errors(crds, rayservice, mutate) -> None:
    bad = copy.deepcopy(rayservice)
    mutate(bad)
    assert crds.errors(bad)


def test_int_or_string_accepts_both(crds, rayservice) -> None:
    obj = copy.deepcopy(rayservice)
    container = obj["spec"]["rayClusterConfig"]["headGroupSpec"]["template"]["spec"]["containers"][0]
    container["resources"]["limits"]["cpu"] = 4
    assert crds.errors(obj) == []
    container["resources"]["limits"]["cpu"] = [4]
    assert crds.errors(obj)
