"""Nothing partial where the runtime reads: download beside the target, rename into place.

``<dest>/model`` appears whole or not at all: files are written under ``<dest>/.staging-*``
on the same volume and the directory is renamed in one step. ``<dest>/.source`` records what
was fetched, so an init container that runs again (its pod restarted) does not fetch twice.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

MODEL_DIR = "model"
SOURCE_FILE = ".source"


def already_fetched(dest: Path, identity: str) -> bool:
    """True when ``<dest>/model`` holds the model ``identity`` names (URI and version)."""
    try:
        return (dest / MODEL_DIR).is_dir() and (dest / SOURCE_FILE).read_text() == identity
    except OSError:
        return False


def new_staging(dest: Path) -> Path:
    """An empty directory on the same file system as ``<dest>/model``; stale ones go first."""
    dest.mkdir(parents=True, exist_ok=True)
    for stale in dest.glob(".staging-*"):
        shutil.rmtree(stale, ignore_errors=True)
    return Path(tempfile.mkdtemp(prefix=".staging-", dir=dest))


def publish(staging: Path, dest: Path, identity: str) -> Path:
    """Move the finished download into place as ``<dest>/model``; its path."""
    final = dest / MODEL_DIR
    (dest / SOURCE_FILE).unlink(missing_ok=True)
    if final.exists():
        shutil.rmtree(final)
    os.rename(staging, final)
    _fsync_dir(dest)
    (dest / SOURCE_FILE).write_text(identity)
    return final


def _fsync_dir(path: Path) -> None:
    descriptor = os.open(path, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)
