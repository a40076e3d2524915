"""Protocol adapters: REST and gRPC translate the wire to ``InferRequest``/``InferResponse``.

Why it exists: the data plane is written once; each protocol only decodes, calls it and encodes,
over Kiln's own lean transports (``httpserver``; ``http2`` + ``hpack`` + ``grpcserver``) or
grpcio's server (``grpcio_server``).
"""
