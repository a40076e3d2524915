"""A shared cache of fetched models: a second pod starts from a copy, not a download.

Why it exists: replicas of one model fetch the same bytes; on a volume every pod of the model
can mount (a ReadWriteMany claim the platform provides; a hostPath is refused under Pod
Security `restricted`), one download serves them all. Entries are keyed by the URI and the
store's version of every object (ETags), so a changed model is a new entry; written under a
temporary name and renamed, so a reader sees whole entries only; bounded by bytes and evicted
least recently used. A cache that fails (full, evicted under a reader, unwritable) only costs
a download: it never fails the fetch.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path, PurePosixPath

log = logging.getLogger(__name__)
MODEL_DIR = "model"
SIZE_FILE = ".bytes"
USED_FILE = ".last-used"
STALE_TEMP_SECONDS = 3600.0
"""A temporary entry older than this was left by a fetcher that died; eviction removes it."""


class ModelCache:
    def __init__(self, root: Path, max_bytes: int) -> None:
        self.root = root
        self.max_bytes = max_bytes

    @staticmethod
    def key(uri: str, versions: list[str]) -> str:
        """The entry of this URI at these object versions (key, size and ETag of each)."""
        text = "\n".join([uri, *sorted(versions)])
        return hashlib.sha256(text.encode()).hexdigest()

    def restore(self, key: str, staging: Path, files: Mapping[PurePosixPath, int]) -> int | None:
        """Copy the entry into ``staging``: its size, or None when absent or not whole.

        ``files`` is the listing the entry is keyed by (each file's path in the model and its
        size). The entry is marked used before the copy, so another pod's eviction (least
        recently used first) passes it over; one that chose it already may still remove files
        under the copy, so the copy is checked against ``files`` and a mismatch is a miss —
        the model is downloaded, never published incomplete."""
        entry = self.root / key
        try:
            os.utime(entry / USED_FILE)  # not touch(): it would recreate a removed entry's file
            shutil.copytree(entry / MODEL_DIR, staging, dirs_exist_ok=True)
            mismatch = _mismatch(staging, files)
        except OSError as error:
            mismatch = str(error)
        if mismatch is not None:
            if entry.exists():
                log.warning("cache entry %s unusable (%s): downloading", key[:12], mismatch)
                # Evicted under us or damaged: gone, so this download can take its place.
                shutil.rmtree(entry, ignore_errors=True)
            for path in staging.iterdir():
                shutil.rmtree(path) if path.is_dir() else path.unlink()
            return None
        size = sum(files.values())
        log.info("restored %d bytes from the cache entry %s", size, key[:12])
        return size

    def store(self, key: str, staging: Path, size: int) -> None:
        """Copy a finished download into the cache, then evict down to the budget."""
        if size > self.max_bytes:
            return
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            temporary = Path(tempfile.mkdtemp(prefix=".tmp-", dir=self.root))
        except OSError as error:
            log.warning("cache unwritable (%s): not kept", error)
            return
        try:
            shutil.copytree(staging, temporary / MODEL_DIR)
            (temporary / SIZE_FILE).write_text(str(size))
            (temporary / USED_FILE).touch()
            os.rename(temporary, self.root / key)
            log.info("kept %d bytes as cache entry %s", size, key[:12])
        except OSError as error:  # another pod stored it first, or the volume is full
            log.info("cache entry %s not stored: %s", key[:12], error)
            shutil.rmtree(temporary, ignore_errors=True)
        self.evict(keep=key)

    def evict(self, keep: str) -> None:
        """Remove least recently used entries (never ``keep``) until within the budget."""
        entries: list[tuple[float, int, Path]] = []
        now = time.time()
        for path in self.root.iterdir():
            try:
                if path.name.startswith(".tmp-"):
                    if now - path.stat().st_mtime > STALE_TEMP_SECONDS:
                        shutil.rmtree(path, ignore_errors=True)
                    continue
                used = (path / USED_FILE).stat().st_mtime
                entries.append((used, int((path / SIZE_FILE).read_text()), path))
            except (OSError, ValueError):
                continue  # being written or removed by another pod
        total = sum(size for _, size, _ in entries)
        for _, size, path in sorted(entries):
            if total <= self.max_bytes:
                break
            if path.name == keep:
                continue
            shutil.rmtree(path, ignore_errors=True)
            total -= size
            log.info("evicted cache entry %s (%d bytes)", path.name[:12], size)


def _mismatch(copy: Path, files: Mapping[PurePosixPath, int]) -> str | None:
    """How the copied tree differs from the listing (a file missing, extra or of another
    size), else None."""
    found = {
        PurePosixPath(path.relative_to(copy).as_posix()): path.stat().st_size
        for path in copy.rglob("*")
        if path.is_file()
    }
    for relative, size in sorted(files.items()):
        if relative not in found:
            return f"{relative} is missing"
        if found[relative] != size:
            return f"{relative} has {found[relative]} bytes, not {size}"
    extra = sorted(set(found) - set(files))
    return f"{extra[0]} is not in the listing" if extra else None
