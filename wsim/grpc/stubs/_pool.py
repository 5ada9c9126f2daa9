"""The private descriptor pool of wsim's generated stubs (see :mod:`wsim.grpc.codegen`)."""

from google.protobuf import descriptor_pool

POOL = descriptor_pool.DescriptorPool()
