"""Loading and unloading LoRA adapters at run time (the admin endpoints of `router/app.py`).

Load: check the request, give the adapter a fresh id, load it into every replica of every pool
of its base model (prefill and decode; `on_every_replica` repeats the call, each time steering
it away from the replicas done already), and only then register it, so that no request is
routed with an adapter a worker failed to load. A replica that starts later (autoscaling, a
restart) loads it from its path on its first request with it: every request carries the
adapter's path (`LoraRef`), and the pools' request routers prefer replicas that report it
loaded (`router/replica_router.py`). Unload: take it out of routing first, wait for its
requests in flight, then drop it from every replica.
"""

from __future__ import annotations

import asyncio
import json
import logging
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from splitserve.config import ModelId
from splitserve.engine.messages import LoraOp, LoraRef
from splitserve.router.adapters import Adapter, AdapterError, AdapterRegistry
from splitserve.router.errors import APIError, bad_request, model_not_found
from splitserve.router.model_routes import ModelRoute
from splitserve.router.retry import rejection

log = logging.getLogger("splitserve.router")


class LoadAdapter(BaseModel):
    """Body of `POST /v1/admin/lora_adapters` (vLLM's field names)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    lora_name: ModelId
    lora_path: str = Field(min_length=1)
    base_model: str | None = None

    @classmethod
    def parse(cls, body: bytes) -> LoadAdapter:
        """Validate the JSON body; 400 naming the bad field."""
        try:
            return cls.model_validate(json.loads(body or b"{}"))
        except ValueError as err:
            if isinstance(err, ValidationError) and err.errors():
                first = err.errors()[0]
                param = ".".join(str(p) for p in first["loc"]) or None
                raise bad_request(f"{param}: {first['msg']}", param=param) from None
            raise bad_request(f"The body is not valid JSON: {err}") from None


def conflict(message: str) -> APIError:
    """409: the request conflicts with the deployment's state."""
    return APIError(409, message, code="conflict")


def _base_route(routes: dict[str, ModelRoute], base: str | None) -> ModelRoute:
    if base is None:
        if len(routes) != 1:
            raise bad_request("base_model is required when several models are served.",
                              param="base_model")
        return next(iter(routes.values()))
    route = routes.get(base)
    if route is None:
        raise model_not_found(base)
    return route


def _check_path(path: str) -> str:
    p = Path(path).expanduser()
    if not (p / "adapter_config.json").is_file():
        raise bad_request(f"lora_path {path!r} is no adapter directory (no adapter_config.json "
                          "there, as the router sees it).", param="lora_path")
    return str(p.resolve())


async def load_adapter(
    routes: dict[str, ModelRoute], adapters: AdapterRegistry, body: LoadAdapter,
    router_replicas: int,
) -> Adapter:
    """Load `body`'s adapter into every pool of its base model and register it (raises
    `APIError`: 400 bad path or a pool could not load it, 404 base, 409 name taken)."""
    if router_replicas != 1:
        raise conflict("Loading adapters at run time needs router.replicas: 1 (each router "
                       "replica keeps its own adapter list); declare them in the config instead.")
    route = _base_route(routes, body.base_model)
    if route.view.lora is None:
        raise bad_request(f"Model `{route.name}` has no LoRA support: set `lora:` on it in the "
                          "deployment config.", param="base_model")
    if body.lora_name in routes:
        raise conflict(f"A model named {body.lora_name!r} exists already.")
    try:
        ref = adapters.new_ref(body.lora_name, _check_path(body.lora_path))
    except AdapterError as err:
        raise conflict(str(err)) from None
    results = await asyncio.gather(
        *(on_every_replica(h, "load_lora", ref, _replicas(route, role))
          for role, h in route.pools.items()),
        return_exceptions=True,
    )
    failed = [r for r in results if isinstance(r, BaseException)]
    if failed:
        await _unload_everywhere(route, ref)  # undo where it did load
        refused = rejection(failed[0])
        raise bad_request(
            refused.args[1] if refused is not None else f"The workers could not load the "
            f"adapter: {type(failed[0]).__name__}", param="lora_path",
        )
    try:
        return adapters.add(route.name, ref)
    except AdapterError as err:  # the same name loaded concurrently
        raise conflict(str(err)) from None


async def unload_adapter(
    routes: dict[str, ModelRoute], adapters: AdapterRegistry, name: str, timeout_s: float
) -> int:
    """Unregister adapter `name`, wait for its requests in flight (up to `timeout_s`), drop it
    from its base model's pools; returns how many requests were in flight. 404 if unknown."""
    try:
        adapter = adapters.remove(name)
    except AdapterError:
        raise model_not_found(name) from None
    in_flight = adapters.in_flight(name)
    if not await adapters.wait_idle(name, timeout_s):
        log.warning("adapter %s: %d requests still running after %.0f s; unloading anyway",
                    name, adapters.in_flight(name), timeout_s)
    route = routes.get(adapter.base)
    if route is not None:
        await _unload_everywhere(route, adapter.ref)
    return in_flight


def _replicas(route: ModelRoute, role: str) -> int:
    """The pool's ready replicas as the router knows them (the controller updates them)."""
    return max(route.dispatcher.replicas.get(role, route.view.deployed_pools()[role].replicas), 1)


async def on_every_replica(handle: Any, method: str, ref: LoraRef, replicas: int) -> set[str]:
    """Call `method(LoraOp)` once on each of a pool's `replicas` replicas; returns their ids.

    Each call avoids the replicas done already, so the pool's request router sends it to a new
    one; when none is left it picks a done one again, and the loop ends early."""
    done: set[str] = set()
    for _ in range(replicas):
        result = await getattr(handle, method).remote(LoraOp(ref, tuple(sorted(done))))
        if result["replica"] in done:
            break
        done.add(result["replica"])
    return done


async def _unload_everywhere(route: ModelRoute, ref: LoraRef) -> None:
    for role, h in route.pools.items():
        try:
            await on_every_replica(h, "unload_lora", ref, _replicas(route, role))
        except Exception as err:  # noqa: BLE001 - best effort: a dead replica has no adapter
            log.warning("adapter %s: unload from %s failed: %r", ref.name, role, err)
