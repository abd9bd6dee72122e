"""Dispatch a prepared request to the worker pools and stream back its chunks.

Colocated: the decode pool runs the whole request. Disaggregated: when `prefill_remotely` says
so, the prefill pool computes the prompt's KV cache first (`max_tokens=1`), and the decode
request carries the handoff so that its engine pulls the KV over NIXL instead of recomputing it.
A prefill that fails or returns no usable handoff falls back to a local prefill on the decode
worker: the client never sees the prefill pool's trouble, only a slower first token.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import AsyncIterator
from typing import Any

from splitserve.config import DisaggregationConfig
from splitserve.engine.messages import GenerateChunk, GenerateRequest
from splitserve.kv_transfer.handoff import HandoffError, KVHandoff, prefill_request_params
from splitserve.router.errors import APIError, server_error, unavailable
from splitserve.router.metrics import RouterMetrics
from splitserve.router.policy import prefill_remotely
from splitserve.router.tenancy import Tenancy, Tenant, TenancyError

log = logging.getLogger("splitserve.router")


class Dispatcher:
    """Sends requests to pool handles; translates worker failures into `APIError`s."""

    def __init__(
        self,
        pools: dict[str, Any],
        disagg: DisaggregationConfig,
        metrics: RouterMetrics,
        tenancy: Tenancy,
    ) -> None:
        self.pools = pools
        self.disagg = disagg
        self.metrics = metrics
        self.tenancy = tenancy

    def _remote(self, req: GenerateRequest) -> bool:
        if "prefill" not in self.pools:
            return False
        gate = self.tenancy.gates["prefill"]
        return prefill_remotely(
            prompt_tokens=len(req.prompt_token_ids),
            expected_cached_tokens=0,
            prefill_in_flight=gate.in_flight + gate.queued,
            cfg=self.disagg,
        )

    async def stream(self, req: GenerateRequest, tenant: Tenant) -> AsyncIterator[GenerateChunk]:
        """The request's chunks, in order. Closing the iterator cancels the worker request.

        Each pool hop first takes a slot of that pool's fair admission gate (per-tenant queues,
        weighted fair order); a full decode queue is the client's 429/503.
        """
        remote = self._remote(req)
        self.metrics.disagg_decisions.labels(path="remote" if remote else "local").inc()
        if remote:
            handoff = await self._admitted_prefill(req, tenant)
            if handoff is not None:
                req = dataclasses.replace(req, kv_transfer_params=handoff.decode_request_params())
        n_prompt = len(req.prompt_token_ids)
        async with self.tenancy.admit("decode", tenant, n_prompt) as ticket:
            gen = self.pools["decode"].options(stream=True).generate.remote(req)
            try:
                async for chunk in gen:
                    ticket.add_output(len(chunk.token_ids))
                    if chunk.kv_bytes:
                        self.metrics.kv_transfer_bytes.observe(chunk.kv_bytes)
                    yield chunk
            except APIError:
                raise
            except Exception as err:  # worker crashed, engine error, replica gone
                raise _worker_error(req.request_id, err) from err
            finally:
                gen.cancel()

    async def _admitted_prefill(self, req: GenerateRequest, tenant: Tenant) -> KVHandoff | None:
        """The prefill hop behind the prefill gate; a full prefill queue means "prefill locally"."""
        try:
            async with self.tenancy.admit("prefill", tenant, len(req.prompt_token_ids)):
                return await self._prefill(req)
        except TenancyError:
            self.metrics.prefill_fallbacks.inc()
            return None

    async def _prefill(self, req: GenerateRequest) -> KVHandoff | None:
        """Run the prefill step; None means "prefill locally instead" (failure is counted)."""
        prefill_req = dataclasses.replace(
            req,
            request_id=f"{req.request_id}-prefill",
            sampling=dataclasses.replace(req.sampling, max_tokens=1, min_tokens=0),
            kv_transfer_params=prefill_request_params(),
        )
        try:
            params = None
            gen = self.pools["prefill"].options(stream=True).generate.remote(prefill_req)
            async for chunk in gen:
                params = chunk.kv_transfer_params or params
            return KVHandoff.from_params(params)
        except (HandoffError, Exception) as err:  # noqa: BLE001 - any prefill failure falls back
            log.warning("prefill of %s failed (%s); prefilling on decode", req.request_id, err)
            self.metrics.prefill_fallbacks.inc()
            return None


def _worker_error(request_id: str, err: Exception) -> APIError:
    from ray.serve.exceptions import BackPressureError, DeploymentUnavailableError

    if isinstance(err, (BackPressureError, DeploymentUnavailableError)):
        return unavailable(f"No worker can take the request now ({type(err).__name__}).")
    log.exception("request %s failed in a worker", request_id)
    return server_error()
