"""splitserve.router.choices: `n` choices as separate worker requests, merged by index."""

from __future__ import annotations

import asyncio

import pytest

from splitserve.engine.messages import GenerateChunk, GenerateRequest, Sampling
from splitserve.router.choices import choice_requests, merge_choices

REQ = GenerateRequest("r", (1, 2), Sampling(max_tokens=4, seed=10))


def test_one_choice_is_the_request_itself() -> None:
    assert choice_requests(REQ, 1) == [REQ]


def test_choices_get_own_ids_and_consecutive_seeds() -> None:
    reqs = choice_requests(REQ, 3)
    assert [r.request_id for r in reqs] == ["r-0", "r-1", "r-2"]
    assert [r.sampling.seed for r in reqs] == [10, 11, 12]
    assert all(r.prompt_token_ids == REQ.prompt_token_ids for r in reqs)


def test_unseeded_choices_stay_unseeded_and_seeds_wrap() -> None:
    unseeded = GenerateRequest("r", (1,), Sampling(max_tokens=1))
    assert {r.sampling.seed for r in choice_requests(unseeded, 2)} == {None}
    top = GenerateRequest("r", (1,), Sampling(max_tokens=1, seed=2**63 - 1))
    assert [r.sampling.seed for r in choice_requests(top, 2)] == [2**63 - 1, -(2**63)]


async def _gen(tokens, closed: list[int], index: int, fail: bool = False):
    try:
        for t in tokens:
            await asyncio.sleep(0)
            yield GenerateChunk((t,), str(t))
        if fail:
            raise RuntimeError("boom")
    finally:
        closed.append(index)


def test_merge_tags_indexes_and_keeps_each_choice_in_order() -> None:
    async def run():
        closed: list[int] = []
        streams = [_gen([1, 2, 3], closed, 0), _gen([4, 5], closed, 1)]
        return [c async for c in merge_choices(streams)], closed

    chunks, closed = asyncio.run(run())
    by_index = {i: [c.token_ids[0] for c in chunks if c.index == i] for i in (0, 1)}
    assert by_index == {0: [1, 2, 3], 1: [4, 5]}
    assert sorted(closed) == [0, 1]


def test_a_failing_choice_fails_the_request_and_closes_the_others() -> None:
    async def run():
        closed: list[int] = []
        streams = [_gen(range(1000), closed, 0), _gen([1], closed, 1, fail=True)]
        with pytest.raises(RuntimeError, match="boom"):
            async for _ in merge_choices(streams):
                pass
        return closed

    assert sorted(asyncio.run(run())) == [0, 1]


def test_closing_early_closes_every_choice() -> None:
    async def run():
        closed: list[int] = []
        merged = merge_choices([_gen(range(1000), closed, 0), _gen(range(1000), closed, 1)])
        await anext(merged)
        await merged.aclose()
        return closed

    assert sorted(asyncio.run(run())) == [0, 1]
