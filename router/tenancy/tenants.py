"""Tenants as the router uses them: frozen dataclasses built once from the validated config.

Sources, merged in this order: `tenants:` in the deployment YAML, then `tenancy.tenants_file`
(a YAML list of the same entries, or a mapping with a `tenants:` key, e.g. a Kubernetes Secret
mounted as a file). A name defined twice is an error, never a silent override.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import yaml
from pydantic import TypeAdapter, ValidationError

from splitserve.config import ConfigError, QuotaConfig, SplitserveConfig, TenantConfig

DEFAULT_TENANT_NAME = "default"  # the one tenant of open mode (no tenants configured)
UNAUTHENTICATED = "-"  # the usage label of requests refused before a tenant is known
RESERVED_NAMES = frozenset({UNAUTHENTICATED})


@dataclass(frozen=True)
class QuotaLimits:
    """Per-tenant limits; None means unlimited."""

    requests_per_minute: int | None = None
    tokens_per_minute: int | None = None
    max_concurrent_requests: int | None = None
    max_tokens_per_request: int | None = None

    @classmethod
    def from_config(cls, q: QuotaConfig) -> QuotaLimits:
        """The same numbers, as a plain frozen dataclass."""
        return cls(
            requests_per_minute=q.requests_per_minute,
            tokens_per_minute=q.tokens_per_minute,
            max_concurrent_requests=q.max_concurrent_requests,
            max_tokens_per_request=q.max_tokens_per_request,
        )


@dataclass(frozen=True)
class Tenant:
    """An authenticated principal. `weight` scales its fair share; `priority`: higher first."""

    name: str
    weight: float = 1.0
    priority: int = 0
    enabled: bool = True
    quotas: QuotaLimits = field(default_factory=QuotaLimits)
    api_key_hashes: tuple[str, ...] = ()
    allowed_models: tuple[str, ...] | None = None  # ids or patterns; None: every model

    @classmethod
    def from_config(cls, t: TenantConfig) -> Tenant:
        """Convert one validated `TenantConfig`."""
        return cls(
            name=t.name,
            weight=t.weight,
            priority=t.priority,
            enabled=t.enabled,
            quotas=QuotaLimits.from_config(t.quotas),
            api_key_hashes=tuple(t.api_key_hashes),
            allowed_models=tuple(t.allowed_models) if t.allowed_models is not None else None,
        )


DEFAULT_TENANT = Tenant(name=DEFAULT_TENANT_NAME)

_TENANT_LIST = TypeAdapter(tuple[TenantConfig, ...])


def load_tenants_file(path: str | Path) -> tuple[TenantConfig, ...]:
    """Read and validate a tenants file; ConfigError names the file and the bad entry."""
    p = Path(path)
    try:
        data = yaml.safe_load(p.read_text())
    except OSError as err:
        raise ConfigError(f"cannot read tenants file {p}: {err.strerror}") from None
    except yaml.YAMLError as err:
        raise ConfigError(f"invalid YAML in tenants file {p}: {err}") from None
    if isinstance(data, dict) and set(data) == {"tenants"}:
        data = data["tenants"]
    if data is None:
        return ()
    try:
        return _TENANT_LIST.validate_python(data)
    except ValidationError as err:
        # Report locations only: an entry may hold a key pasted in by mistake.
        where = ", ".join(".".join(map(str, e["loc"])) for e in err.errors())
        raise ConfigError(f"invalid tenants file {p}: bad entries at {where}") from None


def build_tenants(entries: Iterable[TenantConfig]) -> dict[str, Tenant]:
    """Tenants by name, in order; ConfigError on a duplicate name."""
    tenants: dict[str, Tenant] = {}
    for entry in entries:
        if not entry.name.strip() or entry.name in RESERVED_NAMES:
            raise ConfigError(f"tenant name {entry.name!r} is empty or reserved")
        if entry.name in tenants:
            raise ConfigError(f"tenant {entry.name!r} is defined twice")
        tenants[entry.name] = Tenant.from_config(entry)
    return tenants


def tenants_from_config(cfg: SplitserveConfig) -> dict[str, Tenant]:
    """All configured tenants: `cfg.tenants` plus those of `cfg.tenancy.tenants_file`."""
    extra = load_tenants_file(cfg.tenancy.tenants_file) if cfg.tenancy.tenants_file else ()
    return build_tenants((*cfg.tenants, *extra))
