"""Router: the OpenAI-compatible Ray Serve ingress and its dispatch to the pools."""

from splitserve.router.errors import APIError

__all__ = ["APIError"]
