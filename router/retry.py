"""Retries of failed worker calls: pure decisions (no Ray, no I/O), unit-tested in milliseconds.

Prefill: the dispatcher tries the prefill pool up to `disaggregation.prefill_attempts` times
within `disaggregation.prefill_timeout_s`, each retry steered away from the replicas that failed;
then the decode worker prefills locally. The client never sees a prefill failure, only a later
first token.

Decode: when a decode replica fails before any of the response went out, the whole request
goes to another decode replica (up to `router.decode_migrations` times). Once some of it went
out, the response ends with an error: vLLM's server held its state, so a continuation elsewhere
could not be exact (`router/dispatch.py` `_migrating`).
"""

from __future__ import annotations

from typing import Literal

from splitserve.engine.messages import RequestRejected

from splitserve.kv_transfer.handoff import HandoffError

FailureKind = Literal["replica", "timeout", "handoff", "overload", "rejected"]

# A retry with less time than this left would only time out: prefill locally at once.
MIN_ATTEMPT_S = 0.05

# Ray Serve's "no replica can take it now" errors, matched by name to keep this module Ray-free.
_OVERLOAD = ("BackPressureError", "DeploymentUnavailableError")


def classify(err: BaseException) -> FailureKind:
    """What kind of prefill failure `err` is.

    - overload: the pool refused the request (queues full, no replica): retrying adds load;
    - timeout: the attempt ran past the prefill deadline;
    - handoff: the prefill ran but returned no usable KV handoff;
    - rejected: the engine refused the request as invalid (any replica would);
    - replica: anything else (engine error, replica crashed or was killed).
    """
    if type(err).__name__ in _OVERLOAD:
        return "overload"
    if rejection(err) is not None:
        return "rejected"
    if isinstance(err, TimeoutError):
        return "timeout"
    if isinstance(err, HandoffError):
        return "handoff"
    return "replica"


def rejection(err: BaseException) -> RequestRejected | None:
    """The engine's rejection of an invalid request in `err` (also through Ray's wrapper)."""
    for e in (err, getattr(err, "cause", None)):
        if isinstance(e, RequestRejected):
            return e
    return None


def failed_replica(err: BaseException) -> str | None:
    """The replica id a worker error names (`WorkerError.replica`, also through Ray's wrapper)."""
    for e in (err, getattr(err, "cause", None)):
        replica = getattr(e, "replica", None) if e is not None else None
        if isinstance(replica, str) and replica:
            return replica
    return None


def retry_prefill(*, kind: FailureKind, attempt: int, attempts: int, time_left_s: float) -> bool:
    """After failed try number `attempt` (1-based): try the prefill pool again?

    No after an overload (the decode worker's own prefill is the faster path), after the last
    allowed try, or when the deadline leaves no time for another.
    """
    if kind in ("overload", "timeout", "rejected"):
        return False
    return attempt < attempts and time_left_s > MIN_ATTEMPT_S


def migrate_decode(*, kind: FailureKind, migrations: int, max_migrations: int) -> bool:
    """After a decode failure: continue the request on another decode replica?

    Not when the pool refused it (no replica can take it: moving it would fail the same way), nor
    when the engine rejected the request as invalid, and not past `max_migrations`.
    """
    return kind not in ("overload", "rejected") and migrations < max_migrations


