"""What the router's health endpoints answer: can this router serve, and how well (pure).

A served model can be served while its decode pool answers: the decode pool alone runs every
request (colocated, or a local prefill when the prefill pool is short, `router/dispatch.py`).
The prefill pool is optional: without it requests complete with a later first token, so a short
prefill pool makes the model `degraded`, not unservable. A model whose decode pool does not
answer cannot be served.

With several models (`models:`), the router is ready while at least one of them can be served;
each model's state is in the body (`models`), and a model that cannot be served makes the status
`degraded`. Every router replica reaches the same pools, so a readiness failure here takes all
of them out of the Service at once: making one model's outage fail readiness would turn it into
an outage of every model, while its requests would get a 503 from the router anyway.

Pool states are short words (`POOL_STATES`); what went wrong goes to the log, never into a
response body.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

PoolState = Literal["ok", "timeout", "unavailable"]
Status = Literal["ok", "degraded", "unavailable"]

POOL_STATES: tuple[str, ...] = ("ok", "timeout", "unavailable")
# ok: answered within router.health_timeout_s; timeout: no replica answered in time;
# unavailable: the ping failed (no live replica, the engine is dead, the actor died)

log = logging.getLogger("splitserve.router")  # the router's health pings log here

REQUIRED_ROLE = "decode"  # the pool a model cannot be served without, in either mode


@dataclass(frozen=True)
class Readiness:
    """The answer of `/health` and `/health/ready`."""

    ready: bool
    status: Status
    pools: dict[str, str]  # display name -> pool state (`pool_name`)
    models: dict[str, str]  # model -> its own status

    @property
    def http_status(self) -> int:
        """200 while ready (ok or degraded), else 503."""
        return 200 if self.ready else 503

    def body(self) -> dict[str, object]:
        """The JSON body: short words only."""
        return {"status": self.status, "pools": self.pools, "models": self.models}


def pool_name(model: str, role: str, n_models: int) -> str:
    """A pool's name in the body: its role with one model, `<model>/<role>` with several (as
    `router.model_routes.health_names`)."""
    return role if n_models == 1 else f"{model}/{role}"


def model_status(pings: Mapping[str, str], mode: str) -> Status:
    """One model's status from its pools' states (`pings`: role -> state) and its mode:
    unavailable without an answering decode pool, degraded when another pool that the mode
    deploys (prefill, disaggregated) is short, else ok."""
    if pings.get(REQUIRED_ROLE) != "ok":
        return "unavailable"
    expected = {"prefill", "decode"} if mode == "disaggregated" else {"decode"}
    if any(pings.get(role) != "ok" for role in expected | set(pings)):
        return "degraded"
    return "ok"


def decide(pings: Mapping[str, Mapping[str, str]], modes: Mapping[str, str]) -> Readiness:
    """Readiness from each served model's ping results.

    `pings`: model -> role -> pool state (`POOL_STATES`); `modes`: model -> its mode
    (`disaggregated` or `colocated`; a model absent here counts as disaggregated). Ready while
    at least one model can be served; `ok` when every pool answers, `degraded` when some
    pool or model is short but one model can be served, `unavailable` (not ready) when none
    can.
    """
    for roles in pings.values():
        for role, state in roles.items():
            if state not in POOL_STATES:
                raise ValueError(f"pool {role}: state {state!r} is not one of {POOL_STATES}")
    models = {m: model_status(roles, modes.get(m, "disaggregated")) for m, roles in pings.items()}
    pools = {
        pool_name(m, role, len(pings)): state
        for m, roles in pings.items() for role, state in roles.items()
    }
    states = set(models.values())
    if not models or states == {"unavailable"}:
        status: Status = "unavailable"
    elif states == {"ok"}:
        status = "ok"
    else:
        status = "degraded"
    return Readiness(status != "unavailable", status, pools, models)
