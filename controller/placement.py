"""CPU placement: every engine rank gets cores of its own, never shared with another engine.

`pick_cores` is the pure decision; `CoreLedger` is the Ray actor that applies it for a cluster
node, keyed by the replica that holds the lease. A lease whose holder died is reclaimed the next
time cores run short, so a crashed replica never strands cores.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

LEDGER_NAME = "splitserve-core-ledger"
LEDGER_NAMESPACE = "splitserve"


class PlacementError(RuntimeError):
    """Not enough free cores for an engine; raised instead of letting engines share cores."""


def pick_cores(available: Iterable[int], taken: set[int], n: int) -> list[int] | None:
    """The `n` lowest-numbered available cores not in `taken`, or None when fewer are free."""
    free = sorted(set(available) - taken)
    return free[:n] if len(free) >= n else None


def least_used_cores(available: Iterable[int], leases: list[list[int]], n: int) -> list[int]:
    """The `n` available cores held by the fewest leases (ties: lowest number), sorted."""
    use = {c: 0 for c in available}
    for cores in leases:
        for c in cores:
            if c in use:
                use[c] += 1
    return sorted(sorted(use, key=lambda c: (use[c], c))[:n])


@ray.remote(num_cpus=0)
class CoreLedger:
    """Hands out disjoint core sets to engine replicas on one node."""

    def __init__(self) -> None:
        self._leases: dict[str, tuple[str | None, list[int]]] = {}

    def acquire(
        self,
        holder: str,
        n: int,
        available: list[int],
        holder_actor: str | None,
        allow_shared: bool = False,
    ) -> list[int]:
        """Lease `n` cores from `available` to `holder`; raises PlacementError when short.

        `allow_shared` (development on small machines only) leases the least-used cores instead
        of failing.
        """
        if holder in self._leases:
            return self._leases[holder][1]
        cores = self._pick(n, available)
        if cores is None:
            self._reclaim_dead(_actor_alive)
            cores = self._pick(n, available)
        if cores is None and allow_shared and len(available) >= n:
            cores = least_used_cores(available, [c for _, c in self._leases.values()], n)
        if cores is None:
            leased = {h: c for h, (_, c) in self._leases.items()}
            raise PlacementError(
                f"{holder} needs {n} core(s) of its own but only cores {sorted(available)} exist "
                f"and {leased} are leased; lower replicas or parallelism, or add nodes"
            )
        self._leases[holder] = (holder_actor, cores)
        return cores

    def release(self, holder: str) -> None:
        """Return `holder`'s cores (idempotent)."""
        self._leases.pop(holder, None)

    def leases(self) -> dict[str, list[int]]:
        """Current leases by holder."""
        return {h: c for h, (_, c) in self._leases.items()}

    def _pick(self, n: int, available: list[int]) -> list[int] | None:
        taken = {c for _, cores in self._leases.values() for c in cores}
        return pick_cores(available, taken, n)

    def _reclaim_dead(self, alive: Callable[[str], bool]) -> None:
        for holder, (actor, _) in list(self._leases.items()):
            if actor is not None and not alive(actor):
                del self._leases[holder]


def _actor_alive(name: str) -> bool:
    namespace, _, actor = name.partition("/")
    try:
        ray.get_actor(actor, namespace=namespace)
    except ValueError:
        return False
    return True


def core_ledger():
    """The node's ledger actor handle, created on first use."""
    node = ray.get_runtime_context().get_node_id()
    return CoreLedger.options(
        name=f"{LEDGER_NAME}-{node[:12]}",
        namespace=LEDGER_NAMESPACE,
        get_if_exists=True,
        lifetime="detached",
        scheduling_strategy=NodeAffinitySchedulingStrategy(
            node_id=node, soft=False
        ),
    ).remote()
