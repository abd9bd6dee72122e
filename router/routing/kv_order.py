"""Pure bookkeeping of one replica's KV-event stream: which batch to apply, skip, or replay.

vLLM's ZMQ publisher numbers its batches 0, 1, 2, ... and keeps the last `buffer_steps` of them
for its replay endpoint (`ZmqEventPublisher`). A subscriber sees the live stream from when its
subscription took effect and may miss batches (the PUB socket drops past its high-water mark).
The rule:

- a live batch numbered as expected is applied; an older one (already applied, e.g. replayed)
  is skipped; a newer one means batches were missed: replay from the first missing one;
- a fresh subscriber (a router that just started) replays from 0 first: the engine's history
  as far as its buffer reaches, which rebuilds the index after a router restart;
- a replay that starts past the first missing batch means the publisher no longer has it: the
  replica's entries are reset and rebuilt from what the replay has. Blocks stored before the
  buffer's start then stay unknown until stored again (the index under-counts, never claims a
  block a replica dropped).

An engine restart is a new Serve replica (new id, new endpoint), so it starts fresh too.
"""

from __future__ import annotations

from enum import Enum


class Step(str, Enum):
    """What to do with one batch."""

    APPLY = "apply"
    SKIP = "skip"
    REPLAY = "replay"  # live batch past the expected one: replay from `Sequencer.next` first
    RESET = "reset"  # replayed batch past the expected one: forget the replica, then apply


class Sequencer:
    """Where one replica's stream stands: `next` is the batch number to apply next (None: not
    synchronised yet, a replay from 0 comes first)."""

    def __init__(self) -> None:
        self.next: int | None = None

    def live(self, seq: int) -> Step:
        """A batch from the live stream."""
        if self.next is None or seq > self.next:
            return Step.REPLAY
        if seq < self.next:
            return Step.SKIP
        self.next = seq + 1
        return Step.APPLY

    def replayed(self, seq: int) -> Step:
        """A batch from a replay (in order)."""
        if self.next is not None and seq < self.next:
            return Step.SKIP
        lost = self.next is not None and seq > self.next
        self.next = seq + 1
        return Step.RESET if lost else Step.APPLY

    def replay_from(self) -> int:
        """The first batch number a replay should send."""
        return 0 if self.next is None else self.next

    def replay_ended(self) -> None:
        """A replay answered: with nothing in it, the stream starts at batch 0."""
        if self.next is None:
            self.next = 0

    def give_up_gap(self, seq: int) -> Step:
        """A live batch still past the expected one after a replay (no answer, or the replay
        fell short): take the stream from this batch on; what was missed stays unknown."""
        self.next = seq + 1
        return Step.APPLY
