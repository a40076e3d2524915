"""Kiln's model runtime: one data plane served over the Open Inference Protocol (v2).

Every Kiln pod runs this package. REST and gRPC are thin adapters (``protocol/``) over one
``DataPlane``; a ``DynamicBatcher`` turns single requests into batches for the ``ModelRunner``.
"""

__version__ = "0.1.0"
