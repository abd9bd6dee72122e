"""vLLM's KV offloading on the CPU platform: the OffloadingConnector's copies between the
engine's KV cache and the offload pool when both are in host memory.

vLLM 0.32's OffloadingConnector (`kv_connector: OffloadingConnector`) keeps a second KV tier:
its scheduler side (`CPUOffloadingManager`, or `TieringOffloadingManager` with secondary tiers
such as the file-system tier) decides which blocks to store, looks up evicted prefixes and
schedules loads; its worker side copies blocks. Only the copies are device-specific, and vLLM
has them for CUDA and XPU only:

- `CPUOffloadingSpec.get_worker` (v1/kv_offload/cpu/spec.py) raises "CPU Offloading is
  currently only supported on CUDA-alike and XPU GPUs" on any other platform;
- `SingleDirectionOffloadingHandler` (v1/kv_offload/cpu/gpu_worker.py) asserts device
  tensors, and copies with `ops.swap_blocks_batch` on a device stream timed by device events:
  the CPU build has no such op and "cpu backend doesn't support events".

On the CPU platform the engine's KV is itself in host memory, so a copy is a plain indexed
tensor assignment, synchronous and complete when `transfer_async` returns. `HostCopyHandler`
is that handler, with the same interface and the same block arithmetic (an offloaded chunk is
`blocks_per_chunk` engine blocks; the first chunk of a group may be entered part-way,
`GPULoadStoreSpec.block_indices`). `patch_spec` and `patch_handler` install it on the CPU
platform only (vllm_plugin.patch_cpu_kv_offload); on CUDA and XPU vLLM's code runs unchanged.
The manager, the connector, its metrics and the secondary tiers are vLLM's own.

Not supported on the CPU: `canonical_layout` (it needs the shared region's canonical views,
a multi-rank layout). Upstream, this belongs in `CPUOffloadingSpec.get_worker` as the CPU
platform's branch.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

log = logging.getLogger("splitserve.engine")


def sub_block_rows(
    chunk_ids: np.ndarray, blocks_per_chunk: int, skip: int, count: int
) -> tuple[np.ndarray, np.ndarray]:
    """(chunk, block within chunk) of `count` consecutive engine-sized blocks that start
    `skip` blocks into the first of `chunk_ids` (vLLM's `compute_sub_block_ptrs` order).

    >>> [a.tolist() for a in sub_block_rows(np.array([5, 2]), 2, 1, 3)]
    [[5, 2, 2], [1, 0, 1]]
    """
    chunks = np.repeat(chunk_ids.astype(np.int64), blocks_per_chunk)[skip : skip + count]
    subs = np.tile(np.arange(blocks_per_chunk), len(chunk_ids))[skip : skip + count]
    if len(chunks) != count:
        raise ValueError(f"{len(chunk_ids)} chunks of {blocks_per_chunk} hold no {count} "
                         f"blocks after skipping {skip}")
    return chunks, subs


class HostCopyHandler:
    """One direction of the OffloadingConnector's copies (engine KV -> pool: a store, or pool
    -> engine KV: a load) on the CPU platform; the drop-in for vLLM's
    `SingleDirectionOffloadingHandler` (same constructor, `transfer_async`, `get_finished`,
    `wait`, `shutdown`).

    Every transfer is done when `transfer_async` returns (in submission order, so stores and
    loads keep vLLM's ordering); `get_finished` reports each one once, with its bytes and
    measured duration (vLLM's offload metrics read them).
    """

    replaces: type | None = None  # vLLM's handler, once `patch_handler` put this one instead

    def __init__(
        self,
        gpu_tensors: list[torch.Tensor],
        cpu_tensors: list[torch.Tensor],
        blocks_per_chunk: int,
        layer_refs_per_group: list[list[Any]],
        gpu_to_cpu: bool,
        canonical_layout: bool = False,
        host_memory_is_pinned: bool = True,
    ) -> None:
        if canonical_layout:
            raise NotImplementedError("canonical_layout KV offloading needs a GPU or XPU")
        if len(gpu_tensors) != len(cpu_tensors) or not gpu_tensors:
            raise ValueError("one pool tensor per engine KV tensor expected")
        # both sides as (blocks or chunks, blocks per chunk, engine page bytes), int8 views
        engine = [t.unsqueeze(1) for t in gpu_tensors]
        pool = [t.unflatten(1, (blocks_per_chunk, t.shape[1] // blocks_per_chunk))
                for t in cpu_tensors]
        for e, p in zip(engine, pool):
            if e.dtype != torch.int8 or p.dtype != torch.int8 or e.shape[2] != p.shape[2]:
                raise ValueError(f"engine page {tuple(e.shape)} and pool {tuple(p.shape)} "
                                 "disagree")
        self.gpu_to_cpu = gpu_to_cpu
        self.src, self.dst = (engine, pool) if gpu_to_cpu else (pool, engine)
        self.src_per_chunk = 1 if gpu_to_cpu else blocks_per_chunk
        self.dst_per_chunk = blocks_per_chunk if gpu_to_cpu else 1
        self.refs = layer_refs_per_group
        self._done: list[Any] = []  # TransferResult of transfers not reported yet

    def transfer_async(self, job_id: int, src_spec: Any, dst_spec: Any) -> bool:
        """Copy the blocks of `src_spec` to those of `dst_spec` now; always True."""
        from vllm.v1.kv_offload.base import TransferResult

        start = time.perf_counter()
        engine_spec = src_spec if self.gpu_to_cpu else dst_spec
        src_ids, dst_ids = np.asarray(src_spec.block_ids), np.asarray(dst_spec.block_ids)
        src_at = dst_at = 0
        nbytes = 0
        for refs, size, first in zip(self.refs, engine_spec.group_sizes,
                                     engine_spec.block_indices, strict=True):
            if size == 0:
                continue
            src_at, src_rows = _take(src_ids, src_at, self.src_per_chunk, first, size)
            dst_at, dst_rows = _take(dst_ids, dst_at, self.dst_per_chunk, first, size)
            nbytes += self._copy(refs, src_rows, dst_rows)
        if src_at != len(src_ids) or dst_at != len(dst_ids):
            raise ValueError(f"transfer {job_id}: {len(src_ids) - src_at} source and "
                             f"{len(dst_ids) - dst_at} destination blocks left over")
        self._done.append(TransferResult(job_id=job_id, success=True, transfer_size=nbytes,
                                         transfer_time=time.perf_counter() - start))
        return True

    def _copy(self, refs: Sequence[Any], src_rows: tuple[np.ndarray, np.ndarray],
              dst_rows: tuple[np.ndarray, np.ndarray]) -> int:
        """Copy each layer's page bytes of the rows; the bytes copied."""
        s_chunk, s_sub = (torch.from_numpy(a) for a in src_rows)
        d_chunk, d_sub = (torch.from_numpy(a) for a in dst_rows)
        nbytes = 0
        for ref in refs:
            page = ref.page_size_bytes
            self.dst[ref.tensor_idx][d_chunk, d_sub, :page] = (
                self.src[ref.tensor_idx][s_chunk, s_sub, :page])
            nbytes += len(s_chunk) * page
        return nbytes

    def get_finished(self) -> list[Any]:
        """The transfers done since the last call (all submitted ones)."""
        done, self._done = self._done, []
        return done

    def wait(self, job_ids: set[int]) -> None:
        """Nothing to wait for: every transfer finished when it was submitted."""

    def shutdown(self) -> None:
        """Drop the tensor views (vLLM's handler does the same)."""
        self._done.clear()
        self.src.clear()
        self.dst.clear()


def _take(ids: np.ndarray, at: int, per_chunk: int, first_block: int, count: int
          ) -> tuple[int, tuple[np.ndarray, np.ndarray]]:
    """The rows of `count` blocks of one KV group from `ids[at:]` (chunks of `per_chunk`
    blocks; the group's first block is logical block `first_block` of the request), and where
    the next group's ids start."""
    skip = first_block % per_chunk
    n = -(-(skip + count) // per_chunk)
    return at + n, sub_block_rows(ids[at : at + n], per_chunk, skip, count)


def patch_spec(module: Any) -> None:
    """On the CPU platform, let `CPUOffloadingSpec.get_worker` (and the tiering spec, which
    inherits it) build its worker instead of refusing the platform."""
    from vllm.platforms import current_platform

    cls = module.CPUOffloadingSpec
    if not current_platform.is_cpu() or getattr(cls, "splitserve_cpu_patch", False):
        return
    get_worker = cls.get_worker

    def get_worker_on_cpu(self: Any, kv_caches: Any) -> Any:
        if self._worker is None:
            self._worker = self.create_worker(kv_caches)
        return self._worker

    get_worker_on_cpu.__wrapped__ = get_worker  # type: ignore[attr-defined]
    cls.get_worker, cls.splitserve_cpu_patch = get_worker_on_cpu, True
    log.debug("KV offloading: CPU-platform worker enabled")


def patch_handler(module: Any) -> None:
    """On the CPU platform, make `CPUOffloadingWorker` copy with `HostCopyHandler`."""
    from vllm.platforms import current_platform

    if not current_platform.is_cpu() or module.SingleDirectionOffloadingHandler is HostCopyHandler:
        return
    HostCopyHandler.replaces = module.SingleDirectionOffloadingHandler
    module.SingleDirectionOffloadingHandler = HostCopyHandler
