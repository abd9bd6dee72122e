"""The Serve config in the chart's RayService is what `splitserve serve` deploys for the same
config: same application (built by `app_builder` from the args), same per-deployment options.

`splitserve serve` runs `build_app(cfg, device)` and `serve.run`s it. KubeRay runs the Serve
config: the application builder at `import_path` with `args`, then the `deployments` options on
top. Both are compared as Ray Serve itself resolves them (`build_app` of ray.serve._private,
what `serve.run` calls), so nothing here reimplements Serve.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from ray.serve._private.build_app import build_app as serve_resolve  # pinned ray 2.60.0
from ray.serve.schema import ServeDeploySchema

from splitserve.app import APP_NAME, app_builder, build_app, serve_config
from splitserve.config import parse_config
from splitserve.k8s.chart import (
    chart_values,
    effective_config,
    merge_values,
    rayservice_serve_config,
)
from splitserve.k8s.layout import k8s_device, pool_resource
from tests.k8s.conftest import VALUES_FILES

RAYSERVICE_VALUES = [p for p in VALUES_FILES if "kserve" not in p.stem]
OPTION_KEYS = ("num_replicas", "max_ongoing_requests", "health_check_period_s",
               "health_check_timeout_s", "graceful_shutdown_timeout_s")


def deployed_options(app) -> dict[str, dict]:
    """Per-deployment options and init args of an Application, as Serve resolves them."""
    built = serve_resolve(app, name=APP_NAME)
    out = {}
    for d in built.deployments:
        dc = d._deployment_config
        out[d.name] = {
            "num_replicas": dc.num_replicas,
            "max_ongoing_requests": dc.max_ongoing_requests,
            "health_check_period_s": dc.health_check_period_s,
            "health_check_timeout_s": dc.health_check_timeout_s,
            "graceful_shutdown_timeout_s": dc.graceful_shutdown_timeout_s,
            "ray_actor_options": {k: v for k, v in (d.ray_actor_options or {}).items()
                                  if k in ("num_cpus", "num_gpus", "resources")},
            "init_args": d.init_args if d.name != "router" else d.init_args[0],
        }
    return out


def rendered_serve_config(render_chart, values: Path) -> dict:
    rs = next(d for d in render_chart(values) if d["kind"] == "RayService")
    return yaml.safe_load(rs["spec"]["serveConfigV2"])


@pytest.mark.parametrize("values", [None, *RAYSERVICE_VALUES],
                         ids=["default", *(p.stem for p in RAYSERVICE_VALUES)])
def test_chart_serve_config_is_the_python_one(render_chart, values: Path | None) -> None:
    got = rendered_serve_config(render_chart, values)
    vals = merge_values(chart_values(), yaml.safe_load(values.read_text()) if values else {})
    want = rayservice_serve_config(vals)
    ServeDeploySchema.model_validate(got)  # a valid Serve config, as KubeRay hands it to Serve
    # The config travels as a mapping: compare what it validates to (defaults filled in).
    got_cfg = parse_config(got["applications"][0]["args"].pop("config"))
    want_cfg = parse_config(want["applications"][0]["args"].pop("config"))
    assert got_cfg == want_cfg
    assert got == want


@pytest.mark.parametrize("values", RAYSERVICE_VALUES, ids=[p.stem for p in RAYSERVICE_VALUES])
def test_rayservice_deploys_what_splitserve_serve_deploys(render_chart, values: Path) -> None:
    """From the rendered RayService back to Serve's resolved application, against
    `build_app(cfg, device)` for the same config, as `splitserve serve` calls it."""
    sc = rendered_serve_config(render_chart, values)
    (app_cfg,) = sc["applications"]
    assert app_cfg["import_path"] == "splitserve.app:app_builder"
    kube = deployed_options(app_builder(app_cfg["args"]))

    vals = merge_values(chart_values(), yaml.safe_load(values.read_text()))
    cfg = effective_config(vals)  # what `splitserve serve -c` would load from values' config
    local = deployed_options(build_app(cfg, k8s_device(cfg), kv_host=None))
    assert kube == local

    # The `deployments` section overrides nothing but pins each pool to its worker group.
    for d in app_cfg["deployments"]:
        mine = local[d["name"]]
        assert {k: d[k] for k in OPTION_KEYS if k in d} == {k: mine[k] for k in OPTION_KEYS if k in d}
        actor = dict(d["ray_actor_options"])
        pinned = actor.pop("resources", None)
        assert actor == {k: v for k, v in mine["ray_actor_options"].items() if k != "resources"}
        if d["name"] != "router":
            assert pinned == {pool_resource(d["name"]): 1}


@pytest.mark.parametrize("device", ["cpu", "cuda"])
@pytest.mark.parametrize("mode", ["disaggregated", "colocated"])
def test_serve_config_matches_build_app(device: str, mode: str) -> None:
    cfg = parse_config({
        "mode": mode,
        "model": {"name": "m", "path": "org/model"},
        "pools": {"prefill": {"replicas": 3, "tensor_parallel_size": 2, "max_num_seqs": 8},
                  "decode": {"replicas": 2, "tensor_parallel_size": 2, "max_num_seqs": 32}},
        "router": {"replicas": 2},
    })
    sc = serve_config(cfg, device)
    ServeDeploySchema.model_validate(sc)
    local = deployed_options(build_app(cfg, device))
    assert [d["name"] for d in sc["applications"][0]["deployments"]] == list(local)
    for d in sc["applications"][0]["deployments"]:
        mine = local[d["name"]]
        for key in OPTION_KEYS:
            if key in d:
                assert d[key] == mine[key], (d["name"], key)
        assert d["ray_actor_options"] == mine["ray_actor_options"]
    assert deployed_options(app_builder(sc["applications"][0]["args"])) == local
