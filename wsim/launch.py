"""Kernel launching: on the CPU, large 1-D launches are sharded across threads so every core works.

Warp runs a CPU launch on one core and releases the GIL while it runs, so disjoint index ranges launched from a
thread pool run in parallel. Each shard writes only its own outputs: results are bit-identical to one launch.

Cancellation: inside :func:`cancellable` every launch made by the same thread checks the given predicate before it
starts and between its CPU shards; once it is true the launch stops early and raises :class:`Cancelled` (the outputs
are then incomplete and must be discarded). The gRPC server uses it to stop renders whose client has gone.
"""

from __future__ import annotations

import itertools
import os
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any

import warp as wp

_POOL: ThreadPoolExecutor | None = None
#: Fewest work items a CPU launch shard gets by default (see :func:`launch`).
MIN_SHARD = 2048
_local = threading.local()


class Cancelled(RuntimeError):
    """A launch stopped because the predicate of the enclosing :func:`cancellable` became true."""


@contextmanager
def cancellable(is_cancelled: Callable[[], bool]) -> Iterator[None]:
    """Within the block, launches from this thread stop (raising :class:`Cancelled`) once ``is_cancelled()``."""
    previous = getattr(_local, "is_cancelled", None)
    _local.is_cancelled = is_cancelled
    try:
        yield
    finally:
        _local.is_cancelled = previous


def check_cancelled() -> None:
    """Raise :class:`Cancelled` if the enclosing :func:`cancellable` predicate is true (a point between steps)."""
    fn = getattr(_local, "is_cancelled", None)
    if fn is not None and fn():
        raise Cancelled("cancelled")


def cpu_threads() -> int:
    """Threads used for CPU launches: ``WSIM_NUM_THREADS`` if set, else the cores this process may use."""
    env = os.environ.get("WSIM_NUM_THREADS")
    if env:
        return max(1, int(env))
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # pragma: no cover - non-Linux
        return max(1, os.cpu_count() or 1)


def _pool(n: int) -> ThreadPoolExecutor:
    global _POOL
    if _POOL is None or _POOL._max_workers < n:  # noqa: SLF001 - grow the shared pool when asked for more threads
        _POOL = ThreadPoolExecutor(max_workers=n, thread_name_prefix="wsim-launch")
    return _POOL


def shard_bounds(dim: int, threads: int, min_shard: int = MIN_SHARD) -> list[int]:
    """Bounds of the shards a CPU launch of ``dim`` work items on ``threads`` threads takes in turn: largest first,
    each round of ``threads`` shards half of what is left, none under ``min_shard`` items (the last may be).

    Threads take the next shard as they finish one, so the work is balanced up to the last, smallest shards: with
    equal shards (eight a thread) one thread often finished a whole shard after the other, and the rays of one
    shard can cost several times another's (measured, a street lidar fan on two threads: the threads ended 1-2 ms
    apart in a trace of 8-9 ms; halving shards: 9 % faster).
    """
    bounds = [0]
    while bounds[-1] < dim:
        rest = dim - bounds[-1]
        step = max(min_shard, -(-rest // (2 * threads)))
        for _ in range(threads):
            if bounds[-1] < dim:
                bounds.append(min(dim, bounds[-1] + step))
    return bounds


def launch(kernel: Any, dim: int, inputs: list, outputs: list, *, device: Any, threads: int | None = None,
           min_shard: int = MIN_SHARD) -> None:
    """Launch a 1-D kernel whose second-to-last input is an ``offset: int`` added to ``wp.tid()``.

    Args:
        kernel: A ``@wp.kernel`` taking ``(..., offset, *outputs)``: pass ``inputs`` without the offset.
        dim: Number of work items.
        inputs: Kernel inputs before the offset argument.
        outputs: Kernel arguments after the offset argument.
        device: Warp device.
        threads: CPU threads (default :func:`cpu_threads`); ignored on CUDA, where one launch is made.
        min_shard: Fewest work items a CPU shard gets (smaller for kernels whose items are heavy, such as packets
            of many rays).
    """
    if dim <= 0:
        return
    check_cancelled()
    is_cancelled = getattr(_local, "is_cancelled", None)
    dev = wp.get_device(device)
    n = 1 if dev.is_cuda else (threads or cpu_threads())
    if n <= 1 or dim < 2 * min_shard:
        wp.launch(kernel, dim=dim, inputs=[*inputs, 0], outputs=outputs, device=dev)
        return
    bounds = shard_bounds(dim, n, min_shard)
    shards = len(bounds) - 1
    # compile/load once on this thread before fanning out
    wp.load_module(kernel.module, device=dev)

    stopped = threading.Event()
    taken = itertools.count()  # the next shard to run (next() on it is atomic under the GIL)
    offset_index = len(inputs)

    def work() -> None:
        # each thread packs the arguments once (a recorded launch) and replays it for every shard it takes with
        # the shard's size and offset: packing costs tens of microseconds a launch, a replay a few
        cmd = None
        while (k := next(taken)) < shards:
            if stopped.is_set() or (is_cancelled is not None and is_cancelled()):
                stopped.set()
                return
            a, b = bounds[k], bounds[k + 1]
            if b <= a:
                continue
            if cmd is None:
                cmd = wp.launch(kernel, dim=b - a, inputs=[*inputs, a], outputs=outputs, device=dev, record_cmd=True)
            else:
                cmd.set_dim(b - a)
                cmd.set_param_at_index(offset_index, a)
            cmd.launch()

    list(_pool(n).map(lambda _: work(), range(n)))
    if stopped.is_set():
        raise Cancelled("cancelled between launch shards")


def init_warp(verbose: bool = False) -> None:
    """Initialise Warp. Quiet (the default): no start-up banner, no module-load lines, and no "Could not find or load
    the NVIDIA CUDA driver" warning on a machine without one; Warp's own warnings and errors still show. ``verbose``
    keeps Warp's default output."""
    import sys
    import tempfile

    if verbose:
        wp.config.log_level = wp.LOG_INFO
        wp.init()
        return
    wp.config.log_level = wp.LOG_WARNING  # banner and "Module ... load on device" lines are info messages
    # Warp's native library prints the missing-driver warning with fprintf(stderr) while wp.init() loads it: catch what
    # reaches file descriptor 2 during the call and pass on everything but that line.
    sys.stderr.flush()
    try:
        saved = os.dup(2)
    except OSError:
        wp.init()
        return
    with tempfile.TemporaryFile() as tmp:
        os.dup2(tmp.fileno(), 2)
        try:
            wp.init()
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
        tmp.seek(0)
        text = tmp.read().decode(errors="replace")
    rest = [line for line in text.splitlines(keepends=True)
            if "Could not find or load the NVIDIA CUDA driver" not in line]
    if rest:
        sys.stderr.write("".join(rest))
        sys.stderr.flush()
