"""`python -m splitserve.router.tenancy [--salt SALT]`: print a new API key and its hash.

The key is shown once; only the hash goes into `tenants[].api_key_hashes` (or a tenants file).
"""

from __future__ import annotations

import argparse

from splitserve.router.tenancy.keys import generate_api_key, hash_api_key


def main(argv: list[str] | None = None) -> int:
    """Parse the flags, print `api_key: ...` and `api_key_hash: ...`."""
    parser = argparse.ArgumentParser(
        prog="python -m splitserve.router.tenancy",
        description="Generate a splitserve API key and the hash to store in the config.",
    )
    parser.add_argument("--salt", help="a per-deployment salt (default: a random per-key salt)")
    args = parser.parse_args(argv)
    key = generate_api_key()
    print(f"api_key: {key}\napi_key_hash: {hash_api_key(key, salt=args.salt)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
