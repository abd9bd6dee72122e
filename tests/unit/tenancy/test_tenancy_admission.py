"""The asyncio admission gate: capacity, fair order, bounded queue (429), timeout (503),
cancellation. Small real timeouts only where a timeout is the thing under test."""

from __future__ import annotations

import asyncio

import pytest

from splitserve.router.tenancy.admission import FairAdmission
from splitserve.router.tenancy.errors import TenancyError
from splitserve.router.tenancy.tenants import Tenant
from splitserve.router.tenancy.vtc import ServiceWeights, VTCScheduler

A, B = Tenant("a"), Tenant("b")


async def _settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


def test_admits_at_once_below_capacity_and_releases_on_exit() -> None:
    async def scenario() -> None:
        gate = FairAdmission("decode", 2)
        async with gate.admit(A, 10) as t1, gate.admit(B, 10) as t2:
            assert (t1.tenant, t2.tenant) == ("a", "b")
            assert gate.in_flight == 2
        assert gate.in_flight == 0
        with pytest.raises(RuntimeError):
            async with gate.admit(A, 10):
                raise RuntimeError("worker failed")
        assert gate.in_flight == 0

    asyncio.run(scenario())


def test_waiter_gets_the_slot_when_it_frees() -> None:
    async def scenario() -> None:
        gate = FairAdmission("decode", 1)
        held = await gate.acquire(A, 1)
        waiter = asyncio.create_task(gate.acquire(B, 1))
        await _settle()
        assert not waiter.done() and gate.queued == 1
        gate.release(held)
        ticket = await waiter
        assert ticket.tenant == "b" and gate.in_flight == 1 and gate.queued == 0
        gate.release(ticket)
        gate.release(ticket)  # idempotent
        assert gate.in_flight == 0

    asyncio.run(scenario())


def test_full_queue_is_429() -> None:
    async def scenario() -> None:
        gate = FairAdmission("prefill", 1, max_queued=2)
        held = await gate.acquire(A, 1)
        waiters = [asyncio.create_task(gate.acquire(t, 1)) for t in (A, B)]
        await _settle()
        with pytest.raises(TenancyError) as exc:
            await gate.acquire(B, 1)
        err = exc.value
        assert (err.status, err.reason, err.code) == (429, "queue_full", "rate_limit_exceeded")
        assert err.headers["Retry-After"] == "1" and "prefill" in err.message
        gate.release(held)
        for w in waiters:
            gate.release(await w)

    asyncio.run(scenario())


def test_per_tenant_queue_bound_leaves_room_for_others() -> None:
    async def scenario() -> None:
        gate = FairAdmission("decode", 1, max_queued=10, max_queued_per_tenant=2)
        held = await gate.acquire(A, 1)
        flood = [asyncio.create_task(gate.acquire(A, 1)) for _ in range(2)]
        await _settle()
        with pytest.raises(TenancyError, match="waiting"):
            await gate.acquire(A, 1)
        light = asyncio.create_task(gate.acquire(B, 1))
        await _settle()
        assert gate.queued == 3 and not light.done()
        for task in (*flood, light):
            task.cancel()
        gate.release(held)

    asyncio.run(scenario())


def test_timeout_is_503_and_leaves_the_queue() -> None:
    async def scenario() -> None:
        gate = FairAdmission("decode", 1, timeout_s=0.05)
        held = await gate.acquire(A, 1)
        with pytest.raises(TenancyError) as exc:
            await gate.acquire(B, 1)
        err = exc.value
        assert (err.status, err.reason, err.type) == (503, "queue_timeout", "service_unavailable")
        assert err.headers["Retry-After"] == "1"
        assert gate.queued == 0 and gate.in_flight == 1
        gate.release(held)
        assert gate.in_flight == 0

    asyncio.run(scenario())


def test_cancelled_waiter_leaves_the_queue() -> None:
    async def scenario() -> None:
        gate = FairAdmission("decode", 1)
        held = await gate.acquire(A, 1)
        waiter = asyncio.create_task(gate.acquire(B, 1))
        await _settle()
        waiter.cancel()
        await _settle()
        assert gate.queued == 0
        gate.release(held)
        assert gate.in_flight == 0

    asyncio.run(scenario())


def test_slot_granted_to_a_waiter_cancelled_before_it_ran_is_given_back() -> None:
    async def scenario() -> None:
        gate = FairAdmission("decode", 1)
        held = await gate.acquire(A, 1)
        waiter = asyncio.create_task(gate.acquire(B, 1))
        await _settle()
        gate.release(held)  # grants the slot to the waiter ...
        assert gate.in_flight == 1
        waiter.cancel()  # ... which is cancelled before it resumes
        await _settle()
        assert waiter.cancelled()
        assert gate.in_flight == 0 and gate.queued == 0

    asyncio.run(scenario())


def test_flooding_tenant_cannot_starve_a_light_one_at_the_gate() -> None:
    async def scenario() -> list[str]:
        gate = FairAdmission("decode", 1, max_queued_per_tenant=100)
        held = await gate.acquire(Tenant("x"), 1)  # the pool is saturated from the start
        order: list[str] = []

        async def one(tenant: Tenant) -> None:
            async with gate.admit(tenant, 100) as ticket:
                order.append(tenant.name)
                await asyncio.sleep(0)
                ticket.add_output(50)

        flood = [asyncio.create_task(one(A)) for _ in range(30)]
        await _settle()
        light = asyncio.create_task(one(B))  # arrives behind 30 queued flood requests
        await _settle()
        assert gate.queued == 31
        gate.release(held)
        await asyncio.gather(*flood, light)
        return order

    order = asyncio.run(scenario())
    assert len(order) == 31
    assert order.index("b") <= 1  # at most one flood request (tied, queued earlier) goes first


def test_priority_class_is_served_first_at_the_gate() -> None:
    async def scenario() -> list[str]:
        gate = FairAdmission("decode", 1)
        held = await gate.acquire(A, 1)
        order: list[str] = []

        async def one(tenant: Tenant, priority: int | None) -> None:
            async with gate.admit(tenant, 1, priority):
                order.append(f"{tenant.name}{priority}")

        tasks = [asyncio.create_task(one(A, 0)) for _ in range(3)]
        await _settle()
        tasks.append(asyncio.create_task(one(Tenant("gold", priority=3), None)))
        await _settle()
        gate.release(held)
        await asyncio.gather(*tasks)
        return order

    assert asyncio.run(scenario()) == ["goldNone", "a0", "a0", "a0"]


def test_ticket_charges_output_to_the_tenant_counter() -> None:
    async def scenario() -> float:
        scheduler = VTCScheduler(ServiceWeights(prompt=1.0, output=2.0))
        gate = FairAdmission("decode", 1, scheduler=scheduler)
        async with gate.admit(Tenant("w", weight=2.0), 10) as ticket:
            ticket.add_output(3)
            ticket.add_output(2)
            ticket.add_output(0)
            assert ticket.output_tokens == 5
        return scheduler.counter("w")

    assert asyncio.run(scenario()) == pytest.approx((10 * 1 + 5 * 2) / 2)


def test_limits_must_be_positive() -> None:
    with pytest.raises(ValueError):
        FairAdmission("decode", 0)
