"""Controller: sizes and places the pools (never on a request's path)."""

from splitserve.controller.placement import PlacementError, pick_cores

__all__ = ["PlacementError", "pick_cores"]
