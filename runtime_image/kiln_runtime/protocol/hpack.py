"""HPACK (RFC 7541): the header compression every HTTP/2 peer speaks, for the gRPC server.

The decoder is complete (static and dynamic tables, size updates, Huffman strings) because a
client may use any of it; it bounds the decoded header list so a small block cannot expand into
megabytes. The encoder writes literals without indexing (and fully indexed static entries):
responses then never depend on the peer's table, and the few header blocks a gRPC server sends
are built once and reused.
"""

from __future__ import annotations

import collections

# RFC 7541 Appendix A.
STATIC_TABLE: tuple[tuple[bytes, bytes], ...] = (
    (b":authority", b""),
    (b":method", b"GET"),
    (b":method", b"POST"),
    (b":path", b"/"),
    (b":path", b"/index.html"),
    (b":scheme", b"http"),
    (b":scheme", b"https"),
    (b":status", b"200"),
    (b":status", b"204"),
    (b":status", b"206"),
    (b":status", b"304"),
    (b":status", b"400"),
    (b":status", b"404"),
    (b":status", b"500"),
    (b"accept-charset", b""),
    (b"accept-encoding", b"gzip, deflate"),
    (b"accept-language", b""),
    (b"accept-ranges", b""),
    (b"accept", b""),
    (b"access-control-allow-origin", b""),
    (b"age", b""),
    (b"allow", b""),
    (b"authorization", b""),
    (b"cache-control", b""),
    (b"content-disposition", b""),
    (b"content-encoding", b""),
    (b"content-language", b""),
    (b"content-length", b""),
    (b"content-location", b""),
    (b"content-range", b""),
    (b"content-type", b""),
    (b"cookie", b""),
    (b"date", b""),
    (b"etag", b""),
    (b"expect", b""),
    (b"expires", b""),
    (b"from", b""),
    (b"host", b""),
    (b"if-match", b""),
    (b"if-modified-since", b""),
    (b"if-none-match", b""),
    (b"if-range", b""),
    (b"if-unmodified-since", b""),
    (b"last-modified", b""),
    (b"link", b""),
    (b"location", b""),
    (b"max-forwards", b""),
    (b"proxy-authenticate", b""),
    (b"proxy-authorization", b""),
    (b"range", b""),
    (b"referer", b""),
    (b"refresh", b""),
    (b"retry-after", b""),
    (b"server", b""),
    (b"set-cookie", b""),
    (b"strict-transport-security", b""),
    (b"transfer-encoding", b""),
    (b"user-agent", b""),
    (b"vary", b""),
    (b"via", b""),
    (b"www-authenticate", b""),
)

# RFC 7541 Appendix B: (code, bit length) of symbols 0..255 and of EOS (256).
HUFFMAN_CODES: tuple[tuple[int, int], ...] = (
    (0x1FF8, 13),
    (0x7FFFD8, 23),
    (0xFFFFFE2, 28),
    (0xFFFFFE3, 28),
    (0xFFFFFE4, 28),
    (0xFFFFFE5, 28),
    (0xFFFFFE6, 28),
    (0xFFFFFE7, 28),
    (0xFFFFFE8, 28),
    (0xFFFFEA, 24),
    (0x3FFFFFFC, 30),
    (0xFFFFFE9, 28),
    (0xFFFFFEA, 28),
    (0x3FFFFFFD, 30),
    (0xFFFFFEB, 28),
    (0xFFFFFEC, 28),
    (0xFFFFFED, 28),
    (0xFFFFFEE, 28),
    (0xFFFFFEF, 28),
    (0xFFFFFF0, 28),
    (0xFFFFFF1, 28),
    (0xFFFFFF2, 28),
    (0x3FFFFFFE, 30),
    (0xFFFFFF3, 28),
    (0xFFFFFF4, 28),
    (0xFFFFFF5, 28),
    (0xFFFFFF6, 28),
    (0xFFFFFF7, 28),
    (0xFFFFFF8, 28),
    (0xFFFFFF9, 28),
    (0xFFFFFFA, 28),
    (0xFFFFFFB, 28),
    (0x14, 6),
    (0x3F8, 10),
    (0x3F9, 10),
    (0xFFA, 12),
    (0x1FF9, 13),
    (0x15, 6),
    (0xF8, 8),
    (0x7FA, 11),
    (0x3FA, 10),
    (0x3FB, 10),
    (0xF9, 8),
    (0x7FB, 11),
    (0xFA, 8),
    (0x16, 6),
    (0x17, 6),
    (0x18, 6),
    (0x0, 5),
    (0x1, 5),
    (0x2, 5),
    (0x19, 6),
    (0x1A, 6),
    (0x1B, 6),
    (0x1C, 6),
    (0x1D, 6),
    (0x1E, 6),
    (0x1F, 6),
    (0x5C, 7),
    (0xFB, 8),
    (0x7FFC, 15),
    (0x20, 6),
    (0xFFB, 12),
    (0x3FC, 10),
    (0x1FFA, 13),
    (0x21, 6),
    (0x5D, 7),
    (0x5E, 7),
    (0x5F, 7),
    (0x60, 7),
    (0x61, 7),
    (0x62, 7),
    (0x63, 7),
    (0x64, 7),
    (0x65, 7),
    (0x66, 7),
    (0x67, 7),
    (0x68, 7),
    (0x69, 7),
    (0x6A, 7),
    (0x6B, 7),
    (0x6C, 7),
    (0x6D, 7),
    (0x6E, 7),
    (0x6F, 7),
    (0x70, 7),
    (0x71, 7),
    (0x72, 7),
    (0xFC, 8),
    (0x73, 7),
    (0xFD, 8),
    (0x1FFB, 13),
    (0x7FFF0, 19),
    (0x1FFC, 13),
    (0x3FFC, 14),
    (0x22, 6),
    (0x7FFD, 15),
    (0x3, 5),
    (0x23, 6),
    (0x4, 5),
    (0x24, 6),
    (0x5, 5),
    (0x25, 6),
    (0x26, 6),
    (0x27, 6),
    (0x6, 5),
    (0x74, 7),
    (0x75, 7),
    (0x28, 6),
    (0x29, 6),
    (0x2A, 6),
    (0x7, 5),
    (0x2B, 6),
    (0x76, 7),
    (0x2C, 6),
    (0x8, 5),
    (0x9, 5),
    (0x2D, 6),
    (0x77, 7),
    (0x78, 7),
    (0x79, 7),
    (0x7A, 7),
    (0x7B, 7),
    (0x7FFE, 15),
    (0x7FC, 11),
    (0x3FFD, 14),
    (0x1FFD, 13),
    (0xFFFFFFC, 28),
    (0xFFFE6, 20),
    (0x3FFFD2, 22),
    (0xFFFE7, 20),
    (0xFFFE8, 20),
    (0x3FFFD3, 22),
    (0x3FFFD4, 22),
    (0x3FFFD5, 22),
    (0x7FFFD9, 23),
    (0x3FFFD6, 22),
    (0x7FFFDA, 23),
    (0x7FFFDB, 23),
    (0x7FFFDC, 23),
    (0x7FFFDD, 23),
    (0x7FFFDE, 23),
    (0xFFFFEB, 24),
    (0x7FFFDF, 23),
    (0xFFFFEC, 24),
    (0xFFFFED, 24),
    (0x3FFFD7, 22),
    (0x7FFFE0, 23),
    (0xFFFFEE, 24),
    (0x7FFFE1, 23),
    (0x7FFFE2, 23),
    (0x7FFFE3, 23),
    (0x7FFFE4, 23),
    (0x1FFFDC, 21),
    (0x3FFFD8, 22),
    (0x7FFFE5, 23),
    (0x3FFFD9, 22),
    (0x7FFFE6, 23),
    (0x7FFFE7, 23),
    (0xFFFFEF, 24),
    (0x3FFFDA, 22),
    (0x1FFFDD, 21),
    (0xFFFE9, 20),
    (0x3FFFDB, 22),
    (0x3FFFDC, 22),
    (0x7FFFE8, 23),
    (0x7FFFE9, 23),
    (0x1FFFDE, 21),
    (0x7FFFEA, 23),
    (0x3FFFDD, 22),
    (0x3FFFDE, 22),
    (0xFFFFF0, 24),
    (0x1FFFDF, 21),
    (0x3FFFDF, 22),
    (0x7FFFEB, 23),
    (0x7FFFEC, 23),
    (0x1FFFE0, 21),
    (0x1FFFE1, 21),
    (0x3FFFE0, 22),
    (0x1FFFE2, 21),
    (0x7FFFED, 23),
    (0x3FFFE1, 22),
    (0x7FFFEE, 23),
    (0x7FFFEF, 23),
    (0xFFFEA, 20),
    (0x3FFFE2, 22),
    (0x3FFFE3, 22),
    (0x3FFFE4, 22),
    (0x7FFFF0, 23),
    (0x3FFFE5, 22),
    (0x3FFFE6, 22),
    (0x7FFFF1, 23),
    (0x3FFFFE0, 26),
    (0x3FFFFE1, 26),
    (0xFFFEB, 20),
    (0x7FFF1, 19),
    (0x3FFFE7, 22),
    (0x7FFFF2, 23),
    (0x3FFFE8, 22),
    (0x1FFFFEC, 25),
    (0x3FFFFE2, 26),
    (0x3FFFFE3, 26),
    (0x3FFFFE4, 26),
    (0x7FFFFDE, 27),
    (0x7FFFFDF, 27),
    (0x3FFFFE5, 26),
    (0xFFFFF1, 24),
    (0x1FFFFED, 25),
    (0x7FFF2, 19),
    (0x1FFFE3, 21),
    (0x3FFFFE6, 26),
    (0x7FFFFE0, 27),
    (0x7FFFFE1, 27),
    (0x3FFFFE7, 26),
    (0x7FFFFE2, 27),
    (0xFFFFF2, 24),
    (0x1FFFE4, 21),
    (0x1FFFE5, 21),
    (0x3FFFFE8, 26),
    (0x3FFFFE9, 26),
    (0xFFFFFFD, 28),
    (0x7FFFFE3, 27),
    (0x7FFFFE4, 27),
    (0x7FFFFE5, 27),
    (0xFFFEC, 20),
    (0xFFFFF3, 24),
    (0xFFFED, 20),
    (0x1FFFE6, 21),
    (0x3FFFE9, 22),
    (0x1FFFE7, 21),
    (0x1FFFE8, 21),
    (0x7FFFF3, 23),
    (0x3FFFEA, 22),
    (0x3FFFEB, 22),
    (0x1FFFFEE, 25),
    (0x1FFFFEF, 25),
    (0xFFFFF4, 24),
    (0xFFFFF5, 24),
    (0x3FFFFEA, 26),
    (0x7FFFF4, 23),
    (0x3FFFFEB, 26),
    (0x7FFFFE6, 27),
    (0x3FFFFEC, 26),
    (0x3FFFFED, 26),
    (0x7FFFFE7, 27),
    (0x7FFFFE8, 27),
    (0x7FFFFE9, 27),
    (0x7FFFFEA, 27),
    (0x7FFFFEB, 27),
    (0xFFFFFFE, 28),
    (0x7FFFFEC, 27),
    (0x7FFFFED, 27),
    (0x7FFFFEE, 27),
    (0x7FFFFEF, 27),
    (0x7FFFFF0, 27),
    (0x3FFFFEE, 26),
    (0x3FFFFFFF, 30),
)

ENTRY_OVERHEAD = 32  # RFC 7541 4.1: an entry's size is name + value + 32
EOS = 256


class HpackError(Exception):
    """A header block that cannot be decoded: HTTP/2 answers with COMPRESSION_ERROR."""


class HeaderListTooLarge(HpackError):
    """The block was decoded whole (the table is in step) to a list over the limit: unlike
    other HPACK errors it need not end the connection, only the stream. ``path`` is the
    ``:path`` if it came before the limit (pseudo-headers come first), so the refused call can
    be told apart (an infer call is counted in the metrics), else empty."""

    def __init__(self, message: str, path: bytes = b"") -> None:
        super().__init__(message)
        self.path = path


def _huffman_machine() -> list[tuple[int, bytes, bool] | None]:
    """A decoder that consumes four bits per step (the approach of nghttp2 and others).

    The states are the code tree's inner nodes; ``table[state * 16 + nibble]`` is the next
    state, the bytes completed on the way and whether stopping there is legal (what is left
    is at most seven bits of EOS's all-ones prefix), or None where the bits spell EOS.
    """
    children: list[list[int]] = [[-1, -1]]  # inner nodes; a leaf is stored as -1 - symbol
    for symbol, (code, length) in enumerate(HUFFMAN_CODES):
        node = 0
        for shift in range(length - 1, 0, -1):
            bit = (code >> shift) & 1
            if children[node][bit] == -1:
                children.append([-1, -1])
                children[node][bit] = len(children) - 1
            node = children[node][bit]
        children[node][code & 1] = -1 - symbol
    depth_ones = {0: (0, True)}  # node -> (depth, reached through one-bits only)
    for node, pair in enumerate(children):
        depth, ones = depth_ones[node]
        for bit, child in enumerate(pair):
            if child >= 0:
                depth_ones[child] = (depth + 1, ones and bit == 1)
    table: list[tuple[int, bytes, bool] | None] = []
    for state in range(len(children)):
        for nibble in range(16):
            node, emitted, failed = state, bytearray(), False
            for shift in (3, 2, 1, 0):
                child = children[node][(nibble >> shift) & 1]
                if child >= 0:
                    node = child
                elif -1 - child == EOS:
                    failed = True
                    break
                else:
                    emitted.append(-1 - child)
                    node = 0
            if failed:
                table.append(None)
            else:
                depth, ones = depth_ones[node]
                table.append((node, bytes(emitted), node == 0 or (ones and depth <= 7)))
    return table


_HUFFMAN = _huffman_machine()


def huffman_decode(data: bytes) -> bytes:
    out = bytearray()
    state, accept = 0, True
    table = _HUFFMAN
    for byte in data:
        for nibble in (byte >> 4, byte & 15):
            step = table[state * 16 + nibble]
            if step is None:
                raise HpackError("Huffman string contains EOS")
            state, emitted, accept = step
            if emitted:
                out += emitted
    if not accept:
        raise HpackError("Huffman string ends with invalid padding")
    return bytes(out)


def _integer(data: bytes, pos: int, prefix_bits: int) -> tuple[int, int]:
    mask = (1 << prefix_bits) - 1
    value = data[pos] & mask
    pos += 1
    if value < mask:
        return value, pos
    shift = 0
    while True:
        byte = data[pos]
        pos += 1
        value += (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, pos
        shift += 7
        if shift > 28:
            raise HpackError("integer does not fit in 32 bits")


def _string(data: bytes, pos: int) -> tuple[bytes, int]:
    huffman = data[pos] & 0x80
    length, pos = _integer(data, pos, 7)
    end = pos + length
    if end > len(data):
        raise HpackError("string runs past the end of the header block")
    raw = data[pos:end]
    return (huffman_decode(raw) if huffman else raw), end


Headers = tuple[tuple[bytes, bytes], ...]
CACHED_BLOCKS = 64
CACHED_BLOCK_BYTES = 1024  # a call's headers are a few dozen bytes; larger blocks are not kept


class Decoder:
    """One connection's decoding context; blocks must be decoded in the order they arrived.

    A client sends the same block for every call of the same method (its varying fields
    are literals without indexing, e.g. nghttp2's ``:path`` and ``content-length``), so a
    block that left the table unchanged is remembered with the table's generation and not
    decoded again while the table stays as it was.
    """

    def __init__(self, max_table_size: int = 4096, max_header_list_size: int = 65536) -> None:
        self._settings_limit = max_table_size  # what our SETTINGS_HEADER_TABLE_SIZE allows
        self._max_size = max_table_size  # what the encoder chose, at most the limit
        self._max_list = max_header_list_size
        self._dynamic: collections.deque[tuple[bytes, bytes]] = collections.deque()
        self._size = 0
        self._generation = 0  # bumped by every change of the dynamic table
        self._cache: dict[bytes, tuple[int, Headers]] = {}

    def decode(self, block: bytes) -> Headers:
        cached = self._cache.get(block)
        if cached is not None and cached[0] == self._generation:
            return cached[1]
        generation = self._generation
        headers = tuple(self._decode(block))
        if generation == self._generation and len(block) <= CACHED_BLOCK_BYTES:
            if len(self._cache) >= CACHED_BLOCKS:
                self._cache.clear()
            self._cache[block] = (generation, headers)
        return headers

    def _decode(self, block: bytes) -> list[tuple[bytes, bytes]]:
        headers: list[tuple[bytes, bytes]] = []
        total = 0
        oversized = False  # past the limit, fields are decoded (for the table) but not kept
        path = b""
        pos, end = 0, len(block)
        try:
            while pos < end:
                byte = block[pos]
                if byte & 0x80:  # indexed field
                    index, pos = _integer(block, pos, 7)
                    field = self._entry(index)
                elif byte & 0x40:  # literal with incremental indexing
                    field, pos = self._literal(block, pos, 6)
                    self._add(field)
                elif byte & 0x20:  # dynamic table size update
                    if total:
                        raise HpackError("table size update after a header field")
                    size, pos = _integer(block, pos, 5)
                    if size > self._settings_limit:
                        raise HpackError(f"table size {size} above the limit")
                    self._max_size = size
                    self._generation += 1
                    self._evict(0)
                    continue
                else:  # literal without indexing (0000) or never indexed (0001)
                    field, pos = self._literal(block, pos, 4)
                total += len(field[0]) + len(field[1]) + ENTRY_OVERHEAD
                if total > self._max_list:
                    oversized = True
                    headers.clear()
                if not oversized:
                    headers.append(field)
                    if field[0] == b":path":
                        path = field[1]
        except IndexError:
            raise HpackError("header block ends inside a field") from None
        if oversized:
            raise HeaderListTooLarge(f"header list larger than {self._max_list} bytes", path)
        return headers

    def _entry(self, index: int) -> tuple[bytes, bytes]:
        if 0 < index <= len(STATIC_TABLE):
            return STATIC_TABLE[index - 1]
        dynamic = index - len(STATIC_TABLE) - 1
        if 0 <= dynamic < len(self._dynamic):
            return self._dynamic[dynamic]
        raise HpackError(f"header index {index} is not in the table")

    def _literal(self, block: bytes, pos: int, prefix_bits: int) -> tuple[tuple[bytes, bytes], int]:
        index, pos = _integer(block, pos, prefix_bits)
        if index:
            name = self._entry(index)[0]
        else:
            name, pos = _string(block, pos)
        value, pos = _string(block, pos)
        return (name, value), pos

    def _add(self, field: tuple[bytes, bytes]) -> None:
        self._generation += 1
        size = len(field[0]) + len(field[1]) + ENTRY_OVERHEAD
        self._evict(size)
        if size <= self._max_size:
            self._dynamic.appendleft(field)
            self._size += size

    def _evict(self, room: int) -> None:
        while self._dynamic and self._size + room > self._max_size:
            name, value = self._dynamic.pop()
            self._size -= len(name) + len(value) + ENTRY_OVERHEAD


def _encode_integer(value: int, prefix_bits: int, first: int) -> bytes:
    mask = (1 << prefix_bits) - 1
    if value < mask:
        return bytes([first | value])
    out = bytearray([first | mask])
    value -= mask
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


_STATIC_FIELDS = {field: index for index, field in reversed(list(enumerate(STATIC_TABLE, 1)))}
_STATIC_NAMES = {name: index for index, (name, _) in reversed(list(enumerate(STATIC_TABLE, 1)))}


def encode(headers: list[tuple[bytes, bytes]]) -> bytes:
    """A header block that leaves the peer's dynamic table untouched."""
    out = bytearray()
    for name, value in headers:
        index = _STATIC_FIELDS.get((name, value))
        if index is not None:
            out += _encode_integer(index, 7, 0x80)
            continue
        name_index = _STATIC_NAMES.get(name, 0)
        out += _encode_integer(name_index, 4, 0x00)
        if not name_index:
            out += _encode_integer(len(name), 7, 0x00) + name
        out += _encode_integer(len(value), 7, 0x00) + value
    return bytes(out)
