"""Decode migration: a decode replica that fails before any of its response went out is
replaced by the whole request on another replica; one that fails after ends the response with an
error (vLLM's server held its state: a continuation elsewhere could not be exact). The pure
pieces (router/retry.py) and the dispatcher's loop over fake decode handles (no Ray; the gates,
tenancy and metrics are the real ones)."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest

from splitserve.config import parse_config
from splitserve.engine.messages import (
    GenerateChunk,
    GenerateRequest,
    RequestRejected,
    Sampling,
    WorkerError,
)
from splitserve.router.dispatch import Dispatcher
from splitserve.router.errors import APIError
from splitserve.router.metrics import RouterMetrics
from splitserve.router.retry import migrate_decode
from splitserve.router.tenancy import DEFAULT_TENANT, Tenancy

PROMPT = (5, 6, 7)
REQ = GenerateRequest("cmpl-1", PROMPT, Sampling(max_tokens=6))


class ActorDied(Exception):
    """Like Ray's RayActorError: no replica id in it."""


@pytest.mark.parametrize(
    ("kind", "done", "allowed", "want"),
    [("replica", 0, 1, True), ("replica", 1, 1, False), ("overload", 0, 1, False),
     ("replica", 0, 0, False)],
)
def test_migrate_decode(kind, done, allowed, want):
    assert migrate_decode(kind=kind, migrations=done, max_migrations=allowed) is want


class _Stream:
    """One scripted decode attempt: yields its chunks, then raises `fail` if set."""

    def __init__(self, chunks, fail) -> None:
        self.chunks, self.fail, self.cancelled = chunks, fail, False

    def cancel(self) -> None:
        self.cancelled = True

    def __aiter__(self):
        return self._run()

    async def _run(self):
        for c in self.chunks:
            await asyncio.sleep(0)
            yield c
        if self.fail is not None:
            raise self.fail


class _Decode:
    """A fake decode handle; each call takes the next (replica, tokens, finish, fail) script."""

    def __init__(self, scripts) -> None:
        self.scripts, self.requests, self.streams = list(scripts), [], []

    def options(self, **_):
        return SimpleNamespace(generate=SimpleNamespace(remote=self._remote))

    def _remote(self, req):
        self.requests.append(req)
        replica, tokens, finish, fail = self.scripts.pop(0)
        chunks = [
            GenerateChunk(
                (t,), f"<{t}>", replica=replica,
                num_prompt_tokens=len(req.prompt_token_ids),
                num_cached_tokens=len(req.prompt_token_ids) - 1,
                finish_reason=finish if i == len(tokens) - 1 else None,
            )
            for i, t in enumerate(tokens)
        ]
        self.streams.append(_Stream(chunks, fail))
        return self.streams[-1]


def _run(decode, migrations=1):
    cfg = parse_config({"mode": "colocated"})
    metrics = RouterMetrics()
    d = Dispatcher({"decode": decode}, cfg.disaggregation, metrics, Tenancy.from_config(cfg),
                   decode_migrations=migrations)

    async def go():
        return [c async for c in d.stream(REQ, DEFAULT_TENANT)]

    return asyncio.run(go()), metrics


def _migrations(metrics, reason="replica") -> float:
    return metrics.registry.get_sample_value(
        "splitserve_decode_migrations_total", {"reason": reason}
    ) or 0.0


def test_a_replica_dying_mid_stream_ends_the_response_with_an_error():
    decode = _Decode([("r1", [10, 11], None, ActorDied("actor died")),
                      ("r2", [10, 11, 12, 13, 14, 15], "length", None)])
    got: list[int] = []

    async def go():
        cfg = parse_config({"mode": "colocated"})
        d = Dispatcher({"decode": decode}, cfg.disaggregation, RouterMetrics(),
                       Tenancy.from_config(cfg), decode_migrations=1)
        async for c in d.stream(REQ, DEFAULT_TENANT):
            got.extend(c.token_ids)

    with pytest.raises(APIError) as info:
        asyncio.run(go())
    assert info.value.status == 500
    assert got == [10, 11] and len(decode.requests) == 1  # no continuation that might differ
    assert all(s.cancelled for s in decode.streams)


def test_a_worker_error_names_the_replica_to_avoid():
    decode = _Decode([("r1", [], None, WorkerError("r7", "engine died")),
                      ("r2", [10, 11, 12, 13, 14, 15], "length", None)])
    chunks, _ = _run(decode)
    assert len([t for c in chunks for t in c.token_ids]) == 6
    assert decode.requests[1].avoid_replicas == ("r7",)
    assert decode.requests[1].prompt_token_ids == PROMPT  # the whole request again
    assert decode.requests[1].request_id == "cmpl-1-m1"


def test_after_the_allowed_migrations_the_client_gets_the_error():
    decode = _Decode([("r1", [], None, ActorDied("x")), ("r2", [], None, ActorDied("y"))])
    with pytest.raises(APIError) as info:
        _run(decode, migrations=1)
    assert info.value.status == 500 and len(decode.requests) == 2


def test_an_overloaded_pool_is_not_retried():
    from ray.serve.exceptions import BackPressureError

    decode = _Decode([("r1", [], None, BackPressureError(num_queued_requests=9,
                                                          max_queued_requests=8))])
    with pytest.raises(APIError) as info:
        _run(decode)
    assert info.value.status == 503 and len(decode.requests) == 1


def test_migrations_off():
    decode = _Decode([("r1", [], None, ActorDied("x"))])
    with pytest.raises(APIError):
        _run(decode, migrations=0)
    assert len(decode.requests) == 1


def test_an_engine_rejection_is_the_clients_400_and_never_migrates():
    rejected = RequestRejected("r1", "grammar does not compile", "structured_outputs")
    decode = _Decode([("r1", [], None, rejected), ("r2", [10], "length", None)])
    with pytest.raises(APIError) as info:
        _run(decode, migrations=1)
    assert (info.value.status, info.value.param) == (400, "structured_outputs")
    assert len(decode.requests) == 1
