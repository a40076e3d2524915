"""A headless Service's DNS name, answered as cluster DNS would, for a client on this machine.

Why it exists: the documented fix for one long-lived gRPC client is `round_robin` over a
headless Service's pod addresses, which a client finds by DNS (`dns:///<name>.<ns>.svc...`).
The local cluster runs no cluster DNS, and this machine's resolver knows no cluster names. So
the pinning benchmark answers that one name itself, from the Service's EndpointSlices as CoreDNS
does (the ready pods' addresses, a short TTL), on a UDP port of 127.0.0.1; the client names the
server in its target (`dns://127.0.0.1:<port>/<name>:8001`) and otherwise resolves as it would
in a cluster: again whenever a connection ends (the runtime's maximum connection age).
"""

import socket
import struct
import threading
from collections.abc import Callable
from typing import Self

TYPE_A, CLASS_IN = 1, 1
TTL_SECONDS = 1
NO_ERROR, NAME_ERROR = 0, 3
HEADER = struct.Struct("!HHHHHH")


def _question(query: bytes) -> tuple[str, int, int]:
    """(lower-case name, qtype, offset after the question) of a query's first question."""
    labels, offset = [], HEADER.size
    while length := query[offset]:
        labels.append(query[offset + 1 : offset + 1 + length].decode("ascii").lower())
        offset += 1 + length
    (qtype,) = struct.unpack_from("!H", query, offset + 1)
    return ".".join(labels), qtype, offset + 5


def answer(query: bytes, name: str, addresses: Callable[[], list[str]]) -> bytes:
    """The response to one query: `addresses()` as A records for `name`, no record for its
    other types (an AAAA query), NXDOMAIN for any other name."""
    ident, flags = struct.unpack_from("!HH", query)
    asked, qtype, end = _question(query)
    known = asked == name.lower().rstrip(".")
    records = [
        struct.pack("!HHHIH", 0xC00C, TYPE_A, CLASS_IN, TTL_SECONDS, 4) + socket.inet_aton(ip)
        for ip in (addresses() if known and qtype == TYPE_A else [])
    ]
    # QR, AA, the query's RD, RA; the question echoed, then the answers.
    reply_flags = 0x8480 | (flags & 0x0100) | (NO_ERROR if known else NAME_ERROR)
    header = HEADER.pack(ident, reply_flags, 1, len(records), 0, 0)
    return header + query[HEADER.size : end] + b"".join(records)


class HeadlessDns:
    """Answers `name` with `addresses()` (read afresh for each query) on 127.0.0.1:`port`."""

    def __init__(self, name: str, addresses: Callable[[], list[str]]) -> None:
        self.name = name
        self._addresses = addresses
        self._socket = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self._socket.bind(("127.0.0.1", 0))
        self._socket.settimeout(0.5)
        self.port: int = self._socket.getsockname()[1]
        self.queries = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="headless-dns", daemon=True)

    def __enter__(self) -> Self:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self._socket.close()

    def target(self, port: int) -> str:
        """A gRPC target resolving `name` through this server."""
        return f"dns://127.0.0.1:{self.port}/{self.name}:{port}"

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                query, peer = self._socket.recvfrom(4096)
            except TimeoutError:
                continue
            self.queries += 1
            try:
                reply = answer(query, self.name, self._addresses)
            except (IndexError, UnicodeDecodeError, struct.error):
                continue  # not a query this server understands: no answer, as for a lost packet
            self._socket.sendto(reply, peer)
