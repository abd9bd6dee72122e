"""`n` choices: one worker request per choice, their chunk streams merged into one.

Each choice is a request of its own through the dispatcher (its own prefill decision, KV handoff
and decode stream), so `n` works the same in colocated and disaggregated mode. With a `seed`,
choice i samples with `seed + i`, as vLLM seeds the choices of one request, so that a seeded
request returns the same choices in both modes.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import AsyncIterator, Sequence

from splitserve.engine.messages import GenerateChunk, GenerateRequest


def choice_requests(req: GenerateRequest, n: int) -> list[GenerateRequest]:
    """The worker requests of a request's `n` choices (just `req` for one)."""
    if n == 1:
        return [req]
    out = []
    for i in range(n):
        seed = req.sampling.seed
        sampling = dataclasses.replace(
            req.sampling, seed=None if seed is None else _wrap_seed(seed + i)
        )
        out.append(dataclasses.replace(req, request_id=f"{req.request_id}-{i}", sampling=sampling))
    return out


def _wrap_seed(seed: int) -> int:
    """Keep a seed a signed 64-bit integer (what the engine's generator takes)."""
    return (seed + 2**63) % 2**64 - 2**63


async def merge_choices(
    streams: Sequence[AsyncIterator[GenerateChunk]],
) -> AsyncIterator[GenerateChunk]:
    """Chunks of all choices as they come, each tagged with its choice's `index`.

    A failing choice fails the whole request; closing the iterator (or a failure) cancels and
    closes every choice's stream, so no worker request outlives the client's.
    """
    if len(streams) == 1:
        async for chunk in streams[0]:
            yield chunk
        return
    queue: asyncio.Queue[tuple[int, GenerateChunk | None, BaseException | None]] = (
        asyncio.Queue()
    )

    async def pump(index: int, stream: AsyncIterator[GenerateChunk]) -> None:
        try:
            async for chunk in stream:
                await queue.put((index, dataclasses.replace(chunk, index=index), None))
            await queue.put((index, None, None))
        except Exception as err:  # noqa: BLE001 - handed to the consumer, which re-raises it
            await queue.put((index, None, err))

    tasks = [asyncio.ensure_future(pump(i, s)) for i, s in enumerate(streams)]
    try:
        running = len(tasks)
        while running:
            _, chunk, err = await queue.get()
            if err is not None:
                raise err
            if chunk is None:
                running -= 1
                continue
            yield chunk
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for stream in streams:
            with contextlib.suppress(Exception):
                await stream.aclose()  # type: ignore[attr-defined]
