"""Build the Ray Serve application (router + pools) that a config describes."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from ray import serve

from splitserve.config import SplitserveConfig
from splitserve.engine.args import EngineSpec, engine_spec
from splitserve.kv_transfer.compat import check_pd_compatible, read_model_shape
from splitserve.models import resolve_model_path

APP_NAME = "splitserve"
Device = Literal["cpu", "cuda"]


def resolve_device(cfg: SplitserveConfig, cluster_gpus: float) -> Device:
    """`auto` means CUDA when the cluster has GPUs, else the CPU."""
    if cfg.device != "auto":
        return cfg.device
    return "cuda" if cluster_gpus > 0 else "cpu"


def pool_deployment_options(cfg: SplitserveConfig, role: str, device: Device) -> dict:
    """Ray Serve options of one pool's deployment (pure; tested without Ray)."""
    pool = cfg.deployed_pools()[role]
    resources = {"num_cpus": pool.ranks} if device == "cpu" else {"num_cpus": 1, "num_gpus": pool.ranks}
    return {
        "name": role,
        "num_replicas": pool.replicas,
        "ray_actor_options": resources,
        # Let the engine's scheduler batch: Serve's default (5) would starve continuous batching.
        "max_ongoing_requests": pool.max_num_seqs * 2,
        "health_check_period_s": 10,
        "health_check_timeout_s": 60,
        "graceful_shutdown_timeout_s": 30,
    }


def check_compatible(cfg: SplitserveConfig, specs: dict[str, EngineSpec]) -> None:
    """Deploy-time P/D check (raises `CompatibilityError` before any engine starts)."""
    local = cfg.model.path is None or Path(cfg.model.path).expanduser().exists()
    shape = read_model_shape(resolve_model_path(cfg.model.path)) if local else None
    check_pd_compatible(specs["prefill"], specs["decode"], shape)


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

    specs = {role: engine_spec(cfg, role, device, kv_host=kv_host) for role in cfg.deployed_pools()}
    if cfg.mode == "disaggregated":
        check_compatible(cfg, specs)
    classes = {"prefill": PrefillWorker, "decode": DecodeWorker}
    pools = {
        role: classes[role].options(**pool_deployment_options(cfg, role, device)).bind(spec)
        for role, spec in specs.items()
    }
    router = Router.options(num_replicas=cfg.router.replicas, max_ongoing_requests=4096)
    return router.bind(cfg, pools)
