"""A lean HTTP/2 server connection (RFC 9113) for gRPC's exchanges, unary ones first.

Why not grpcio's server: on one core it answers at most 3,000-3,500 empty calls per second
(``bench/grpc_floor.py``), less than the runtime's HTTP/1.1 path answers with a model behind
it. This connection is an asyncio protocol like ``httpserver``: it parses frames in place,
decodes headers with ``hpack``, hands each complete request to a handler, and writes each
answer (headers, data, trailers) in one write. It keeps what an HTTP/2 peer relies on: the
SETTINGS exchange, flow control in both directions (a response larger than the client's window
waits for its WINDOW_UPDATE), PING, RST_STREAM (the request's task is cancelled), a stream
limit, GOAWAY on shutdown and on protocol errors (and a graceful drain, GOAWAY, PING and the
final GOAWAY, at a connection's maximum age), the request checks of RFC 9113 8.2-8.3 (h2spec
passes in full). It serves prior-knowledge cleartext HTTP/2 (``h2c``), which is what gRPC
clients speak without TLS. Streamed calls (``Streaming``: health Watch, reflection) are handed
on from their headers, their body as it arrives, and may send data before their end.

Every input is bounded (``config.Http2Limits``): connections per port (with a budget kept for
health checks, so the kubelet's gRPC probe is always served), the header list (a list
over the limit fails its own stream, not the connection), memory held per connection and per
process for request bodies and unsent responses, the time a preface, a header block, a body
or an idle connection may take, and flood budgets for resets, empty frames and control
frames, which end in GOAWAY ENHANCE_YOUR_CALM as Go, nginx and Envoy do. Memory stays within
the budgets through flow control: the connection's receive window is reopened only as
buffered requests are consumed (answered); answers the client does not take (its window
closed, or its TCP not read: ``pause_writing``) are held within the budget while no new call
starts (and, with its TCP unread, its socket is not read either).

Out of scope, because gRPC never needs them: server push, priorities (checked, then ignored, as
RFC 9113 allows), HTTP/1.1 upgrade.

The package, read bottom up (each module's docstring says why it exists):

- ``wire``: the wire format, RFC 9113's constants and ``frame``.
- ``settings``: what this server announces (its SETTINGS, the windows it grants).
- ``messages``: ``Request``, ``Response`` and ``Handler``, the boundary with ``grpcserver``;
  which requests are malformed.
- ``budgets``: the memory budget shared by a port's connections, the per-connection flood
  budgets.
- ``state``, ``answering``, ``receiving``, ``connection``: the connection, one class in four
  layers (state and memory; answers out; frames in; the asyncio protocol, timeouts and
  shutdown), ``connection.Http2Connection`` on top.
"""
