"""splitserve's vLLM general plugin: loaded by vLLM in every engine process it starts.

Registered as the `vllm.general_plugins` entry point `splitserve` (pyproject.toml), so vLLM
runs `register()` in the API process, the EngineCore and every worker process, before the
KV connector creates its NIXL agent.

What it does: NIXL's Python API creates each agent with a progress-thread delay of 0
(`nixl._api.nixl_agent.__init__` sets `pthrDelay = 0`). The UCX backend's shared progress thread
then polls with a zero timeout and spins: measured here, an idle agent holds 86 % of a core,
in every engine worker, on the core that the worker computes on. With a delay, the thread
waits in `epoll` (it still wakes on every socket event) and an idle agent uses 2 %. vLLM gives
no setting for it, so the plugin substitutes `PROGRESS_DELAY_US` for a zero delay.

Second: seeded sampling on the CPU (`seed` in a request). When a prompt's prefill is split over
engine steps (chunked prefill: several long prompts at once), the token sampled at the end of a
partial step is discarded, and vLLM rewinds the request's generator with
`Generator.set_offset`, which only CUDA's Philox generator has: on the CPU it raises
"CPU Generator does not use offset" and the engine dies, taking every request with it. The
plugin makes the CPU model runner save those generators' state before sampling and restore it
after (the same rewind), and hides them from the CUDA-only rewind (`patch_cpu_seeded_sampling`).

Third: it installs per-request KV-transfer telemetry (`kv_telemetry`): the connector's measured
duration and bytes of each transfer, tagged with the request they belong to.

Fourth: engine start-up (`fork_engine_workers`). A replica is a Ray actor, so vLLM must *spawn*
its EngineCore process, and it then also spawns the EngineCore's model-runner worker (the
`spawn` choice is inherited through the environment). Each spawned process imports vLLM and
torch again: about 25 s of CPU here, per process. The EngineCore is not a Ray actor, and
forking its workers is vLLM's own default outside Ray, so in the EngineCore of an engine whose
host asks for it (`FORK_WORKERS_ENV`), the plugin sets the method back to `fork`: the worker
starts with everything imported. vLLM's own checks still force `spawn` where fork is unsafe
(CUDA already initialised).

Fifth: each CPU engine computes on its own cores (`patch_cpu_worker_affinity`). A forked worker
misses vLLM's OpenMP binding, so it pins its compute thread to its rank's cores; and vLLM's NIXL
connector worker, on the CPU, moves that thread to the last core of the NUMA node, so that every
disaggregated engine of a node computed on one core (measured here: both engines on core 1,
BENCHMARKS.md). The connector now leaves the thread where it was.

Sixth, when `MQ_WAIT_ENV` is set (`patch_mq_sleep`; CPU engines get it from their pool's
`step_wait_ms`, on by default): vLLM's message-queue readers between the EngineCore and its
worker sleep on their socket instead of busy-waiting for 1 s after every message. On two shared
cores the two spinning processes of each engine took CPU from every engine's compute: colocated
engines decoded about a fifth faster without it (BENCHMARKS.md, session 10).

Seventh, on the CPU platform only (`patch_cpu_kv_offload`): vLLM's OffloadingConnector (the KV
tier, config `kv_tier`) copies blocks between the engine's KV and its offload pool with CUDA or
XPU streams and refuses other platforms; `host_offload.HostCopyHandler` does those copies in
host memory, where a CPU engine's KV already is (the why and the upstream fix: host_offload.py).
"""

from __future__ import annotations

import contextlib
import importlib.abc
import importlib.util
import logging
import os
import sys
from collections.abc import Callable, Iterator
from typing import Any

from splitserve.engine import host_offload, kv_telemetry

log = logging.getLogger("splitserve.engine")

# Microseconds NIXL's progress thread waits for events when idle. 100 us: idle CPU 2 % (vs 86 %
# at 0) and well under a decode step, so a transfer never waits noticeably for progress.
PROGRESS_DELAY_US = 100


class _AgentConfig:
    """A `nixlAgentConfig` whose zero progress-thread delay becomes `PROGRESS_DELAY_US`."""

    def __init__(self, real: Any) -> None:
        object.__setattr__(self, "real", real)

    def __setattr__(self, name: str, value: Any) -> None:
        if name == "pthrDelay" and value == 0:
            value = PROGRESS_DELAY_US
        setattr(self.real, name, value)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.real, name)


class _BindingsWithDelay:
    """Stands in for the `nixlBind` module inside `nixl._api`: everything passes through,
    except that agent configs are `_AgentConfig`s and agents get the real config."""

    splitserve_patched = True

    def __init__(self, real: Any) -> None:
        self._real = real

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)

    def nixlAgentConfig(self) -> _AgentConfig:
        """A fresh agent config, wrapped."""
        return _AgentConfig(self._real.nixlAgentConfig())

    def nixlAgent(self, name: str, config: Any) -> Any:
        """The real agent, from the real config."""
        real = config.real if isinstance(config, _AgentConfig) else config
        return self._real.nixlAgent(name, real)


def nixl_api_module() -> Any | None:
    """The module that defines `nixl_agent` (nixl re-exports it from a CUDA-flavoured
    package), or None when NIXL is not installed."""
    try:
        from nixl._api import nixl_agent
    except ImportError:
        return None
    return sys.modules[nixl_agent.__module__]


def patch_nixl_progress_delay() -> bool:
    """Install the delay substitution (idempotent); False when NIXL is absent."""
    mod = nixl_api_module()
    if mod is None or not hasattr(mod, "nixlBind"):
        return False
    if not getattr(mod.nixlBind, "splitserve_patched", False):
        mod.nixlBind = _BindingsWithDelay(mod.nixlBind)
        log.debug("NIXL progress-thread delay set to %d us", PROGRESS_DELAY_US)
    return True


CPU_MODEL_RUNNER = "vllm.v1.worker.cpu_model_runner"


@contextlib.contextmanager
def _discarded_generators(runner: Any, *, restore_state: bool) -> Iterator[None]:
    """Around sampling (`restore_state`): put back the state of the generators of requests whose
    sampled token this step discards. Around bookkeeping: hide them from the offset rewind."""
    n = runner.input_batch.num_reqs
    gens = runner.input_batch.generators
    discarded = [int(i) for i in runner.discard_request_mask.np[:n].nonzero()[0] if int(i) in gens]
    if restore_state:
        saved = {i: gens[i].get_state() for i in discarded}
        try:
            yield
        finally:
            for i, state in saved.items():
                gens[i].set_state(state)
        return
    hidden = {i: gens.pop(i) for i in discarded}
    try:
        yield
    finally:
        gens.update(hidden)


def _patch_cpu_runner(module: Any) -> None:
    cls = module.CPUModelRunner
    if getattr(cls, "splitserve_seed_patch", False):
        return
    sample, bookkeeping = cls._sample, cls._bookkeeping_sync

    def _sample(self: Any, *args: Any, **kwargs: Any) -> Any:
        with _discarded_generators(self, restore_state=True):
            return sample(self, *args, **kwargs)

    def _bookkeeping_sync(self: Any, *args: Any, **kwargs: Any) -> Any:
        with _discarded_generators(self, restore_state=False):
            return bookkeeping(self, *args, **kwargs)

    cls._sample, cls._bookkeeping_sync = _sample, _bookkeeping_sync
    cls.splitserve_seed_patch = True
    log.debug("CPU model runner: seeded generators rewound by state, not offset")


class _AfterImport(importlib.abc.MetaPathFinder):
    """Runs `fn(module)` right after `name` is first imported (importing it from the plugin
    itself could be circular: vLLM loads plugins while its model registry imports)."""

    def __init__(self, name: str, fn: Callable[[Any], None]) -> None:
        self.name, self.fn = name, fn

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if fullname != self.name:
            return None
        sys.meta_path.remove(self)
        try:
            spec = importlib.util.find_spec(fullname)
        finally:
            sys.meta_path.insert(0, self)
        if spec is None or spec.loader is None:
            return spec
        exec_module, fn = spec.loader.exec_module, self.fn

        def exec_then_patch(module: Any) -> None:
            exec_module(module)
            fn(module)

        spec.loader.exec_module = exec_then_patch  # type: ignore[method-assign]
        return spec


def patch_cpu_seeded_sampling() -> None:
    """Install the seeded-sampling fix on the CPU model runner (now or when it is imported)."""
    _when_imported(CPU_MODEL_RUNNER, _patch_cpu_runner)


def _when_imported(name: str, fn: Callable[[Any], None]) -> None:
    """`fn(module)` now if `name` is imported, else right after its import (once)."""
    module = sys.modules.get(name)
    if module is not None:
        fn(module)
    elif not any(isinstance(f, _AfterImport) and f.name == name for f in sys.meta_path):
        sys.meta_path.insert(0, _AfterImport(name, fn))


CPU_WORKER = "vllm.v1.worker.cpu_worker"
NIXL_WORKER = "vllm.distributed.kv_transfer.kv_connector.v1.nixl.base_worker"


def rank_cores(bind: str | None, local_rank: int) -> set[int] | None:
    """The cores of `local_rank` in a `VLLM_CPU_OMP_THREADS_BIND` value ("0-3|4-7": one group
    per rank, each "a,b-c"), or None when it names no explicit cores ("auto", "nobind",
    unset, or fewer groups than ranks)."""
    if not bind or bind in ("auto", "nobind"):
        return None
    groups = bind.split("|")
    if local_rank >= len(groups):
        return None
    cores: set[int] = set()
    for part in groups[local_rank].split(","):
        lo, _, hi = part.strip().partition("-")
        cores.update(range(int(lo), int(hi or lo) + 1))
    return cores


def _pin_to_rank_cores(module: Any) -> None:
    cls = module.CPUWorker
    if getattr(cls, "splitserve_pin_patch", False):
        return
    init_device = cls.init_device

    def pinned_init_device(self: Any, *args: Any, **kwargs: Any) -> Any:
        out = init_device(self, *args, **kwargs)
        cores = rank_cores(os.environ.get("VLLM_CPU_OMP_THREADS_BIND"), self.local_rank)
        if cores:
            try:
                os.sched_setaffinity(0, cores)
            except OSError as err:  # cores outside this container's set: leave it to the OS
                log.warning("engine worker rank %d: cannot pin to cores %s: %s",
                            self.local_rank, sorted(cores), err)
        return out

    cls.init_device, cls.splitserve_pin_patch = pinned_init_device, True


def _keep_affinity(module: Any) -> None:
    cls = module.NixlBaseConnectorWorker
    if getattr(cls, "splitserve_affinity_patch", False):
        return
    init = cls.__init__

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        before = os.sched_getaffinity(0)
        try:
            init(self, *args, **kwargs)
        finally:
            if os.sched_getaffinity(0) != before:
                os.sched_setaffinity(0, before)
                log.debug("NIXL connector: compute thread kept on cores %s", sorted(before))

    cls.__init__, cls.splitserve_affinity_patch = __init__, True


def patch_cpu_worker_affinity() -> None:
    """Keep each CPU engine worker's compute thread on its own cores (now or on import).

    vLLM binds a CPU worker's threads through OpenMP environment variables read when the
    OpenMP runtime loads, which a worker forked from its EngineCore (`fork_engine_workers`)
    loaded before they were set: the thread is then unbound. So the worker pins its thread to
    its rank's group of `VLLM_CPU_OMP_THREADS_BIND` once its device is set up. And vLLM's NIXL
    connector worker, on the CPU, moves the calling thread (the worker's one compute thread
    with one core per rank) to the last core of its NUMA node, "reserved for KV transfer":
    every disaggregated engine on a node then computes on that same core. The connector keeps
    the thread's cores instead."""
    _when_imported(CPU_WORKER, _pin_to_rank_cores)
    _when_imported(NIXL_WORKER, _keep_affinity)


FORK_WORKERS_ENV = "SPLITSERVE_FORK_ENGINE_WORKERS"
MQ_WAIT_ENV = "SPLITSERVE_MQ_WAIT_MS"  # unset or empty: vLLM's busy-wait
SHM_BROADCAST = "vllm.distributed.device_communicators.shm_broadcast"


def _sleep_between_steps(module: Any, wait_ms: int) -> None:
    cls = module.SpinCondition
    if getattr(cls, "splitserve_mq_patch", False):
        return
    init, wait = cls.__init__, cls.wait

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        if self.is_reader:
            self.busy_loop_s = 0  # sleep on the socket at once instead of a sched_yield loop

    def wait_capped(self: Any, timeout_ms: int | None = None) -> None:
        # a notification missed (e.g. before the subscription took) costs wait_ms, not 5 s
        wait(self, wait_ms if timeout_ms is None else min(timeout_ms, wait_ms))

    cls.__init__, cls.wait, cls.splitserve_mq_patch = __init__, wait_capped, True


def patch_mq_sleep() -> bool:
    """With `MQ_WAIT_ENV` set to N: vLLM's message-queue readers (the EngineCore waiting for its
    worker, the worker for the next step) sleep on their socket at once, waking at least every
    N ms, instead of busy-waiting for 1 s after each message. (vLLM's busy window set to 0
    alone hangs a request whose wake-up was missed for vLLM's 5-s recheck; the cap bounds that
    to N ms.) False when unset or empty."""
    value = os.environ.get(MQ_WAIT_ENV)
    if not value:
        return False
    wait_ms = max(1, int(value))
    _when_imported(SHM_BROADCAST, lambda m: _sleep_between_steps(m, wait_ms))
    return True


OFFLOAD_SPEC = "vllm.v1.kv_offload.cpu.spec"
OFFLOAD_WORKER = "vllm.v1.kv_offload.cpu.gpu_worker"


def patch_cpu_kv_offload() -> None:
    """On the CPU platform, vLLM's KV offloading workers copy in host memory (now or when its
    modules are imported; the hooks check the platform): `host_offload`."""
    _when_imported(OFFLOAD_SPEC, host_offload.patch_spec)
    _when_imported(OFFLOAD_WORKER, host_offload.patch_handler)


def _in_ray_actor() -> bool:
    ray = sys.modules.get("ray")  # never imported here just to answer "no"
    if ray is None or not ray.is_initialized():
        return False
    return ray.get_runtime_context().get_actor_id() is not None


def fork_engine_workers() -> bool:
    """Outside Ray actors, when `FORK_WORKERS_ENV` is "1": have vLLM fork (not spawn) the worker
    processes this process starts. True when it did (in the EngineCore and its workers)."""
    if os.environ.get(FORK_WORKERS_ENV) != "1" or _in_ray_actor():
        return False
    os.environ["VLLM_WORKER_MULTIPROC_METHOD"] = "fork"
    return True


def register() -> None:
    """vLLM general-plugin entry point: runs in every vLLM process, possibly several times."""
    fork_engine_workers()
    patch_mq_sleep()
    patch_nixl_progress_delay()
    patch_cpu_seeded_sampling()
    patch_cpu_worker_affinity()
    patch_cpu_kv_offload()
    kv_telemetry.install()
