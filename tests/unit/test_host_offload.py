"""vLLM's KV offloading on the CPU platform (engine/host_offload.py): the plugin's copy handler
inside vLLM's own `CPUOffloadingWorker`, the addresses it copies against vLLM's pointer
arithmetic, and pins on the upstream code it stands in for."""

from __future__ import annotations

import inspect

import numpy as np
import pytest
import torch
from vllm.v1.kv_offload.base import (
    CanonicalKVCacheRef,
    CanonicalKVCaches,
    CanonicalKVCacheTensor,
    GPULoadStoreSpec,
)
from vllm.v1.kv_offload.cpu import gpu_worker, spec
from vllm.v1.kv_offload.cpu.common import CPULoadStoreSpec

from splitserve.engine import host_offload, vllm_plugin

PAGE = 64  # bytes of one engine block of one layer


def _kv_caches(num_blocks: int, layers: int) -> CanonicalKVCaches:
    """Random int8 engine KV, one tensor per layer, one KV group."""
    gen = torch.Generator().manual_seed(3)
    tensors = [CanonicalKVCacheTensor(
        torch.randint(-128, 127, (num_blocks, PAGE), dtype=torch.int8, generator=gen), PAGE)
        for _ in range(layers)]
    return CanonicalKVCaches(tensors, [[CanonicalKVCacheRef(i, PAGE) for i in range(layers)]])


@pytest.fixture(autouse=True)
def _patched():
    vllm_plugin.patch_cpu_kv_offload()
    assert gpu_worker.SingleDirectionOffloadingHandler is host_offload.HostCopyHandler


def _finished(worker) -> dict[int, int]:
    return {r.job_id: r.transfer_size for r in worker.get_finished() if r.success}


@pytest.mark.parametrize("blocks_per_chunk, first_block", [(1, 0), (2, 0), (2, 1), (4, 3)])
def test_stored_blocks_load_back_into_other_blocks(blocks_per_chunk, first_block) -> None:
    caches = _kv_caches(num_blocks=12, layers=3)
    engine = [t.tensor for t in caches.tensors]
    worker = gpu_worker.CPUOffloadingWorker(caches, blocks_per_chunk, num_cpu_chunks=6)
    src_blocks, dst_blocks = [3, 1, 4, 9, 7], [0, 2, 5, 6, 11]
    n_chunks = -(-(first_block % blocks_per_chunk + len(src_blocks)) // blocks_per_chunk)
    chunks = [5, 0, 2, 1, 3][:n_chunks]
    before = [t[src_blocks].clone() for t in engine]

    assert worker.submit_store(1, GPULoadStoreSpec(src_blocks, [5], [first_block]),
                               CPULoadStoreSpec(chunks))
    assert worker.submit_load(2, CPULoadStoreSpec(chunks),
                              GPULoadStoreSpec(dst_blocks, [5], [first_block]))

    for t, b in zip(engine, before):
        assert torch.equal(t[dst_blocks], b)
    assert _finished(worker) == {1: 5 * 3 * PAGE, 2: 5 * 3 * PAGE}
    assert _finished(worker) == {}  # each reported once
    worker.wait({1, 2})  # nothing pending
    worker.shutdown()


def test_rows_are_the_bytes_vllm_addresses() -> None:
    """The (chunk, block) rows the handler copies are the addresses vLLM's CUDA handler
    computes with `compute_sub_block_ptrs`, for a chunked pool entered part-way."""
    pool = torch.zeros((6, 3 * PAGE), dtype=torch.int8)
    chunk_ids, skip, count = np.array([4, 1, 3]), 2, 6
    ptrs = np.empty(count, dtype=np.uint64)
    gpu_worker.compute_sub_block_ptrs(chunk_ids, 3, ptrs, pool, skip_count=skip)
    chunks, subs = host_offload.sub_block_rows(chunk_ids, 3, skip, count)
    rows = pool.unflatten(1, (3, PAGE))
    assert [rows[c, s].data_ptr() for c, s in zip(chunks, subs)] == ptrs.tolist()


def test_a_transfer_with_blocks_left_over_is_refused() -> None:
    worker = gpu_worker.CPUOffloadingWorker(_kv_caches(4, 1), 1, num_cpu_chunks=4)
    with pytest.raises(ValueError, match="left over"):
        worker.submit_store(1, GPULoadStoreSpec([0, 1], [2], [0]), CPULoadStoreSpec([0, 1, 2]))


def test_canonical_layout_is_refused_on_the_cpu() -> None:
    caches = _kv_caches(4, 1)
    t = caches.tensors[0].tensor
    with pytest.raises(NotImplementedError, match="canonical_layout"):
        host_offload.HostCopyHandler([t], [t.clone()], 1, caches.group_data_refs, True,
                                     canonical_layout=True)


def test_the_cpu_spec_builds_its_worker_on_the_cpu() -> None:
    """`get_worker` no longer refuses the CPU platform; it builds the worker once."""

    class Spec(spec.CPUOffloadingSpec):
        def __init__(self) -> None:  # no vLLM config: only the worker half is used
            self._worker = None

        def create_worker(self, kv_caches):
            return gpu_worker.CPUOffloadingWorker(kv_caches, 1, num_cpu_chunks=2)

    s = Spec()
    w = s.get_worker(_kv_caches(4, 1))
    assert isinstance(w, gpu_worker.CPUOffloadingWorker)
    assert s.get_worker(_kv_caches(4, 1)) is w


# Pins on vLLM 0.32.0: when one fails, vLLM changed what the patch stands in for; check
# whether vLLM now copies on the CPU itself (then drop the patch) or adapt it.

def test_pin_vllm_refuses_cpu_offloading_workers() -> None:
    original = spec.CPUOffloadingSpec.get_worker.__wrapped__
    assert "currently only supported on CUDA-alike" in inspect.getsource(original)


def test_pin_the_worker_builds_its_handlers_by_module_name() -> None:
    src = inspect.getsource(gpu_worker.CPUOffloadingWorker.__init__)
    assert src.count("SingleDirectionOffloadingHandler(") == 2


def test_pin_the_handler_interface() -> None:
    """vLLM's handler (kept as `HostCopyHandler.replaces`) has the constructor and methods
    that `CPUOffloadingWorker` and the connector call on ours."""
    real, ours = host_offload.HostCopyHandler.replaces, host_offload.HostCopyHandler
    assert real.__name__ == "SingleDirectionOffloadingHandler"
    for name in ("__init__", "transfer_async", "get_finished", "wait", "shutdown"):
        assert list(inspect.signature(getattr(real, name)).parameters) == list(
            inspect.signature(getattr(ours, name)).parameters), name
