"""The prefill pool: workers that compute a prompt's KV cache and hand it to a decode worker."""

from __future__ import annotations

from ray import serve

from splitserve.engine.host import EngineHost


@serve.deployment(name="prefill")
class PrefillWorker(EngineHost):
    """A Ray Serve replica hosting one prefill engine.

    Methods called by the router through a deployment handle:
    - `generate(GenerateRequest)` (streaming), used for the prefill step with `max_tokens=1`;
    - `health()`, `stats()`: readiness and load.
    """
