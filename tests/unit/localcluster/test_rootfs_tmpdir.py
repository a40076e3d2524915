"""Commands the image scripts run inside a root filesystem get a TMPDIR that exists there
(`make demo` failed with `mktemp: failed to create file via template` when TMPDIR named a
directory of the host other than /tmp): e2e/docker/chroot.sh's `in_rootfs`, run as
e2e/docker/base-image.sh runs it, on a rootfs holding mktemp and its libraries."""

import os
import shutil
import subprocess
from pathlib import Path

from tests.sessioncluster import missing_component

REPO = Path(__file__).resolve().parents[3]
CHROOT_SH = REPO / "e2e" / "docker" / "chroot.sh"


def _rootfs_with_mktemp(root: Path) -> Path:
    """A root filesystem with /usr/bin/mktemp, the libraries it links and an empty /tmp."""
    mktemp = shutil.which("mktemp")
    assert mktemp is not None
    linked = subprocess.run(["ldd", mktemp], capture_output=True, text=True, check=True).stdout
    files = [Path(mktemp).resolve()] + [
        Path(word)
        for line in linked.splitlines()
        for word in line.split()
        if word.startswith("/") and Path(word).exists()
    ]
    for file in files:
        target = root / file.relative_to("/")
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(file, target)
    (root / "usr" / "bin").mkdir(parents=True, exist_ok=True)
    if not (root / "usr" / "bin" / "mktemp").exists():
        shutil.copy2(files[0], root / "usr" / "bin" / "mktemp")
    (root / "tmp").mkdir(mode=0o1777)
    return root


def _in_shell(script: str, tmpdir: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", "-c", f"set -euo pipefail; source {CHROOT_SH}; {script}"],
        capture_output=True,
        text=True,
        timeout=30,
        env={**os.environ, "TMPDIR": str(tmpdir)},
        check=False,
    )


def test_a_command_in_the_rootfs_gets_a_tmpdir_that_exists_there(tmp_path: Path) -> None:
    if os.geteuid() != 0 or shutil.which("chroot") is None or shutil.which("ldd") is None:
        missing_component("chroot needs root (and chroot, ldd): the image scripts run as root")
    rootfs = _rootfs_with_mktemp(tmp_path / "rootfs")
    host_tmpdir = tmp_path / "host-only-tmp"  # exists on the host, not in the rootfs
    host_tmpdir.mkdir()
    # the cause: a plain chroot inherits the host's TMPDIR
    plain = _in_shell(f"chroot {rootfs} /usr/bin/mktemp", host_tmpdir)
    assert plain.returncode != 0 and "failed to create file" in plain.stderr, plain
    # what the scripts run
    entered = _in_shell(f"in_rootfs {rootfs} /usr/bin/mktemp", host_tmpdir)
    assert entered.returncode == 0, entered.stderr
    created = entered.stdout.strip()
    assert created.startswith("/tmp/tmp.") and (rootfs / created.lstrip("/")).is_file()
    # a host command that chroots on its own (debootstrap) gets the same TMPDIR
    told = _in_shell("with_rootfs_tmpdir bash -c 'echo \"$TMPDIR\"'", host_tmpdir)
    assert told.stdout.strip() == "/tmp", told


def test_the_base_image_script_enters_its_rootfs_only_through_chroot_sh() -> None:
    script = (REPO / "e2e" / "docker" / "base-image.sh").read_text()
    assert 'source "$(dirname "$0")/chroot.sh"' in script
    commands = [line.strip() for line in script.splitlines() if not line.strip().startswith("#")]
    assert not [line for line in commands if line.startswith("chroot ")], "a bare chroot"
    assert any(line.startswith("with_rootfs_tmpdir debootstrap ") for line in commands)
    assert any(line.startswith('in_rootfs "$rootfs" ') for line in commands)
