"""The decode pool: workers that stream tokens.

In colocated mode a decode worker also computes the prefill itself; in disaggregated mode it
receives the prompt's KV cache from a prefill worker (see `splitserve.kv_transfer`).
"""

from __future__ import annotations

from ray import serve

from splitserve.engine.host import EngineHost


@serve.deployment(name="decode")
class DecodeWorker(EngineHost):
    """A Ray Serve replica hosting one decode engine.

    Methods called by the router through a deployment handle:
    - `generate(GenerateRequest)` (streaming): the request's chunks, one per engine step;
    - `health()`, `stats()`: readiness and load.
    """
