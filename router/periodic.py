"""A background step repeated every period on the replica's event loop (publishers, reporters)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

log = logging.getLogger("splitserve.router")


class Periodic:
    """Awaits `step()` every `period_s` seconds until stopped; a failing step is logged once (until
    a step succeeds again) and the next period retries. Never raises into its owner."""

    def __init__(self, name: str, step: Callable[[], Awaitable[None]], period_s: float) -> None:
        self.name = name
        self.step = step
        self.period_s = period_s
        self._task: asyncio.Task[None] | None = None
        self._failing = False

    @property
    def running(self) -> bool:
        """True once started and not stopped."""
        return self._task is not None and not self._task.done()

    def start(self) -> bool:
        """Start on the running event loop (idempotent). False when there is no running loop
        yet (a Serve replica's constructor): call again from a request handler."""
        if self.running:
            return True
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return False
        self._task = loop.create_task(self._run(), name=self.name)
        return True

    def stop(self) -> None:
        """Cancel the loop (a step in progress is cancelled too)."""
        if self._task is not None:
            self._task.cancel()
            self._task = None

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.period_s)
            try:
                await self.step()
            except Exception as err:  # noqa: BLE001 - the next period retries
                if not self._failing:
                    log.warning("%s failed (%r); retrying every %.1fs", self.name, err,
                                self.period_s)
                self._failing = True
                continue
            self._failing = False
