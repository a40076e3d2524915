"""A server's process tree and the CPU time it has used, from the kernel's ``/proc`` accounting.

Server CPU per request is the clearest cost a protocol path has, and unlike throughput it does
not move much when a shared host is busy. pytriton runs Triton as child processes (the
``tritonserver`` binary, the Python backend's stubs), so a server is its whole process tree.
Parsing is kept apart from reading so the fiddly part (a ``comm`` field may hold spaces and
parentheses) is tested without a live process.
"""

from __future__ import annotations

import os
from pathlib import Path

PROC = Path("/proc")


def match_autogroup(pid: int) -> bool:
    """Give the session of ``pid`` this process's nice value as its autogroup's, when that is
    negative; whether it did.

    With the kernel's autogroups (``sched_autogroup_enabled``, the default on many kernels)
    each session competes with the others by its autogroup's nice, not its processes': on a
    host shared with other sessions, ``nice -n -20 make bench-runtime`` alone would raise the
    benchmark only above other work of its own session. A server started in a session of its
    own (Triton's, stopped as a group) needs the same, or the two sides would not be alike.
    """
    nice = os.nice(0)
    if nice >= 0:
        return False
    try:
        (PROC / str(pid) / "autogroup").write_text(str(nice))
    except OSError:  # no autogroups, or not permitted: the nice value alone counts
        return False
    return True


def parse_stat(text: str) -> tuple[int, int]:
    """(parent PID, user + system CPU ticks) from the text of ``/proc/PID/stat``.

    The command name sits in parentheses and may itself contain ``)`` and spaces, so fields are
    counted from the last ``)``: state is field 3, ppid 4, utime 14 and stime 15 (proc(5)).
    """
    rest = text.rsplit(")", 1)[1].split()
    return int(rest[1]), int(rest[11]) + int(rest[12])


def _stats() -> dict[int, tuple[int, int]]:
    """Every live process's (parent, ticks); a process that exits while read is skipped."""
    found = {}
    for entry in PROC.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            found[int(entry.name)] = parse_stat((entry / "stat").read_text())
        except (OSError, IndexError, ValueError):
            continue
    return found


def tree(root: int, parents: dict[int, int]) -> list[int]:
    """``root`` and its descendants, given each process's parent."""
    members = [root]
    for pid in members:  # grows while iterated: a breadth-first walk
        members.extend(child for child, parent in parents.items() if parent == pid)
    return members


def descendants(root: int) -> list[int]:
    """The live descendants of ``root`` (not ``root`` itself)."""
    stats = _stats()
    return tree(root, {pid: parent for pid, (parent, _) in stats.items()})[1:]


def tree_cpu_seconds(root: int) -> float:
    """CPU seconds (user + system) used so far by ``root`` and its live descendants."""
    stats = _stats()
    members = tree(root, {pid: parent for pid, (parent, _) in stats.items()})
    ticks = sum(stats[pid][1] for pid in members if pid in stats)
    return ticks / os.sysconf("SC_CLK_TCK")
