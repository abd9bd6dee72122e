"""Build the Ray Serve application (router + pools) that a config describes."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from ray import serve

from splitserve.config import SplitserveConfig
from splitserve.engine.args import EngineSpec, engine_spec
from splitserve.kv_transfer.compat import check_pd_compatible, read_model_shape
from splitserve.models import resolve_model_path

APP_NAME = "splitserve"
ROUTER_DEPLOYMENT = "router"
Device = Literal["cpu", "cuda"]
# How often Serve checks a stopping replica for unfinished requests (Serve's default: 2 s). On
# `splitserve serve`'s stop the routers have drained first (router/drain.py), so a replica has
# none and stops at its first check; Serve stops the router, then each pool, one after another,
# and every check period is paid once per deployment. A scale-down's drain is still bounded by
# `graceful_shutdown_timeout_s`, not by this.
SHUTDOWN_CHECK_PERIOD_S = 0.5


def resolve_device(cfg: SplitserveConfig, cluster_gpus: float) -> Device:
    """`auto` means CUDA when the cluster has GPUs, else the CPU."""
    if cfg.device != "auto":
        return cfg.device
    return "cuda" if cluster_gpus > 0 else "cpu"


def deployment_name(cfg: SplitserveConfig, view: SplitserveConfig, role: str) -> str:
    """The Serve deployment of `view`'s pool `role`: `prefill` / `decode` for a one-model
    config, `<role>-<model>` with several `models` (characters other than letters, digits,
    `.`, `_` and `-` become `_`)."""
    if not cfg.models:
        return role
    slug = "".join(c if c.isalnum() or c in "._-" else "_" for c in view.model.name)
    return f"{role}-{slug}"


def pool_max_replicas(cfg: SplitserveConfig, role: str) -> int:
    """The most replicas pool `role` can have: `autoscaling.max_replicas` when the controller
    sizes the pools, else the fixed `replicas` (pure)."""
    if cfg.autoscaling is not None:
        return cfg.autoscaling.max_replicas
    return cfg.deployed_pools()[role].replicas


def pool_deployment_options(
    cfg: SplitserveConfig, role: str, device: Device, *, name: str | None = None
) -> dict:
    """Ray Serve options of one pool's deployment (pure; tested without Ray). `cfg` is a
    single-model view; `name`: the deployment's name (default: the role)."""
    pool = cfg.deployed_pools()[role]
    if device == "cuda":
        resources = {"num_cpus": 1, "num_gpus": pool.ranks}
    elif cfg.placement.share_cores:
        resources = {"num_cpus": 0.01 * pool.ranks}  # sharing: Ray's CPU accounting set aside
    else:
        resources = {"num_cpus": pool.ranks}
    return {
        "name": name or role,
        "num_replicas": pool.replicas,
        "ray_actor_options": resources,
        # Let the engine's scheduler batch: Serve's default (5) would starve continuous batching.
        "max_ongoing_requests": pool.max_num_seqs * 2,
        "health_check_period_s": 10,
        "health_check_timeout_s": 60,
        # Scale-down drains: a replica being removed finishes its requests first.
        "graceful_shutdown_timeout_s": (
            cfg.autoscaling.drain_timeout_s if cfg.autoscaling is not None else 30
        ),
        "graceful_shutdown_wait_loop_s": SHUTDOWN_CHECK_PERIOD_S,
        # splitserve's routing policy for this pool (router/replica_router.py)
        "request_router_config": {
            "request_router_class": "splitserve.router.replica_router.PolicyRequestRouter",
            "request_router_kwargs": {
                "policy": getattr(cfg.router.routing, role),
                "max_replicas": pool_max_replicas(cfg, role),
                **cfg.router.routing.model_dump(),
            },
        },
    }


def router_deployment_options(cfg: SplitserveConfig) -> dict:
    """Ray Serve options of the router deployment (pure)."""
    return {
        "name": ROUTER_DEPLOYMENT,
        "num_replicas": cfg.router.replicas,
        "ray_actor_options": {"num_cpus": 0},
        "max_ongoing_requests": 4096,
        "graceful_shutdown_wait_loop_s": SHUTDOWN_CHECK_PERIOD_S,
    }


def serve_run_options(cfg: SplitserveConfig) -> dict:
    """Keyword arguments of `serve.run` for the application (pure). With `autoscaling`, Serve's
    external-scaler API is on: the controller (`controller.live`) sets the pools' replicas."""
    return {
        "name": APP_NAME,
        "route_prefix": "/",
        "external_scaler_enabled": cfg.autoscaling is not None,
    }


def check_compatible(cfg: SplitserveConfig, specs: dict[str, EngineSpec]) -> None:
    """Deploy-time P/D check (raises `CompatibilityError` before any engine starts)."""
    local = cfg.model.path is None or Path(cfg.model.path).expanduser().exists()
    shape = (
        read_model_shape(resolve_model_path(cfg.model.path, cfg.model.tiny_variant))
        if local else None
    )
    check_pd_compatible(specs["prefill"], specs["decode"], shape)


def check_adapters(cfg: SplitserveConfig) -> None:
    """Deploy-time check of the declared LoRA adapters: each directory has an
    adapter_config.json whose rank fits `max_lora_rank` (raises ConfigError)."""
    import json

    from splitserve.config import ConfigError

    for view in cfg.model_views():
        for a in view.lora.adapters if view.lora is not None else ():
            conf = Path(a.path).expanduser() / "adapter_config.json"
            try:
                rank = int(json.loads(conf.read_text()).get("r", 0))
            except (OSError, ValueError) as err:
                raise ConfigError(f"lora adapter {a.name!r}: cannot read {conf}: {err}") from None
            if rank > view.lora.max_lora_rank:
                raise ConfigError(f"lora adapter {a.name!r}: rank {rank} exceeds "
                                  f"max_lora_rank {view.lora.max_lora_rank}")


def build_app(
    cfg: SplitserveConfig, device: Device, *, kv_host: str | None = None
) -> serve.Application:
    """The application graph: one deployment per deployed pool, the router in front.

    `kv_host`: NIXL side-channel address; 127.0.0.1 on a one-machine cluster, None (each node's
    own IP) on a multi-node one.
    """
    from splitserve.decode_workers import DecodeWorker
    from splitserve.prefill_workers import PrefillWorker
    from splitserve.router.app import Router

    check_adapters(cfg)
    classes = {"prefill": PrefillWorker, "decode": DecodeWorker}
    if cfg.router.direct_streaming:  # the decode replicas serve HTTP (engine/front.py)
        classes["decode"] = serve.deployment(serve.ingress()(DecodeWorker.func_or_class))
    pools: dict[str, dict] = {}
    for view in cfg.model_views():
        specs = {
            role: engine_spec(view, role, device, kv_host=kv_host)
            for role in view.deployed_pools()
        }
        if view.mode == "disaggregated":
            check_compatible(view, specs)
        bound: dict[str, Any] = {}
        for role in sorted(specs, key=lambda r: r != "prefill"):  # prefill first
            # Direct streaming, disaggregated: the decode pool (the ingress) is bound with the
            # prefill pool, so that Serve builds the prefill deployment in the main graph (the
            # ingress request router must build into one deployment alone).
            extra = ({"prefill_pool": bound["prefill"]}
                     if cfg.router.direct_streaming and role == "decode" and "prefill" in bound
                     else {})
            bound[role] = classes[role].options(**pool_deployment_options(
                view, role, device, name=deployment_name(cfg, view, role)
            )).bind(specs[role], **extra)
        pools[view.model.name] = {role: bound[role] for role in specs}
    router = Router.options(**router_deployment_options(cfg)).bind(cfg, pools)
    if not cfg.router.direct_streaming:
        return router
    # Direct streaming: the decode pool is the HTTP ingress and the router its ingress request
    # router (HAProxy asks it where each request goes: router/direct.py). Ray Serve's hook for
    # this is internal (Ray Serve LLM's direct streaming builds on it).
    decode = pools[cfg.model_views()[0].model.name]["decode"]
    return decode._with_ingress_request_router(router)


# --- Deploying through a Serve config (KubeRay's RayService, `serve deploy`) -------------------

SERVE_IMPORT_PATH = "splitserve.app:app_builder"


def serve_app_args(cfg: SplitserveConfig, device: Device | Literal["auto"], *,
                   kv_host: str | None = None) -> dict:
    """The `args` of the Serve application: what `app_builder` rebuilds the app from."""
    return {"config": cfg.model_dump(mode="json"), "device": device, "kv_host": kv_host}


def app_builder(args: dict) -> serve.Application:
    """Ray Serve application builder, for `import_path: splitserve.app:app_builder`.

    `args` is `serve_app_args(...)`: {"config": <config mapping>, "device": "cpu"|"cuda"|"auto",
    "kv_host": <address or null>}. Returns exactly `build_app(cfg, device, kv_host=...)`, the
    application `splitserve serve` deploys. "auto" resolves against the running Ray cluster.
    """
    from splitserve.config import parse_config

    cfg = parse_config(args.get("config") or {}, "<serve args: config>")
    device = args.get("device") or cfg.device
    if device == "auto":
        import ray

        device = resolve_device(cfg, ray.cluster_resources().get("GPU", 0))
    return build_app(cfg, device, kv_host=args.get("kv_host"))


def serve_config(
    cfg: SplitserveConfig,
    device: Device,
    *,
    kv_host: str | None = None,
    pool_resources: dict[str, dict[str, float]] | None = None,
) -> dict:
    """The Ray Serve config (`serve deploy` / RayService `serveConfigV2` schema) for `cfg` (pure).

    One application, built by `app_builder` from `serve_app_args`: the very `build_app` that
    `splitserve serve` runs, so every deployment option comes from the same code. Each deployment
    also spells out the options a scaler or the cluster layout changes, `num_replicas` and
    `ray_actor_options` (as `build_app` sets them), so that a scaler can patch `num_replicas` in
    place (Serve applies it without restarting replicas). `pool_resources` adds Ray custom
    resources to a pool's actors (on Kubernetes, each pool is pinned to its own worker group).
    """
    scaled = ("name", "num_replicas", "ray_actor_options")
    deployments = []
    for view in cfg.model_views():
        for role in view.deployed_pools():
            opts = pool_deployment_options(view, role, device,
                                           name=deployment_name(cfg, view, role))
            extra = (pool_resources or {}).get(role)
            if extra:
                opts["ray_actor_options"] = {**opts["ray_actor_options"], "resources": dict(extra)}
            deployments.append({k: opts[k] for k in scaled})
    router = router_deployment_options(cfg)
    deployments.append({k: router[k] for k in scaled})
    return {
        "http_options": {"host": cfg.router.host, "port": cfg.router.port},
        "applications": [
            {
                "name": APP_NAME,
                "route_prefix": "/",
                "import_path": SERVE_IMPORT_PATH,
                "args": serve_app_args(cfg, device, kv_host=kv_host),
                "deployments": deployments,
                "external_scaler_enabled": cfg.autoscaling is not None,
            }
        ],
    }
