"""The router's per-model state: one `ModelRoute` per served model of the deployment.

Each served model has its own pool handles, its own admission gates (sharing the tenants' keys,
quotas and usage with the other models, `Tenancy.for_model`), its own dispatcher and its own
tokenizer. The first model is the primary one: its gates and dispatcher are the router's
`tenancy` and `dispatcher` (metrics, the controller link and `/v1/usage` read them).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from splitserve.config import SplitserveConfig
from splitserve.models import resolve_model
from splitserve.router.dispatch import Dispatcher
from splitserve.router.prompts import PromptBuilder
from splitserve.router.tenancy import Tenancy


@dataclass
class ModelRoute:
    """One served model as the router reaches it (`view`: its single-model config)."""

    view: SplitserveConfig
    pools: dict[str, Any]  # role -> deployment handle
    tenancy: Tenancy
    dispatcher: Dispatcher
    prompts: PromptBuilder

    @property
    def name(self) -> str:
        """The served model id."""
        return self.view.model.name


def pool_handles(cfg: SplitserveConfig, pools: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """`pools` as {model name: {role: handle}}; a single model's plain {role: handle} (the form
    of one-model deployments) is keyed by its model's name."""
    if pools and not all(isinstance(v, dict) for v in pools.values()):
        return {cfg.model_views()[0].model.name: dict(pools)}
    return {name: dict(roles) for name, roles in pools.items()}


def health_names(routes: dict[str, ModelRoute]) -> dict[str, Any]:
    """The handles `/health` pings, by display name: `prefill`, `decode` with one model,
    `<model>/<role>` with several."""
    if len(routes) == 1:
        return dict(next(iter(routes.values())).pools)
    return {f"{name}/{role}": h for name, r in routes.items() for role, h in r.pools.items()}


def _prompt_builder(view: SplitserveConfig) -> PromptBuilder:
    """The router's tokenizer of a model: the directory or hub repo (and revision) the engines
    load."""
    model = resolve_model(view.model.path, view.model.tiny_variant)
    return PromptBuilder(model.model, view.model.max_model_len, revision=model.revision)


def build_routes(
    cfg: SplitserveConfig,
    pools: dict[str, dict[str, Any]],
    primary: Tenancy,
    make_dispatcher: Callable[[SplitserveConfig, dict[str, Any], Tenancy], Dispatcher],
    make_prompts: Callable[[SplitserveConfig], PromptBuilder] | None = None,
) -> dict[str, ModelRoute]:
    """A route per served model, in config order; the first uses `primary` as its tenancy."""
    make_prompts = make_prompts or _prompt_builder
    routes: dict[str, ModelRoute] = {}
    for i, view in enumerate(cfg.model_views()):
        handles = pools[view.model.name]
        tenancy = primary if i == 0 else primary.for_model(view)
        routes[view.model.name] = ModelRoute(
            view, handles, tenancy, make_dispatcher(view, handles, tenancy), make_prompts(view)
        )
    return routes
