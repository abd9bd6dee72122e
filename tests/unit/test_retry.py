"""Remote-prefill retries: the pure decisions (router/retry.py), the dispatcher's retry loop with
fake pool handles, and replica steering (router/replica_router.avoid_failed). No Ray."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest

from splitserve.config import DisaggregationConfig
from splitserve.engine.messages import (
    GenerateChunk,
    GenerateRequest,
    RequestRejected,
    Sampling,
    WorkerError,
)
from splitserve.kv_transfer.handoff import HandoffError
from splitserve.router.dispatch import Dispatcher
from splitserve.router.metrics import RouterMetrics
from splitserve.router.replica_router import avoid_failed
from splitserve.router.retry import (
    MIN_ATTEMPT_S,
    classify,
    failed_replica,
    migrate_decode,
    rejection,
    retry_prefill,
)


class BackPressureError(Exception):
    """Named like Ray Serve's, which `classify` matches by name."""


class _RayWrapped(Exception):
    """Like Ray's RayTaskError: the worker's exception is in `.cause`."""

    def __init__(self, cause: BaseException) -> None:
        super().__init__(str(cause))
        self.cause = cause


@pytest.mark.parametrize(
    ("err", "kind"),
    [
        (BackPressureError(), "overload"),
        (TimeoutError(), "timeout"),
        (HandoffError("no params"), "handoff"),
        (WorkerError("r1", "engine dead"), "replica"),
        (RuntimeError("actor died"), "replica"),
        (RequestRejected("r1", "bad grammar"), "rejected"),
        (_RayWrapped(RequestRejected("r1", "bad grammar")), "rejected"),
    ],
)
def test_classify(err, kind):
    assert classify(err) == kind


def test_failed_replica_reads_worker_error_directly_and_through_a_wrapper():
    err = WorkerError("abc123", "boom")
    assert failed_replica(err) == "abc123"
    assert failed_replica(_RayWrapped(err)) == "abc123"
    assert failed_replica(RuntimeError("no replica named")) is None


def test_rejection_pickles_and_is_never_retried_or_migrated():
    import pickle

    err = pickle.loads(pickle.dumps(RequestRejected("abc", "bad regex", "regex")))
    assert (err.replica, err.message, err.param) == ("abc", "bad regex", "regex")
    assert rejection(_RayWrapped(err)) is not None and rejection(RuntimeError()) is None
    assert not retry_prefill(kind="rejected", attempt=1, attempts=3, time_left_s=10.0)
    assert not migrate_decode(kind="rejected", migrations=0, max_migrations=3)


def test_worker_error_pickles_with_its_replica():
    import pickle

    err = pickle.loads(pickle.dumps(WorkerError("abc", "engine died")))
    assert (err.replica, err.message) == ("abc", "engine died")
    assert str(err) == "engine died (replica abc)"


@pytest.mark.parametrize(
    ("kind", "attempt", "attempts", "left", "want"),
    [
        ("replica", 1, 2, 10.0, True),
        ("handoff", 1, 3, 10.0, True),
        ("replica", 2, 2, 10.0, False),  # out of tries
        ("replica", 1, 2, MIN_ATTEMPT_S / 2, False),  # out of time
        ("overload", 1, 5, 10.0, False),  # a full pool: prefill locally at once
        ("timeout", 1, 5, 10.0, False),  # the deadline is shared by all tries
    ],
)
def test_retry_prefill(kind, attempt, attempts, left, want):
    assert retry_prefill(kind=kind, attempt=attempt, attempts=attempts, time_left_s=left) is want


# ---- the dispatcher's loop over fake handles --------------------------------------------------

GOOD = {
    "remote_engine_id": "prefill-x",
    "remote_block_ids": [[1, 2]],
    "remote_host": "127.0.0.1",
    "remote_port": 5000,
}


class _Stream:
    def __init__(self, outcome) -> None:
        self.outcome = outcome
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True

    def __aiter__(self):
        return self._run()

    async def _run(self):
        if isinstance(self.outcome, float):
            await asyncio.sleep(self.outcome)
        elif isinstance(self.outcome, BaseException):
            raise self.outcome
        yield GenerateChunk(token_ids=(7,), text="", kv_transfer_params=self.outcome)


class _Pool:
    """A fake prefill handle: each call consumes the next scripted outcome (params, an
    exception, or a float = hang that long)."""

    def __init__(self, outcomes) -> None:
        self.outcomes = list(outcomes)
        self.requests: list[GenerateRequest] = []
        self.streams: list[_Stream] = []

    def options(self, **_):
        return SimpleNamespace(generate=SimpleNamespace(remote=self._remote))

    def _remote(self, req):
        self.requests.append(req)
        self.streams.append(_Stream(self.outcomes.pop(0)))
        return self.streams[-1]


def _dispatcher(pool, **disagg):
    signals = SimpleNamespace(arrival=lambda *a: None, first_token=lambda *a: None)
    metrics = RouterMetrics()
    d = Dispatcher({"prefill": pool}, DisaggregationConfig(**disagg), metrics, None, signals)
    return d, metrics


def _count(metrics, name, **labels) -> float:
    return metrics.registry.get_sample_value(name, labels) or 0.0


REQ = GenerateRequest("cmpl-1", tuple(range(300)), Sampling(max_tokens=8))


def test_first_try_succeeds_without_retry():
    pool = _Pool([GOOD])
    d, m = _dispatcher(pool)
    handoff = asyncio.run(d._prefill(REQ))
    assert handoff.engine_id == "prefill-x"
    assert [r.request_id for r in pool.requests] == ["cmpl-1-prefill"]
    assert pool.requests[0].kv_transfer_params == {"do_remote_decode": True}  # keep the KV
    assert _count(m, "splitserve_prefill_retries_total") == 0


def test_failed_replica_is_avoided_on_the_retry():
    pool = _Pool([_RayWrapped(WorkerError("bad", "engine error")), GOOD])
    d, m = _dispatcher(pool, prefill_attempts=3)
    assert asyncio.run(d._prefill(REQ)).engine_id == "prefill-x"
    assert [r.avoid_replicas for r in pool.requests] == [(), ("bad",)]
    assert [r.request_id for r in pool.requests] == ["cmpl-1-prefill", "cmpl-1-prefill-2"]
    assert _count(m, "splitserve_prefill_retries_total") == 1
    assert _count(m, "splitserve_prefill_failures_total", reason="replica") == 1
    assert _count(m, "splitserve_prefill_fallbacks_total") == 0


def test_attempts_are_bounded_then_local():
    pool = _Pool([RuntimeError("died"), HandoffError("none"), RuntimeError("x")])
    d, m = _dispatcher(pool, prefill_attempts=2)
    assert asyncio.run(d._prefill(REQ)) is None
    assert len(pool.requests) == 2
    assert _count(m, "splitserve_prefill_fallbacks_total") == 1
    assert _count(m, "splitserve_prefill_failures_total", reason="handoff") == 1


def test_overload_goes_local_without_retry():
    pool = _Pool([BackPressureError(), GOOD])
    d, m = _dispatcher(pool, prefill_attempts=4)
    assert asyncio.run(d._prefill(REQ)) is None
    assert len(pool.requests) == 1
    assert _count(m, "splitserve_prefill_failures_total", reason="overload") == 1


def test_a_hung_prefill_is_cut_at_the_deadline_and_cancelled():
    pool = _Pool([30.0, GOOD])
    d, m = _dispatcher(pool, prefill_attempts=3, prefill_timeout_s=0.2)
    assert asyncio.run(asyncio.wait_for(d._prefill(REQ), 10)) is None
    assert len(pool.requests) == 1  # the deadline covers every try: no time left for another
    assert pool.streams[0].cancelled  # the prefill worker aborts and frees its blocks
    assert _count(m, "splitserve_prefill_failures_total", reason="timeout") == 1
    assert _count(m, "splitserve_prefill_fallbacks_total") == 1


# ---- steering -----------------------------------------------------------------------------------


def _replica(uid: str):
    return SimpleNamespace(replica_id=SimpleNamespace(unique_id=uid))


def test_avoid_failed_drops_failed_replicas_but_never_all():
    a, b = _replica("a"), _replica("b")
    pending = SimpleNamespace(args=[GenerateRequest("r", (1,), Sampling(1), avoid_replicas=("a",))])
    assert avoid_failed([a, b], pending) == [b]
    only_a = SimpleNamespace(args=[GenerateRequest("r", (1,), Sampling(1), avoid_replicas=("a",))])
    assert avoid_failed([a], only_a) == [a]
    assert avoid_failed([a, b], None) == [a, b]
    assert avoid_failed([a, b], SimpleNamespace(args=["not a request"])) == [a, b]
