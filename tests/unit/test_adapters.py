"""The router's adapter registry: ids, add/remove, in-flight counts (pure, no engines)."""

from __future__ import annotations

import asyncio

import pytest

from splitserve.router.adapters import RUNTIME_FIRST_ID, AdapterError, AdapterRegistry


def test_declared_adapters_get_ids_in_order():
    reg = AdapterRegistry([("a", "m", "/a"), ("b", "m", "/b"), ("c", "n", "/c")])
    assert [(x.name, x.ref.lora_id, x.declared) for x in reg.all()] == [
        ("a", 1, True), ("b", 2, True), ("c", 3, True)]
    assert [x.name for x in reg.of("m")] == ["a", "b"]


def test_runtime_ids_are_fresh_and_never_reused():
    reg = AdapterRegistry([("a", "m", "/a")])
    first = reg.new_ref("x", "/x")
    reg.add("m", first)
    reg.remove("x")
    second = reg.new_ref("x", "/x")
    assert (first.lora_id, second.lora_id) == (RUNTIME_FIRST_ID, RUNTIME_FIRST_ID + 1)


def test_conflicts_and_unknown_names_are_refused():
    reg = AdapterRegistry([("a", "m", "/a")])
    with pytest.raises(AdapterError, match="exists already"):
        reg.new_ref("a", "/a2")
    with pytest.raises(AdapterError, match="no adapter"):
        reg.remove("zzz")
    assert reg.get("zzz") is None


def test_wait_idle_waits_for_the_last_request():
    async def run():
        reg = AdapterRegistry([("a", "m", "/a")])
        reg.acquire("a")
        reg.acquire("a")
        reg.remove("a")
        assert reg.get("a") is None and reg.in_flight("a") == 2
        waiter = asyncio.create_task(reg.wait_idle("a", 5))
        reg.release("a")
        await asyncio.sleep(0.01)
        assert not waiter.done()
        reg.release("a")
        assert await waiter
        assert await reg.wait_idle("a", 0.01)  # nothing in flight: at once
        reg.acquire("b")
        assert not await reg.wait_idle("b", 0.01)  # still busy after the timeout

    asyncio.run(run())
