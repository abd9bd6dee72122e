"""The deployment's secret key: what signs the router's verdicts and the replicas'
settlements (`engine/routed.py`) and keys the tenants' cache salts.

Taken from `SPLITSERVE_DEPLOYMENT_KEY` when set (the chart's Secret, the same in every pod of
the release), else generated once per Ray cluster and kept in Ray's internal KV store, where
every process of the cluster reads the same one (a local cluster, `make serve`, the tests).
Read once per process.
"""

from __future__ import annotations

import base64
import functools
import os
import secrets

ENV = "SPLITSERVE_DEPLOYMENT_KEY"
_KV_KEY = b"splitserve/deployment-key"
_KV_NAMESPACE = "splitserve"


@functools.cache
def deployment_key() -> bytes:
    """This deployment's key (32 bytes or more); RuntimeError when there is neither the
    environment variable nor a Ray cluster to keep one in."""
    value = os.environ.get(ENV)
    if value:
        return value.encode()
    import ray
    from ray.experimental import internal_kv

    if not ray.is_initialized():
        raise RuntimeError(f"no deployment key: set {ENV} or run inside a Ray cluster")
    fresh = base64.urlsafe_b64encode(secrets.token_bytes(32))
    # the first process to ask writes it; every other one reads that one
    internal_kv._internal_kv_put(_KV_KEY, fresh, overwrite=False, namespace=_KV_NAMESPACE)
    key = internal_kv._internal_kv_get(_KV_KEY, namespace=_KV_NAMESPACE)
    if not key:
        raise RuntimeError("no deployment key in Ray's internal KV store")
    return bytes(key)
