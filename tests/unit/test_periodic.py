"""`Periodic`: the background loop behind the usage publisher and the controller link."""

from __future__ import annotations

import asyncio
import logging

from splitserve.router.periodic import Periodic


def test_start_needs_a_running_loop_and_is_idempotent():
    calls = []

    async def step():
        calls.append(1)

    p = Periodic("t", step, 0.01)
    assert p.start() is False  # no running loop here (a replica constructor)
    assert not p.running

    async def run():
        assert p.start() and p.start()
        while len(calls) < 3:
            await asyncio.sleep(0.01)
        p.stop()
        assert not p.running
        n = len(calls)
        await asyncio.sleep(0.05)
        return n

    n = asyncio.run(run())
    assert len(calls) == n  # stopped: no more steps


def test_a_failing_step_is_retried_and_logged_once(caplog):
    outcomes = [RuntimeError("down"), RuntimeError("still down"), None, RuntimeError("again")]
    done = []

    async def step():
        err = outcomes.pop(0)
        done.append(err)
        if err is not None:
            raise err

    async def run():
        p = Periodic("report", step, 0.005)
        p.start()
        while outcomes:
            await asyncio.sleep(0.005)
        p.stop()

    with caplog.at_level(logging.WARNING, logger="splitserve.router"):
        asyncio.run(run())
    assert len(done) == 4
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 2  # the first failure, and the first after a success
    assert "down" in warnings[0] and "again" in warnings[1]
