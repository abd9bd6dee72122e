"""Retries of failed worker calls: pure decisions (no Ray, no I/O), unit-tested in milliseconds.

Prefill: the dispatcher tries the prefill pool up to `disaggregation.prefill_attempts` times
within `disaggregation.prefill_timeout_s`, each retry steered away from the replicas that failed;
then the decode worker prefills locally. The client never sees a prefill failure, only a later
first token.

Decode: when a decode replica fails mid-stream, the request migrates (up to
`router.decode_migrations` times) to another decode replica as a continuation: the prompt plus
the tokens already streamed, for the tokens still owed. The client's stream goes on without a
repeated or missing token; for greedy decoding without presence/frequency penalties the output is
the one an undisturbed run gives (penalties count only a request's own output tokens, and the
streamed ones are prompt tokens in the continuation).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Literal

from splitserve.engine.messages import GenerateRequest, RequestRejected

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


def continuation(
    req: GenerateRequest, streamed: Sequence[int], *, migration: int, avoid: tuple[str, ...]
) -> GenerateRequest | None:
    """The request that finishes `req` after `streamed` output tokens reached the client, or None
    when nothing is owed any more (the failure came after the last token).

    The continuation prefills on the decode worker (no KV handoff: the prefill's blocks belong to
    the failed attempt), has a request id of its own, and avoids the replicas that failed.
    """
    owed = req.sampling.max_tokens - len(streamed)
    if owed <= 0:
        return None
    sampling = dataclasses.replace(
        req.sampling, max_tokens=owed, min_tokens=max(req.sampling.min_tokens - len(streamed), 0)
    )
    return dataclasses.replace(
        req,
        request_id=f"{req.request_id}-m{migration}",
        prompt_token_ids=(*req.prompt_token_ids, *streamed),
        sampling=sampling,
        kv_transfer_params=None,
        avoid_replicas=avoid,
    )
