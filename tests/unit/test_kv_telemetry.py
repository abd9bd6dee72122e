"""Per-request KV-transfer telemetry (splitserve/engine/kv_telemetry.py): vLLM's own
`_pop_done_transfers` and `NixlKVConnectorStats`, run on a fake worker and a fake NIXL agent
(no engine, no NIXL), attribute each DONE transfer's telemetry to its request, and each failed
KV load (`failed_recving`) is listed by request; the entries survive the EngineCore -> front-end
serialization and reach `LatestStats` per request."""

from __future__ import annotations

import sys
from types import SimpleNamespace

import pytest

from splitserve.engine import kv_telemetry as kt
from splitserve.engine.messages import KV_EXPIRED, KV_TRANSFER_ERROR, kv_recompute_reason
from splitserve.engine.stats import MAX_REQUEST_TRANSFERS, LatestStats

base_worker = pytest.importorskip(
    "vllm.distributed.kv_transfer.kv_connector.v1.nixl.base_worker"
)
from vllm.distributed.kv_transfer.kv_connector.v1.nixl.stats import (
    NixlKVConnectorStats,
)

STOCK_KEYS = set(NixlKVConnectorStats().data) - set(kt._KEYS)


class _Stats(NixlKVConnectorStats):
    """The real stats class; a subclass so that the patch stays local to these tests."""


class _Agent:
    """A NIXL agent: scripted transfer states, telemetry (us, bytes) per handle."""

    def __init__(self, states: dict[int, str], telemetry: dict[int, tuple[int, int]]) -> None:
        self.states, self.telemetry, self.released = states, telemetry, []

    def check_xfer_state(self, handle: int) -> str:
        return self.states[handle]

    def get_xfer_telemetry(self, handle: int):
        us, n_bytes = self.telemetry[handle]
        return SimpleNamespace(xferDuration=us, postDuration=us // 10, totalBytes=n_bytes,
                               descCount=4)

    def release_xfer_handle(self, handle: int) -> None:
        self.released.append(handle)


class _Worker:
    """Just enough of a `NixlBaseConnectorWorker` for its real `_pop_done_transfers`."""

    _pop_done_transfers = base_worker.NixlBaseConnectorWorker._pop_done_transfers

    def __init__(self, agent: _Agent) -> None:
        self.nixl_wrapper = agent
        self.xfer_stats = _Stats()
        self.failed_recving: set[str] = set()

    def get_transfer_results(self):
        """Scripted: the step's `KVConnectorTransferResults` (only the failures matter)."""
        failed, self.failed_recving = self.failed_recving, set()
        return SimpleNamespace(finished_sending=set(), finished_recving=set(failed),
                               failed_recving=failed)

    def _log_failure(self, **_) -> None:
        pass

    def _handle_failed_transfer(self, req_id, handle, failed) -> bool:
        failed.add(req_id)
        return True


@pytest.fixture(autouse=True, scope="module")
def _patched():
    kt.patch(_Worker, _Stats)


def test_each_done_transfer_is_recorded_under_its_request():
    agent = _Agent({1: "DONE", 2: "DONE", 3: "PROC"},
                   {1: (2_000, 4096), 2: (3_000, 8192), 3: (1_000, 512)})
    worker = _Worker(agent)
    transfers = {"cmpl-a-1a2b3c4d": [1, 2], "cmpl-b-5e6f7a8b": [3]}
    done, failed = worker._pop_done_transfers(transfers)
    assert (done, failed) == ({"cmpl-a-1a2b3c4d"}, set())
    data = worker.xfer_stats.data
    assert data[kt.REQUEST_TRANSFERS] == [
        ["cmpl-a-1a2b3c4d", 0.002, 4096], ["cmpl-a-1a2b3c4d", 0.003, 8192],
    ]
    assert data["transfer_duration"] == [0.002, 0.003]  # vLLM's own keys: as without the patch
    assert data["bytes_transferred"] == [4096, 8192]

    agent.states[3] = "DONE"
    assert worker._pop_done_transfers(transfers) == ({"cmpl-b-5e6f7a8b"}, set())
    assert data[kt.REQUEST_TRANSFERS][-1] == ["cmpl-b-5e6f7a8b", 0.001, 512]
    assert transfers == {} and agent.released == [1, 2, 3]
    assert worker.__dict__[kt._MARK] == {}  # no handle remembered after the call


def test_a_failed_transfer_records_nothing():
    worker = _Worker(_Agent({1: "ERR"}, {1: (1, 1)}))
    assert worker._pop_done_transfers({"r-12345678": [1]}) == ({"r-12345678"}, {"r-12345678"})
    assert worker.xfer_stats.data[kt.REQUEST_TRANSFERS] == []


def test_telemetry_outside_pop_done_transfers_is_not_attributed():
    worker = _Worker(_Agent({1: "DONE"}, {1: (5, 10)}))
    worker._pop_done_transfers({})  # installs the agent's wrapper
    assert worker.nixl_wrapper.get_xfer_telemetry(1).totalBytes == 10
    assert worker.xfer_stats.data[kt.REQUEST_TRANSFERS] == []


def test_patching_is_idempotent_and_keeps_the_stock_keys():
    kt.patch(_Worker, _Stats)
    inner = _Worker._pop_done_transfers.__wrapped__
    assert not getattr(inner, "splitserve_patched", False)
    assert not getattr(_Stats.reset.__wrapped__, "splitserve_patched", False)
    stats = _Stats()
    assert set(stats.data) == STOCK_KEYS | set(kt._KEYS)
    assert stats.clone_and_reset().data is not stats.data and stats.data[kt.REQUEST_TRANSFERS] == []
    assert stats.reduce()["Num successful transfers"] == 0


def test_stats_cross_to_the_front_end_and_aggregate():
    """EngineCore -> front-end: msgpack of `SchedulerStats.kv_connector_stats` (the data dict);
    there vLLM's logger aggregates it into stats objects built from data or from nothing."""
    from vllm.v1.engine import EngineCoreOutputs
    from vllm.v1.metrics.stats import SchedulerStats
    from vllm.v1.serial_utils import MsgpackDecoder, MsgpackEncoder

    worker = _Worker(_Agent({7: "DONE"}, {7: (1_500, 2048)}))
    worker._pop_done_transfers({"cmpl-x-abcdefgh": [7]})
    sent = EngineCoreOutputs(scheduler_stats=SchedulerStats(
        kv_connector_stats=worker.xfer_stats.clone_and_reset().to_dict()))
    frames = MsgpackEncoder().encode(sent)
    got = MsgpackDecoder(EngineCoreOutputs).decode(frames).scheduler_stats.kv_connector_stats
    assert got[kt.REQUEST_TRANSFERS] == [["cmpl-x-abcdefgh", 0.0015, 2048]]

    acc = _Stats()
    acc.aggregate(_Stats(data=got))
    assert acc.data[kt.REQUEST_TRANSFERS] == got[kt.REQUEST_TRANSFERS]
    without_key = {k: [] for k in STOCK_KEYS} | {"transfer_duration": [0.1]}
    old = _Stats(data=without_key)  # e.g. from a process without the plugin
    old.aggregate(_Stats(data=got))
    assert old.data[kt.REQUEST_TRANSFERS] == got[kt.REQUEST_TRANSFERS]


def test_failed_kv_loads_are_listed_by_request_and_keep_the_step():
    worker = _Worker(_Agent({}, {}))
    assert worker.get_transfer_results().failed_recving == set()
    assert worker.xfer_stats.data[kt.REQUEST_FAILURES] == []
    assert worker.xfer_stats.is_empty()

    worker.failed_recving = {"cmpl-b-5e6f7a8b", "cmpl-a-1a2b3c4d"}
    results = worker.get_transfer_results()
    assert results.failed_recving == {"cmpl-a-1a2b3c4d", "cmpl-b-5e6f7a8b"}  # unchanged
    data = worker.xfer_stats.data
    assert data[kt.REQUEST_FAILURES] == ["cmpl-a-1a2b3c4d", "cmpl-b-5e6f7a8b"]
    assert data["num_failed_transfers"] == []  # vLLM's own counters: as without the patch
    # vLLM counted the handshake failure in an earlier step: this one is not empty all the same
    assert not worker.xfer_stats.is_empty()
    step = worker.xfer_stats.clone_and_reset()
    assert step.data[kt.REQUEST_FAILURES] == data[kt.REQUEST_FAILURES]
    assert worker.xfer_stats.data[kt.REQUEST_FAILURES] == []

    acc = _Stats(data={k: [] for k in STOCK_KEYS})  # built without the keys
    acc.aggregate(step)
    assert acc.data[kt.REQUEST_FAILURES] == ["cmpl-a-1a2b3c4d", "cmpl-b-5e6f7a8b"]


def test_failures_cross_to_the_front_end():
    from vllm.v1.engine import EngineCoreOutputs
    from vllm.v1.metrics.stats import SchedulerStats
    from vllm.v1.serial_utils import MsgpackDecoder, MsgpackEncoder

    worker = _Worker(_Agent({}, {}))
    worker.failed_recving = {"cmpl-x-abcdefgh"}
    worker.get_transfer_results()
    sent = EngineCoreOutputs(scheduler_stats=SchedulerStats(
        kv_connector_stats=worker.xfer_stats.clone_and_reset().to_dict()))
    frames = MsgpackEncoder().encode(sent)
    got = MsgpackDecoder(EngineCoreOutputs).decode(frames).scheduler_stats.kv_connector_stats
    assert got[kt.REQUEST_FAILURES] == ["cmpl-x-abcdefgh"]


def test_install_patches_vllm_and_degrades_to_a_no_op(monkeypatch, caplog):
    from splitserve.engine import vllm_plugin

    vllm_plugin.register()  # what vLLM runs in each of its processes
    assert kt.install() is True
    assert base_worker.NixlBaseConnectorWorker._pop_done_transfers.splitserve_patched
    assert base_worker.NixlBaseConnectorWorker.get_transfer_results.splitserve_patched
    assert NixlKVConnectorStats.reset.splitserve_patched
    assert NixlKVConnectorStats.is_empty.splitserve_patched
    monkeypatch.setitem(sys.modules, "vllm.distributed.kv_transfer.kv_connector.v1.nixl.stats",
                        None)
    with caplog.at_level("INFO", logger="splitserve.engine"):
        assert kt.install() is False
    assert "telemetry unavailable" in caplog.text
    with pytest.raises(AttributeError):
        kt.patch(object, _Stats)  # internals not as expected: nothing is patched


@pytest.mark.parametrize(("engine_id", "external"), [
    ("cmpl-abc-1a2b3c4d", "cmpl-abc"), ("cmpl-abc-prefill-0a0b0c0d", "cmpl-abc-prefill"),
    ("x-12345678", "x"), ("no-suffix", "no-suffix"), ("-12345678", "-12345678"),
])
def test_external_request_id_strips_vllms_suffix(engine_id, external):
    assert kt.external_request_id(engine_id) == external


def _step(*entries) -> dict:
    return {"transfer_duration": [e[1] for e in entries],
            "bytes_transferred": [e[2] for e in entries],
            kt.REQUEST_TRANSFERS: [list(e) for e in entries]}


def test_latest_stats_collects_each_requests_transfers_once():
    stats = LatestStats()
    stats.add_connector_stats(_step(("cmpl-a-1a2b3c4d", 0.002, 4096),
                                    ("cmpl-a-1a2b3c4d", 0.003, 8192)))
    stats.add_connector_stats(_step(("cmpl-b-5e6f7a8b", 0.001, 512)))
    a = stats.pop_request_transfer("cmpl-a")
    assert (a.seconds, a.bytes, a.transfers) == (0.003, 12288, 2)  # concurrent: the longest
    assert stats.pop_request_transfer("cmpl-a") is None
    assert stats.pop_request_transfer("cmpl-b").bytes == 512
    snap = stats.snapshot(role="decode", replica="r", num_unfinished=0)
    assert (snap.kv_transfers, snap.kv_bytes_received) == (3, 4096 + 8192 + 512)


def test_latest_stats_keeps_a_bounded_number_of_uncollected_requests():
    stats = LatestStats()
    for i in range(MAX_REQUEST_TRANSFERS + 5):
        stats.add_connector_stats(_step((f"r{i}-00000000", 0.001, 1)))
    assert len(stats.requests) == MAX_REQUEST_TRANSFERS
    assert stats.pop_request_transfer("r0") is None  # the oldest went first
    assert stats.pop_request_transfer(f"r{MAX_REQUEST_TRANSFERS + 4}") is not None


def test_latest_stats_marks_a_request_whose_kv_load_failed():
    stats = LatestStats()
    stats.add_connector_stats({"num_failed_handshakes": [1]})
    stats.add_connector_stats({kt.REQUEST_FAILURES: ["cmpl-a-1a2b3c4d"]})
    stats.add_connector_stats(_step(("cmpl-b-5e6f7a8b", 0.001, 512)))
    a = stats.pop_request_transfer("cmpl-a")
    assert (a.failed, a.transfers, a.bytes) == (True, 0, 0)  # nothing pulled: recomputed
    assert stats.pop_request_transfer("cmpl-b").failed is False
    assert stats.snapshot(role="decode", replica="r", num_unfinished=0).kv_transfer_failures == 1


@pytest.mark.parametrize(("expired", "load_failed", "reason"), [
    (False, False, None), (False, True, KV_TRANSFER_ERROR), (True, False, KV_EXPIRED),
    (True, True, KV_EXPIRED),  # an expired handoff is never pulled: its expiry is the cause
])
def test_kv_recompute_reason(expired, load_failed, reason):
    assert kv_recompute_reason(expired=expired, load_failed=load_failed) == reason
