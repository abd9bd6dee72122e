"""One shared object per pool deployment in this process: the pool's request router (made by
Serve) and the dispatcher (made by the router replica) find the same one by the deployment's
name, without passing it to each other."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Generic, TypeVar

T = TypeVar("T")


class PerPool(Generic[T]):
    """`make(key)` once per "app/deployment" key, shared after (thread-safe)."""

    def __init__(self, make: Callable[[str], T]) -> None:
        self._make = make
        self._items: dict[str, T] = {}
        self._lock = threading.Lock()

    def get(self, app: str, deployment: str) -> T:
        """The deployment's object, made on first use."""
        key = f"{app}/{deployment}"
        with self._lock:
            item = self._items.get(key)
            if item is None:
                item = self._items[key] = self._make(key)
            return item
