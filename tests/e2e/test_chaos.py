"""Chaos tests on the real CPU cluster: faults in the disaggregated path never change an answer.

One deployment for the module: disaggregated, two prefill replicas and one decode replica. This
machine has two cores for three engines, so the test sets `placement.share_cores` (development
and tests only): engines share cores instead of failing to start. Faults come from the `faults`
config section (tests only). Each fault hits a fixed set of prompts (a seeded hash of the token
ids, `splitserve.engine.faults`), so every test picks prompts that one fault hits and the others
spare, and knows in advance how many requests each fault reaches:

- kill a prefill replica while 32 streams are in flight (every prefill waits `PREFILL_DELAY_S`
  first, so the killed replica surely holds some): its prefills are retried on the other one;
- 20 % of KV loads fail (the handoff names a dead NIXL peer): decode recomputes those prompts;
- delayed KV loads, past the handoff's fetch deadline: decode recomputes instead of reading
  blocks the prefill engine may already have freed;
- prefill engine errors on every replica: bounded tries, then a local prefill.

In each, all 32 streams finish within their deadline with the greedy token ids of an undisturbed
run (the decode engine's own prefill, `direct_greedy`), and afterwards no replica of either pool
holds a request or a KV block. The router traces every request to a JSON-lines file
(`tracing.file`): each recomputed handoff must show in its own request's trace as a failed
`splitserve.kv_transfer` span and in `splitserve_kv_recomputes_total{reason}`.
"""

from __future__ import annotations

import asyncio
import time

import httpx
import numpy as np
import openai
import pytest
import ray
from ray import serve

from splitserve.config import FaultsConfig
from splitserve.engine.faults import kv_load_delay_s, kv_load_fails, prefill_fails
from splitserve.engine.messages import KV_EXPIRED, KV_TRANSFER_ERROR
from splitserve.router import tracing as tr
from splitserve.router.span_file import read_spans
from tests.conftest import (
    direct_greedy,
    running_deployment,
    stream_token_ids,
    test_config,
    wait_healthy,
)

pytestmark = [pytest.mark.engine, pytest.mark.chaos]

MODEL = "splitserve-tiny"
STREAMS = 32
MAX_TOKENS = 12
REQUEST_DEADLINE_S = 300  # a stream still open after this is a hang: the test fails
KV_LEASE_S = 12  # prefill keeps unpulled blocks this long: leaks must clear soon after
PREFILL_DELAY_S = 1.5
FAULTS = FaultsConfig(
    seed=11,
    prefill_error_rate=0.15,
    prefill_delay_s=PREFILL_DELAY_S,
    kv_load_failure_rate=0.2,
    kv_load_delay_rate=0.15,
    kv_load_delay_s=KV_LEASE_S,  # past the fetch deadline (3/4 of the lease)
)


@pytest.fixture(scope="module")
def span_file(tmp_path_factory) -> str:
    """The file the router writes its spans to."""
    return str(tmp_path_factory.mktemp("trace") / "spans.jsonl")


@pytest.fixture(scope="module")
def deployment(span_file):
    cfg = test_config(
        **{
            "mode": "disaggregated",
            "pools.prefill.replicas": 2,
            "placement.share_cores": True,
            "disaggregation.kv_lease_s": KV_LEASE_S,
            "disaggregation.prefill": "remote",  # the remote path, whatever the rule predicts
            "disaggregation.min_remote_prompt_tokens": 128,  # ... from 150-token prompts up
            "disaggregation.prefill_attempts": 2,
            "disaggregation.prefill_timeout_s": 120,
            "faults": FAULTS.model_dump(),
            "tracing.enabled": True,
            "tracing.file": span_file,
        }
    )
    with running_deployment(cfg) as base:
        yield base


# ---- prompts ------------------------------------------------------------------------------------


def _faults_of(ids: list[int]) -> dict[str, bool]:
    return {
        "prefill_error": prefill_fails(FAULTS, ids),
        "kv_fail": kv_load_fails(FAULTS, ids),
        "kv_delay": kv_load_delay_s(FAULTS, ids) > 0,
    }


def _prompts(seed: int, n: int, **want: bool) -> list[list[int]]:
    """`n` prompts (150-500 tokens: all prefill remotely) whose faults match `want`."""
    rng = np.random.default_rng(seed)
    out = []
    while len(out) < n:
        ids = rng.integers(10, 500, int(rng.integers(150, 500))).tolist()
        hit = _faults_of(ids)
        if all(hit[k] == v for k, v in want.items()):
            out.append(ids)
    return out


# ---- observation --------------------------------------------------------------------------------


def _metric(base: str, name: str, **labels: str) -> float:
    want = ",".join(f'{k}="{v}"' for k, v in labels.items())
    key = f"{name}{{{want}}}" if labels else name
    for line in httpx.get(f"{base}/metrics").text.splitlines():
        if line.startswith(key + " "):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def _recomputed_prompt_lengths(path: str, since: int, reason: str) -> list[int]:
    """Prompt lengths of the requests (in the spans after the first `since`) whose trace holds a
    failed `splitserve.kv_transfer` span for `reason`; each such request succeeded (root span)."""
    deadline = time.monotonic() + 10  # a root span is written when its stream closes
    while True:
        spans = read_spans(path)[since:]
        roots = {s["trace_id"]: s for s in spans if s["parent_id"] is None}
        failed = [s for s in spans
                  if s["name"] == tr.KV_TRANSFER and s["attributes"].get(tr.KV_RECOMPUTED)]
        if all(kv["trace_id"] in roots for kv in failed) or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    for kv in failed:
        assert kv["status"] == "ERROR" and kv["attributes"][tr.ERROR_TYPE] == reason, kv
        assert [(e["name"], e["attributes"]) for e in kv["events"]] == [
            (tr.KV_FAILED, {"reason": reason})]
        assert roots[kv["trace_id"]]["attributes"][tr.HTTP_STATUS] == 200
    return sorted(roots[kv["trace_id"]]["attributes"][tr.GENAI_INPUT_TOKENS] for kv in failed)


def _decode_stats():
    return serve.get_deployment_handle("decode", app_name="splitserve").stats.remote().result()


def _replica_loads() -> dict[str, tuple[int, float]]:
    """(unfinished requests, KV cache usage) of every live replica of both pools, read from each
    replica actor's routing-stats hook (a deployment handle would reach only one replica)."""
    loads = {}
    for entry in ray.util.list_named_actors(all_namespaces=True):
        name = entry["name"]
        pool = name.split("#")[1] if name.startswith("SERVE_REPLICA::splitserve#") else None
        if pool not in ("prefill", "decode"):
            continue
        try:
            actor = ray.get_actor(name, namespace=entry["namespace"])
            stats = ray.get(actor.record_routing_stats.remote(), timeout=30)
        except (ray.exceptions.RayActorError, ValueError):
            continue  # the replica this test killed
        except ray.exceptions.RayTaskError:
            # a replica still starting (its replacement: Serve's status may count the killed
            # one as running for a while), not counted until it answers
            continue
        loads[name] = (stats["num_unfinished"], stats["kv_cache_usage"])
    return loads


def _wait_running(prefill: int = 2, timeout_s: float = 300) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        deps = serve.status().applications["splitserve"].deployments
        states = {p: dict(deps[p].replica_states) for p in ("prefill", "decode")}
        if all(
            states[p].get("RUNNING", 0) == n == sum(states[p].values())
            for p, n in (("prefill", prefill), ("decode", 1))
        ) and len(_replica_loads()) == prefill + 1:  # ... and each of them answers
            return
        time.sleep(1)
    pytest.fail(f"pools not back to {prefill} prefill + 1 decode replicas: {serve.status()}")


def _assert_nothing_left() -> None:
    """No request and no KV block in any replica of either pool (unpulled prefill blocks are
    freed when their lease ends, so this waits up to a few leases)."""
    deadline = time.monotonic() + 10 * KV_LEASE_S
    loads = {}
    while time.monotonic() < deadline:
        loads = _replica_loads()
        if len(loads) == 3 and all(v == (0, 0.0) for v in loads.values()):
            return
        time.sleep(2)
    assert loads == {name: (0, 0.0) for name in loads} and len(loads) == 3, loads


# ---- load ---------------------------------------------------------------------------------------


def _run_streams(base: str, prompts: list[list[int]], during=None) -> list[list[int]]:
    """All prompts as concurrent streams; `during()` runs (in a thread) once they are sent."""

    async def main():
        async with openai.AsyncOpenAI(
            base_url=f"{base}/v1", api_key="x", max_retries=0, timeout=REQUEST_DEADLINE_S
        ) as client:
            tasks = [asyncio.create_task(stream_token_ids(client, ids, MAX_TOKENS)) for ids in prompts]
            if during is not None:
                await asyncio.sleep(PREFILL_DELAY_S / 2)  # every prefill is now in flight
                await asyncio.to_thread(during)
            return await asyncio.wait_for(asyncio.gather(*tasks), REQUEST_DEADLINE_S + 30)

    return asyncio.run(main())


def _assert_parity(outputs: list[list[int]], prompts: list[list[int]]) -> None:
    reference = [direct_greedy(ids, MAX_TOKENS, fresh_cache=True) for ids in prompts]
    assert [len(o) for o in outputs] == [MAX_TOKENS] * len(prompts)
    mismatched = [i for i, (o, r) in enumerate(zip(outputs, reference, strict=True)) if o != r]
    assert not mismatched, f"{len(mismatched)} outputs differ from the undisturbed run"


# ---- scenarios ----------------------------------------------------------------------------------


def test_undisturbed_prompts_pull_their_kv(deployment):
    prompts = _prompts(1, 8, prefill_error=False, kv_fail=False, kv_delay=False)
    before = _decode_stats()
    outputs = _run_streams(deployment, prompts)
    after = _decode_stats()
    _assert_parity(outputs, prompts)
    assert after.kv_transfers - before.kv_transfers >= len(prompts)
    assert after.kv_transfer_failures == before.kv_transfer_failures
    for reason in (KV_TRANSFER_ERROR, KV_EXPIRED):  # the module's first requests: none yet
        assert _metric(deployment, "splitserve_kv_recomputes_total", reason=reason) == 0
    _assert_nothing_left()


def test_killing_a_prefill_replica_mid_load(deployment):
    prompts = _prompts(2, STREAMS, prefill_error=False, kv_fail=False, kv_delay=False)
    victims = sorted(
        e["name"] for e in ray.util.list_named_actors(all_namespaces=True)
        if e["name"].startswith("SERVE_REPLICA::splitserve#prefill#")
    )
    assert len(victims) == 2
    failures = _metric(deployment, "splitserve_prefill_failures_total", reason="replica")
    retries = _metric(deployment, "splitserve_prefill_retries_total")

    def kill():
        ray.kill(ray.get_actor(victims[0], namespace="serve"), no_restart=True)

    outputs = _run_streams(deployment, prompts, during=kill)
    _assert_parity(outputs, prompts)
    # prefills in flight on the killed replica failed and were retried on the other one
    assert _metric(deployment, "splitserve_prefill_failures_total", reason="replica") > failures
    assert _metric(deployment, "splitserve_prefill_retries_total") > retries
    _wait_running(prefill=2)  # Serve replaced the killed replica
    assert victims[0] not in _replica_loads()
    wait_healthy(deployment)
    _assert_nothing_left()


def test_twenty_percent_of_kv_loads_fail(deployment, span_file):
    prompts = _prompts(3, STREAMS, prefill_error=False, kv_delay=False)
    n_failed = sum(kv_load_fails(FAULTS, ids) for ids in prompts)
    assert 3 <= n_failed <= 12, n_failed  # about 20 % of the 32 (fixed by the seed)
    before = _decode_stats()
    fallbacks = _metric(deployment, "splitserve_prefill_fallbacks_total")
    recomputes = _metric(deployment, "splitserve_kv_recomputes_total", reason=KV_TRANSFER_ERROR)
    spans = len(read_spans(span_file))
    outputs = _run_streams(deployment, prompts)
    after = _decode_stats()
    _assert_parity(outputs, prompts)
    # the connector saw the dead peer; the prefill itself succeeded every time
    assert after.kv_transfer_failures > before.kv_transfer_failures
    assert after.kv_transfers - before.kv_transfers >= STREAMS - n_failed
    assert _metric(deployment, "splitserve_prefill_fallbacks_total") == fallbacks
    # each request hit by the fault, and no other, is flagged: its trace and the counter
    got = _metric(deployment, "splitserve_kv_recomputes_total", reason=KV_TRANSFER_ERROR)
    assert got - recomputes == n_failed
    hit = sorted(len(ids) for ids in prompts if kv_load_fails(FAULTS, ids))
    assert _recomputed_prompt_lengths(span_file, spans, KV_TRANSFER_ERROR) == hit
    _assert_nothing_left()


def test_kv_loads_delayed_past_the_lease_are_recomputed(deployment, span_file):
    delayed = _prompts(4, 8, prefill_error=False, kv_fail=False, kv_delay=True)
    prompts = delayed + _prompts(5, STREAMS - 8, prefill_error=False, kv_fail=False, kv_delay=False)
    before = _decode_stats()
    recomputes = _metric(deployment, "splitserve_kv_recomputes_total", reason=KV_EXPIRED)
    spans = len(read_spans(span_file))
    outputs = _run_streams(deployment, prompts)
    after = _decode_stats()
    _assert_parity(outputs, prompts)
    assert after.kv_handoffs_expired - before.kv_handoffs_expired == len(delayed)
    got = _metric(deployment, "splitserve_kv_recomputes_total", reason=KV_EXPIRED)
    assert got - recomputes == len(delayed)
    assert _recomputed_prompt_lengths(span_file, spans, KV_EXPIRED) == sorted(map(len, delayed))
    assert after.kv_transfers - before.kv_transfers >= STREAMS - len(delayed)
    _assert_nothing_left()


def test_prefill_errors_are_retried_then_prefilled_locally(deployment):
    failing = _prompts(6, 8, prefill_error=True, kv_fail=False, kv_delay=False)
    prompts = failing + _prompts(7, STREAMS - 8, prefill_error=False, kv_fail=False, kv_delay=False)
    failures = _metric(deployment, "splitserve_prefill_failures_total", reason="replica")
    fallbacks = _metric(deployment, "splitserve_prefill_fallbacks_total")
    retries = _metric(deployment, "splitserve_prefill_retries_total")
    outputs = _run_streams(deployment, prompts)
    _assert_parity(outputs, prompts)
    # a failing prompt fails on every replica: two tries each, then the decode worker prefills
    got = _metric(deployment, "splitserve_prefill_failures_total", reason="replica") - failures
    assert got == 2 * len(failing)
    assert _metric(deployment, "splitserve_prefill_retries_total") - retries == len(failing)
    assert _metric(deployment, "splitserve_prefill_fallbacks_total") - fallbacks == len(failing)
    _assert_nothing_left()


def test_health_and_metrics_answer_after_the_chaos(deployment):
    assert httpx.get(f"{deployment}/health").json()["pools"] == {"prefill": "ok", "decode": "ok"}
    assert _metric(deployment, "splitserve_prefill_retries_total") > 0
