"""HPACK (RFC 7541): the header compression every HTTP/2 peer speaks, for the gRPC server.

The decoder is complete (static and dynamic tables, size updates, Huffman strings) because a
client may use any of it; it bounds the decoded header list so a small block cannot expand into
megabytes. The encoder writes literals without indexing (and fully indexed static entries):
responses then never depend on the peer's table, and the few header blocks a gRPC server sends
are built once and reused. The RFC's static table and Huffman code are in ``hpack_tables``.
"""

from __future__ import annotations

import collections

from kiln_runtime.protocol.hpack_tables import EOS, HUFFMAN_CODES, STATIC_TABLE

ENTRY_OVERHEAD = 32  # RFC 7541 4.1: an entry's size is name + value + 32


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
                elif oversized:  # a literal not for the table, in a list already refused:
                    pos = self._skip_literal(block, pos)  # its strings are not decoded
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

    def _skip_literal(self, block: bytes, pos: int) -> int:
        """Past a literal field without indexing, its strings unread (no Huffman decoding)."""
        index, pos = _integer(block, pos, 4)
        if index:
            self._entry(index)  # still a valid reference
        for _ in range(1 if index else 2):
            length, pos = _integer(block, pos, 7)
            pos += length
            if pos > len(block):
                raise HpackError("string runs past the end of the header block")
        return pos

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
