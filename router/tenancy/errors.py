"""The errors tenancy raises: OpenAI error bodies with a status, and a `reason` for accounting.

Every refusal is a `TenancyError`, a subclass of the router's `APIError`, so the router's existing
handler renders it unchanged; `reason` is the label the usage ledger counts it under.

| status | reason              | when                                           | header           |
| ------ | ------------------- | ---------------------------------------------- | ---------------- |
| 401    | `missing_api_key`   | no `Authorization: Bearer` header              | WWW-Authenticate |
| 401    | `invalid_api_key`   | a key no tenant holds, or another scheme       | WWW-Authenticate |
| 403    | `tenant_disabled`   | a valid key of a disabled tenant               |                  |
| 400    | `request_too_large` | prompt + max_tokens over what a quota allows   |                  |
| 429    | `rpm`, `tpm`        | requests / tokens per minute spent             | Retry-After      |
| 429    | `concurrency`       | the tenant's concurrent requests at the limit  | Retry-After      |
| 429    | `queue_full`        | a gate's queue (or the tenant's share) is full | Retry-After      |
| 503    | `queue_timeout`     | waited longer than the gate's timeout          | Retry-After      |
"""

from __future__ import annotations

import math
from typing import Any

from splitserve.router.errors import APIError

MISSING_API_KEY = "missing_api_key"
INVALID_API_KEY = "invalid_api_key"
TENANT_DISABLED = "tenant_disabled"
REQUEST_TOO_LARGE = "request_too_large"
RPM = "rpm"
TPM = "tpm"
CONCURRENCY = "concurrency"
QUEUE_FULL = "queue_full"
QUEUE_TIMEOUT = "queue_timeout"

# Retry-After is whole seconds (RFC 9110); a client told "0" would retry in a tight loop.
MIN_RETRY_AFTER_S = 1

_LIMIT_NAMES = {
    RPM: ("requests", "requests per minute (RPM)"),
    TPM: ("tokens", "tokens per minute (TPM)"),
    CONCURRENCY: ("requests", "concurrent requests"),
}


class TenancyError(APIError):
    """An `APIError` with the accounting `reason` (a constant above) and `tenant` if known."""

    def __init__(
        self, status: int, message: str, *, reason: str, tenant: str | None = None, **kwargs: Any
    ) -> None:
        super().__init__(status, message, **kwargs)
        self.reason = reason
        self.tenant = tenant


def retry_after(seconds: float) -> str:
    """The Retry-After header value: whole seconds, rounded up, at least one."""
    return str(max(MIN_RETRY_AFTER_S, math.ceil(seconds - 1e-9)))


def _unauthorized(message: str, reason: str) -> TenancyError:
    return TenancyError(
        401,
        message,
        reason=reason,
        code="invalid_api_key",
        headers={"WWW-Authenticate": "Bearer"},
    )


def missing_api_key() -> TenancyError:
    """401: no key was sent."""
    return _unauthorized(
        "You didn't provide an API key. Send it in an Authorization header using Bearer auth "
        "(Authorization: Bearer YOUR_KEY).",
        MISSING_API_KEY,
    )


def invalid_api_key() -> TenancyError:
    """401: the key matches no tenant (the message never echoes the key)."""
    return _unauthorized("Incorrect API key provided.", INVALID_API_KEY)


def tenant_disabled(tenant: str) -> TenancyError:
    """403: the key is right but its tenant is switched off."""
    return TenancyError(
        403,
        f"The tenant `{tenant}` is disabled; its API keys are not accepted.",
        reason=TENANT_DISABLED,
        tenant=tenant,
        code="tenant_disabled",
    )


def request_too_large(tenant: str, requested: int, allowed: int, what: str) -> TenancyError:
    """400: this request can never fit the quota, so retrying (what a 429 invites) cannot help."""
    return TenancyError(
        400,
        f"Request too large for tenant `{tenant}` on {what}: limit {allowed}, requested "
        f"{requested} (prompt + max_tokens). Lower max_tokens or shorten the prompt.",
        reason=REQUEST_TOO_LARGE,
        tenant=tenant,
        param="max_tokens",
        code="request_too_large",
    )


def rate_limited(tenant: str, reason: str, limit: int, wait_s: float) -> TenancyError:
    """429 for a spent RPM / TPM / concurrency quota; Retry-After says when it will fit."""
    kind, name = _LIMIT_NAMES[reason]
    after = retry_after(wait_s)
    return TenancyError(
        429,
        f"Rate limit reached for tenant `{tenant}` on {name}: limit {limit}. "
        f"Please try again in {after}s.",
        reason=reason,
        tenant=tenant,
        type=kind,
        code="rate_limit_exceeded",
        headers={"Retry-After": after},
    )


def queue_full(pool: str, wait_s: float) -> TenancyError:
    """429: the pool's admission queue (or this tenant's share of it) is full."""
    return TenancyError(
        429,
        f"Too many requests are waiting for the {pool} pool. Please try again later.",
        reason=QUEUE_FULL,
        type="requests",
        code="rate_limit_exceeded",
        headers={"Retry-After": retry_after(wait_s)},
    )


def queue_timeout(pool: str, waited_s: float, wait_s: float) -> TenancyError:
    """503: the request waited `waited_s` for the pool without getting its turn."""
    return TenancyError(
        503,
        f"The {pool} pool had no capacity for this request within {waited_s:g}s.",
        reason=QUEUE_TIMEOUT,
        type="service_unavailable",
        code="queue_timeout",
        headers={"Retry-After": retry_after(wait_s)},
    )
