"""The vLLM general plugin: registered as an entry point, and it turns NIXL's zero
progress-thread delay into `PROGRESS_DELAY_US` on the real NIXL bindings."""

from __future__ import annotations

import os
import sys
from importlib.metadata import entry_points

import pytest
from splitserve.engine import vllm_plugin


def test_registered_as_a_vllm_general_plugin() -> None:
    eps = {e.name: e.value for e in entry_points(group="vllm.general_plugins")}
    assert eps.get("splitserve") == "splitserve.engine.vllm_plugin:register"


def test_zero_progress_delay_is_replaced_and_everything_else_passes_through() -> None:
    mod = vllm_plugin.nixl_api_module()
    if mod is None:
        pytest.skip("NIXL is not installed")
    assert vllm_plugin.patch_nixl_progress_delay() is True
    assert vllm_plugin.patch_nixl_progress_delay() is True  # idempotent: no double wrapping
    assert not isinstance(mod.nixlBind._real, vllm_plugin._BindingsWithDelay)
    cfg = mod.nixlBind.nixlAgentConfig()
    cfg.pthrDelay = 0  # what nixl_agent.__init__ does
    cfg.lthrDelay = 100_000
    assert cfg.real.pthrDelay == vllm_plugin.PROGRESS_DELAY_US
    assert cfg.real.lthrDelay == 100_000
    cfg.pthrDelay = 7  # a deliberate non-zero delay is kept
    assert cfg.real.pthrDelay == 7
    assert mod.nixlBind.DRAM_SEG is mod.nixlBind._real.DRAM_SEG


def test_an_agent_starts_with_the_patch() -> None:
    mod = vllm_plugin.nixl_api_module()
    if mod is None:
        pytest.skip("NIXL is not installed")
    vllm_plugin.register()
    agent = mod.nixl_agent("splitserve-plugin-test", mod.nixl_agent_config(num_threads=1))
    assert "UCX" in agent.backends


def _fake_runner_module():
    """A stand-in for vLLM's CPU model runner: sampling draws from each request's generator;
    bookkeeping rewinds the discarded ones by offset, as vLLM does (CUDA-only)."""
    from types import SimpleNamespace

    import numpy as np
    import torch

    class CPUModelRunner:
        def __init__(self, discard: list[bool]) -> None:
            gens = {i: torch.Generator().manual_seed(7) for i in range(len(discard))}
            self.input_batch = SimpleNamespace(num_reqs=len(discard), generators=gens)
            self.discard_request_mask = SimpleNamespace(np=np.array(discard))

        def _sample(self, n: int) -> list[float]:
            gens = self.input_batch.generators
            return [torch.rand(n, generator=gens[i]).sum().item() for i in sorted(gens)]

        def _bookkeeping_sync(self) -> None:
            for i in self.discard_request_mask.np.nonzero()[0]:
                gen = self.input_batch.generators.get(int(i))
                if gen is not None:
                    gen.set_offset(gen.get_offset() - 4)  # raises on the CPU

    return SimpleNamespace(CPUModelRunner=CPUModelRunner)


def test_cpu_offset_rewind_raises_without_the_patch() -> None:
    runner = _fake_runner_module().CPUModelRunner([True, False])
    runner._sample(3)
    with pytest.raises(RuntimeError, match="offset"):
        runner._bookkeeping_sync()


def test_discarded_samples_leave_the_generator_as_it_was() -> None:
    module = _fake_runner_module()
    vllm_plugin._patch_cpu_runner(module)
    runner = module.CPUModelRunner([True, False])
    first = runner._sample(3)
    runner._bookkeeping_sync()  # no offset rewind: nothing raises
    again = runner._sample(3)
    assert again[0] == first[0]  # discarded: the same draw comes again
    assert again[1] != first[1]  # kept: the generator moved on
    assert set(runner.input_batch.generators) == {0, 1}


def test_the_real_cpu_model_runner_is_patched_when_imported() -> None:
    vllm_plugin.patch_cpu_seeded_sampling()
    from vllm.v1.worker.cpu_model_runner import CPUModelRunner

    assert CPUModelRunner.splitserve_seed_patch


class _FakeRay:
    """Stands in for the `ray` module as seen from inside a Ray actor (a fake: no cluster)."""

    @staticmethod
    def is_initialized() -> bool:
        return True

    @staticmethod
    def get_runtime_context():
        class _Ctx:
            @staticmethod
            def get_actor_id() -> str:
                return "actor-1"
        return _Ctx()


def test_engine_core_forks_its_workers_when_the_host_asks(monkeypatch) -> None:
    monkeypatch.setenv(vllm_plugin.FORK_WORKERS_ENV, "1")
    monkeypatch.setenv("VLLM_WORKER_MULTIPROC_METHOD", "spawn")  # inherited from the replica
    assert vllm_plugin.fork_engine_workers()
    assert os.environ["VLLM_WORKER_MULTIPROC_METHOD"] == "fork"


def test_no_fork_without_the_flag_or_inside_a_ray_actor(monkeypatch) -> None:
    monkeypatch.setenv("VLLM_WORKER_MULTIPROC_METHOD", "spawn")
    monkeypatch.delenv(vllm_plugin.FORK_WORKERS_ENV, raising=False)
    assert not vllm_plugin.fork_engine_workers()
    monkeypatch.setenv(vllm_plugin.FORK_WORKERS_ENV, "1")
    monkeypatch.setitem(sys.modules, "ray", _FakeRay())  # the replica: vLLM must spawn there
    assert not vllm_plugin.fork_engine_workers()
    assert os.environ["VLLM_WORKER_MULTIPROC_METHOD"] == "spawn"


def test_mq_sleep_makes_readers_wait_on_their_socket(monkeypatch) -> None:
    import zmq
    from vllm.distributed.device_communicators import shm_broadcast

    cls = shm_broadcast.SpinCondition
    for name in ("__init__", "wait"):  # restored after the test: the patch is process-wide
        monkeypatch.setattr(cls, name, getattr(cls, name))
    monkeypatch.setattr(cls, "splitserve_mq_patch", False, raising=False)
    monkeypatch.setenv(vllm_plugin.MQ_WAIT_ENV, "2")
    assert vllm_plugin.patch_mq_sleep()
    reader = cls(is_reader=True, context=zmq.Context.instance(),
                 notify_address=f"ipc:///tmp/splitserve-mq-test-{os.getpid()}")
    assert reader.busy_loop_s == 0  # vLLM's default: 1 s of sched_yield after each message
    timeouts = []

    class _Poller:  # records the timeout the reader sleeps with (a fake: nothing to wait for)
        def poll(self, timeout):
            timeouts.append(timeout)
            return []

    reader.poller = _Poller()
    reader.wait(None)
    reader.wait(5000)  # vLLM's recheck interval: a missed notification would cost 5 s
    assert timeouts == [2, 2]


@pytest.mark.parametrize("value", [None, ""])
def test_mq_untouched_when_unset_or_empty(monkeypatch, value) -> None:
    if value is None:
        monkeypatch.delenv(vllm_plugin.MQ_WAIT_ENV, raising=False)
    else:
        monkeypatch.setenv(vllm_plugin.MQ_WAIT_ENV, value)
    assert not vllm_plugin.patch_mq_sleep()


@pytest.mark.parametrize(
    ("bind", "rank", "cores"),
    [("0|1", 0, {0}), ("0|1", 1, {1}), ("0-3|4-7", 1, {4, 5, 6, 7}), ("0,2-3", 0, {0, 2, 3}),
     ("auto", 0, None), ("nobind", 0, None), (None, 0, None), ("0", 1, None)],
)
def test_rank_cores_reads_the_bind_variable(bind, rank, cores) -> None:
    assert vllm_plugin.rank_cores(bind, rank) == cores


def _in_thread(fn):
    """`fn()`'s result, run in a fresh thread (affinity is per thread: the test's own thread
    keeps its cores)."""
    import threading

    out: list = []
    t = threading.Thread(target=lambda: out.append(fn()))
    t.start()
    t.join()
    return out[0]


two_cores = pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs 2 cores")


@two_cores
def test_the_nixl_connector_worker_keeps_the_threads_cores() -> None:
    """vLLM's connector worker moves the calling thread to the node's last core; patched, the
    thread keeps the cores it had (the real class is patched the same way when imported)."""
    first, last = min(os.sched_getaffinity(0)), max(os.sched_getaffinity(0))

    class NixlBaseConnectorWorker:
        def __init__(self) -> None:
            os.sched_setaffinity(0, {last})  # what vLLM does on the CPU

    module = type(sys)("fake_nixl_worker")
    module.NixlBaseConnectorWorker = NixlBaseConnectorWorker

    def build() -> tuple[set[int], set[int]]:
        os.sched_setaffinity(0, {first})
        NixlBaseConnectorWorker()
        unpatched = os.sched_getaffinity(0)
        os.sched_setaffinity(0, {first})
        vllm_plugin._keep_affinity(module)
        vllm_plugin._keep_affinity(module)  # idempotent
        NixlBaseConnectorWorker()
        return unpatched, os.sched_getaffinity(0)

    assert _in_thread(build) == ({last}, {first})
    from vllm.distributed.kv_transfer.kv_connector.v1.nixl import base_worker

    vllm_plugin.patch_cpu_worker_affinity()
    assert base_worker.NixlBaseConnectorWorker.splitserve_affinity_patch


@two_cores
def test_a_cpu_worker_pins_its_compute_thread_to_its_ranks_cores(monkeypatch) -> None:
    """A worker forked from its EngineCore is not bound by OpenMP's variables; patched, its
    `init_device` pins the thread to its rank's group of VLLM_CPU_OMP_THREADS_BIND."""
    cores = sorted(os.sched_getaffinity(0))
    monkeypatch.setenv("VLLM_CPU_OMP_THREADS_BIND", f"{cores[0]}|{cores[1]}")

    class CPUWorker:
        def __init__(self, local_rank: int) -> None:
            self.local_rank = local_rank

        def init_device(self) -> str:
            return "ready"

    module = type(sys)("fake_cpu_worker")
    module.CPUWorker = CPUWorker
    vllm_plugin._pin_to_rank_cores(module)

    def start(rank: int):
        return CPUWorker(rank).init_device(), os.sched_getaffinity(0)

    assert _in_thread(lambda: start(1)) == ("ready", {cores[1]})
    assert _in_thread(lambda: start(0)) == ("ready", {cores[0]})
    monkeypatch.setenv("VLLM_CPU_OMP_THREADS_BIND", "auto")  # vLLM binds: left alone
    assert _in_thread(lambda: start(0)) == ("ready", set(cores))
