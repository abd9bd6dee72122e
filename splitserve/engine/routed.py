"""What the router tells an engine replica that answers a client itself, and what the replica
tells the router back (`router.direct_streaming`; docs/dataplane.md).

With direct streaming the client's request reaches the decode pool's replica straight from
HAProxy, and the router is Ray Serve's *ingress request router*: HAProxy first POSTs the body
to the router's `/internal/route`, which authenticates, admits and picks the replica, and
answers with the replica and request headers that HAProxy sets on the request. HAProxy strips
every client header of the router's prefix (`x-serve-router-`) before, so a client cannot
forge them. The router's headers carry one value (`HEADER`): a `Verdict`, URL-safe base64 of
its JSON (HAProxy's Lua reads the router's answer with a pattern that allows no quotes in a
value).

A verdict is sealed: `seal` appends an HMAC-SHA256 under the deployment's key
(`splitserve/deployment_key.py`) over its JSON, which names the replica it is for, its expiry
and the SHA-256 of the body the router admitted, so a replica port reached by anything else
than HAProxy (a pod of the release, the node network) cannot be handed a verdict the router
did not write, one for another replica, an old one, or one for another body; the replica
accepts a "serve" verdict once (`Verdict.ticket`). Settlements carry a MAC under the same key
(`SETTLEMENT_MAC`).

When the replica is done with a request it reports a `Settlement` to the router replica that
admitted it (`Verdict.settle_url`): the tokens used, for the tenant's quota and usage, and the
latencies the controller's signals need. Pure data and codecs: no Ray, no network.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
from dataclasses import asdict, dataclass, fields
from typing import Any, Literal

# The router-owned header namespace HAProxy clears of client values (Ray Serve's
# SERVE_INGRESS_ROUTER_HEADER_PREFIX) and the one header splitserve sets in it.
PREFIX = "x-serve-router-"
HEADER = PREFIX + "splitserve"

Kind = Literal["serve", "refuse", "forward"]

# How long a verdict is good after the router sealed it. HAProxy sends the request on to the
# replica as soon as the router answers, so this only has to cover the clocks of two nodes
# (NTP keeps them within milliseconds) and a busy event loop, not a queue; it bounds how long a
# captured verdict could be tried on its replica at all.
VERDICT_TTL_S = 30.0
# The header a settlement's MAC travels in (the replica's POST to the router).
SETTLEMENT_MAC = "x-splitserve-mac"


def _mac(key: bytes, domain: bytes, data: bytes) -> str:
    digest = hmac.new(key, domain + b"\0" + data, hashlib.sha256).digest()
    return base64.urlsafe_b64encode(digest).decode().rstrip("=")


def body_digest(body: bytes) -> str:
    """The SHA-256 of a request body, as a verdict names it."""
    return hashlib.sha256(body).hexdigest()


def settlement_mac(key: bytes, body: bytes) -> str:
    """The MAC of a settlement's JSON body under the deployment's key."""
    return _mac(key, b"settlement", body)


def settlement_signed(key: bytes, body: bytes, mac: str | None) -> bool:
    """Whether `mac` is the MAC of `body` under `key` (constant time)."""
    return mac is not None and hmac.compare_digest(settlement_mac(key, body), mac)


class VerdictError(ValueError):
    """A verdict header that cannot be read (not from this router version)."""


class ForgedVerdict(VerdictError):
    """A verdict header the router of this deployment did not seal, or not for this use: a
    wrong MAC, expired, or for another replica."""


@dataclass(frozen=True)
class Verdict:
    """The router's answer for one request.

    `kind`: "serve" (a generation request admitted: the replica rewrites the body's router
    fields from `request_id`, `model`, `max_tokens`, `cache_salt` and `kv_transfer_params`,
    runs it streaming `stream_interval` tokens per event, and settles with `ticket` at
    `settle_url`); "refuse"
    (the router's OpenAI error: `status`, `error` (the body) and `headers`, which the replica
    returns as they are); "forward" (not a request the router admits here: the replica hands it
    to the router whole).
    """

    kind: Kind
    endpoint: str = ""  # "chat" or "completions"
    request_id: str = ""
    model: str = ""
    max_tokens: int | None = None  # the output limit the router set (None: the client's own)
    cache_salt: str | None = None
    ticket: str = ""
    settle_url: str = ""
    status: int = 0
    error: dict[str, Any] | None = None
    headers: dict[str, str] | None = None  # a refusal's own headers (Retry-After)
    # tokens per streamed event the router's coalescing asks for (router/coalescing.py)
    stream_interval: int = 1
    # the KV handoff of a request prefilled on the prefill pool (vLLM's `kv_transfer_params`
    # for the decode engine's pull); None: the decode engine prefills it
    kv_transfer_params: dict[str, Any] | None = None
    # set when sealed: the full id of the replica it is for, when it expires (Unix time) and
    # the SHA-256 of the body the router read
    replica: str = ""
    expires: float = 0.0
    body_sha256: str = ""

    def encode(self) -> str:
        """The header value: URL-safe base64 of the JSON of the fields that are set."""
        data = {k: v for k, v in asdict(self).items() if v not in (None, "", 0)}
        return base64.urlsafe_b64encode(json.dumps(data, separators=(",", ":")).encode()).decode()

    @classmethod
    def decode(cls, value: str | bytes) -> Verdict:
        """The verdict of a header value; `VerdictError` when it is not one."""
        try:
            raw = base64.urlsafe_b64decode(value)
            data = json.loads(raw)
        except (binascii.Error, ValueError) as err:
            raise VerdictError(f"unreadable verdict: {err}") from None
        known = {f.name for f in fields(cls)}
        if not isinstance(data, dict) or data.get("kind") not in ("serve", "refuse", "forward"):
            raise VerdictError("unreadable verdict: no kind")
        return cls(**{k: v for k, v in data.items() if k in known})

    def seal(self, key: bytes) -> str:
        """The header value, sealed: `encode()`, a dot, and its MAC under `key`."""
        payload = self.encode()
        return f"{payload}.{_mac(key, b'verdict', payload.encode())}"

    @classmethod
    def open(cls, value: str | bytes, key: bytes, *, replica: str, now: float) -> Verdict:
        """The verdict of a sealed header value, checked for replica `replica` at time `now`:
        `ForgedVerdict` when its MAC is not the router's, it is past its expiry or it names
        another replica; `VerdictError` when the router's seal holds but it cannot be read."""
        text = value.decode("latin-1") if isinstance(value, bytes) else value
        payload, _, mac = text.rpartition(".")
        if not payload or not hmac.compare_digest(_mac(key, b"verdict", payload.encode()), mac):
            raise ForgedVerdict("a verdict not sealed by this deployment's router")
        verdict = cls.decode(payload)
        if verdict.expires <= now:
            raise ForgedVerdict("an expired verdict")
        if verdict.replica != replica:
            raise ForgedVerdict(f"a verdict for another replica ({verdict.replica!r})")
        return verdict


@dataclass(frozen=True)
class Settlement:
    """What a directly served request used, reported by the replica once its response ended.

    `generated`: whether the request ran as a generation (False: the replica forwarded it, or
    refused it before the engine saw it; the router then charges nothing). `first_token_s`:
    from the replica's start of the request to its first output token; `decode_s`: from then
    to the last (None: no token). `status`: the HTTP status the client got; `cancelled`: the
    client left before the end. `finish_reason` and `cached_tokens` (prompt tokens the engine
    did not compute) are the engine's, for the router's request log.
    """

    ticket: str
    generated: bool = True
    prompt_tokens: int = 0
    output_tokens: int = 0
    first_token_s: float | None = None
    decode_s: float | None = None
    status: int = 200
    cancelled: bool = False
    finish_reason: str | None = None
    cached_tokens: int = 0

    @property
    def handed_back(self) -> bool:
        """The replica handed the request to the router whole (not generated, not refused):
        the router's own path answers and records it."""
        return not self.generated and self.status < 400

    def to_json(self) -> bytes:
        return json.dumps(asdict(self)).encode()

    @classmethod
    def from_json(cls, body: bytes) -> Settlement:
        """The settlement in `body`; ValueError when it is not one."""
        data = json.loads(body)
        if not isinstance(data, dict) or not isinstance(data.get("ticket"), str):
            raise ValueError("not a settlement")
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})


# The status a request whose replica never settled it (lost with the replica) is recorded
# with, in its request log line and its span: what its client got is unknown, so it failed.
SETTLEMENT_LOST = 502


class SettlementLost(Exception):
    """A directly served request's replica never reported its end (lost with the replica)."""


def guess_endpoint(payload: Any) -> str | None:
    """Pure: the generation endpoint a request body is for, as far as the body says (HAProxy
    sends the router the body, not the path): "chat" with `messages`, "completions" with
    `prompt`, None otherwise. The replica checks it against the request's path."""
    if not isinstance(payload, dict):
        return None
    if "messages" in payload:
        return "chat"
    if "prompt" in payload:
        return "completions"
    return None
