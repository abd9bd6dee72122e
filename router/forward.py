"""Client requests forwarded to the engines' own vLLM server: what the router reads and adds.

The router does not re-implement vLLM's request models: the body goes to the engine replica,
where vLLM's OpenAI server validates and runs it (`splitserve/engine/vllm_server.py`). The
router reads only what its own decisions need (the model, the output budget, the number of
choices, streaming, a token count of the prompt) and overwrites the fields that are its to set:
`model` (the served model or adapter the name resolved to), `request_id`, the tenant-scoped
`cache_salt`, and `kv_transfer_params` (only the router's handoff: a client's own would let it
read other requests' KV blocks). Pure functions: no Ray, no network.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from splitserve.router.errors import bad_request

from splitserve.engine.messages import GenerateRequest, HTTPCall

PATHS = {"chat": "/v1/chat/completions", "completions": "/v1/completions"}


@dataclass(frozen=True)
class Forwarded:
    """A generation request body as the router reads it."""

    endpoint: str  # "chat" or "completions"
    payload: dict[str, Any]

    @property
    def model(self) -> str | None:
        """The `model` the client named (None: absent or not a string; vLLM's server then
        uses its default model, as here the primary model)."""
        model = self.payload.get("model")
        return model if isinstance(model, str) else None

    @property
    def stream(self) -> bool:
        return self.payload.get("stream") is True

    @property
    def user(self) -> str | None:
        user = self.payload.get("user")
        return user if isinstance(user, str) else None

    @property
    def cache_salt(self) -> str | None:
        salt = self.payload.get("cache_salt")
        return salt if isinstance(salt, str) else None

    @property
    def max_tokens(self) -> int | None:
        """The output budget the client asked for (`max_completion_tokens` wins on chat, as in
        vLLM); None when absent or not a positive integer (vLLM's server judges the value)."""
        for key in ("max_completion_tokens", "max_tokens"):
            value = self.payload.get(key)
            if isinstance(value, int) and not isinstance(value, bool) and value > 0:
                return value
        return None

    @property
    def choices(self) -> int:
        """Output sequences one engine request samples: `n` (or `best_of`, or the beam width),
        and every prompt of a batched completions request."""
        counts = [1]
        for key in ("n", "best_of"):
            value = self.payload.get(key)
            if isinstance(value, int) and not isinstance(value, bool):
                counts.append(value)
        prompt = self.payload.get("prompt")
        if isinstance(prompt, list) and prompt and not isinstance(prompt[0], int):
            counts.append(len(prompt) * max(counts))
        return max(counts)

    @property
    def disaggregable(self) -> bool:
        """Whether the prompt may be prefilled on another engine than the one that decodes:
        one prompt (vLLM's server returns one handoff per request; several samples of it share
        one pull, `samples`), no beam search (its search re-submits growing prompts), and no
        prompt logprobs (computed by the engine that runs the prompt, and answered by the one
        that decodes)."""
        return (self.choices == samples(self.payload)
                and not self.payload.get("use_beam_search")
                and self.payload.get("prompt_logprobs") is None)

    def prompt_text(self) -> Any:
        """The prompt as sent (a completion's `prompt`, a chat's `messages`), for request logs."""
        return self.payload.get("messages" if self.endpoint == "chat" else "prompt")


def capped(fwd: Forwarded, max_tokens: int) -> Forwarded:
    """`fwd` with an output limit the client did not set (the tenant's quota ends it there)."""
    return Forwarded(fwd.endpoint, {**fwd.payload, "max_tokens": max_tokens})


def parse(endpoint: str, body: bytes) -> Forwarded:
    """The body of a generation request; 400 unless it is a JSON object (vLLM's server checks
    every field)."""
    try:
        payload = json.loads(body)
    except ValueError as err:
        raise bad_request(f"The request body is not valid JSON: {err}") from None
    if not isinstance(payload, dict):
        raise bad_request("The request body must be a JSON object.")
    return Forwarded(endpoint, payload)


def call(fwd: Forwarded, *, model: str, request_id: str, cache_salt: str | None,
         kv_transfer_params: dict[str, Any] | None = None) -> HTTPCall:
    """The call the engine replica's vLLM server gets, with the router's own fields set (the
    KV handoff only when the router made one: a client's own is dropped)."""
    payload = dict(fwd.payload)
    payload["model"] = model
    payload["request_id"] = request_id
    payload.pop("kv_transfer_params", None)
    if kv_transfer_params is not None:
        payload["kv_transfer_params"] = kv_transfer_params
    payload.pop("ec_transfer_params", None)
    if cache_salt is not None:
        payload["cache_salt"] = cache_salt
    else:
        payload.pop("cache_salt", None)
    return HTTPCall("POST", PATHS[fwd.endpoint], json=payload)


def engine_request(req: GenerateRequest) -> GenerateRequest:
    """`req` as sent to a pool: a forwarded call's body carries the request's id and KV
    handoff (`kv_transfer_params`, set by the dispatcher for a prefill or a remote decode)."""
    if req.http is None or req.http.json is None:
        return req
    from dataclasses import replace

    payload = dict(req.http.json)
    payload["request_id"] = req.request_id
    if req.kv_transfer_params is not None:
        payload["kv_transfer_params"] = req.kv_transfer_params
    else:
        payload.pop("kv_transfer_params", None)
    if req.kv_transfer_params is not None and req.kv_transfer_params.get("do_remote_decode"):
        payload = prefill_payload(payload)
    return replace(req, http=replace(req.http, json=payload))


def samples(payload: dict[str, Any] | None) -> int:
    """Output sequences sampled from one prompt (`n`, or `best_of` when larger)."""
    counts = [1]
    for key in ("n", "best_of"):
        value = (payload or {}).get(key)
        if isinstance(value, int) and not isinstance(value, bool):
            counts.append(value)
    return max(counts)


def prefill_payload(payload: dict[str, Any]) -> dict[str, Any]:
    """A remote prefill's body: the same prompt (everything that shapes it is kept: chat
    template arguments, tools, truncation, special tokens), one token, not streamed, one
    choice, no logprobs: its token is discarded, the decode engine samples every output token."""
    out = dict(payload)
    out.update(max_tokens=1, stream=False, n=1)
    if "max_completion_tokens" in out:
        out["max_completion_tokens"] = 1
    for key in ("stream_options", "logprobs", "top_logprobs", "min_tokens", "best_of", "echo"):
        out.pop(key, None)
    return out


def estimate_prompt(fwd: Forwarded, prompts: Any) -> tuple[int, ...]:
    """The router's own token ids of the prompt, for its decisions only (disaggregation, prefix
    routing, quotas, fault injection): the engine's vLLM server tokenizes the request itself.

    Chat messages go through the model's chat template with their text parts; anything the
    router cannot render counts by its text alone.
    """
    tok = prompts.tokenizer
    payload = fwd.payload
    if fwd.endpoint == "completions":
        prompt = payload.get("prompt")
        if isinstance(prompt, list) and prompt and isinstance(prompt[0], (str, list)):
            prompt = prompt[0]
        if isinstance(prompt, str):
            return tuple(tok(prompt)["input_ids"])
        if isinstance(prompt, list) and all(isinstance(t, int) for t in prompt):
            return tuple(prompt)
        return ()
    messages = payload.get("messages")
    if not isinstance(messages, list):
        return ()
    plain = [{"role": m.get("role", "user"), "content": _text(m.get("content"))}
             for m in messages if isinstance(m, dict)]
    try:
        kwargs = payload.get("chat_template_kwargs")
        ids = tok.apply_chat_template(
            plain, tools=payload.get("tools") if prompts.renders_tools else None,
            add_generation_prompt=payload.get("add_generation_prompt", True) is not False,
            tokenize=True, return_dict=False, **(kwargs if isinstance(kwargs, dict) else {}),
        )
        return tuple(ids)
    except Exception:  # noqa: BLE001 - an estimate; vLLM's server judges the request
        return tuple(tok(" ".join(m["content"] for m in plain))["input_ids"])


def _text(content: Any) -> str:
    """A message's text (a string, or the text parts of a list of content parts)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content
                       if isinstance(p, dict) and isinstance(p.get("text"), str))
    return ""
