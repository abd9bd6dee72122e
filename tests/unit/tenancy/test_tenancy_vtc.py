"""The Virtual Token Counter scheduler: weighted shares, no starvation, no banked credit,
priority classes. Pure simulations: each picked request is charged its output right away."""

from __future__ import annotations

import pytest

from splitserve.router.tenancy.vtc import ServiceWeights, VTCScheduler

W = ServiceWeights(prompt=1.0, output=2.0)
# Deliberately unequal request shapes: fairness is by weighted tokens, not request counts.
SHAPES = {"a": (100, 50), "b": (30, 200), "c": (10, 10)}


def _serve(vtc: VTCScheduler, picks: int, service: dict[str, float]) -> list[str]:
    """Pick `picks` times; charge each request's output; tally weighted service."""
    order = []
    for _ in range(picks):
        entry = vtc.pick()
        assert entry is not None
        prompt, output = SHAPES[entry.tenant]
        vtc.charge(entry.tenant, output_tokens=output)
        cost = prompt * W.prompt + output * W.output
        service[entry.tenant] = service.get(entry.tenant, 0.0) + cost
        order.append(entry.tenant)
    return order


def _keep_backlogged(vtc: VTCScheduler, tenant: str, weight: float, depth: int) -> None:
    while vtc.queued(tenant) < depth:
        vtc.enqueue(tenant, SHAPES[tenant][0], weight=weight)


def test_weights_two_to_one_split_service_within_five_percent() -> None:
    vtc = VTCScheduler(W)
    service: dict[str, float] = {}
    for _ in range(500):
        _keep_backlogged(vtc, "a", 2.0, 4)
        _keep_backlogged(vtc, "b", 1.0, 4)
        _serve(vtc, 4, service)
    ratio = service["a"] / service["b"]
    assert abs(ratio - 2.0) / 2.0 < 0.05, ratio


def test_equal_weights_split_equally_despite_different_shapes() -> None:
    vtc = VTCScheduler(W)
    service: dict[str, float] = {}
    for _ in range(500):
        _keep_backlogged(vtc, "a", 1.0, 20)  # deep enough that neither runs dry in a round
        _keep_backlogged(vtc, "c", 1.0, 20)
        _serve(vtc, 4, service)
    assert abs(service["a"] / service["c"] - 1.0) < 0.05
    assert service["a"] > 0 and service["c"] > 0


def test_flooding_tenant_cannot_starve_a_light_one() -> None:
    vtc = VTCScheduler(W)
    for _ in range(1000):
        vtc.enqueue("a", SHAPES["a"][0])
    _serve(vtc, 100, {})
    vtc.enqueue("c", SHAPES["c"][0])
    order = _serve(vtc, 2, {})
    assert "c" in order  # served within two picks despite 900 of "a" ahead of it
    assert vtc.queued("a") == 899 and vtc.queued("c") == 0


def test_light_tenant_wait_is_bounded_under_flood() -> None:
    vtc = VTCScheduler(W)
    for _ in range(2000):
        vtc.enqueue("a", SHAPES["a"][0])
    waits = []
    for _ in range(200):  # c sends one request at a time, the next when the last is served
        vtc.enqueue("c", SHAPES["c"][0])
        picks = 1
        while _serve(vtc, 1, {}) != ["c"]:
            picks += 1
        waits.append(picks)
    assert max(waits) <= 2  # at most one of the flood's requests goes first, every time
    assert 2000 - 200 <= vtc.queued("a") < 2000  # and the flood is still served in between


def test_idle_tenant_does_not_bank_credit() -> None:
    vtc = VTCScheduler(W)
    for _ in range(50):
        _keep_backlogged(vtc, "a", 1.0, 3)
        _serve(vtc, 1, {})
    assert vtc.counter("b") == 0.0
    lowest_backlogged = vtc.counter("a")
    vtc.enqueue("b", SHAPES["b"][0])
    assert vtc.counter("b") == lowest_backlogged  # lifted, not left at zero
    service: dict[str, float] = {}
    for _ in range(50):
        _keep_backlogged(vtc, "a", 1.0, 3)
        _keep_backlogged(vtc, "b", 1.0, 3)
        _serve(vtc, 2, service)
    assert abs(service["a"] / service["b"] - 1.0) < 0.1  # not b first for a long while


def test_lift_when_nobody_is_backlogged_uses_last_picked_counter() -> None:
    vtc = VTCScheduler(W)
    for _ in range(10):
        vtc.enqueue("a", 100)
        _serve(vtc, 1, {})
    at_last_pick = vtc.counter("a") - 100 - 2 * 50  # before the last request's charges
    assert len(vtc) == 0
    vtc.enqueue("b", 30)
    assert vtc.counter("b") == pytest.approx(at_last_pick)
    assert vtc.counter("b") > 0


def test_a_tenant_that_was_overserved_keeps_its_debt() -> None:
    vtc = VTCScheduler(W)
    vtc.charge("a", prompt_tokens=10_000)
    vtc.enqueue("b", 1)
    vtc.enqueue("a", 1)  # not lifted down: max(counter, floor)
    assert vtc.counter("a") == 10_000
    assert [vtc.pick().tenant, vtc.pick().tenant] == ["b", "a"]


def test_higher_priority_class_always_first() -> None:
    vtc = VTCScheduler(W)
    vtc.charge("gold", prompt_tokens=1_000_000)  # far ahead on service received
    for _ in range(3):
        vtc.enqueue("free", 10, priority=0)
        vtc.enqueue("gold", 10, priority=5)
    order = [vtc.pick().tenant for _ in range(6)]
    assert order == ["gold"] * 3 + ["free"] * 3
    assert vtc.pick() is None


def test_fifo_within_a_tenant_and_remove() -> None:
    vtc = VTCScheduler(W)
    first = vtc.enqueue("a", 1, payload="first")
    second = vtc.enqueue("a", 1, payload="second")
    third = vtc.enqueue("a", 1, payload="third")
    assert vtc.remove(second)
    assert not vtc.remove(second)
    assert len(vtc) == 2
    assert [vtc.pick().payload, vtc.pick().payload] == ["first", "third"]
    assert not vtc.remove(first) and not vtc.remove(third)
    assert len(vtc) == 0 and vtc.backlogged() == []


def test_charge_is_divided_by_weight() -> None:
    vtc = VTCScheduler(W)
    vtc.enqueue("heavy", 0, weight=4.0)
    vtc.charge("heavy", prompt_tokens=40, output_tokens=10)
    assert vtc.counter("heavy") == pytest.approx((40 * 1 + 10 * 2) / 4)


def test_weight_must_be_positive() -> None:
    with pytest.raises(ValueError):
        VTCScheduler().enqueue("a", 1, weight=0)
