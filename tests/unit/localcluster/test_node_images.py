"""The real node's image store stays bounded: an image whose tag moved on is found and removed."""

from kiln_localcluster.node import stale_images

HEADER = "REF TYPE DIGEST SIZE PLATFORMS LABELS\n"
MANIFEST = "application/vnd.docker.distribution.manifest.v2+json"
LABEL = "io.cri-containerd.image=managed"
PAUSE = "sha256:7bcc9fc01162a46483ec638e25a50417912e8be806c172dea7783890fe07b470"
RUNTIME_NOW = "sha256:1f86b87efe7eca0ed8352a17cdaa56deeafb6c0a934843b4ad7c9d7522ee824a"
RUNTIME_BEFORE = "sha256:8f1c5dd0e0b9a35f4a8d1c0e7cbbd5f1c6f0a3b2d4e5f60718293a4b5c6d7e8f"
RUNTIME_NOW_ID = "sha256:0cb7891d4b4dcbd1eca2fce81bf2995ce10bc879a7328dcb6e0d7d1daab9776b"
PAUSE_ID = "sha256:59b4802b6995ead4e5078d37b75b6492b3caca9327d195d812e3754d7de44885"
RUNTIME_BEFORE_ID = "sha256:8c63eca0e66d4135f9911941d04c06bcf8884696c172834ee1fccd828d6f03f6"


def row(ref: str, digest: str, size: str = "5.5 GiB") -> str:
    """One line of `ctr images ls` (its SIZE column holds a space)."""
    return f"{ref} {MANIFEST} {digest} {size} linux/amd64 {LABEL}\n"


def test_an_id_whose_tag_moved_on_is_stale_and_tagged_ones_are_kept() -> None:
    listing = (
        HEADER
        + row("docker.io/kiln/runtime:dev", RUNTIME_NOW)
        + row("kiln.local/pause:1", PAUSE, "751.3 KiB")
        + row(RUNTIME_NOW_ID, RUNTIME_NOW)
        + row(PAUSE_ID, PAUSE)
        + row(RUNTIME_BEFORE_ID, RUNTIME_BEFORE)
    )
    assert stale_images(listing) == [RUNTIME_BEFORE_ID]


def test_a_store_of_tagged_images_has_nothing_stale() -> None:
    listing = (
        HEADER + row("docker.io/kiln/runtime:dev", RUNTIME_NOW) + row(RUNTIME_NOW_ID, RUNTIME_NOW)
    )
    assert stale_images(listing) == []
    assert stale_images(HEADER) == []
