"""splitserve.router.prompts: tokenization and the context-window check, over the tiny model."""

from __future__ import annotations

from pathlib import Path

import pytest

from splitserve.router.errors import APIError
from splitserve.router.prompts import PreparedPrompt, PromptBuilder


@pytest.fixture(scope="module")
def builder(tiny_model_dir: Path) -> PromptBuilder:
    return PromptBuilder(str(tiny_model_dir), max_model_len=32)


def test_fit_requested(builder: PromptBuilder) -> None:
    assert builder.fit([0, 5, 6], 10, param="max_tokens") == PreparedPrompt((0, 5, 6), 10)


def test_fit_none_takes_all_room(builder: PromptBuilder) -> None:
    assert builder.fit([0] * 12, None, param="max_tokens").max_tokens == 20


def test_fit_exact_fill(builder: PromptBuilder) -> None:
    assert builder.fit([0] * 30, 2, param="max_tokens").max_tokens == 2


def test_context_length_exceeded(builder: PromptBuilder) -> None:
    with pytest.raises(APIError) as exc:
        builder.fit([0] * 30, 3, param="max_completion_tokens")
    e = exc.value
    assert e.status == 400
    assert e.code == "context_length_exceeded"
    assert e.param == "max_completion_tokens"
    assert "maximum context length is 32 tokens" in e.message
    assert "you requested 33 tokens (30 in the prompt, 3 for the completion)" in e.message


def test_prompt_filling_window_with_none_requested(builder: PromptBuilder) -> None:
    with pytest.raises(APIError) as exc:
        builder.fit([0] * 32, None, param="messages")
    assert exc.value.code == "context_length_exceeded"
    assert exc.value.param == "messages"
    assert "you requested 33 tokens (32 in the prompt, 1 for the completion)" in exc.value.message


def test_empty_prompt_rejected(builder: PromptBuilder) -> None:
    with pytest.raises(APIError) as exc:
        builder.fit([], 4, param="max_tokens")
    assert exc.value.status == 400
    assert exc.value.param == "prompt"
    assert exc.value.message == "The prompt is empty."


def test_encode_completion_string(builder: PromptBuilder) -> None:
    ids = builder.encode_completion("hello world")
    assert ids[0] == builder.tokenizer.bos_token_id == 0
    assert ids == list(builder.tokenizer("hello world")["input_ids"])
    assert builder.encode_completion(["hello world"]) == ids


def test_encode_completion_token_ids(builder: PromptBuilder) -> None:
    assert builder.encode_completion([5, 6, 511]) == [5, 6, 511]
    assert builder.encode_completion([[5, 6]]) == [5, 6]


@pytest.mark.parametrize("bad", [512, -1])
def test_encode_completion_out_of_vocab(builder: PromptBuilder, bad: int) -> None:
    with pytest.raises(APIError) as exc:
        builder.encode_completion([1, bad])
    assert exc.value.status == 400
    assert exc.value.param == "prompt"
    assert exc.value.message == f"Token id {bad} is out of vocabulary."


@pytest.mark.parametrize("prompts", [["a", "b"], [[1, 2], [3, 4]]])
def test_encode_completion_batched_unsupported(builder: PromptBuilder, prompts) -> None:
    with pytest.raises(APIError) as exc:
        builder.encode_completion(prompts)
    assert exc.value.status == 400
    assert exc.value.code == "unsupported_parameter"
    assert exc.value.param == "prompt"


def test_encode_chat(builder: PromptBuilder) -> None:
    msgs = [{"role": "user", "content": "hi"}]
    ids = builder.encode_chat(msgs)
    tok = builder.tokenizer
    assert ids[0] == tok.bos_token_id
    assert ids.count(tok.bos_token_id) == 1  # template's BOS only, no second one added
    assert tok.decode(ids) == "<s><|user|>\nhi<|end|>\n<|assistant|>\n"
