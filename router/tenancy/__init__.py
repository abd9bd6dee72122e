"""Multi-tenancy for the router: API keys, quotas, fair admission, cache isolation, usage.

Pure and in-process (no Ray, no vLLM); `Tenancy` (service.py) wires the parts for one router
replica. Modules: keys (hashing, constant-time lookup), tenants (config -> frozen `Tenant`),
auth (Authorization header -> Tenant), buckets + quotas (RPM/TPM/concurrency), vtc (the Virtual
Token Counter scheduler), admission (the asyncio gate per pool), cache_salt, usage, errors.
"""

from splitserve.router.tenancy.admission import FairAdmission, Ticket
from splitserve.router.tenancy.auth import Authenticator
from splitserve.router.tenancy.cache_salt import cache_salt_for
from splitserve.router.tenancy.errors import TenancyError
from splitserve.router.tenancy.keys import KeyRing, generate_api_key, hash_api_key
from splitserve.router.tenancy.quotas import LocalQuotaLimiter, QuotaBackend, Reservation
from splitserve.router.tenancy.service import RequestUsage, Tenancy, pool_max_in_flight
from splitserve.router.tenancy.tenants import (
    DEFAULT_TENANT,
    QuotaLimits,
    Tenant,
    load_tenants_file,
    tenants_from_config,
)
from splitserve.router.tenancy.usage import UsageLedger, UsageMetrics
from splitserve.router.tenancy.vtc import ServiceWeights, VTCScheduler

__all__ = [
    "DEFAULT_TENANT",
    "Authenticator",
    "FairAdmission",
    "KeyRing",
    "LocalQuotaLimiter",
    "QuotaBackend",
    "QuotaLimits",
    "RequestUsage",
    "Reservation",
    "ServiceWeights",
    "Tenancy",
    "TenancyError",
    "Tenant",
    "Ticket",
    "UsageLedger",
    "UsageMetrics",
    "VTCScheduler",
    "cache_salt_for",
    "generate_api_key",
    "hash_api_key",
    "load_tenants_file",
    "pool_max_in_flight",
    "tenants_from_config",
]
