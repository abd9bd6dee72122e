"""splitserve.app: device resolution and per-pool Ray Serve options (pure, no Ray cluster)."""

from __future__ import annotations

import pytest

from splitserve.app import pool_deployment_options, pool_max_replicas, resolve_device
from splitserve.config import parse_config


@pytest.mark.parametrize(
    ("device", "gpus", "expected"),
    [("auto", 0, "cpu"), ("auto", 0.0, "cpu"), ("auto", 2, "cuda"), ("auto", 0.5, "cuda"),
     ("cpu", 8, "cpu"), ("cuda", 0, "cuda")],
)
def test_resolve_device(device: str, gpus: float, expected: str) -> None:
    assert resolve_device(parse_config({"device": device}), gpus) == expected


def _cfg(mode: str):
    return parse_config(
        {
            "mode": mode,
            "pools": {
                "prefill": {"replicas": 2, "tensor_parallel_size": 2, "max_num_seqs": 8},
                "decode": {"replicas": 3, "tensor_parallel_size": 2, "pipeline_parallel_size": 2,
                           "max_num_seqs": 16},
            },
        }
    )


def test_cpu_options() -> None:
    opts = pool_deployment_options(_cfg("disaggregated"), "decode", "cpu")
    assert opts["name"] == "decode"
    assert opts["num_replicas"] == 3
    assert opts["ray_actor_options"] == {"num_cpus": 4}
    assert opts["max_ongoing_requests"] == 32


def test_cuda_options() -> None:
    opts = pool_deployment_options(_cfg("disaggregated"), "prefill", "cuda")
    assert opts["name"] == "prefill"
    assert opts["num_replicas"] == 2
    assert opts["ray_actor_options"] == {"num_cpus": 1, "num_gpus": 2}
    assert opts["max_ongoing_requests"] == 16


def test_colocated_has_no_prefill_pool() -> None:
    cfg = _cfg("colocated")
    assert pool_deployment_options(cfg, "decode", "cpu")["num_replicas"] == 3
    with pytest.raises(KeyError):
        pool_deployment_options(cfg, "prefill", "cpu")


def test_request_router_gets_the_pools_max_replicas() -> None:
    fixed = _cfg("disaggregated")
    kwargs = {role: pool_deployment_options(fixed, role, "cpu")["request_router_config"]
              ["request_router_kwargs"] for role in ("prefill", "decode")}
    assert kwargs["prefill"]["max_replicas"] == pool_max_replicas(fixed, "prefill") == 2
    assert kwargs["decode"]["max_replicas"] == 3
    assert kwargs["decode"]["index_max_blocks"] == "auto"
    scaled = fixed.with_overrides(**{"autoscaling.max_replicas": 5})
    assert pool_max_replicas(scaled, "prefill") == pool_max_replicas(scaled, "decode") == 5


def test_direct_streaming_makes_the_decode_pool_the_ingress() -> None:
    """With direct streaming the decode deployment serves HTTP (its replicas' front, built by
    `__serve_build_asgi_app__`) and the router is its ingress request router; without it the
    router is the ingress, as before. Built in-process, no cluster."""
    from ray.serve._private.http_util import ASGIAppReplicaWrapper

    from splitserve.app import build_app

    direct = build_app(parse_config({"mode": "colocated", "router": {
        "direct_ingress": True, "direct_streaming": True}}), "cpu")
    assert direct._bound_deployment.name == "decode"
    decode_cls = direct._bound_deployment.func_or_class
    assert issubclass(decode_cls, ASGIAppReplicaWrapper)
    assert hasattr(decode_cls, "__serve_build_asgi_app__")
    assert direct._ingress_request_router._bound_deployment.name == "router"
    plain = build_app(parse_config({"mode": "colocated"}), "cpu")
    assert plain._bound_deployment.name == "router"
    assert plain._ingress_request_router is None
    # disaggregated: the decode pool is the ingress, the prefill pool stays behind the router
    disagg = build_app(parse_config({"mode": "disaggregated", "router": {
        "direct_ingress": True, "direct_streaming": True}}), "cpu")
    assert disagg._bound_deployment.name == "decode"
    router = disagg._ingress_request_router._bound_deployment
    assert router.name == "router"
    (pools,) = router.init_args[1].values()
    assert {role: app._bound_deployment.name for role, app in pools.items()} == {
        "prefill": "prefill", "decode": "decode"}
    # the prefill pool is also bound to the ingress: Serve builds the ingress request router
    # into one deployment of its own only when the rest of its graph is the main one's
    assert disagg._bound_deployment.init_kwargs["prefill_pool"] is pools["prefill"]
    assert "prefill_pool" not in direct._bound_deployment.init_kwargs  # colocated: no pool
    built = _serve_build(disagg)
    assert built.ingress_request_router_deployment.name == "router"
    assert {d.name for d in built.deployments} == {"prefill", "decode"}


def _serve_build(app):
    """Ray Serve's own build of `app` as `serve.run` builds it (HAProxy on, as direct streaming
    has it; no cluster needed)."""
    from ray.serve._private import build_app as serve_build

    patched = pytest.MonkeyPatch()
    patched.setattr(serve_build, "RAY_SERVE_ENABLE_HA_PROXY", True)
    try:
        return serve_build.build_app(app, name="splitserve")
    finally:
        patched.undo()


@pytest.mark.parametrize(("doc", "message"), [
    ({"mode": "colocated", "router": {"direct_streaming": True}}, "needs router.direct_ingress"),
])
def test_direct_streaming_config_is_checked(doc: dict, message: str) -> None:
    from splitserve.config import ConfigError

    with pytest.raises(ConfigError, match=message):
        parse_config(doc)
    assert parse_config({}).router.direct_streaming is False  # opt-in
