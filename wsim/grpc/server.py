"""The sensorsim gRPC server: ``wsim serve`` and :class:`SensorsimServer` for embedding (tests, examples)."""

from __future__ import annotations

import logging
import signal
import threading
from concurrent import futures
from pathlib import Path

import grpc

from .budget import RequestBudget
from .scenes import SceneStore, discover
from .service import API_VERSION, MAX_MESSAGE_BYTES, SensorsimServicer
from .stubs import sensorsim_pb2_grpc

log = logging.getLogger("wsim.grpc")

#: Seconds in-flight requests get to finish on shut_down / SIGTERM / SIGINT (a second signal stops at once).
SHUTDOWN_GRACE_S = 30.0


def is_loopback(host: str) -> bool:
    """Whether ``host`` (a bind address or name) is a loopback address."""
    import ipaddress

    if host in ("localhost", "ip6-localhost"):
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def channel_options(max_message_bytes: int = MAX_MESSAGE_BYTES) -> list[tuple[str, int]]:
    """gRPC channel / server options for ``max_message_bytes`` messages each way (AlpaSim uses 64 MiB)."""
    return [("grpc.max_send_message_length", max_message_bytes),
            ("grpc.max_receive_message_length", max_message_bytes)]


class _Recorder:
    """Stands in for a grpc.Server to collect the generated code's handlers."""

    def __init__(self) -> None:
        self.handlers: list = []

    def add_generic_rpc_handlers(self, handlers) -> None:
        self.handlers.extend(handlers)

    def add_registered_method_handlers(self, service, handlers) -> None:  # newer generated code also calls this
        pass


class _ParseInHandler(grpc.GenericRpcHandler):
    """The generated handlers with request parsing moved inside the handler: a request whose bytes do not parse is
    answered INVALID_ARGUMENT (grpcio's own deserialisation would answer INTERNAL)."""

    def __init__(self, inner: grpc.GenericRpcHandler) -> None:
        self.inner = inner
        self._cache: dict[str, object] = {}
        self._lock = threading.Lock()

    def service(self, details):
        with self._lock:
            if details.method in self._cache:
                return self._cache[details.method]
        h = self.inner.service(details)
        if h is not None and h.request_deserializer is not None and h.unary_unary is not None:
            parse, fn = h.request_deserializer, h.unary_unary

            def call(raw: bytes, context, parse=parse, fn=fn):
                try:
                    request = parse(raw)
                except Exception as e:  # noqa: BLE001 - DecodeError, bad UTF-8 in a string field, ...
                    context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                                  f"request: the bytes are not a valid request message ({type(e).__name__})")
                return fn(request, context)

            h = h._replace(request_deserializer=None, unary_unary=call)
        with self._lock:
            self._cache[details.method] = h
        return h


def _parsing_handlers(servicer) -> tuple:
    rec = _Recorder()
    sensorsim_pb2_grpc.add_SensorsimServiceServicer_to_server(servicer, rec)
    return tuple(_ParseInHandler(h) for h in rec.handlers)


class SensorsimServer:
    """A sensorsim server on ``host:port``.

    Args:
        scenes: Scene folder, glob or file (USD stages, NuRec USDZ artifacts); None for the built-in scene.
        host: Address to bind (default loopback).
        port: Port (0 picks a free one; see :attr:`port` after :meth:`start`).
        device: Warp device ("cpu", "cuda:0"; default Warp's default device).
        cache_size: Scenes kept resident (LRU).
        max_workers: Threads serving requests concurrently.
        ego_masks_dir: Folder of ego masks (``<rig_config_id>/<camera_logical_id>.png``).
        assets_dir: Folder of asset stages for edit_assets.
        max_message_bytes: Send / receive limit.
        api_version: (major, minor, patch) reported by get_version.
        unknown_tracks: ``"error"`` (a ``dynamic_objects`` entry naming a track the scene lacks answers NOT_FOUND) or
            ``"ignore"`` (warn once per id and render without it).
        budget: Work one request may ask for (:class:`~wsim.grpc.budget.RequestBudget`).
        allow_remote_shutdown: Accept the shut_down RPC from clients that are not on this machine (loopback clients
            may always shut the server down).
        shutdown_grace_s: Seconds in-flight requests get to finish on shut_down or the first SIGTERM / SIGINT.
    """

    def __init__(self, scenes: str | Path | None = None, *, host: str = "127.0.0.1", port: int = 6001,
                 device: str | None = None, cache_size: int = 4, max_workers: int = 4,
                 ego_masks_dir: str | Path | None = None, assets_dir: str | Path | None = None,
                 max_message_bytes: int = MAX_MESSAGE_BYTES,
                 api_version: tuple[int, int, int] = API_VERSION, unknown_tracks: str = "error",
                 budget: RequestBudget | None = None, allow_remote_shutdown: bool = False,
                 shutdown_grace_s: float = SHUTDOWN_GRACE_S) -> None:
        import warp as wp

        wp.init()
        self.shutdown_grace_s = float(shutdown_grace_s)
        self.device = str(wp.get_device(device))
        self.store = SceneStore(discover(None if scenes is None else str(scenes)), cache_size, self.device)
        self.host = host
        self.port = int(port)
        self.servicer = SensorsimServicer(self.store, device=self.device, ego_masks_dir=ego_masks_dir,
                                          assets_dir=assets_dir, max_message_bytes=max_message_bytes,
                                          max_workers=max_workers, api_version=api_version,
                                          on_shutdown=self.shutdown, unknown_tracks=unknown_tracks, budget=budget,
                                          allow_remote_shutdown=allow_remote_shutdown)
        # no SO_REUSEPORT: a second server on a port in use fails instead of silently sharing it
        self._server = grpc.server(futures.ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="wsim-rpc"),
                                   options=channel_options(max_message_bytes) + [("grpc.so_reuseport", 0)])
        self._server.add_generic_rpc_handlers(_parsing_handlers(self.servicer))
        self._stopped = threading.Event()
        self._stop_lock = threading.Lock()
        self._stopping = False

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    def start(self) -> int:
        """Bind and start serving; returns the port."""
        try:
            bound = self._server.add_insecure_port(f"{self.host}:{self.port}")
        except RuntimeError:  # current grpcio raises where older releases returned 0
            bound = 0
        if bound == 0:
            raise OSError(f"cannot bind {self.host}:{self.port}: address in use or not available")
        self.port = bound
        self._server.start()
        if not is_loopback(self.host):
            log.warning("listening on %s, reachable from other machines: the sensorsim API has no authentication",
                        self.address)
        return bound

    def preload(self) -> None:
        """Load every scene the cache holds (the first ``cache_size``) and build its geometry."""
        for sid in self.store.scene_ids[: self.store.cache_size]:
            self.store.get(sid)

    def warm_up(self) -> float:
        """Preload the resident scenes and render each of their cameras and both lidar types once, small, so that
        every kernel a request needs is compiled or loaded (:mod:`wsim.grpc.warmup`); returns the time taken [s]."""
        from .warmup import warm_up

        return warm_up(self.servicer, self.store.scene_ids[: self.store.cache_size])

    def shutdown(self, grace: float | None = None) -> None:
        """Stop accepting requests, let in-flight ones finish (up to ``grace`` s, default ``shutdown_grace_s``), then
        stop. A second call while the first is waiting cancels the requests still running and stops at once."""
        with self._stop_lock:
            again = self._stopping
            self._stopping = True
        if self._stopped.is_set():
            return
        if again:
            log.info("stopping now: cancelling in-flight requests")
            self._server.stop(None)
            return
        grace = self.shutdown_grace_s if grace is None else grace
        log.info("shutting down (in-flight requests get %s s)", grace)
        self._server.stop(grace).wait()
        self._stopped.set()

    stop = shutdown

    def wait(self, timeout: float | None = None) -> bool:
        """Block until the server has stopped (True) or ``timeout`` s passed (False)."""
        return self._stopped.wait(timeout)

    def __enter__(self) -> SensorsimServer:
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.shutdown(grace=1.0)


def serve(scenes: str | None = None, *, warm_up: bool = True, **server_options) -> int:
    """Run a server until shut_down or SIGTERM / SIGINT: the first signal lets in-flight requests finish (up to
    ``shutdown_grace_s``), a second one stops at once.

    With ``warm_up`` (the default) the resident scenes are loaded and every render path is run once before the server
    binds its port, so the first request is as fast as later ones (:meth:`SensorsimServer.warm_up`).

    Args:
        scenes: As :class:`SensorsimServer`.
        warm_up: Warm up before listening.
        **server_options: Keyword arguments of :class:`SensorsimServer`.
    """
    server = SensorsimServer(scenes, **server_options)
    if warm_up:
        seconds = server.warm_up()
        print(f"wsim serve: warmed up in {seconds:.1f} s (scenes loaded, camera and lidar kernels ready)", flush=True)
    server.start()
    print(f"wsim serve: listening on {server.address} ({server.device}); scenes: {', '.join(server.store.scene_ids)}",
          flush=True)

    def on_signal(signum, frame):  # noqa: ARG001
        threading.Thread(target=server.shutdown, name="wsim-signal-shutdown", daemon=True).start()

    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, on_signal)
        signal.signal(signal.SIGINT, on_signal)
    while not server.wait(0.5):
        pass
    return 0


def main(args) -> int:
    """``wsim serve`` (arguments parsed by :mod:`wsim.cli`)."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    api = API_VERSION
    if args.api_version:
        try:
            api = tuple(int(v) for v in args.api_version.split("."))
            assert len(api) == 3
        except (ValueError, AssertionError):
            raise ValueError(f"--api-version: expected MAJOR.MINOR.PATCH, got {args.api_version!r}") from None
    budget = RequestBudget(max_image_pixels=args.max_image_pixels, max_request_pixels=args.max_request_pixels,
                           max_images=args.max_images, max_lidar_sweeps=args.max_lidar_sweeps)
    return serve(args.scenes, host=args.host, port=args.port, device=args.device, cache_size=args.cache_size,
                 max_workers=args.max_workers, ego_masks_dir=args.ego_masks, assets_dir=args.assets, api_version=api,
                 warm_up=not args.no_warm_up, unknown_tracks=args.unknown_tracks, budget=budget,
                 allow_remote_shutdown=args.allow_remote_shutdown, shutdown_grace_s=args.shutdown_grace)
