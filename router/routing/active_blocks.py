"""The KV blocks each replica holds for the requests this router sent it and that have not
completed: the prefix policies' load term (`cost = overlap_weight * uncached + active`), as
Dynamo's KV router counts its active sequences.

Counted by the router itself, when Serve routes a request and when it completes, so the figure
is current at every decision: the engines' own KV usage reaches the router only with their
routing stats, seconds late, and an idle replica would look idle to a burst of new
conversations. A request counts the blocks of its prompt, what it holds when it starts (its
output's blocks, a budget many streams never use, are left to the engines' reports); pure.
"""

from __future__ import annotations

import math
from collections import defaultdict

# Requests tracked at most; the oldest is dropped beyond it (a completion Serve never reported
# must not hold a replica's load forever).
MAX_TRACKED = 65536


class ActiveBlocks:
    """Per replica, the blocks of the requests routed to it and not yet completed."""

    def __init__(self, max_tracked: int = MAX_TRACKED) -> None:
        self._requests: dict[str, tuple[str, int]] = {}  # request id -> (replica, blocks)
        self._replicas: dict[str, int] = defaultdict(int)
        self._block_size = 1
        self._max = max_tracked

    def routed(self, request_id: str, replica_id: str, tokens: int, block_size: int) -> None:
        """The request went to `replica_id`; `tokens`: its prompt's."""
        self.completed(request_id)
        self._block_size = max(block_size, 1)
        blocks = math.ceil(max(tokens, 0) / self._block_size)
        self._requests[request_id] = (replica_id, blocks)
        self._replicas[replica_id] += blocks
        while len(self._requests) > self._max:
            self.completed(next(iter(self._requests)))

    def completed(self, request_id: str) -> None:
        """The request ended (finished, failed or cancelled); unknown ids are ignored."""
        held = self._requests.pop(request_id, None)
        if held is None:
            return
        replica, blocks = held
        self._replicas[replica] -= blocks
        if self._replicas[replica] <= 0:
            del self._replicas[replica]

    def of(self, replica_id: str) -> int:
        """The replica's active blocks (0 for one with nothing in flight)."""
        return self._replicas.get(replica_id, 0)

    def tokens_of(self, replica_id: str) -> int:
        """The replica's active blocks in tokens (in the block size last routed with)."""
        return self.of(replica_id) * self._block_size

    def forget_replica(self, replica_id: str) -> None:
        """The replica is gone: its requests no longer count."""
        for rid in [r for r, (rep, _) in self._requests.items() if rep == replica_id]:
            self.completed(rid)
