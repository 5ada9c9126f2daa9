"""Running a plan: the manifest decides what is left, a backend runs :func:`wsim.dataset.render.render_shard` on it.

Backends, one code path (a function run per shard):
- **in-process** (``workers=0``): this process renders the shards one after the other.
- **local workers** (default): ``workers`` processes (multiprocessing, spawn), each with ``WSIM_NUM_THREADS`` =
  ``threads`` so workers × threads ≤ cores; a worker keeps its scene loaded and is given shards of that scene first.
  A worker that dies (crash, ``os._exit``, killed) loses only its current shard: it is retried on a new worker.
- **Ray** (``ray=...``): one Ray task per shard (``num_cpus`` = ``threads``): ``"auto"`` starts a local Ray instance
  with the cores of this machine, any other value is a cluster address (``ray://host:10001``, ``host:6379``); when
  Ray is already initialised in this process, its connection is used as it is.

A shard that fails (an exception, a dead worker or Ray task) is tried again up to ``retries`` more times, then
recorded as failed; rerunning the same command renders only the shards that are not finished.
"""

from __future__ import annotations

import fcntl
import os
import sys
import time
import traceback
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from .manifest import Manifest
from .plan import Plan, ShardTask, plan_dataset
from .spec import DatasetSpec, load_spec, spec_to_dict

LOCK = ".wsim-dataset.lock"


def local_cores() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # pragma: no cover - non-Linux
        return max(1, os.cpu_count() or 1)


@dataclass
class DatasetSummary:
    """What a run did. ``failures``: (shard id, one-line error) per shard that failed after its retries."""

    out: str
    backend: str
    shards: int = 0
    rendered: int = 0
    skipped: int = 0
    frames: int = 0
    points: int = 0
    images: int = 0
    seconds: float = 0.0
    retried: int = 0
    failures: list[tuple[str, str]] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.failures

    def lines(self) -> list[str]:
        rate = self.frames / self.seconds if self.seconds > 0 else 0.0
        out = [
            f"dataset          {self.out} (manifest.json)",
            f"shards           {self.shards}: {self.rendered} rendered, {self.skipped} finished before, "
            f"{len(self.failures)} failed{f', {self.retried} retried' if self.retried else ''}",
            f"frames           {self.frames:,} rendered: {self.points:,} lidar points, {self.images:,} images",
            f"time             {self.seconds:.1f} s ({rate:.2f} frames/s) on {self.backend}" if self.rendered or
            self.failures else f"time             {self.seconds:.1f} s: nothing left to render",
        ]
        out += [f"failed           {sid}: {err}" for sid, err in self.failures]
        return out


def _one_line(text: str, limit: int = 300) -> str:
    s = "; ".join(x.strip() for x in str(text).strip().splitlines() if x.strip())
    return s if len(s) <= limit else s[:limit - 3] + "..."


def _error_text(e: BaseException) -> str:
    return _one_line(f"{type(e).__name__}: {e}")


# ---------------------------------------------------------------------------------------------------------------------
# progress


class _Progress:
    def __init__(self, plan_frames: int, shards: int, enabled: bool) -> None:
        from tqdm import tqdm

        self.bar = tqdm(total=plan_frames, desc="wsim dataset", unit="frame", disable=not enabled, smoothing=0.1,
                        dynamic_ncols=True)
        self.shards, self.done, self.failed = shards, 0, 0
        self._post()

    def _post(self) -> None:
        self.bar.set_postfix_str(f"shards {self.done}/{self.shards}" + (f", {self.failed} failed" if self.failed
                                                                        else ""), refresh=False)

    def frames(self, n: int) -> None:
        self.bar.update(n)

    def shard(self, ok: bool) -> None:
        if ok:
            self.done += 1
        else:
            self.failed += 1
        self._post()
        self.bar.refresh()

    def close(self) -> None:
        self.bar.close()


# ---------------------------------------------------------------------------------------------------------------------
# backends: each calls on_frames(task, n_frames), on_done(task, result, attempts), on_fail(task, error, attempts)


class _Attempts:
    def __init__(self, retries: int) -> None:
        self.retries = retries
        self.count: dict[str, int] = {}
        self.errors: dict[str, list[str]] = {}  # shard id -> the errors of its failed attempts, in order
        self.retried = 0

    def next(self, task: ShardTask) -> int:
        self.count[task.shard_id] = self.count.get(task.shard_id, 0) + 1
        return self.count[task.shard_id]

    def again(self, task: ShardTask, error: str) -> bool:
        """Whether a shard whose attempt failed with ``error`` is tried again (the error is kept either way)."""
        self.errors.setdefault(task.shard_id, []).append(error)
        ok = self.count.get(task.shard_id, 0) <= self.retries
        self.retried += ok
        return ok


def _run_in_process(tasks: list[ShardTask], root: Path, threads: int | None, att: _Attempts, cb: dict,
                    verbose: bool) -> None:
    from .render import init_worker, render_shard

    saved = os.environ.get("WSIM_NUM_THREADS")
    init_worker(threads, verbose)
    try:
        queue = deque(tasks)
        while queue:
            task = queue.popleft()
            n = att.next(task)
            seen = [0]

            def frame(_pts: int, _imgs: int, task=task, seen=seen) -> None:
                seen[0] += 1
                cb["frames"](task, 1)

            try:
                result = render_shard(task, root, progress=frame)
            except Exception as e:  # noqa: BLE001 - a shard's failure is recorded, the run goes on
                cb["frames"](task, -seen[0])
                if att.again(task, _error_text(e)):
                    queue.appendleft(task)
                else:
                    cb["fail"](task, _error_text(e), n)
                continue
            cb["done"](task, result, n)
    finally:
        if threads:
            if saved is None:
                os.environ.pop("WSIM_NUM_THREADS", None)
            else:
                os.environ["WSIM_NUM_THREADS"] = saved


def _worker_main(conn: Any, threads: int | None, verbose: bool) -> None:
    """A local worker process: render the shards the driver sends until it sends "stop" (or goes away)."""
    from .render import init_worker, render_shard

    init_worker(threads, verbose)
    while True:
        try:
            msg = conn.recv()
        except (EOFError, OSError):
            return
        if msg[0] == "stop":
            return
        _, task, root = msg
        try:
            result = render_shard(task, root, progress=lambda p, i: conn.send(("frame", p, i)), may_crash=True)
        except Exception as e:  # noqa: BLE001 - reported to the driver
            conn.send(("error", _error_text(e), traceback.format_exc(limit=3)))
            continue
        conn.send(("done", result))


class _Worker:
    def __init__(self, ctx: Any, threads: int | None, verbose: bool) -> None:
        self.conn, child = ctx.Pipe(duplex=True)
        self.proc = ctx.Process(target=_worker_main, args=(child, threads, verbose), daemon=True,
                                name="wsim-dataset-worker")
        self.proc.start()
        child.close()
        self.task: ShardTask | None = None
        self.scene: str | None = None
        self.frames = 0
        self.attempt = 0


def _run_local(tasks: list[ShardTask], root: Path, workers: int, threads: int | None, att: _Attempts, cb: dict,
               verbose: bool) -> None:
    import multiprocessing as mp
    from multiprocessing.connection import wait

    ctx = mp.get_context("spawn")
    queue = deque(tasks)
    pool: list[_Worker] = []

    def take(w: _Worker) -> ShardTask | None:
        for i, t in enumerate(queue):  # a shard of the scene this worker holds, else the next one
            if t.scene_source == w.scene:
                del queue[i]
                return t
        return queue.popleft() if queue else None

    def failed(w: _Worker, error: str) -> None:
        task, w.task = w.task, None
        cb["frames"](task, -w.frames)
        if att.again(task, error):
            queue.appendleft(task)
        else:
            cb["fail"](task, error, w.attempt)

    def handle(w: _Worker, msg: tuple) -> None:
        if msg[0] == "frame":
            w.frames += 1
            cb["frames"](w.task, 1)
        elif msg[0] == "done":
            task, w.task = w.task, None
            cb["done"](task, msg[1], w.attempt)
        elif msg[0] == "error":
            failed(w, msg[1])

    try:
        while queue or any(w.task for w in pool):
            while len(pool) < min(workers, len(queue) + sum(1 for w in pool if w.task)):
                pool.append(_Worker(ctx, threads, verbose))
            for w in pool:
                if w.task is None and queue:
                    w.task = take(w)
                    w.scene, w.frames, w.attempt = w.task.scene_source, 0, att.next(w.task)
                    w.conn.send(("task", w.task, str(root)))
            busy = [w for w in pool if w.task is not None]
            if not busy:
                continue
            ready = set(wait([w.conn for w in busy] + [w.proc.sentinel for w in busy]))
            for w in busy:
                if w.conn in ready:
                    try:
                        handle(w, w.conn.recv())
                    except (EOFError, OSError):
                        pass  # the process is gone: its sentinel says so
                if w.proc.sentinel in ready or not w.proc.is_alive():
                    try:
                        while w.conn.poll():  # what it sent before it died
                            handle(w, w.conn.recv())
                    except (EOFError, OSError):
                        pass
                    w.proc.join(1.0)
                    if w.task is not None:
                        code = w.proc.exitcode
                        failed(w, f"worker process died (exit code {code}) while rendering it")
                    pool.remove(w)
    finally:
        for w in pool:
            try:
                w.conn.send(("stop",))
            except (OSError, ValueError):
                pass
        for w in pool:
            w.proc.join(5.0)
            if w.proc.is_alive():
                w.proc.terminate()
                w.proc.join(1.0)


def _ray_task(task: ShardTask, root: str, threads: int, verbose: bool) -> dict[str, Any]:
    from .render import init_worker, render_shard

    init_worker(threads, verbose)
    return render_shard(task, root, may_crash=True)


def _run_ray(tasks: list[ShardTask], root: Path, address: str | None, threads: int | None, att: _Attempts, cb: dict,
             verbose: bool, info: dict) -> None:
    try:
        import ray
    except ImportError:
        raise ValueError("--ray: Ray is not installed; pip install 'wsim[ray]'") from None
    started = False
    if not ray.is_initialized():
        kw: dict[str, Any] = {"logging_level": "INFO" if verbose else "ERROR", "log_to_driver": verbose}
        if address in (None, "", "auto", "local"):
            ray.init(address="local", num_cpus=local_cores(), include_dashboard=False, **kw)
        else:
            ray.init(address=address, **kw)
        started = True
    try:
        cpus = int(ray.cluster_resources().get("CPU", 1))
        node_cpus = max([int(n.get("Resources", {}).get("CPU", 0)) for n in ray.nodes() if n.get("Alive")] or [1])
        if threads is None:
            threads = max(1, min(node_cpus, cpus // max(1, min(cpus, len(tasks)))))
        info["backend"] = f"Ray ({cpus} CPUs, {threads} thread{'s' * (threads > 1)} per task)"
        remote = ray.remote(_ray_task).options(num_cpus=threads, max_retries=0)
        inflight: dict[Any, tuple[ShardTask, int]] = {}

        def submit(task: ShardTask) -> None:
            inflight[remote.remote(task, str(root), threads, verbose)] = (task, att.next(task))

        for t in tasks:
            submit(t)
        while inflight:
            done, _ = ray.wait(list(inflight), num_returns=1)
            for ref in done:
                task, n = inflight.pop(ref)
                try:
                    result = ray.get(ref)
                except Exception as e:  # noqa: BLE001 - RayTaskError (an exception in the task), a crashed worker
                    cause = getattr(e, "cause", None)
                    error = (_error_text(cause) if cause is not None else
                             _one_line(f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"))
                    if att.again(task, error):
                        submit(task)
                    else:
                        cb["fail"](task, error, n)
                    continue
                cb["frames"](task, task.num_frames)
                cb["done"](task, result, n)
    finally:
        if started:
            ray.shutdown()


# ---------------------------------------------------------------------------------------------------------------------
# the run


def run_dataset(spec: DatasetSpec | str | os.PathLike, out: str | os.PathLike, *, workers: int | None = None,
                threads: int | None = None, ray: str | None = None, retries: int = 2, progress: bool = True,
                device: str | None = None, verbose: bool = False, plan: Plan | None = None) -> DatasetSummary:
    """Render a dataset (see README "Datasets").

    Args:
        spec: A parsed spec or the path of a YAML spec.
        out: Dataset folder (created; a rerun into the same folder renders only what is not finished).
        workers: Local worker processes (default: the cores, at most one per shard left); 0 renders in this process.
        threads: CPU threads per worker or Ray task (default: cores / workers locally; for Ray, the CPUs per shard).
        ray: None for local workers; "auto" starts a local Ray instance; else a Ray cluster address.
        retries: Further attempts of a shard that failed (a crash or an exception) before it counts as failed.
        progress: Show a progress bar (stderr).
        device: Warp device (overrides the spec's ``device``).
        verbose: Warp's and Ray's own messages.
        plan: A plan made already by :func:`wsim.dataset.plan_dataset` of ``spec``.

    Returns:
        A :class:`DatasetSummary`; its ``failures`` list the shards that failed (the rest is written and recorded).

    Raises:
        SpecError: A bad spec (names the field).
        ValueError: Bad options, another run holding the folder, a foreign manifest.
    """
    if not isinstance(spec, DatasetSpec):
        spec = load_spec(spec)
    if device is not None:
        import dataclasses

        spec = dataclasses.replace(spec, device=device)
    if workers is not None and workers < 0:
        raise ValueError(f"--workers {workers}: must be >= 0 (0 renders in this process)")
    if threads is not None and threads < 1:
        raise ValueError(f"--threads {threads}: must be >= 1")
    if retries < 0:
        raise ValueError(f"--retries {retries}: must be >= 0")
    plan = plan or plan_dataset(spec)
    root = Path(out)
    root.mkdir(parents=True, exist_ok=True)
    lock = open(root / LOCK, "w")
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        lock.close()
        raise ValueError(f"--out {out}: another wsim dataset run is writing this folder") from None
    try:
        return _run(plan, root, workers, threads, ray, retries, progress, verbose)
    finally:
        fcntl.flock(lock, fcntl.LOCK_UN)
        lock.close()


def _run(plan: Plan, root: Path, workers: int | None, threads: int | None, ray: str | None, retries: int,
         progress: bool, verbose: bool) -> DatasetSummary:
    from .. import __version__

    t0 = time.perf_counter()
    manifest = Manifest.load(root)
    manifest.data.update({"format": manifest.data.get("format"), "wsim_version": __version__, "name": plan.spec.name,
                          "spec_file": plan.spec.path, "spec": spec_to_dict(plan.spec), "scenes": plan.scenes})
    pending = [s for s in plan.shards if not manifest.is_done(s)]
    summary = DatasetSummary(out=str(root), backend="", shards=len(plan.shards),
                             skipped=len(plan.shards) - len(pending))
    # entries of shards the spec no longer has are dropped (their files stay)
    keep = {s.shard_id for s in plan.shards}
    for sid in [k for k in manifest.shards if k not in keep]:
        del manifest.shards[sid]
    manifest.save()
    cores = local_cores()
    info: dict[str, str] = {}
    n_workers = min(cores if workers is None else workers, len(pending))
    if ray is None and workers == 0:
        info["backend"] = f"this process ({threads or cores} thread{'s' * ((threads or cores) > 1)})"
    elif ray is None and n_workers:
        threads = threads or max(1, cores // n_workers)
        info["backend"] = f"{n_workers} local worker{'s' * (n_workers > 1)} x {threads} thread{'s' * (threads > 1)}"
    bar = _Progress(sum(s.num_frames for s in pending), len(pending), progress and bool(pending))
    att = _Attempts(retries)

    def on_frames(task: ShardTask, n: int) -> None:
        bar.frames(n)

    def on_done(task: ShardTask, result: dict, attempts: int) -> None:
        manifest.record(task, "done", attempts=attempts, result=result, retried_after=att.errors.get(task.shard_id))
        manifest.save()
        summary.rendered += 1
        summary.frames += result["frames"]
        summary.points += result["points"]
        summary.images += result["images"]
        bar.shard(True)

    def on_fail(task: ShardTask, error: str, attempts: int) -> None:
        manifest.record(task, "failed", attempts=attempts, error=error,
                        retried_after=att.errors.get(task.shard_id, [])[:-1])
        manifest.save()
        summary.failures.append((task.shard_id, error))
        bar.shard(False)

    cb: dict[str, Callable] = {"frames": on_frames, "done": on_done, "fail": on_fail}
    try:
        if pending:
            if ray is not None:
                _run_ray(pending, root, ray, threads, att, cb, verbose, info)
            elif workers == 0:
                _run_in_process(pending, root, threads, att, cb, verbose)
            else:
                _run_local(pending, root, n_workers, threads, att, cb, verbose)
    finally:
        bar.close()
    summary.backend = info.get("backend", "nothing to render" if not pending else "Ray")
    summary.retried = att.retried
    summary.seconds = time.perf_counter() - t0
    return summary


def print_summary(summary: DatasetSummary, file: Any = None) -> None:
    print("\n".join(summary.lines()), file=file or sys.stdout)


__all__ = ["DatasetSummary", "print_summary", "run_dataset"]
