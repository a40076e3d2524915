"""The real servers the fetcher is tested against, all on loopback, beside SeaweedFS
(``kiln_localcluster.objectstore``, shared with the end-to-end tests and the demo).

- ``CuttingProxy``: a TCP proxy in front of a server that cuts a connection once it has carried
  a given number of response bytes, ``cuts`` times: a connection dropped mid-download.
- ``https_file_server``: an HTTPS file server (TLS from a CA of the project's PKI helper) that
  honours Range requests.
"""

from __future__ import annotations

import contextlib
import datetime
import http.server
import socket
import ssl
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kiln_localcluster.pki import create_pki


class CuttingProxy:
    """Forwards loopback TCP to ``upstream``; the first ``cuts`` connections whose responses
    pass ``cut_after_bytes`` are closed there, mid-body."""

    def __init__(self, upstream_port: int, cut_after_bytes: int, cuts: int) -> None:
        self.upstream_port = upstream_port
        self.cut_after_bytes = cut_after_bytes
        self.cuts_left = cuts
        self.cuts_done = 0
        self._lock = threading.Lock()
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._listener.getsockname()[1]
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    def _accept(self) -> None:
        self._listener.settimeout(0.2)
        while not self._stopped.is_set():
            try:
                client, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            upstream = socket.create_connection(("127.0.0.1", self.upstream_port))
            threading.Thread(target=self._pipe, args=(client, upstream, False), daemon=True).start()
            threading.Thread(target=self._pipe, args=(upstream, client, True), daemon=True).start()

    def _pipe(self, source: socket.socket, sink: socket.socket, is_response: bool) -> None:
        carried = 0
        try:
            while True:
                data = source.recv(65536)
                if not data:
                    break
                if is_response and self._should_cut(carried, len(data)):
                    sink.sendall(data[: max(0, self.cut_after_bytes - carried)])
                    break
                sink.sendall(data)
                carried += len(data)
        except OSError:
            pass
        finally:
            for end in (source, sink):
                with contextlib.suppress(OSError):
                    end.shutdown(socket.SHUT_RDWR)
                end.close()

    def _should_cut(self, carried: int, incoming: int) -> bool:
        if carried + incoming <= self.cut_after_bytes:
            return False
        with self._lock:
            if self.cuts_left <= 0:
                return False
            self.cuts_left -= 1
            self.cuts_done += 1
            return True

    def close(self) -> None:
        self._stopped.set()
        self._listener.close()
        self._thread.join(timeout=2)


@dataclass
class HttpsServer:
    base_url: str
    ca_cert: Path
    requests: list[str]


class _RangeFileHandler(http.server.SimpleHTTPRequestHandler):
    """SimpleHTTPRequestHandler plus single ``bytes=N-`` ranges (what the fetcher resumes with)."""

    seen: list[str]

    def log_message(self, format: str, *args: Any) -> None:
        return

    def do_GET(self) -> None:
        self.seen.append(f"GET {self.path} {self.headers.get('Range', '')}".strip())
        header = self.headers.get("Range")
        path = Path(self.translate_path(self.path))
        if not header or not path.is_file():
            super().do_GET()
            return
        start = int(header.removeprefix("bytes=").split("-", 1)[0])
        data = path.read_bytes()
        self.send_response(206)
        self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
        self.send_header("Content-Length", str(len(data) - start))
        self.end_headers()
        self.wfile.write(data[start:])


class _QuietServer(http.server.ThreadingHTTPServer):
    """Connections the tests cut on purpose are not errors worth a traceback."""

    def handle_error(self, request: Any, client_address: Any) -> None:
        return


@contextlib.contextmanager
def https_file_server(root: Path, pki_dir: Path) -> Iterator[HttpsServer]:
    """Serve ``root`` over HTTPS on loopback with a certificate of a fresh local CA."""
    pki = create_pki(pki_dir, [], datetime.datetime.now(datetime.UTC))
    seen: list[str] = []
    handler = type(
        "Handler",
        (_RangeFileHandler,),
        {"seen": seen, "__init__": _bind_directory(root)},
    )
    httpd = _QuietServer(("127.0.0.1", 0), handler)
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(pki.serving_cert, pki.serving_key)
    httpd.socket = context.wrap_socket(httpd.socket, server_side=True)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield HttpsServer(f"https://127.0.0.1:{httpd.server_address[1]}", pki.ca_cert, seen)
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join(timeout=5)


def _bind_directory(root: Path) -> Any:
    def init(self: http.server.SimpleHTTPRequestHandler, *args: Any, **kwargs: Any) -> None:
        http.server.SimpleHTTPRequestHandler.__init__(self, *args, directory=str(root), **kwargs)

    return init
