"""Prompt preparation: tokenize, apply the chat template, check the context window.

The router tokenizes (not the engine) so that it knows every request's token count before
dispatch: for context-length errors, for routing and quotas, and so that prefill and decode
workers receive identical token ids.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from splitserve.router.errors import APIError, bad_request


@dataclass(frozen=True)
class PreparedPrompt:
    """Token ids ready for a worker, and the output budget they leave."""

    token_ids: tuple[int, ...]
    max_tokens: int


class PromptBuilder:
    """Wraps the model's Hugging Face tokenizer (loaded once per router replica)."""

    def __init__(self, model_path: str, max_model_len: int) -> None:
        from transformers import AutoTokenizer

        self.tokenizer = AutoTokenizer.from_pretrained(model_path)
        self.max_model_len = max_model_len

    def encode_completion(self, prompt: Any) -> list[int]:
        """Token ids of a completions `prompt` (a string or a list of token ids)."""
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
            prompt = prompt[0]
        if isinstance(prompt, str):
            return list(self.tokenizer(prompt)["input_ids"])
        if isinstance(prompt, list) and all(isinstance(t, int) for t in prompt):
            vocab = len(self.tokenizer)
            bad = [t for t in prompt if not 0 <= t < vocab]
            if bad:
                raise bad_request(f"Token id {bad[0]} is out of vocabulary.", param="prompt")
            return list(prompt)
        raise bad_request(
            "Batched prompts (a list of several prompts) are not supported; send one per request.",
            param="prompt",
            code="unsupported_parameter",
        )

    @property
    def vocab_size(self) -> int:
        """Token ids are `0 .. vocab_size - 1`."""
        return len(self.tokenizer)

    @property
    def renders_tools(self) -> bool:
        """Whether the chat template renders `tools` itself (else the router describes them)."""
        template = self.tokenizer.chat_template
        return isinstance(template, str) and "tools" in template

    def encode_chat(
        self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None
    ) -> list[int]:
        """Token ids of a chat conversation with the generation prompt appended; `tools`
        (OpenAI `tools` entries) are passed to a template that `renders_tools`."""
        if self.tokenizer.chat_template is None:
            raise bad_request("This model has no chat template; use /v1/completions.")
        ids = self.tokenizer.apply_chat_template(
            messages, tools=tools, add_generation_prompt=True, tokenize=True, return_dict=False
        )
        return list(ids)

    def fit(self, token_ids: list[int], requested: int | None, *, param: str) -> PreparedPrompt:
        """Check `token_ids` + `requested` output tokens against the context window.

        `requested=None` means "as many as fit". Raises a 400 `context_length_exceeded`.
        """
        n = len(token_ids)
        if n == 0:
            raise bad_request("The prompt is empty.", param="prompt")
        room = self.max_model_len - n
        if room < 1 or (requested is not None and requested > room):
            asked = n + (requested if requested is not None else 1)
            raise APIError(
                400,
                f"This model's maximum context length is {self.max_model_len} tokens. However, "
                f"you requested {asked} tokens ({n} in the prompt, "
                f"{requested if requested is not None else 1} for the completion). Please reduce "
                f"the length of the prompt or the completion.",
                param=param,
                code="context_length_exceeded",
            )
        return PreparedPrompt(tuple(token_ids), requested if requested is not None else room)
