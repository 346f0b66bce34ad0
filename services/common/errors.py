"""API errors: one exception type, rendered as an OpenAI-style body over REST or a gRPC status."""

from __future__ import annotations

import logging
import uuid

import grpc

log = logging.getLogger("ray.serve")


class OmniError(Exception):
    def __init__(
        self,
        status: int,
        message: str,
        *,
        code: str | None = None,
        param: str | None = None,
        type: str | None = None,
        headers: dict[str, str] | None = None,
    ):
        super().__init__(message)
        self.status = status
        self.message = message
        self.code = code
        self.param = param
        self.type = type or _TYPES.get(status, "invalid_request_error")
        self.headers = headers or {}

    def __reduce__(self):
        # Keyword-only fields: default exception pickling would lose them (Serve pickles errors).
        return (_rebuild, (self.status, self.message, self.code, self.param, self.type, self.headers))

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}

    @property
    def grpc_code(self) -> grpc.StatusCode:
        return _GRPC.get(
            self.status, grpc.StatusCode.INVALID_ARGUMENT if self.status < 500 else grpc.StatusCode.INTERNAL
        )


def _rebuild(status, message, code, param, type, headers) -> OmniError:
    return OmniError(status, message, code=code, param=param, type=type, headers=headers)


_TYPES = {
    401: "authentication_error",
    404: "not_found_error",
    429: "rate_limit_error",
    500: "server_error",
    503: "service_unavailable",
}

_GRPC = {
    400: grpc.StatusCode.INVALID_ARGUMENT,
    401: grpc.StatusCode.UNAUTHENTICATED,
    404: grpc.StatusCode.NOT_FOUND,
    413: grpc.StatusCode.INVALID_ARGUMENT,
    422: grpc.StatusCode.INVALID_ARGUMENT,
    429: grpc.StatusCode.RESOURCE_EXHAUSTED,
    503: grpc.StatusCode.UNAVAILABLE,
}


def bad_request(message: str, *, code: str = "invalid_request", param: str | None = None) -> OmniError:
    return OmniError(400, message, code=code, param=param)


def too_large(message: str, *, code: str, param: str | None = None) -> OmniError:
    return OmniError(413, message, code=code, param=param)


def internal_error(e: BaseException, what: str = "request failed") -> OmniError:
    """Our fault, not the client's: logged in full under an id; the client gets only the id (no
    exception text, host names, actor ids or stack traces). (A stage replica that died is a 503,
    raised as such where stages are called: services/pipeline/pipeline.py stage_calls.)"""
    error_id = f"err_{uuid.uuid4().hex[:16]}"
    log.error("%s [%s]", what, error_id, exc_info=e)
    return OmniError(500, f"internal error; quote {error_id} when reporting it", code="internal_error")
