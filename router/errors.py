"""OpenAI-style errors: `{"error": {"message", "type", "param", "code"}}` with an HTTP status."""

from __future__ import annotations

from typing import Any

from fastapi.responses import JSONResponse, Response


class APIError(Exception):
    """An error the client sees as an OpenAI error body with `status`."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        type: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
        raw: bytes | None = None,
    ) -> None:
        super().__init__(message)
        self.raw = raw  # a body written elsewhere (vLLM's server), passed on as it is
        self.status = status
        self.message = message
        self.type = type
        self.param = param
        self.code = code
        self.headers = headers or {}

    def body(self) -> dict[str, Any]:
        """The JSON body (also used inside an SSE `data:` line mid-stream)."""
        if self.raw is not None:
            import json

            try:
                return json.loads(self.raw)
            except ValueError:
                pass
        return {
            "error": {
                "message": self.message,
                "type": self.type,
                "param": self.param,
                "code": self.code,
            }
        }

    def response(self) -> JSONResponse:
        """The HTTP response."""
        if self.raw is not None:
            return Response(self.raw, status_code=self.status, headers=self.headers,
                            media_type="application/json")
        return JSONResponse(self.body(), status_code=self.status, headers=self.headers)


def bad_request(message: str, *, param: str | None = None, code: str | None = None) -> APIError:
    """400 invalid_request_error."""
    return APIError(400, message, param=param, code=code)


def model_not_found(model: str) -> APIError:
    """404, worded as OpenAI words it."""
    return APIError(
        404,
        f"The model `{model}` does not exist or you do not have access to it.",
        param="model",
        code="model_not_found",
    )


def too_large(limit: int) -> APIError:
    """413 for a body over the configured limit."""
    return APIError(413, f"Request body is larger than {limit} bytes.", code="request_too_large")


def server_error(
    message: str = "The server had an error while processing your request.",
) -> APIError:
    """500 server_error (details go to the log, not to the client)."""
    return APIError(500, message, type="server_error")


def deadline_exceeded(timeout_s: float) -> APIError:
    """504: the request ran past its deadline and was aborted in every pool."""
    return APIError(
        504,
        f"The request did not finish within its {timeout_s:g} s deadline "
        "(router.request_timeout_s, or the x-splitserve-timeout-s header) and was cancelled; "
        "ask for fewer tokens or retry later.",
        type="timeout_error",
        code="request_timeout",
    )


def unavailable(message: str, retry_after_s: int = 1) -> APIError:
    """503 with Retry-After."""
    return APIError(
        503,
        message,
        type="service_unavailable",
        headers={"Retry-After": str(retry_after_s)},
    )


def sse(data: dict[str, Any] | str) -> bytes:
    """One server-sent event (`data: ...`), e.g. an error event that ends a begun stream."""
    import json

    payload = data if isinstance(data, str) else json.dumps(data, separators=(",", ":"))
    return f"data: {payload}\n\n".encode()
