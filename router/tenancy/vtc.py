"""Fair queueing across tenants: the Virtual Token Counter (Sheng et al., OSDI '24), with weights
and strict priority classes. Pure: no clock, no I/O, no asyncio.

Each tenant has a counter of weighted service received,

    counter += (prompt_tokens * w_p + output_tokens * w_q) / tenant_weight

charged for the prompt when a request is picked and for output tokens as they are reported.

`pick` serves the highest priority class that has waiting requests; within it, the tenant with
the smallest counter (ties: the earliest-queued head request); within a tenant, FIFO. A tenant
that becomes backlogged (had nothing queued) has its counter lifted to the smallest counter of
the backlogged tenants, or, when nobody is backlogged, to the counter the last picked tenant had
when it was picked: an idle tenant cannot bank credit and then monopolise the pools.

Bounds (from the paper): two continuously backlogged tenants' weighted counters never differ by
more than about one request's worth of service, so service splits by weight, and a new tenant
waits at most for the tenants tied with it before it is picked.
"""

from __future__ import annotations

import itertools
from collections import deque
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class ServiceWeights:
    """w_p and w_q: the cost of a prompt token and of a generated token (the paper uses 1, 2)."""

    prompt: float = 1.0
    output: float = 2.0


@dataclass(eq=False)
class QueueEntry:
    """One waiting request. Identity, not value, tells entries apart."""

    tenant: str
    priority: int
    prompt_tokens: int
    seq: int
    payload: Any = None


class VTCScheduler:
    """Per-tenant FIFO queues in priority classes; `pick` serves by weighted virtual counters."""

    def __init__(self, weights: ServiceWeights = ServiceWeights()) -> None:
        self.weights = weights
        self._counters: dict[str, float] = {}
        self._tenant_weights: dict[str, float] = {}
        self._classes: dict[int, dict[str, deque[QueueEntry]]] = {}
        self._queued: dict[str, int] = {}  # entries per tenant, all classes
        self._floor = 0.0  # the counter of the last picked tenant, at its pick
        self._seq = itertools.count()

    # ---- queries --------------------------------------------------------------------------

    def __len__(self) -> int:
        return sum(self._queued.values())

    def queued(self, tenant: str) -> int:
        """Waiting entries of `tenant` (all classes)."""
        return self._queued.get(tenant, 0)

    def counter(self, tenant: str) -> float:
        """The tenant's virtual counter (0 for a tenant never seen)."""
        return self._counters.get(tenant, 0.0)

    def backlogged(self) -> list[str]:
        """Tenants with at least one waiting entry."""
        return [t for t, n in self._queued.items() if n > 0]

    # ---- mutations ------------------------------------------------------------------------

    def enqueue(
        self,
        tenant: str,
        prompt_tokens: int,
        *,
        weight: float = 1.0,
        priority: int = 0,
        payload: Any = None,
    ) -> QueueEntry:
        """Queue a request; lifts the tenant's counter if it was not backlogged."""
        if weight <= 0:
            raise ValueError("a tenant weight must be positive")
        self._tenant_weights[tenant] = weight
        if self.queued(tenant) == 0:
            self._lift(tenant)
        entry = QueueEntry(tenant, priority, prompt_tokens, next(self._seq), payload)
        self._classes.setdefault(priority, {}).setdefault(tenant, deque()).append(entry)
        self._queued[tenant] = self.queued(tenant) + 1
        return entry

    def _lift(self, tenant: str) -> None:
        others = [self.counter(t) for t in self.backlogged()]
        floor = min(others) if others else self._floor
        self._counters[tenant] = max(self.counter(tenant), floor)

    def pick(self) -> QueueEntry | None:
        """Dequeue the next entry to serve and charge its prompt; None when nothing waits."""
        for priority in sorted(self._classes, reverse=True):
            queues = self._classes[priority]
            if not queues:
                continue
            tenant = min(queues, key=lambda t: (self.counter(t), queues[t][0].seq))
            entry = queues[tenant].popleft()
            self._drop(entry, queues)
            self._floor = max(self._floor, self.counter(tenant))
            self.charge(tenant, prompt_tokens=entry.prompt_tokens)
            return entry
        return None

    def remove(self, entry: QueueEntry) -> bool:
        """Withdraw a waiting entry (timeout, cancellation); False if it is not queued."""
        queues = self._classes.get(entry.priority, {})
        queue = queues.get(entry.tenant)
        if queue is None or entry not in queue:
            return False
        queue.remove(entry)
        self._drop(entry, queues)
        return True

    def _drop(self, entry: QueueEntry, queues: dict[str, deque[QueueEntry]]) -> None:
        if not queues[entry.tenant]:
            del queues[entry.tenant]
        if not queues:
            del self._classes[entry.priority]
        self._queued[entry.tenant] -= 1
        if not self._queued[entry.tenant]:
            del self._queued[entry.tenant]

    def charge(self, tenant: str, *, prompt_tokens: int = 0, output_tokens: int = 0) -> None:
        """Add weighted service to `tenant`'s counter (any time, queued or not)."""
        cost = prompt_tokens * self.weights.prompt + output_tokens * self.weights.output
        weight = self._tenant_weights.get(tenant, 1.0)
        self._counters[tenant] = self.counter(tenant) + cost / weight
