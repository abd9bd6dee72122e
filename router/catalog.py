"""Which served model a request's `model` names: served models, LoRA adapters, weighted aliases.

Pure (no Ray, no I/O). `ModelCatalog.resolve(requested, allowed=..., key=...)` returns the
`Target` a request runs on, or raises the 404 `model_not_found` OpenAI answers both for a model
that does not exist and for one the caller may not use (so that a tenant cannot probe for other
tenants' models). Aliases split their requests by weight with `pick_target`, a pure function of
the targets, a key and a seed: a canary rollout (`chat` -> 90 % `tiny-v1`, 10 % `tiny-v2`) is
reproducible in tests and sticky per end user when the key is the request's `user`.
"""

from __future__ import annotations

import fnmatch
import hashlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from splitserve.config import SplitserveConfig
from splitserve.engine.messages import LoraRef
from splitserve.router.adapters import AdapterRegistry
from splitserve.router.errors import model_not_found


def pick_target(targets: Sequence[tuple[str, float]], key: str, seed: int = 0) -> str:
    """The target of `key` among weighted `targets` ((model id, weight > 0), in order).

    A seeded SHA-256 of the key, read as a number in [0, 1), falls into one target's slice of
    the cumulative weights: each target gets its weight's share of uniformly spread keys, and the
    same (key, seed) always gets the same target.

    >>> pick_target([("a", 1.0)], "anything")
    'a'
    """
    if not targets:
        raise ValueError("pick_target: no targets")
    total = sum(w for _, w in targets)
    digest = hashlib.sha256(f"{seed}\x00{key}".encode()).digest()
    point = int.from_bytes(digest[:8], "big") / 2**64 * total
    edge = 0.0
    for model, weight in targets:
        edge += weight
        if point < edge:
            return model
    return targets[-1][0]  # float rounding at the top edge


def is_allowed(model_id: str, allowed: Iterable[str] | None) -> bool:
    """Whether a tenant with access list `allowed` (None: everything) may use `model_id`; the
    list holds ids or shell-style patterns."""
    if allowed is None:
        return True
    return any(fnmatch.fnmatchcase(model_id, pattern) for pattern in allowed)


@dataclass(frozen=True)
class Target:
    """Where a request runs: the served model `base` (its pools), with `adapter` if the id
    named one; `model` is the id the response reports (the alias's chosen target, never the
    alias itself, so a client can tell which version answered)."""

    model: str
    base: str
    adapter: LoraRef | None = None


@dataclass(frozen=True)
class ServedModel:
    """A served base model as `/v1/models` shows it."""

    name: str
    max_model_len: int


class ModelCatalog:
    """The ids a deployment answers to; adapters come from the (mutable) `AdapterRegistry`."""

    def __init__(
        self,
        models: Sequence[ServedModel],
        aliases: Mapping[str, tuple[tuple[tuple[str, float], ...], int]],
        adapters: AdapterRegistry,
    ) -> None:
        self.models = {m.name: m for m in models}
        self.aliases = dict(aliases)
        self.adapters = adapters

    @classmethod
    def from_config(cls, cfg: SplitserveConfig, adapters: AdapterRegistry) -> ModelCatalog:
        """The models and aliases of `cfg`."""
        models = [ServedModel(v.model.name, v.model.max_model_len) for v in cfg.model_views()]
        aliases = {
            a.name: (tuple((t.model, t.weight) for t in a.targets), a.seed) for a in cfg.aliases
        }
        return cls(models, aliases, adapters)

    def resolve(self, requested: str, *, allowed: Iterable[str] | None, key: str) -> Target:
        """The target of `requested` for a caller with access list `allowed`; `key` picks an
        alias's target (the request's `user`, else its id). 404 when the id is unknown or not
        allowed; an alias is allowed when its own id is (its targets need not be)."""
        allowed = tuple(allowed) if allowed is not None else None
        if not is_allowed(requested, allowed):
            raise model_not_found(requested)
        model_id = requested
        if requested in self.aliases:
            targets, seed = self.aliases[requested]
            model_id = pick_target(targets, key, seed)
        if model_id in self.models:
            return Target(model=model_id, base=model_id)
        adapter = self.adapters.get(model_id)
        if adapter is not None:
            return Target(model=model_id, base=adapter.base, adapter=adapter.ref)
        raise model_not_found(requested)

    def cards(self, *, allowed: Iterable[str] | None, created: int) -> list[dict[str, Any]]:
        """`/v1/models` entries the caller may use: models, then adapters (`parent` and `root`:
        their base model), then aliases (`root`: the alias's first target)."""
        allowed = tuple(allowed) if allowed is not None else None
        out: list[dict[str, Any]] = []
        for m in self.models.values():
            out.append(_card(m.name, created, max_model_len=m.max_model_len, root=m.name))
        for a in self.adapters.all():
            base = self.models.get(a.base)
            out.append(_card(a.name, created, parent=a.base, root=a.base,
                             max_model_len=base.max_model_len if base else None))
        for name, (targets, _) in self.aliases.items():
            out.append(_card(name, created, root=targets[0][0],
                             targets=[{"model": m, "weight": w} for m, w in targets]))
        return [c for c in out if is_allowed(c["id"], allowed)]


def _card(model_id: str, created: int, **extra: Any) -> dict[str, Any]:
    card = {"id": model_id, "object": "model", "created": created, "owned_by": "splitserve",
            "parent": None}
    card.update({k: v for k, v in extra.items() if v is not None or k == "parent"})
    return card
