"""Protocol adapters: REST and gRPC translate the wire to ``InferRequest``/``InferResponse``."""
