"""API keys: generation, salted hashing, and constant-time lookup.

Only hashes are stored (config, tenants file, Secret). A stored hash reads

    sha256$<salt>$<hex of HMAC-SHA256(key=salt, msg=api_key)>

The salt is per key by default (`hash_api_key` draws 16 random bytes); an operator may pass one
salt for the whole deployment instead (`hash_api_key(key, salt=...)`), which makes checking a
request cost one HMAC however many keys exist. Keys are random (`generate_api_key`: 256 bits),
not passwords, so a fast keyed hash is enough: nobody can brute-force 256 bits, and the router
hashes on every request, where a slow KDF would cost latency.

Invariants of `KeyRing.lookup`: it computes one HMAC per distinct salt and compares the result
with *every* stored digest through `hmac.compare_digest`, never stopping at the first match, so
its timing does not depend on which key (if any) matched or on how many bytes of it were right.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
from collections.abc import Iterable
from dataclasses import dataclass

from splitserve.config import API_KEY_HASH_PATTERN

SCHEME = "sha256"
KEY_PREFIX = "sk-ss-"  # recognisable in logs and by secret scanners
KEY_RANDOM_BYTES = 32  # 256 bits: brute force is out of reach, so no slow KDF is needed
SALT_RANDOM_BYTES = 16  # 128 bits per key: equal keys still hash differently
_SALT_RE = re.compile(r"^[A-Za-z0-9._-]{8,128}$")
_HASH_RE = re.compile(API_KEY_HASH_PATTERN)


def generate_api_key() -> str:
    """A fresh random API key (`sk-ss-` + 43 URL-safe characters). Show it once; store its hash."""
    return KEY_PREFIX + secrets.token_urlsafe(KEY_RANDOM_BYTES)


def _digest(salt: str, api_key: str) -> bytes:
    return hmac.new(salt.encode(), api_key.encode(), hashlib.sha256).digest()


def hash_api_key(api_key: str, *, salt: str | None = None) -> str:
    """The storable hash of `api_key`; `salt` None draws a random per-key salt.

    `salt` (a per-deployment salt) must be 8-128 characters of [A-Za-z0-9._-].
    """
    if not api_key:
        raise ValueError("an API key must not be empty")
    if salt is None:
        salt = secrets.token_hex(SALT_RANDOM_BYTES)
    elif not _SALT_RE.match(salt):
        raise ValueError("a salt must be 8-128 characters of [A-Za-z0-9._-]")
    return f"{SCHEME}${salt}${_digest(salt, api_key).hex()}"


@dataclass(frozen=True)
class KeyHash:
    """One parsed stored hash and the tenant it belongs to."""

    salt: str
    digest: bytes
    tenant: str

    @classmethod
    def parse(cls, stored: str, tenant: str) -> KeyHash:
        """Parse `sha256$salt$hex`; ValueError (without echoing it) when malformed."""
        if not _HASH_RE.match(stored):
            raise ValueError(f"tenant {tenant!r}: an api_key_hashes entry is not a key hash")
        _, salt, hexdigest = stored.split("$")
        return cls(salt=salt, digest=bytes.fromhex(hexdigest), tenant=tenant)


class KeyRing:
    """Every tenant's key hashes; answers "whose key is this?" in constant time per ring."""

    def __init__(self, hashes: Iterable[KeyHash]) -> None:
        self._hashes = tuple(hashes)
        seen: dict[tuple[str, bytes], str] = {}
        for h in self._hashes:
            other = seen.setdefault((h.salt, h.digest), h.tenant)
            if other != h.tenant:
                raise ValueError(f"tenants {other!r} and {h.tenant!r} share an API key hash")
        self._salts = tuple(dict.fromkeys(h.salt for h in self._hashes))

    def __len__(self) -> int:
        return len(self._hashes)

    def lookup(self, api_key: str) -> str | None:
        """The tenant holding `api_key`, or None. Scans all hashes; see the module invariants."""
        digests = {salt: _digest(salt, api_key) for salt in self._salts}
        found: str | None = None
        for h in self._hashes:
            match = hmac.compare_digest(digests[h.salt], h.digest)
            found = h.tenant if match else found
        return found

