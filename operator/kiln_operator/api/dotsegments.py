"""Dot segments (`.`, `..`) in URL paths and image references: found, removed, refused.

Why it exists: an allow-list that compares the raw path of a URL can be walked out of.
`http://prom:9090/prom/../p7` starts with the allowed `http://prom:9090/prom`, yet the HTTP
client normalizes it and queries `/p7`; `%2e%2e` is the same segment percent-encoded. An image
reference `kiln/runtime/../evil:1` starts with the allowed prefix `kiln/runtime` too. So the
guardrails compare normalized paths (RFC 3986: unreserved percent-encodings decoded, then dot
segments removed, section 5.2.4), and the API refuses dot segments and encoded dots in a
Prometheus URL, an allow-list entry and an image outright: no legitimate value needs one.
Pure: strings in, strings out.
"""

import re
import string

UNRESERVED = frozenset(string.ascii_letters + string.digits + "-._~")
"""RFC 3986's unreserved characters: percent-encoding one changes nothing (section 2.3)."""
_PERCENT = re.compile(r"%([0-9A-Fa-f]{2})")
DOT_SEGMENTS = frozenset({".", ".."})
IMAGE_DOT_SEGMENT = re.compile(r"(?:^|/)\.\.?(?:$|[/:@])")
"""A path component of an image reference that is `.` or `..` (before a tag or digest)."""

_ENCODED_DOT = re.compile(r"%2e", re.IGNORECASE)
_SEPARATORS = re.compile(r"%2f|%5c|\\", re.IGNORECASE)
"""A slash, percent-encoded or not, or a backslash: proxies that decode the path before they
resolve its dot segments (and Windows-minded servers) split segments there too."""

URL_RULE = (
    "a URL's path may not hold a dot segment ('.' or '..', also between encoded slashes) nor a "
    "percent-encoded dot (%2e): allow-lists compare paths, and the HTTP client or a proxy "
    "would resolve it to another path"
)
"""The rule a refused URL is named by."""
IMAGE_RULE = (
    "an image reference's path components may not be '.' or '..': allow-lists compare "
    "prefixes, and such a component names another repository"
)
"""The rule a refused image reference is named by."""


def decode_unreserved(path: str) -> str:
    """The path with percent-encoded unreserved characters decoded (`%2e` -> `.`, `%7E` -> `~`);
    other percent-encodings stay, in upper case (RFC 3986 section 6.2.2.1 and 6.2.2.2)."""

    def one(match: re.Match[str]) -> str:
        char = chr(int(match.group(1), 16))
        return char if char in UNRESERVED else "%" + match.group(1).upper()

    return _PERCENT.sub(one, path)


def remove_dot_segments(path: str) -> str:
    """RFC 3986 section 5.2.4: `/a/b/../c/./d` -> `/a/c/d`; `..` never climbs above the root."""
    output: list[str] = []
    for segment in path.split("/"):
        if segment == ".":
            continue
        if segment == "..":
            if output and output != [""]:
                output.pop()
            continue
        output.append(segment)
    if path.startswith("/") and (not output or output[0]):
        output.insert(0, "")
    if path.endswith(("/.", "/..")):
        output.append("")
    return "/".join(output)


def normalized_path(path: str) -> str:
    """The path an HTTP client requests for `path`: unreserved characters decoded, then dot
    segments removed."""
    return remove_dot_segments(decode_unreserved(path))


def has_dot_segment(path: str) -> bool:
    """Whether the path holds a percent-encoded dot, or a segment that is `.` or `..` when
    encoded slashes and backslashes count as separators too."""
    if _ENCODED_DOT.search(path):
        return True
    segments = _SEPARATORS.sub("/", decode_unreserved(path)).split("/")
    return any(segment in DOT_SEGMENTS for segment in segments)


def image_has_dot_segment(image: str) -> bool:
    """Whether a path component of an image reference is `.` or `..`."""
    return IMAGE_DOT_SEGMENT.search(image) is not None
