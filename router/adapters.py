"""LoRA adapters a router replica can serve: declared in the config or loaded at run time.

Pure bookkeeping (no Ray, no I/O): ids, which base model each adapter belongs to, and how many
requests use each one right now, so that an adapter being unloaded is first taken out of
routing and then dropped from the engines only once its last request is done
(`wait_idle`). Loading into the engines is the router's job (`router/app.py` calls each pool's
`load_lora` before `add`), and the engines' own LRU (`lora.max_loras`) evicts idle adapters.

Ids: declared adapters get 1, 2, ... in config order; run-time ones count on from
`RUNTIME_FIRST_ID`, never reused, so that an id names one set of weights for the life of the
router (vLLM caches adapters by id).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from dataclasses import dataclass

from splitserve.config import SplitserveConfig
from splitserve.engine.messages import LoraRef

RUNTIME_FIRST_ID = 1000


@dataclass(frozen=True)
class Adapter:
    """One adapter: `name` is its model id, `base` the served model it applies to."""

    name: str
    base: str
    ref: LoraRef
    declared: bool = False


class AdapterError(ValueError):
    """An add or remove the registry refuses (the message says why)."""


class AdapterRegistry:
    """Adapters by name, with in-flight counts. All methods run on the router's event loop."""

    def __init__(self, declared: Iterable[tuple[str, str, str]] = ()) -> None:
        """`declared`: (name, base model, path) of the config's adapters, in order."""
        self._adapters: dict[str, Adapter] = {}
        self._in_flight: dict[str, int] = {}
        self._idle: dict[str, asyncio.Event] = {}
        for i, (name, base, path) in enumerate(declared, start=1):
            self._adapters[name] = Adapter(name, base, LoraRef(name, i, path), declared=True)
        self._next_id = RUNTIME_FIRST_ID

    @classmethod
    def from_config(cls, cfg: SplitserveConfig) -> AdapterRegistry:
        """The adapters declared under each model's `lora.adapters`."""
        return cls(
            (a.name, view.model.name, a.path)
            for view in cfg.model_views() if view.lora is not None
            for a in view.lora.adapters
        )

    def get(self, name: str) -> Adapter | None:
        """The adapter called `name`, or None (also while it is being removed)."""
        return self._adapters.get(name)

    def all(self) -> list[Adapter]:
        """Every adapter, declared ones first, then in load order."""
        return list(self._adapters.values())

    def of(self, base: str) -> list[Adapter]:
        """The adapters of base model `base`."""
        return [a for a in self._adapters.values() if a.base == base]

    def new_ref(self, name: str, path: str) -> LoraRef:
        """A fresh id for an adapter about to be loaded at run time (not registered yet)."""
        if name in self._adapters:
            raise AdapterError(f"an adapter or model named {name!r} exists already")
        ref = LoraRef(name, self._next_id, path)
        self._next_id += 1
        return ref

    def add(self, base: str, ref: LoraRef) -> Adapter:
        """Register a run-time adapter, after every pool of `base` loaded it."""
        if ref.name in self._adapters:
            raise AdapterError(f"an adapter or model named {ref.name!r} exists already")
        adapter = Adapter(ref.name, base, ref)
        self._adapters[ref.name] = adapter
        return adapter

    def remove(self, name: str) -> Adapter:
        """Take `name` out of routing (new requests get 404); `wait_idle` then waits for the
        requests already using it."""
        adapter = self._adapters.pop(name, None)
        if adapter is None:
            raise AdapterError(f"no adapter named {name!r}")
        return adapter

    def acquire(self, name: str) -> None:
        """One more request uses `name` (call `release` when it ends, however it ends)."""
        self._in_flight[name] = self._in_flight.get(name, 0) + 1
        self._idle.setdefault(name, asyncio.Event()).clear()

    def release(self, name: str) -> None:
        """A request using `name` ended."""
        left = self._in_flight.get(name, 0) - 1
        if left > 0:
            self._in_flight[name] = left
            return
        self._in_flight.pop(name, None)
        event = self._idle.pop(name, None)
        if event is not None:
            event.set()

    def in_flight(self, name: str) -> int:
        """Requests using `name` now."""
        return self._in_flight.get(name, 0)

    async def wait_idle(self, name: str, timeout_s: float) -> bool:
        """Wait until no request uses `name`; False if some still do after `timeout_s`."""
        event = self._idle.get(name)
        if event is None:
            return True
        try:
            await asyncio.wait_for(event.wait(), timeout_s)
        except TimeoutError:
            return False
        return True
