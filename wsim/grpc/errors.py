"""Request errors of the sensorsim server: each carries the gRPC status it maps to and names the offending field."""

from __future__ import annotations

import grpc

#: Longest client string echoed in an error message [characters]; longer ones are cut with their length noted.
MAX_ECHO_CHARS = 200
#: Longest status message sent [characters] (gRPC carries it in a header, whose size is limited).
MAX_MESSAGE_CHARS = 2000


def clip(value: object, limit: int = MAX_ECHO_CHARS) -> str:
    """``repr`` of a client-supplied value for an error message, cut to ``limit`` characters (noting the length)."""
    if isinstance(value, (str, bytes)) and len(value) > limit:
        return f"{value[:limit]!r}... ({len(value)} characters)"
    text = repr(value)
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} characters)"


def cap(message: str) -> str:
    """A status message cut to :data:`MAX_MESSAGE_CHARS`."""
    return message if len(message) <= MAX_MESSAGE_CHARS else message[: MAX_MESSAGE_CHARS - 12] + "... (cut)"


class RequestError(Exception):
    """A request the server answers with a non-OK status.

    Args:
        code: gRPC status code.
        message: Human-readable message; starts with the request field it is about (``sensor_pose.start_pose.quat``).
    """

    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        message = cap(message)
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


def cancelled(message: str) -> RequestError:
    """CANCELLED (the client went away or its deadline passed while rendering)."""
    return RequestError(grpc.StatusCode.CANCELLED, message)


def as_request_error(exc: BaseException, field_prefix: str = "") -> RequestError:
    """Map an exception raised by wsim on a request to its status: ValueError → INVALID_ARGUMENT (message prefixed
    with ``field_prefix``), MemoryError → RESOURCE_EXHAUSTED, a cancelled launch → CANCELLED, anything else →
    INTERNAL (the exception type only: its text may hold server paths and is logged instead)."""
    from ..launch import Cancelled

    if isinstance(exc, RequestError):
        return exc
    if isinstance(exc, Cancelled):
        return cancelled("the request was cancelled (client gone or deadline passed)")
    if isinstance(exc, ValueError):
        return invalid(f"{field_prefix}{exc}")
    if isinstance(exc, MemoryError):
        return exhausted(f"out of memory: {exc}")
    return RequestError(grpc.StatusCode.INTERNAL, f"internal error ({type(exc).__name__}); see the server log")
