"""The handler wrapper every RPC of the servicer runs in: exceptions become statuses, one log line per request."""

from __future__ import annotations

import functools
import logging
import time
from typing import Any, Callable

import grpc

from ..launch import cancellable
from .errors import as_request_error

log = logging.getLogger("wsim.grpc")


def rpc(fn: Callable) -> Callable:
    """Run a handler: RequestError / ValueError / other exceptions become statuses; log one line with the duration.
    Launches inside the handler stop (CANCELLED) once the client has gone (:func:`wsim.launch.cancellable`)."""

    @functools.wraps(fn)
    def wrapper(self: Any, request: Any, context: grpc.ServicerContext) -> Any:
        t0 = time.perf_counter()
        status = "OK"
        with self._inflight_lock:
            self._inflight += 1
        try:
            with cancellable(lambda: not context.is_active()):
                return fn(self, request, context)
        except Exception as e:  # noqa: BLE001 - every failure becomes a status; the server keeps serving
            err = as_request_error(e)
            status = err.code.name
            if err.code is grpc.StatusCode.INTERNAL:
                log.exception("%s failed", fn.__name__)
            context.abort(err.code, err.message)
        finally:
            with self._inflight_lock:
                self._inflight -= 1
            log.info("%s %s %.1f ms", fn.__name__, status, (time.perf_counter() - t0) * 1e3)

    return wrapper
