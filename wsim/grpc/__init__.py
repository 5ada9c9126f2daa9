"""wsim's sensorsim gRPC server: a drop-in renderer for AlpaSim and other NuRec sensorsim clients.

- :class:`SensorsimServer` / :func:`serve` (``wsim serve``) — the server.
- :class:`SensorsimServicer` — the RPC implementations (protobuf ⇄ wsim translation).
- :mod:`wsim.grpc.stubs` — generated messages and stubs (``sensorsim_pb2``, ``common_pb2``, ``egodriver_pb2`` …);
  regenerate with ``python -m wsim.grpc.codegen``.
- :func:`channel_options` — 64 MiB send/receive options for clients.

Protobuf types do not leave this package.
"""

from __future__ import annotations

from typing import Any

__all__ = ["SensorsimServer", "SensorsimServicer", "channel_options", "serve"]


def __getattr__(name: str) -> Any:  # lazy: importing wsim.grpc.stubs must not start a server's dependencies
    if name in ("SensorsimServer", "serve", "channel_options"):
        from . import server

        return getattr(server, name)
    if name == "SensorsimServicer":
        from .service import SensorsimServicer

        return SensorsimServicer
    raise AttributeError(name)
