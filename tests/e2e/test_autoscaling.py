"""The live controller on real engines: a load step adds a decode replica, and when the load
drops the replica drains and leaves, with zero failed requests throughout.

One disaggregated deployment: 1 prefill + 1 decode engine, autoscaling on (decode 1..2
replicas). This machine has two cores and the scaled deployment runs three engines, so
the test sets `placement.share_cores` (development only): two engines share a core after the
scale-up. Production placement never lets engines share cores.

Phases:
1. Load step: many concurrent short requests (local prefill on the decode pool, so that the
   prefill pool stays idle and at its minimum). The decode pool's ongoing requests exceed the
   per-replica target, so the controller adds a replica. The load continues until the new
   replica has served requests.
2. Load drop: a trickle of long streamed requests (remote prefill, KV over NIXL) keeps running
   on both replicas. The controller scales down; Serve stops routing to one replica and waits
   for its requests before stopping it (`autoscaling.drain_timeout_s`).
Every request of both phases must succeed with its full token count.

The test runs the `queue` policy: its decisions depend on request counts only. The `slo`
policy also reacts to measured TPOT, which on two shared cores is noise (3 engines, the load
generator, the proxy and the router share them); its decisions are tested in
tests/unit/controller and the simulator. Both policies use the same live loop, signals,
actuator and drain, which is what this test covers.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from dataclasses import dataclass, field

import openai
import pytest
import ray
from ray import serve
from splitserve.controller.live import CONTROLLER_NAME, CONTROLLER_NAMESPACE
from splitserve.router.app import REPLICA_HEADER

from splitserve.app import APP_NAME
from tests.conftest import running_deployment, test_config

pytestmark = pytest.mark.engine

MODEL = "splitserve-tiny"
# Ongoing requests one decode replica should carry: LOAD_CLIENTS streams want 4 replicas
# (capped at 2), the trickle's TRICKLE_CLIENTS want 1.
TARGET_ONGOING = 4
LOAD_CLIENTS = 16
LOAD_TOKENS = 32
TRICKLE_CLIENTS = 3
TRICKLE_TOKENS = 600
# Waits are bounds on how long the machine may take, not expectations of speed: a replica
# starting while two engines serve the load step can take minutes on two shared cores.
SCALE_UP_WAIT_S = 900
SCALE_DOWN_WAIT_S = 300
NEW_REPLICA_REQUESTS = 16  # requests the new replica must serve before the load drops
NEW_REPLICA_WAIT_S = 300  # a fresh engine's first steps on shared cores (120 s ran out once)


@dataclass
class Outcome:
    """What the clients saw: (replica, sent at, finished at) per success, and every failure."""

    ok: list[tuple[str, float, float]] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)


@pytest.fixture(scope="module")
def deployment():
    cfg = test_config(
        **{
            "mode": "disaggregated",
            "disaggregation.prefill": "remote",  # long prompts take the remote path ...
            "disaggregation.min_remote_prompt_tokens": 64,  # ... short ones run on decode
            "placement.share_cores": True,
            "autoscaling.policy": "queue",
            "autoscaling.target_ongoing_requests": TARGET_ONGOING,
            "autoscaling.control_period_s": 1.0,
            "autoscaling.upscale_cooldown_s": 2.0,
            # Long enough for the trickle's streams to reach both replicas before the scale-down
            # (at 10 s a CI run once removed a replica that none of them had reached yet).
            "autoscaling.downscale_cooldown_s": 30.0,
            "autoscaling.warmup_samples": 1,
            "autoscaling.min_replicas": 1,
            "autoscaling.max_replicas": 2,
            "autoscaling.drain_timeout_s": 300.0,
        }
    )
    with running_deployment(cfg) as base:
        yield base


def decode_states() -> dict[str, int]:
    """Serve's replica states of the decode deployment, e.g. {'RUNNING': 2}."""
    return dict(serve.status().applications[APP_NAME].deployments["decode"].replica_states)


def history() -> list[dict]:
    """The controller's decisions so far."""
    actor = ray.get_actor(CONTROLLER_NAME, namespace=CONTROLLER_NAMESPACE)
    return ray.get(actor.history.remote())


async def client_loop(base: str, stop: threading.Event, out: Outcome, *, prompt: str,
                      max_tokens: int) -> None:
    """Send streamed completions back to back until `stop`; record each outcome (a success
    is a stream without an error event whose usage reports all `max_tokens` tokens)."""
    client = openai.AsyncOpenAI(base_url=f"{base}/v1", api_key="x", max_retries=0, timeout=600)
    while not stop.is_set():
        sent = time.monotonic()
        try:
            async with client.completions.with_streaming_response.create(
                model=MODEL, prompt=prompt, max_tokens=max_tokens, temperature=0, stream=True,
                stream_options={"include_usage": True}, extra_body={"ignore_eos": True},
            ) as resp:
                replica = resp.headers.get(REPLICA_HEADER, "")
                tokens, error = 0, None
                async for line in resp.iter_lines():
                    if not line.startswith("data: {"):
                        continue
                    event = json.loads(line[len("data: "):])
                    error = event.get("error") or error
                    tokens = (event.get("usage") or {}).get("completion_tokens", tokens)
                if error or tokens != max_tokens:
                    out.failures.append(f"{tokens}/{max_tokens} tokens from {replica}: {error}")
                else:
                    out.ok.append((replica, sent, time.monotonic()))
        except Exception as err:  # noqa: BLE001 - every failure is the test's finding
            out.failures.append(repr(err))
    await client.close()


def start_clients(base: str, n: int, *, prompt: str, max_tokens: int):
    """`n` concurrent client loops on a thread of their own, each with its own prompt prefix
    (so prefix-aware routing spreads them); returns (stop event, outcome, thread)."""
    stop, out = threading.Event(), Outcome()

    async def main() -> None:
        await asyncio.gather(*(
            client_loop(base, stop, out, prompt=f"{i}: {prompt}", max_tokens=max_tokens)
            for i in range(n)
        ))

    thread = threading.Thread(target=asyncio.run, args=(main(),), daemon=True)
    thread.start()
    return stop, out, thread


def wait_for(predicate, timeout_s: float, what: str, poll_s: float = 1.0):
    """Poll `predicate` until it returns something truthy; fail naming `what` after the bound."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(poll_s)
    pytest.fail(f"timed out after {timeout_s:.0f} s waiting for {what}; decode {decode_states()}")


def test_load_step_adds_a_decode_replica_and_scale_down_drains_it(deployment):
    base = deployment
    assert decode_states() == {"RUNNING": 1}

    # 1. Load step: short prompts (under min_remote_prompt_tokens: whole on decode).
    stop_load, load, load_thread = start_clients(base, LOAD_CLIENTS, prompt="Count with me:",
                                                 max_tokens=LOAD_TOKENS)
    try:
        wait_for(lambda: decode_states().get("RUNNING", 0) == 2, SCALE_UP_WAIT_S,
                 "a second RUNNING decode replica")
        before = {r for r, _, _ in load.ok}
        up = [h for h in history() if h["pool"] == "decode" and h["scaled"]]
        assert up and up[0]["replicas"] == 2, up
        assert up[0]["sample"]["running"] + up[0]["sample"]["queue_depth"] > 0

        def new_replica_served() -> bool:
            served = [r for r, _, _ in load.ok if r not in before]
            return len(served) >= NEW_REPLICA_REQUESTS

        wait_for(new_replica_served, NEW_REPLICA_WAIT_S,
                 f"{NEW_REPLICA_REQUESTS} requests on the new replica")
    finally:
        stop_load.set()
        load_thread.join(timeout=600)
    assert not load.failures, load.failures[:5]
    replicas_under_load = {r for r, _, _ in load.ok}
    assert len(replicas_under_load) == 2, replicas_under_load
    prefill_scaled = [h for h in history() if h["pool"] == "prefill" and h["scaled"]]
    assert not prefill_scaled, "the idle prefill pool must stay at its minimum"

    # 2. Load drop: long streams (remote prefill) keep both replicas busy while it scales down.
    long_prompt = " ".join(["the quick brown fox jumps over the lazy dog"] * 30)
    stop_trickle, trickle, trickle_thread = start_clients(
        base, TRICKLE_CLIENTS, prompt=long_prompt, max_tokens=TRICKLE_TOKENS)
    try:
        def stopping() -> float | None:
            states = decode_states()
            return time.monotonic() if states.get("STOPPING") or states == {"RUNNING": 1} else None

        stopping_at = wait_for(stopping, SCALE_DOWN_WAIT_S, "a decode replica to start draining",
                               poll_s=0.2)
        wait_for(lambda: decode_states() == {"RUNNING": 1}, SCALE_DOWN_WAIT_S,
                 "the drained replica to leave")
        gone_at = time.monotonic()

        def after_removal() -> list[str]:
            return [r for r, sent, _ in trickle.ok if sent > gone_at]

        # Requests sent now can only land on the remaining replica.
        wait_for(lambda: len(after_removal()) >= TRICKLE_CLIENTS, 300,
                 "requests after the scale-down")
    finally:
        stop_trickle.set()
        trickle_thread.join(timeout=600)
    assert not trickle.failures, trickle.failures[:5]
    remaining = set(after_removal())
    assert len(remaining) == 1, remaining
    removed = replicas_under_load - remaining
    assert len(removed) == 1, (replicas_under_load, remaining)
    down = [h for h in history() if h["pool"] == "decode" and h["scaled"] and h["replicas"] == 1]
    assert down, "no scale-down decision"
    assert down[-1]["reason"].startswith("ongoing"), down[-1]
    # The drain: requests on the removed replica finished after its removal began.
    drained = [done for r, _, done in trickle.ok if r in removed and done > stopping_at]
    assert drained, "the removed replica had no request in flight to drain"
