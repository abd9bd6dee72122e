"""A Kubernetes API emulator for actuator tests: kmock's `KubernetesEmulator`, run in a thread,
with the API server's optimistic concurrency added.

kmock stores objects and applies merge patches but knows nothing of `resourceVersion` or
`generation`. `ConcurrentEmulator` adds what an actuator relies on: every write bumps
`metadata.resourceVersion`; a spec change bumps `metadata.generation`; a PATCH that carries a
stale `metadata.resourceVersion` gets 409 Conflict. `before_patch` hooks run just before the
next PATCH is applied: they simulate another writer acting between the actuator's GET and PATCH.
"""

from __future__ import annotations

import asyncio
import copy
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import attrs
import kmock


@attrs.frozen
class Conflict(kmock.KubernetesError):
    """HTTP 409, as the API server answers a write based on a stale resourceVersion."""

    status: int = 409
    reason: str = "Conflict"
    message: str = "the object has been modified; please apply your changes to the latest version"


@attrs.define
class ConcurrentEmulator(kmock.KubernetesEmulator):
    """kmock's emulator plus resourceVersion / generation semantics and a PATCH log."""

    patches: list[dict] = attrs.field(factory=list, init=False)
    before_patch: list[Callable[[ConcurrentEmulator, Any], None]] = attrs.field(
        factory=list, init=False)
    _version: int = attrs.field(default=100, init=False)

    def next_version(self) -> str:
        """A new resourceVersion."""
        self._version += 1
        return str(self._version)

    def write(self, key: Any, changes: dict) -> None:
        """Another writer's change (merge patch), with the API server's bookkeeping."""
        obj = self.objects[key]
        meta: dict[str, Any] = {"resourceVersion": self.next_version()}
        if "spec" in changes:
            meta["generation"] = int(obj.get("metadata", {}).get("generation", 1)) + 1
        obj.patch({**changes, "metadata": {**changes.get("metadata", {}), **meta}})

    async def _handle(self, request: Any) -> Any:
        if request.resource is not None and request.name is not None and \
                request.action == kmock.action.UPDATE:
            key = (request.resource, request.namespace, request.name)
            self.patches.append(copy.deepcopy(request.data))
            hooks, self.before_patch[:] = list(self.before_patch), []
            for hook in hooks:
                hook(self, key)
            stored = self.objects[key].get("metadata", {}).get("resourceVersion")
            sent = (request.data.get("metadata") or {}).get("resourceVersion")
            if sent is not None and sent != stored:
                return await self._render_error(Conflict())
            # The API server's bookkeeping, applied with the patch so the response shows it.
            meta = request.data.setdefault("metadata", {})
            meta["resourceVersion"] = self.next_version()
            if "spec" in request.data:
                generation = self.objects[key].get("metadata", {}).get("generation", 1)
                meta["generation"] = int(generation) + 1
        return await super()._handle(request)


@contextmanager
def running_emulator() -> Iterator[tuple[ConcurrentEmulator, str]]:
    """Start the emulator on 127.0.0.1 in a background thread; yield it and its base URL."""
    loop = asyncio.new_event_loop()
    ready = threading.Event()
    box: dict[str, Any] = {}

    async def serve() -> None:
        box["stop"] = asyncio.Event()
        try:
            async with ConcurrentEmulator() as em, kmock.Server(em) as server:
                box["em"], box["url"] = em, str(server.url).rstrip("/")
                ready.set()
                await box["stop"].wait()
        except BaseException as err:  # noqa: BLE001 -- reported to the test thread
            box["error"] = err
            ready.set()

    thread = threading.Thread(target=lambda: loop.run_until_complete(serve()), daemon=True)
    thread.start()
    if not ready.wait(30) or "error" in box:
        raise RuntimeError(f"kmock emulator did not start: {box.get('error')!r}")
    try:
        yield box["em"], box["url"]
    finally:
        loop.call_soon_threadsafe(box["stop"].set)
        thread.join(10)
        loop.close()
