"""Request errors of the sensorsim server: each carries the gRPC status it maps to and names the offending field."""

from __future__ import annotations

import grpc


class RequestError(Exception):
    """A request the server answers with a non-OK status.

    Args:
        code: gRPC status code.
        message: Human-readable message; starts with the request field it is about (``sensor_pose.start_pose.quat``).
    """

    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def invalid(message: str) -> RequestError:
    """INVALID_ARGUMENT (malformed request)."""
    return RequestError(grpc.StatusCode.INVALID_ARGUMENT, message)


def not_found(message: str) -> RequestError:
    """NOT_FOUND (unknown scene, track or camera)."""
    return RequestError(grpc.StatusCode.NOT_FOUND, message)


def precondition(message: str) -> RequestError:
    """FAILED_PRECONDITION (the server lacks the feature: harmonizer, CUDA IPC)."""
    return RequestError(grpc.StatusCode.FAILED_PRECONDITION, message)


def exhausted(message: str) -> RequestError:
    """RESOURCE_EXHAUSTED (answer or work too large)."""
    return RequestError(grpc.StatusCode.RESOURCE_EXHAUSTED, message)


def as_request_error(exc: BaseException, field_prefix: str = "") -> RequestError:
    """Map an exception raised by wsim on a request to its status: ValueError → INVALID_ARGUMENT (message prefixed
    with ``field_prefix``), MemoryError → RESOURCE_EXHAUSTED, anything else → INTERNAL."""
    if isinstance(exc, RequestError):
        return exc
    if isinstance(exc, ValueError):
        return invalid(f"{field_prefix}{exc}")
    if isinstance(exc, MemoryError):
        return exhausted(f"out of memory: {exc}")
    return RequestError(grpc.StatusCode.INTERNAL, f"{type(exc).__name__}: {exc}")
