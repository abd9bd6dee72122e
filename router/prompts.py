"""The model's tokenizer in the router: its own count of each prompt's tokens.

The engines' vLLM servers tokenize every request themselves; the router needs a count before
dispatch, for its decisions alone (disaggregation, prefix-aware routing, quotas):
`router/forward.py` `estimate_prompt`.
"""

from __future__ import annotations


class PromptBuilder:
    """Wraps the model's Hugging Face tokenizer (loaded once per router replica)."""

    def __init__(self, model_path: str, max_model_len: int, revision: str | None = None) -> None:
        from transformers import AutoTokenizer

        # the engines' revision of a hub model (splitserve.models.resolve_model)
        self.tokenizer = AutoTokenizer.from_pretrained(model_path, revision=revision)
        self.max_model_len = max_model_len

    @property
    def renders_tools(self) -> bool:
        """Whether the chat template renders `tools` itself."""
        template = self.tokenizer.chat_template
        return isinstance(template, str) and "tools" in template
