"""Dispatch a prepared request to the worker pools and stream back its chunks.

Colocated: the decode pool runs the whole request. The disaggregated path (prefill pool, KV
handoff, then decode) plugs in here; the HTTP layer above never changes.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from typing import Any

from splitserve.engine.messages import GenerateChunk, GenerateRequest
from splitserve.router.errors import APIError, server_error, unavailable

log = logging.getLogger("splitserve.router")


class Dispatcher:
    """Sends requests to pool handles; translates worker failures into `APIError`s."""

    def __init__(self, pools: dict[str, Any]) -> None:
        self.pools = pools

    async def stream(self, req: GenerateRequest) -> AsyncIterator[GenerateChunk]:
        """The request's chunks, in order. Closing the iterator cancels the worker request."""
        gen = self.pools["decode"].options(stream=True).generate.remote(req)
        try:
            async for chunk in gen:
                yield chunk
        except APIError:
            raise
        except Exception as err:  # worker crashed, engine error, replica gone
            raise _worker_error(req.request_id, err) from err
        finally:
            gen.cancel()


def _worker_error(request_id: str, err: Exception) -> APIError:
    from ray.serve.exceptions import BackPressureError, DeploymentUnavailableError

    if isinstance(err, (BackPressureError, DeploymentUnavailableError)):
        return unavailable(f"No worker can take the request now ({type(err).__name__}).")
    log.exception("request %s failed in a worker", request_id)
    return server_error()
