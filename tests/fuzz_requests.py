"""A seeded generator of malformed (and a few valid) OpenAI API requests, for the API fuzz tests.

`hypothesis` is not in the project's pinned environment (requirements/cpu.lock), so the cases
come from `random.Random(seed)`: the same seed gives the same cases on every machine. Each case
is (path, headers, body bytes). Valid cases keep `max_tokens` tiny so that they cost the engine
almost nothing.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from typing import Any

MODEL = "splitserve-tiny"
PATHS = ("/v1/chat/completions", "/v1/completions")

# Values that are wrong for most fields: types, signs, sizes, encodings.
_ODD_VALUES: list[Any] = [
    None, True, False, 0, -1, -(2**63), 2**63, 2**200, 1e308, -1e308, 0.5, -0.0, "", "x",
    "1", "\u0000", "\ud800", "💥" * 50, [], [1], [[]], [None], {}, {"a": 1}, [{"role": "user"}],
    "a" * 5000, list(range(300)), [2**40], [-5],
]
_FIELDS = [
    "model", "messages", "prompt", "max_tokens", "max_completion_tokens", "n", "temperature",
    "top_p", "top_k", "stream", "stream_options", "stop", "seed", "presence_penalty",
    "frequency_penalty", "logprobs", "min_tokens", "ignore_eos", "user", "logit_bias", "tools",
    "return_token_ids", "cache_salt", "unknown_field",
]
_RAW_BODIES: list[bytes] = [
    b"", b"{", b"}", b"null", b"[]", b"1", b'"text"', b"\xff\xfe\xfd", b'{"model": "\xff"}',
    b"\xef\xbb\xbf{}", b"{" * 10_000, b"[" * 100_000, b'{"a":' * 50_000, b"NaN",
    b'{"model": NaN}', b'{"max_tokens": Infinity}', b"\x00" * 100, b'{"model": "x"}' * 3,
]


def _valid(path: str, rng: random.Random) -> dict[str, Any]:
    body: dict[str, Any] = {"model": MODEL, "max_tokens": rng.choice([1, 2]), "temperature": 0}
    if path.endswith("chat/completions"):
        body["messages"] = [{"role": "user", "content": rng.choice(["hi", "héllo ✓", "a b c"])}]
    else:
        body["prompt"] = rng.choice(["hi", [1, 2, 3], ["one prompt"]])
    return body


def _mutate(body: dict[str, Any], rng: random.Random) -> dict[str, Any]:
    body = dict(body)
    for _ in range(rng.randint(1, 3)):
        field = rng.choice(_FIELDS)
        if rng.random() < 0.15 and field in body and field != "max_tokens":
            del body[field]  # never drop max_tokens: "what fits" would generate ~2k tokens
        else:
            body[field] = rng.choice(_ODD_VALUES)
    if body.get("max_tokens") in (None, True) or "max_tokens" not in body:
        body["max_tokens"] = 2
    return body


def cases(seed: int, n: int, *, max_body: int) -> Iterator[tuple[str, dict[str, str], bytes]]:
    """`n` requests: mutated bodies, raw byte bodies, wrong headers, oversized bodies."""
    rng = random.Random(seed)
    for _ in range(n):
        path = rng.choice(PATHS)
        headers = {"content-type": "application/json"}
        roll = rng.random()
        if roll < 0.15:
            body = rng.choice(_RAW_BODIES)
        elif roll < 0.2:
            body = b'{"model": "' + b"a" * (max_body + rng.randint(1, 4096)) + b'"}'
        elif roll < 0.25:
            body = bytes(rng.getrandbits(8) for _ in range(rng.randint(1, 200)))
        else:
            doc = _mutate(_valid(path, rng), rng)
            body = json.dumps(doc, allow_nan=True).encode("utf-8", "surrogatepass")
        if rng.random() < 0.05:
            headers["content-type"] = rng.choice(["text/plain", "", "application/x-www-form"])
        yield path, headers, body
