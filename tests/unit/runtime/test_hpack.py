"""HPACK: RFC 7541's own example, an independent encoder (hpack, from h2) as the peer, and the
limits that keep a hostile header block from costing memory or breaking the decoder."""

import random

import hpack as reference
import pytest

from kiln_runtime.protocol import hpack

# RFC 7541 C.4.1: a request with Huffman-coded strings, one field added to the dynamic table.
RFC_C41 = bytes.fromhex("828684418cf1e3c2e5f23a6ba0ab90f4ff")
RFC_C41_HEADERS = (
    (b":method", b"GET"),
    (b":scheme", b"http"),
    (b":path", b"/"),
    (b":authority", b"www.example.com"),
)


def test_rfc_example_decodes_and_indexes_its_literal() -> None:
    decoder = hpack.Decoder()
    assert decoder.decode(RFC_C41) == RFC_C41_HEADERS
    # index 62 is the first dynamic entry: the :authority the block added
    assert decoder.decode(b"\xbe") == ((b":authority", b"www.example.com"),)


def _random_headers(rng: random.Random) -> list[tuple[bytes, bytes]]:
    names = [b":path", b"content-type", b"grpc-timeout", b"x-trace", b"user-agent", b"te"]
    return [
        (rng.choice(names), bytes(rng.randrange(256) for _ in range(rng.randrange(0, 40))))
        for _ in range(rng.randrange(1, 12))
    ]


@pytest.mark.parametrize("huffman", [True, False])
def test_an_independent_encoder_is_understood_block_after_block(huffman: bool) -> None:
    rng = random.Random(7)
    encoder, decoder = reference.Encoder(), hpack.Decoder()
    for step in range(400):
        if step % 50 == 25:  # the encoder shrinks and regrows its table: size updates
            encoder.header_table_size = rng.choice([0, 64, 256, 4096])
        headers = _random_headers(rng)
        if step % 3 == 0:
            headers = headers[:1] * 3  # repeats: indexed fields
        block = encoder.encode(headers, huffman=huffman)
        assert decoder.decode(block) == tuple(headers), step


def test_never_indexed_fields_are_decoded() -> None:
    encoder = reference.Encoder()
    block = encoder.encode([reference.NeverIndexedHeaderTuple(b"authorization", b"secret")])
    assert hpack.Decoder().decode(block) == ((b"authorization", b"secret"),)


def test_a_cached_block_follows_the_table() -> None:
    """A block of indexed fields means something else once the table changed."""
    decoder = hpack.Decoder()
    decoder.decode(b"\x40\x01a\x011")  # adds (a, 1): index 62
    assert decoder.decode(b"\xbe") == ((b"a", b"1"),)
    assert decoder.decode(b"\xbe") == ((b"a", b"1"),)  # from the cache
    decoder.decode(b"\x40\x01b\x012")  # adds (b, 2): now index 62, (a, 1) is 63
    assert decoder.decode(b"\xbe") == ((b"b", b"2"),)
    assert decoder.decode(b"\xbf") == ((b"a", b"1"),)


def test_a_block_that_adds_to_the_table_adds_every_time() -> None:
    decoder = hpack.Decoder()
    adding = b"\x40\x01a\x011"
    decoder.decode(adding)
    decoder.decode(adding)
    assert decoder.decode(b"\xbe\xbf") == ((b"a", b"1"), (b"a", b"1"))


def test_eviction_keeps_the_table_within_its_size() -> None:
    decoder = hpack.Decoder(max_table_size=80)  # room for two 34-byte entries, not three
    for name in (b"a", b"b", b"c"):
        decoder.decode(b"\x40\x01" + name + b"\x011")
    assert decoder.decode(b"\xbe\xbf") == ((b"c", b"1"), (b"b", b"1"))
    with pytest.raises(hpack.HpackError, match="not in the table"):
        decoder.decode(b"\xc0")  # (a, 1) was evicted


@pytest.mark.parametrize(
    ("block", "message"),
    [
        (b"\x80", "not in the table"),  # index 0
        (b"\xff\x80\x80\x80\x80\x80\x01", "32 bits"),
        (b"\x41\x05abc", "past the end"),
        (b"\x41", "ends inside"),
        (b"\x41\x81\xff", "padding"),  # eight one-bits of padding
        (b"\x41\x84\xff\xff\xff\xff", "EOS"),
        (b"\x3f\x81\x3f", "above the limit"),  # a table size update to 8096
        (b"\x82\x20", "after a header field"),
    ],
)
def test_malformed_blocks_are_refused(block: bytes, message: str) -> None:
    with pytest.raises(hpack.HpackError, match=message):
        hpack.Decoder().decode(block)


def test_a_small_block_cannot_expand_into_a_large_header_list() -> None:
    decoder = hpack.Decoder(max_header_list_size=65536)
    length_3000 = b"\x7f\xb9\x16"  # 127 + 2873 in 7-bit groups
    decoder.decode(b"\x40\x01x" + length_3000 + b"v" * 3000)  # one 3000-byte entry, index 62
    with pytest.raises(hpack.HpackError, match="header list larger"):
        decoder.decode(b"\xbe" * 100)  # 100 bytes that would expand to 300 kB


def test_encoded_blocks_leave_the_peer_table_alone() -> None:
    headers = [
        (b":status", b"200"),
        (b"content-type", b"application/grpc"),
        (b"grpc-status", b"3"),
        (b"grpc-message", b"x" * 300),
    ]
    block = hpack.encode(headers)
    peer = reference.Decoder()
    assert peer.decode(block, raw=True) == headers
    assert len(peer.header_table.dynamic_entries) == 0
    assert block[0] == 0x88  # ":status: 200" is the static table's entry 8
    assert hpack.Decoder().decode(block) == tuple(headers)


def test_the_cache_keeps_only_small_blocks() -> None:
    decoder = hpack.Decoder()
    small = hpack.encode([(b":path", b"/a")])
    large = hpack.encode([(b"x-big", b"v" * hpack.CACHED_BLOCK_BYTES)])
    assert decoder.decode(small) == ((b":path", b"/a"),)
    assert decoder.decode(large) == ((b"x-big", b"v" * hpack.CACHED_BLOCK_BYTES),)
    assert list(decoder._cache) == [small]  # a hostile client cannot park large blocks here


def test_a_list_over_the_limit_still_names_its_path() -> None:
    """Only the ``:path`` (before the limit) is kept, so the refused call can be counted."""
    block = hpack.encode([(b":method", b"POST"), (b":path", b"/s/M"), (b"x-big", b"v" * 200)])
    with pytest.raises(hpack.HeaderListTooLarge) as refused:
        hpack.Decoder(max_header_list_size=100).decode(block)
    assert refused.value.path == b"/s/M"
    with pytest.raises(hpack.HeaderListTooLarge) as unnamed:
        hpack.Decoder(max_header_list_size=10).decode(block)
    assert unnamed.value.path == b""
