"""Read a running deployment's engine counters for a benchmark: each replica's `EngineStats`
(prefix-cache queries and hits, KV capacity) and routing stats, and the difference between two
readings. Needs Ray connected to the cluster that runs the `splitserve` application.
"""

from __future__ import annotations

import time
from typing import Any


def replica_actors(pool: str) -> dict[str, Any]:
    """The Ray actors of a pool's Serve replicas, by replica ("prefill#<id>")."""
    import ray

    prefix = f"SERVE_REPLICA::splitserve#{pool}#"
    named = ray.util.list_named_actors(all_namespaces=True)
    return {
        a["name"].split("#", 1)[1]: ray.get_actor(a["name"], namespace=a["namespace"])
        for a in named
        if a["name"].startswith(prefix)
    }


def pool_stats(pool: str, replicas: int) -> dict[str, Any]:
    """Each replica's `EngineStats` and Serve routing stats, asked of every replica directly.

    Not through the pool's handle: its request router picks one replica per call, and after a
    run it kept picking the same one. Calling a replica actor's user method takes Serve's
    internal request envelope (`RequestMetadata`); fine for a benchmark, not for product code.
    Falls back to asking through the handle (slowly, until every replica answered).
    """
    import pickle
    import uuid

    import ray
    from ray import serve
    from ray.serve._private.common import RequestMetadata

    out: dict[str, Any] = {}
    try:
        for rid, actor in replica_actors(pool).items():
            req_id = f"bench-stats-{uuid.uuid4().hex}"
            meta = RequestMetadata(
                request_id=req_id,
                internal_request_id=req_id,
                call_method="stats",
                app_name="splitserve",
            )
            stats = ray.get(actor.handle_request.remote(pickle.dumps(meta)))
            out[rid] = {"engine": stats, "routing": ray.get(actor.record_routing_stats.remote())}
    except Exception as err:  # noqa: BLE001 - Serve internals moved: use the handle
        print(f"[stats] direct replica call failed ({err!r}); asking through the handle")
    handle = serve.get_deployment_handle(pool, app_name="splitserve")
    for _ in range(120):
        if len(out) >= replicas:
            return out
        s = handle.stats.remote().result()
        out.setdefault(s.replica, {"engine": s, "routing": None})
        time.sleep(0.5)
    raise RuntimeError(f"only {len(out)} of {replicas} {pool} replicas answered stats")


def _loaded(stats: Any) -> dict[str, int]:
    return dict(getattr(stats, "kv_loaded_tokens", None) or {})


def loaded_delta(before: Any, after: Any) -> dict[str, int]:
    """Prompt tokens a KV connector supplied between two `EngineStats`, by source ("host",
    "disk": the KV tier; others: the NIXL handoff)."""
    b, a = _loaded(before), _loaded(after)
    return {src: n - b.get(src, 0) for src, n in a.items() if n - b.get(src, 0)}


def cache_delta(before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
    """Prefix-cache queries and hits (tokens) per replica between two `pool_stats`, and the
    prompt tokens KV connectors supplied (by source)."""
    per = {
        rid: {
            "queried_tokens": after[rid]["engine"].prefix_cache_queries
            - before[rid]["engine"].prefix_cache_queries,
            "hit_tokens": after[rid]["engine"].prefix_cache_hits
            - before[rid]["engine"].prefix_cache_hits,
            "loaded_tokens": loaded_delta(before[rid]["engine"], after[rid]["engine"]),
            "routing_stats_after": after[rid]["routing"],
        }
        for rid in after
    }
    queried = sum(r["queried_tokens"] for r in per.values())
    hits = sum(r["hit_tokens"] for r in per.values())
    loaded: dict[str, int] = {}
    for r in per.values():
        for src, n in r["loaded_tokens"].items():
            loaded[src] = loaded.get(src, 0) + n
    return {
        "hit_rate": hits / queried if queried else None,
        "queried_tokens": queried,
        "hit_tokens": hits,
        "loaded_tokens": loaded,
        "per_replica": per,
    }


def kv_capacity_tokens(stats: dict[str, Any]) -> int:
    """The smallest engine KV cache, in tokens, among the replicas of one `pool_stats`."""
    return min(int(s["engine"].kv_capacity_tokens) for s in stats.values())
