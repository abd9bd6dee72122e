"""splitserve.router.prompts and forward.estimate_prompt over the tiny model's real tokenizer:
the router's count is the engines' count for the requests it sees most."""

from __future__ import annotations

from pathlib import Path

import pytest

from splitserve.router.forward import Forwarded, estimate_prompt
from splitserve.router.prompts import PromptBuilder


@pytest.fixture(scope="module")
def builder(tiny_model_dir: Path) -> PromptBuilder:
    return PromptBuilder(str(tiny_model_dir), max_model_len=32)


def test_a_completion_prompt_counts_as_the_tokenizer_encodes_it(builder: PromptBuilder) -> None:
    ids = estimate_prompt(Forwarded("completions", {"prompt": "hello world"}), builder)
    assert ids == tuple(builder.tokenizer("hello world")["input_ids"])
    assert ids[0] == builder.tokenizer.bos_token_id == 0


def test_a_chat_counts_through_the_chat_template(builder: PromptBuilder) -> None:
    messages = [{"role": "user", "content": "hello world"}]
    ids = estimate_prompt(Forwarded("chat", {"messages": messages}), builder)
    assert ids == tuple(builder.tokenizer.apply_chat_template(
        messages, add_generation_prompt=True, tokenize=True, return_dict=False))
    assert builder.max_model_len == 32
