"""Generated protobuf / gRPC stubs of the sensorsim, egodriver and common packages (``python -m wsim.grpc.codegen``).

Import the modules directly: ``from wsim.grpc.stubs import sensorsim_pb2, sensorsim_pb2_grpc``. Their descriptors
live in the private pool :data:`POOL`, so they coexist with AlpaSim's ``alpasim_grpc`` stubs in one process.
"""

from ._pool import POOL

__all__ = ["POOL"]
