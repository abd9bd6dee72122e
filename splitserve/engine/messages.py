"""Typed messages between the router and the worker pools.

Plain frozen dataclasses (no vLLM types), so the router never imports the engine. They cross
process boundaries through Ray's serializer.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Sampling:
    """What the router plans for a request's output: its budget in tokens (the client's
    `max_tokens`, or what the context or the tenant's limits leave). The engine's vLLM server
    samples with the request's own parameters."""

    max_tokens: int


@dataclass(frozen=True)
class LoraRef:
    """The LoRA adapter a request runs with. Every engine the request visits (its prefill and
    its decode worker) gets the full reference, and loads the adapter from `path` if it has not
    yet: no worker can wait for an adapter it does not have. `lora_id` is unique per adapter
    within a deployment (vLLM's lora_int_id)."""

    name: str
    lora_id: int
    path: str


@dataclass(frozen=True)
class LoraOp:
    """Load or unload `ref` on one replica of a pool, other than `avoid_replicas` (the ones done
    already): the router repeats it to reach every replica (`router/lora_admin.py`)."""

    ref: LoraRef
    avoid_replicas: tuple[str, ...] = ()


@dataclass(frozen=True)
class HTTPCall:
    """A client request forwarded to the engine replica's vLLM server (`engine/vllm_server.py`):
    the router's additions (model, cache salt, request id, KV params) are already in `body`."""

    method: str
    path: str
    body: bytes = b""
    headers: tuple[tuple[str, str], ...] = (("content-type", "application/json"),)
    query: str = ""
    json: dict[str, Any] | None = None  # a JSON body not yet encoded (wins over `body`)

    def encoded(self) -> bytes:
        """The body's bytes."""
        if self.json is None:
            return self.body
        import json

        return json.dumps(self.json).encode()


@dataclass(frozen=True)
class PromptBlocks:
    """A prompt's KV block hashes as its pool's engines compute them (vLLM's hashes, in the
    engines' `block_size`; `splitserve.router.routing.vllm_hash`). The dispatcher computes them
    once per request; the pools' request routers read them. Engines ignore them."""

    block_size: int
    hashes: tuple[int, ...]


@dataclass(frozen=True)
class ReplicaPin:
    """The decode replica reserved for a request before its remote prefill (decode first,
    `router/routing/reservations.py`): `replica_id` is Serve's replica unique id, `reservation`
    the key the router releases once the decode request is routed there."""

    replica_id: str
    reservation: str


@dataclass(frozen=True)
class GenerateRequest:
    """One request as a worker sees it: `http`, the call to the engine replica's vLLM server
    (`engine/vllm_server.py`), whose chunks carry that server's response bytes
    (`GenerateChunk.data`), and what the router planned around it: `prompt_token_ids`, its own
    count of the prompt (policy, routing, faults), and `sampling.max_tokens`, the output budget.
    """

    request_id: str
    prompt_token_ids: tuple[int, ...]
    sampling: Sampling
    kv_transfer_params: dict[str, Any] | None = None
    cache_salt: str | None = None  # scopes prefix caching (derived from the tenant)
    avoid_replicas: tuple[str, ...] = ()  # replica ids that failed this request (retries)
    lora: LoraRef | None = None  # the request's LoRA adapter (None: the base model)
    # The engine yields a chunk once this many new tokens are ready (the first token and the
    # last chunk at once); the router raises it under load (router/coalescing.py).
    stream_interval: int = 1
    http: HTTPCall | None = None
    # False: the request must run whole on one engine (a forwarded call with several output
    # sequences or prompts: vLLM's server hands off one prompt's KV per request)
    disaggregable: bool = True
    prompt_blocks: PromptBlocks | None = None  # set by the dispatcher (routing only)
    # Decode request: the replica reserved for it; the pool's request router sends it there
    # unless that replica is gone (then its ranking decides). Engines ignore it.
    pin_replica: ReplicaPin | None = None
    # Prefill request: the decode replica that will pull its KV (traces now; NIXL push later).
    decode_replica: str | None = None
    # True: the response's bytes and tokens come over HTTP from the replica's stream server
    # (`engine/stream_server.py`); the call yields the stream's address first
    # (`GenerateChunk.stream_url`) and the request's figures last. False: every chunk is an item
    # of the call.
    http_stream: bool = False

    @classmethod
    def completion(
        cls, request_id: str, prompt_token_ids: tuple[int, ...] | list[int], max_tokens: int,
        *, lora: LoraRef | None = None, **params: Any,
    ) -> GenerateRequest:
        """A completions request on token ids for a pool's handle directly, bypassing the router
        (references in tests, benchmarks): greedy unless `params` say otherwise."""
        body: dict[str, Any] = {"prompt": list(prompt_token_ids), "max_tokens": max_tokens,
                                "temperature": 0.0, "request_id": request_id, **params}
        if lora is not None:
            body["model"] = lora.name
        return cls(request_id, tuple(prompt_token_ids), Sampling(max_tokens), lora=lora,
                   http=HTTPCall("POST", "/v1/completions", json=body))


# Why a decode engine recomputed a handoff's prompt instead of pulling its KV
# (`GenerateChunk.kv_recomputed`): the pull failed (transfer error, failed handshake, peer gone),
# or the handoff's fetch deadline had passed before the engine saw it.
KV_TRANSFER_ERROR = "transfer_error"
KV_EXPIRED = "expired"


def kv_recompute_reason(*, expired: bool, load_failed: bool) -> str | None:
    """Why a remote-prefill request's KV was recomputed on decode (None: it was not)."""
    if expired:
        return KV_EXPIRED
    return KV_TRANSFER_ERROR if load_failed else None


@dataclass(frozen=True)
class GenerateChunk:
    """What a worker yields: the response bytes vLLM's server wrote since the last chunk
    (`data`; the first chunk has the response's `status` and `headers`), and the output token
    ids the engine produced meanwhile (`text` is unused: the text is in `data`).

    `finish_reason` is set on the last chunk only, which carries the request's figures and the
    bytes written once the engine finished it (so that the router has the figures before its
    client reads the response's end); `num_cached_tokens` is the number of prompt tokens served from the prefix cache (or
    received over KV transfer).
    """

    token_ids: tuple[int, ...]
    text: str
    finish_reason: str | None = None
    num_prompt_tokens: int = 0
    num_cached_tokens: int = 0
    kv_transfer_params: dict[str, Any] | None = None
    replica: str = ""  # the worker replica that produced it (debugging, routing tests)
    # Last chunk of a remote-prefill request: the KV bytes pulled over NIXL (as the connector
    # measured them; computed from the handoff's blocks when no measurement came) and the
    # connector's measured transfer time (None: not measured).
    kv_bytes: int = 0
    kv_transfer_s: float | None = None
    # Last chunk: why the handoff's KV was recomputed instead of pulled (`KV_TRANSFER_ERROR`,
    # `KV_EXPIRED`); None when it was pulled, or without a handoff.
    kv_recomputed: str | None = None
    # First chunk with tokens: the engine's own time to first token (vLLM's first-token latency:
    # from the request's arrival in the engine to its first token's output); None otherwise.
    engine_ttft_s: float | None = None
    # A forwarded HTTP call (`GenerateRequest.http`): the response's status and headers (first
    # chunk) and the body bytes vLLM's server wrote since the last chunk.
    status: int | None = None
    headers: tuple[tuple[str, str], ...] = ()
    data: bytes = b""
    # Last chunk: the engine's step cost as fitted from its own steps (`StepCost`; None until
    # it has stepped), for the router's disaggregation rule.
    engine_cost: StepCost | None = None
    # First item of a call with `GenerateRequest.http_stream`: where to read the response
    # (`engine/frames.py`); nothing else is set on it but `replica`.
    stream_url: str | None = None


@dataclass(frozen=True)
class StepCost:
    """An engine's step time as it measures it: `step_s + per_seq_s * decoding sequences +
    per_token_s * prefill tokens`, at most `chunk_tokens` tokens a step (None: not seen yet)."""

    step_s: float
    per_seq_s: float | None
    per_token_s: float | None
    chunk_tokens: int


@dataclass(frozen=True)
class EngineStats:
    """A snapshot of one engine's load, for routing, autoscaling and tests."""

    role: str
    replica: str
    num_running: int = 0
    num_waiting: int = 0
    num_unfinished: int = 0
    kv_cache_usage: float = 0.0
    prefix_cache_queries: int = 0
    prefix_cache_hits: int = 0
    kv_transfers: int = 0  # KV pulls this engine completed (decode side)
    kv_bytes_received: int = 0
    kv_transfer_seconds: float = 0.0  # summed NIXL transfer durations (post to completion)
    kv_transfer_failures: int = 0
    kv_handoffs_expired: int = 0  # handoffs recomputed because their fetch deadline had passed
    # The engine's whole KV cache in tokens (vLLM's num_gpu_blocks x block_size, fixed once it
    # started; 0: unknown). The router sizes its prefix indexes from it (routing.index_size).
    kv_capacity_tokens: int = 0
    # Prompt tokens whose KV a KV connector supplied instead of the engine computing them, by
    # vLLM's source: "host" / "disk" loaded from the KV tier (config kv_tier), others (e.g.
    # "external_unspecified") came over the NIXL handoff. Counted since the engine started.
    kv_loaded_tokens: dict[str, int] = field(default_factory=dict)
    # Responses sent over the replica's stream server (`engine/stream_server.py`): opened since
    # the replica started, and those whose calls have not ended.
    streams_opened: int = 0
    open_streams: int = 0


class WorkerError(RuntimeError):
    """A worker failed a request; `replica` (the replica's unique id) lets a retry avoid it."""

    def __init__(self, replica: str, message: str) -> None:
        super().__init__(replica, message)  # both in args: the exception pickles across Ray
        self.replica = replica
        self.message = message

    def __str__(self) -> str:
        return f"{self.message} (replica {self.replica})"


class RequestRejected(WorkerError):
    """The engine refused the request as invalid (a vLLM client error, e.g. a grammar or schema
    its structured-output compiler does not accept): the client's 400, never retried elsewhere.
    `param`: the request parameter vLLM names, if any."""

    def __init__(
        self, replica: str, message: str, param: str | None = None,
        status: int = 400, body: bytes = b"",
    ) -> None:
        super().__init__(replica, message)
        self.param = param
        # vLLM's server's own answer (status and JSON error body), passed to the client as is
        self.status = status
        self.body = body
        self.args = (replica, message, param, status, body)  # so that it pickles across Ray
