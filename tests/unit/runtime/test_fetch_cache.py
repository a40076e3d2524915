"""The shared model cache: a restore races other pods' evictions and never yields a partial model.

Another pod's fetcher may evict the entry a restore is copying. The restore marks the entry
used before it copies (an eviction then passes it over) and checks the copy against the
listing the entry is keyed by (an eviction already under way is a miss, not a wrong model).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from pathlib import Path, PurePosixPath
from typing import Any

import pytest

from kiln_runtime.fetch.cache import MODEL_DIR, USED_FILE, ModelCache

FILES = {PurePosixPath("config.json"): 10, PurePosixPath("weights/part-1.bin"): 1000}
LONG_AGO = 1_000_000_000.0


def staged(root: Path, files: dict[PurePosixPath, int] = FILES) -> Path:
    """A finished download of ``files`` in a fresh staging directory."""
    staging = root / "staging"
    shutil.rmtree(staging, ignore_errors=True)
    for relative, size in files.items():
        (staging / relative).parent.mkdir(parents=True, exist_ok=True)
        (staging / relative).write_bytes(b"x" * size)
    return staging


def stored(cache: ModelCache, key: str, tmp_path: Path, used: float = LONG_AGO) -> None:
    """An entry of FILES under ``key``, last used at ``used``."""
    cache.store(key, staged(tmp_path), sum(FILES.values()))
    os.utime(cache.root / key / USED_FILE, (used, used))


def empty_staging(tmp_path: Path) -> Path:
    staging = tmp_path / "restore-into"
    staging.mkdir(parents=True)
    return staging


def during_copy(monkeypatch: pytest.MonkeyPatch, action: Callable[[], None]) -> None:
    """Run ``action`` — another pod's fetcher — after the restore began, before it copies."""
    copytree = shutil.copytree
    pending = [action]

    def interleaved(*args: Any, **options: Any) -> Any:
        while pending:  # once: copytree calls itself for each subdirectory
            pending.pop()()
        return copytree(*args, **options)

    monkeypatch.setattr(shutil, "copytree", interleaved)


def test_a_whole_entry_is_restored_with_its_size(tmp_path: Path) -> None:
    cache = ModelCache(tmp_path / "cache", max_bytes=10_000)
    stored(cache, "a", tmp_path)
    staging = empty_staging(tmp_path)
    assert cache.restore("a", staging, FILES) == 1010
    assert (staging / "weights" / "part-1.bin").stat().st_size == 1000
    assert (cache.root / "a" / USED_FILE).stat().st_mtime > LONG_AGO


def test_an_entry_evicted_between_listing_and_copy_is_a_miss(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cache = ModelCache(tmp_path / "cache", max_bytes=10_000)
    stored(cache, "a", tmp_path)
    # The eviction of another pod, which chose this entry before it was marked used, has
    # removed some of its files when the copy starts.
    weights = cache.root / "a" / MODEL_DIR / "weights"
    during_copy(monkeypatch, lambda: shutil.rmtree(weights))
    staging = empty_staging(tmp_path)
    assert cache.restore("a", staging, FILES) is None
    assert list(staging.iterdir()) == []  # nothing for the fetcher to publish
    assert not (cache.root / "a").exists()  # gone: the download that follows takes its place
    monkeypatch.undo()
    stored(cache, "a", tmp_path)
    assert cache.restore("a", empty_staging(tmp_path / "again"), FILES) == 1010


def test_a_file_of_another_size_is_a_miss(tmp_path: Path) -> None:
    cache = ModelCache(tmp_path / "cache", max_bytes=10_000)
    stored(cache, "a", tmp_path)
    listing = {**FILES, PurePosixPath("config.json"): 11}
    staging = empty_staging(tmp_path)
    assert cache.restore("a", staging, listing) is None
    assert list(staging.iterdir()) == []


def test_a_file_missing_from_the_listing_is_a_miss(tmp_path: Path) -> None:
    cache = ModelCache(tmp_path / "cache", max_bytes=10_000)
    stored(cache, "a", tmp_path)
    listing = {PurePosixPath("config.json"): 10}
    assert cache.restore("a", empty_staging(tmp_path), listing) is None


def test_an_entry_being_restored_is_passed_over_by_a_concurrent_eviction(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cache = ModelCache(tmp_path / "cache", max_bytes=10_000)
    stored(cache, "restoring", tmp_path, used=LONG_AGO)  # the least recently used...
    stored(cache, "older", tmp_path, used=LONG_AGO + 10)
    stored(cache, "new", tmp_path, used=LONG_AGO + 20)
    other_pod = ModelCache(cache.root, max_bytes=2_100)  # two of the three entries fit
    during_copy(monkeypatch, lambda: other_pod.evict(keep="new"))  # ...until this restore
    assert cache.restore("restoring", empty_staging(tmp_path), FILES) == 1010
    entries = sorted(path.name for path in cache.root.iterdir())
    assert entries == ["new", "restoring"]


def test_an_absent_entry_is_a_miss_that_leaves_no_trace(tmp_path: Path) -> None:
    cache = ModelCache(tmp_path / "cache", max_bytes=10_000)
    cache.root.mkdir()
    assert cache.restore("absent", empty_staging(tmp_path), FILES) is None
    assert list(cache.root.iterdir()) == []
