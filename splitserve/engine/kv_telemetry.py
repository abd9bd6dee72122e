"""Per-request NIXL transfer telemetry: which request each measured KV transfer belonged to, and
which requests' KV loads failed.

vLLM's NIXL connector measures every transfer it completes (NIXL's `nixlXferTelemetry`:
`xferDuration` in microseconds from post to completion, `totalBytes`) and adds it to its per-step
`NixlKVConnectorStats` as anonymous list entries. This module, installed by the vLLM plugin
(`vllm_plugin.register`) in every vLLM process, adds the request id:

- `NixlBaseConnectorWorker._pop_done_transfers(transfers)` (called by the worker each step with
  `{req_id: [handle, ...]}`) is wrapped to remember handle -> req_id while it runs;
- the worker's NIXL agent gets an instance-level `get_xfer_telemetry(handle)` that, besides
  returning the telemetry as before, appends `[req_id, seconds, bytes]` to
  `xfer_stats.data[REQUEST_TRANSFERS]`;
- `NixlBaseConnectorWorker.get_transfer_results()` (called by the model runner each step) is
  wrapped to append the id of every request whose KV load failed this step (its result's
  `failed_recving`: a transfer error, a failed handshake with a gone or unknown peer, an invalid
  peer; vLLM then recomputes the prompt, `kv_load_failure_policy: recompute`) to
  `xfer_stats.data[REQUEST_FAILURES]`; the model runner collects the stats right after;
- `NixlKVConnectorStats.reset` gives every stats object both keys, `aggregate` adds them when
  only the other object has them (it indexes `self.data[k]` for each of the other's keys, in the
  engine and in the front-end process), and `is_empty` is false while a failure is listed (vLLM
  counts a failed handshake once, from a background thread, for all the requests waiting on it,
  and fails those requests in a later step: that step may otherwise look empty and be dropped).

The stock keys are untouched, so vLLM's own metrics and logs do not change. The entries reach
`LatestStats.add_connector_stats` in the front-end process like the rest of the connector stats
(msgpack of `data`: lists of str, float and int survive). The request id there is vLLM's
internal one: the caller's id plus "-" and 8 random characters (`engine_request_id`).

Pull mode (the default) records on the decode worker, which reads the blocks; push mode would
record on the prefill side. When vLLM's internals differ from what is expected here, `install`
logs it and changes nothing.
"""

from __future__ import annotations

import functools
import logging
from typing import Any

log = logging.getLogger("splitserve.engine")

# The key the entries go under in `NixlKVConnectorStats.data`: [[req_id, seconds, bytes], ...].
REQUEST_TRANSFERS = "splitserve_request_transfers"
# ... and the requests whose KV load failed (vLLM recomputes them): [req_id, ...].
REQUEST_FAILURES = "splitserve_request_failures"
_KEYS = (REQUEST_TRANSFERS, REQUEST_FAILURES)
# vLLM's internal request id: the external id + "-" + this many random characters.
_ID_SUFFIX = 8
_MARK = "_splitserve_kv_telemetry"


def external_request_id(engine_id: str) -> str:
    """The caller's request id of an engine-core request id (the 8-character suffix removed)."""
    cut = len(engine_id) - _ID_SUFFIX - 1
    return engine_id[:cut] if cut > 0 and engine_id[cut] == "-" else engine_id


def _telemetry_getter(worker: Any, real: Any) -> Any:
    """`real` (the agent's bound `get_xfer_telemetry`), also recording the result under the
    request the handle belongs to (known while `_pop_done_transfers` runs)."""

    @functools.wraps(real)
    def get_xfer_telemetry(handle: Any, *args: Any, **kwargs: Any) -> Any:
        res = real(handle, *args, **kwargs)
        req_id = worker.__dict__.get(_MARK, {}).get(handle)
        if res is not None and req_id is not None:
            entries = worker.xfer_stats.data.setdefault(REQUEST_TRANSFERS, [])
            entries.append([str(req_id), res.xferDuration / 1e6, int(res.totalBytes)])
        return res

    get_xfer_telemetry.splitserve_patched = True  # type: ignore[attr-defined]
    return get_xfer_telemetry


def _wrap_pop_done(real: Any) -> Any:
    @functools.wraps(real)
    def _pop_done_transfers(self: Any, transfers: dict[str, list[Any]], *args: Any, **kw: Any):
        agent = self.nixl_wrapper
        getter = getattr(agent, "get_xfer_telemetry", None)
        if getter is not None and not getattr(getter, "splitserve_patched", False):
            agent.get_xfer_telemetry = _telemetry_getter(self, getter)
        pending = self.__dict__.setdefault(_MARK, {})
        handles = {h: req_id for req_id, hs in transfers.items() for h in hs}
        pending.update(handles)  # handles are unique: concurrent callers do not collide
        try:
            return real(self, transfers, *args, **kw)
        finally:
            for h in handles:
                pending.pop(h, None)

    _pop_done_transfers.splitserve_patched = True  # type: ignore[attr-defined]
    return _pop_done_transfers


def _wrap_transfer_results(real: Any) -> Any:
    @functools.wraps(real)
    def get_transfer_results(self: Any, *args: Any, **kw: Any) -> Any:
        results = real(self, *args, **kw)
        failed = getattr(results, "failed_recving", None)
        if failed:
            entries = self.xfer_stats.data.setdefault(REQUEST_FAILURES, [])
            entries.extend(str(req_id) for req_id in sorted(failed))
        return results

    get_transfer_results.splitserve_patched = True  # type: ignore[attr-defined]
    return get_transfer_results


def _wrap_reset(real: Any) -> Any:
    @functools.wraps(real)
    def reset(self: Any) -> None:
        real(self)
        for key in _KEYS:
            self.data[key] = []

    reset.splitserve_patched = True  # type: ignore[attr-defined]
    return reset


def _wrap_aggregate(real: Any) -> Any:
    @functools.wraps(real)
    def aggregate(self: Any, other: Any) -> Any:
        # A stats object built from another process's data may lack the keys.
        for key in _KEYS:
            if key in getattr(other, "data", {}):
                self.data.setdefault(key, [])
        return real(self, other)

    aggregate.splitserve_patched = True  # type: ignore[attr-defined]
    return aggregate


def _wrap_is_empty(real: Any) -> Any:
    @functools.wraps(real)
    def is_empty(self: Any) -> bool:
        return real(self) and not self.data.get(REQUEST_FAILURES)

    is_empty.splitserve_patched = True  # type: ignore[attr-defined]
    return is_empty


def patch(worker_cls: Any, stats_cls: Any) -> None:
    """Install the attribution on these classes (idempotent)."""
    wraps = ((worker_cls, "_pop_done_transfers", _wrap_pop_done),
             (worker_cls, "get_transfer_results", _wrap_transfer_results),
             (stats_cls, "reset", _wrap_reset), (stats_cls, "aggregate", _wrap_aggregate),
             (stats_cls, "is_empty", _wrap_is_empty))
    for cls, name, wrap in wraps:
        if not callable(getattr(cls, name)):
            raise TypeError(f"{cls.__name__}.{name} is not a method")
    for cls, name, wrap in wraps:
        if not getattr(getattr(cls, name), "splitserve_patched", False):
            setattr(cls, name, wrap(getattr(cls, name)))


def install() -> bool:
    """Patch vLLM's NIXL connector worker and stats; False (logged) when they are not as
    expected or not installed."""
    try:
        from vllm.distributed.kv_transfer.kv_connector.v1.nixl.base_worker import (
            NixlBaseConnectorWorker,
        )
        from vllm.distributed.kv_transfer.kv_connector.v1.nixl.stats import (
            NixlKVConnectorStats,
        )

        patch(NixlBaseConnectorWorker, NixlKVConnectorStats)
    except Exception as err:  # noqa: BLE001 - another vLLM: per-request KV telemetry is off
        log.info("per-request KV transfer telemetry unavailable: %s: %s",
                 type(err).__name__, err)
        return False
    return True
