"""The pods' termination grace follows `router.shutdown_grace_s` (issue 25, point 7): long enough
for `splitserve serve`'s drain after SIGTERM plus stopping Serve, the engines and Ray, in the
chart's RayService and KServe InferenceService and in `splitserve k8s render --target kserve`."""

from __future__ import annotations

import math

import pytest

from splitserve.config import parse_config
from splitserve.k8s import kserve
from tests.k8s.conftest import CHART


def _pods(rayservice: dict) -> list[dict]:
    cluster = rayservice["spec"]["rayClusterConfig"]
    return [cluster["headGroupSpec"]["template"]] + [g["template"] for g in
                                                     cluster["workerGroupSpecs"]]


def test_termination_grace_is_the_shutdown_grace_plus_the_teardown_margin():
    assert kserve.TEARDOWN_MARGIN_S > 0
    default = parse_config({})
    assert kserve.termination_grace_period_s(default) == (
        math.ceil(default.router.shutdown_grace_s) + kserve.TEARDOWN_MARGIN_S)
    tuned = parse_config({"router": {"shutdown_grace_s": 12.5}})
    assert kserve.termination_grace_period_s(tuned) == 13 + kserve.TEARDOWN_MARGIN_S


@pytest.mark.parametrize("grace", [None, 12.5, 120])
def test_rayservice_pods_get_the_grace(render_chart, validate, grace):
    extra = () if grace is None else ("--set-json", f"config.router.shutdown_grace_s={grace}")
    (rs,) = [d for d in render_chart(None, *extra) if d["kind"] == "RayService"]
    want = kserve.termination_grace_period_s(
        parse_config({} if grace is None else {"router": {"shutdown_grace_s": grace}}))
    pods = _pods(rs)
    assert len(pods) >= 2  # the head and the pools' worker groups
    for pod in pods:
        assert pod["spec"]["terminationGracePeriodSeconds"] == want
    validate(rs)


@pytest.mark.parametrize("grace", [None, 45])
def test_inference_service_gets_the_grace_in_chart_and_render(render_chart, validate, grace):
    extra = () if grace is None else ("--set-json", f"config.router.shutdown_grace_s={grace}")
    objs = render_chart(CHART / "ci" / "kserve-isvc-values.yaml", *extra)
    (isvc,) = [o for o in objs if o["kind"] == "InferenceService"]
    cfg = parse_config({} if grace is None else {"router": {"shutdown_grace_s": grace}})
    want = kserve.termination_grace_period_s(cfg)
    assert isvc["spec"]["predictor"]["terminationGracePeriodSeconds"] == want
    validate(isvc)
    rendered = kserve.inference_service(cfg, name="s", runtime="s")
    assert rendered["spec"]["predictor"]["terminationGracePeriodSeconds"] == want
    validate(rendered)
