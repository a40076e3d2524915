"""Kiln's activator: holds the requests of a service at zero until a warmed-up pod exists.

Why it exists: with ``autoscaling.minReplicas: 0`` a service's Service points at the activator
while no pod of it is ready. The activator holds each HTTP and gRPC request (bounded per
service in count and bytes, each with a deadline), tells the operator how many it holds (the
autoscaler, the only writer of replicas, wakes the service from that), and releases them to the
first pod the operator reports as ready, i.e. one that passed its warm-up gate: a held request
is never answered by a cold pod. Started by ``python -m kiln_runtime.activator`` from the
runtime image; it reuses the runtime's HTTP/1.1 and HTTP/2 servers (``kiln_runtime.protocol``).
docs/scale-to-zero.md explains it.
"""
