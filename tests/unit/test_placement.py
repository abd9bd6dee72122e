"""splitserve.controller.placement: pick_cores and the CoreLedger logic, without a Ray cluster."""

from __future__ import annotations

import pytest

from splitserve.controller import placement
from splitserve.controller.placement import CoreLedger, PlacementError, pick_cores


def _ledger():
    """A plain instance of the class under @ray.remote (no actor, no cluster)."""
    cls = getattr(CoreLedger, "__ray_actor_class__", None)
    if cls is None:
        cls = CoreLedger.__ray_metadata__.modified_class
    return cls()


@pytest.fixture
def all_alive(monkeypatch: pytest.MonkeyPatch) -> None:
    """acquire() consults Ray when short; answer 'alive' without a cluster."""
    monkeypatch.setattr(placement, "_actor_alive", lambda name: True)


def test_pick_cores_lowest_free() -> None:
    assert pick_cores(range(8), {0, 2}, 3) == [1, 3, 4]


def test_pick_cores_sorts_available() -> None:
    assert pick_cores([7, 3, 5, 1], set(), 2) == [1, 3]


def test_pick_cores_short_is_none() -> None:
    assert pick_cores([0, 1, 2], {1}, 3) is None


def test_pick_cores_exact_fit_and_zero() -> None:
    assert pick_cores([0, 1], set(), 2) == [0, 1]
    assert pick_cores([0, 1], {0, 1}, 0) == []


def test_acquire_disjoint(all_alive) -> None:
    led = _ledger()
    a = led.acquire("r1", 2, [0, 1, 2, 3, 4, 5], None)
    b = led.acquire("r2", 3, [0, 1, 2, 3, 4, 5], None)
    assert a == [0, 1]
    assert b == [2, 3, 4]
    assert not set(a) & set(b)
    assert led.leases() == {"r1": [0, 1], "r2": [2, 3, 4]}


def test_acquire_same_holder_is_idempotent(all_alive) -> None:
    led = _ledger()
    first = led.acquire("r1", 2, [0, 1, 2, 3], None)
    again = led.acquire("r1", 2, [0, 1, 2, 3], None)
    assert again == first == [0, 1]
    assert led.leases() == {"r1": [0, 1]}
    assert led.acquire("r2", 2, [0, 1, 2, 3], None) == [2, 3]


def test_release_frees_cores_and_is_idempotent(all_alive) -> None:
    led = _ledger()
    led.acquire("r1", 2, [0, 1, 2, 3], None)
    led.acquire("r2", 2, [0, 1, 2, 3], None)
    led.release("r1")
    led.release("r1")
    led.release("never-held")
    assert led.leases() == {"r2": [2, 3]}
    assert led.acquire("r3", 2, [0, 1, 2, 3], None) == [0, 1]


def test_short_raises_placement_error(all_alive) -> None:
    led = _ledger()
    led.acquire("r1", 3, [0, 1, 2, 3], None)
    with pytest.raises(PlacementError) as exc:
        led.acquire("r2", 2, [3, 2, 1, 0], None)
    msg = str(exc.value)
    assert msg.startswith("r2 needs 2 core(s) of its own but only cores [0, 1, 2, 3] exist")
    assert "{'r1': [0, 1, 2]} are leased" in msg
    assert led.leases() == {"r1": [0, 1, 2]}  # the failed request leased nothing


def test_reclaim_dead_drops_only_dead_holders() -> None:
    led = _ledger()
    led.acquire("r1", 1, [0, 1, 2], "serve/dead")
    led.acquire("r2", 1, [0, 1, 2], "serve/live")
    led.acquire("r3", 1, [0, 1, 2], None)  # no actor name: never reclaimed
    asked: list[str] = []

    def alive(name: str) -> bool:
        asked.append(name)
        return name != "serve/dead"

    led._reclaim_dead(alive)
    assert led.leases() == {"r2": [1], "r3": [2]}
    assert sorted(asked) == ["serve/dead", "serve/live"]


def test_acquire_reclaims_dead_holder_when_short(monkeypatch: pytest.MonkeyPatch) -> None:
    led = _ledger()
    monkeypatch.setattr(placement, "_actor_alive", lambda name: True)
    led.acquire("old", 2, [0, 1], "serve/old-replica")
    monkeypatch.setattr(placement, "_actor_alive", lambda name: name != "serve/old-replica")
    assert led.acquire("new", 2, [0, 1], "serve/new-replica") == [0, 1]
    assert led.leases() == {"new": [0, 1]}


def test_acquire_does_not_probe_liveness_when_cores_are_free(monkeypatch: pytest.MonkeyPatch) -> None:
    def boom(name: str) -> bool:
        raise AssertionError("liveness probed although cores were free")

    monkeypatch.setattr(placement, "_actor_alive", boom)
    led = _ledger()
    assert led.acquire("r1", 1, [0, 1], "serve/a") == [0]
    assert led.acquire("r2", 1, [0, 1], "serve/b") == [1]


def test_least_used_cores_prefers_free_then_lowest():
    from splitserve.controller.placement import least_used_cores

    assert least_used_cores([0, 1], [[0, 1]], 1) == [0]
    assert least_used_cores([0, 1, 2], [[0], [0, 1]], 2) == [1, 2]
    assert least_used_cores([0, 1], [[1], [1]], 2) == [0, 1]
