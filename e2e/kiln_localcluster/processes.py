"""Start background processes and stop exactly those, by PID.

Why it exists: the control plane outlives the command that starts it, so its PIDs are recorded;
a PID can be reused by an unrelated process after ours exits, so each record also keeps the
process's start time (field 22 of /proc/PID/stat) and a stop signals only a process whose start
time still matches. Nothing here ever signals by name.
"""

import contextlib
import json
import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

from kiln_localcluster.waiting import wait_for


@dataclass(frozen=True)
class Started:
    """One process this package started."""

    name: str
    pid: int
    start_ticks: int
    log: str


def _start_ticks(pid: int) -> int | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name (field 2) may hold spaces; fields after it are space-separated.
    fields = stat[stat.rindex(")") + 2 :].split()
    if fields[0] == "Z":  # a zombie has exited already
        return None
    return int(fields[19])


def is_running(process: Started) -> bool:
    """True while the recorded process, and not a reuse of its PID, is alive."""
    return _start_ticks(process.pid) == process.start_ticks


def exited_during_start(name: str, log: Path | str) -> RuntimeError:
    """The one error for a process that died before it was ready, whichever check saw it: a
    crash races the checks, and a caller should meet the same message from each."""
    return RuntimeError(f"{name} exited during start; see {log}")


def spawn(name: str, argv: list[str], log: Path, env: dict[str, str] | None = None) -> Started:
    """Start ``argv`` in a new session (it survives this command), output appended to ``log``."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("ab") as out:
        child = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env=env,
        )
    ticks = _start_ticks(child.pid)
    if ticks is None:
        raise exited_during_start(name, log)
    return Started(name=name, pid=child.pid, start_ticks=ticks, log=str(log))


def wait_started(process: Started, ready: Callable[[], bool], *, timeout: float) -> None:
    """Wait until ``ready()``; fail at once, naming the log, if the process exits first."""

    def check() -> str | None:
        if not is_running(process):
            return "exited"
        return "ready" if ready() else None

    try:
        outcome = wait_for(
            check, timeout=timeout, interval=0.2, description=f"{process.name} ready"
        )
    except TimeoutError as error:  # say what the process last said (e.g. a lock it waits for)
        raise TimeoutError(f"{error}; its log {process.log} ends: {_last_line(process.log)}") from (
            error
        )
    if outcome == "exited":
        raise exited_during_start(process.name, process.log)


def _last_line(log: str) -> str:
    try:
        lines = Path(log).read_text(errors="replace").strip().splitlines()
    except OSError as error:
        return f"(unreadable: {error})"
    return lines[-1][:500] if lines else "(empty)"


def free_ports(count: int) -> list[int]:
    """Ports free on loopback now, for processes about to be started."""
    sockets = [socket.socket() for _ in range(count)]
    try:
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def stop(process: Started, grace: float = 10.0) -> None:
    """SIGTERM the process if it is still ours, SIGKILL it after ``grace`` seconds."""
    if not is_running(process):
        return
    os.kill(process.pid, signal.SIGTERM)
    if _gone_within(process, grace):
        return
    os.kill(process.pid, signal.SIGKILL)
    if not _gone_within(process, 10.0):
        raise RuntimeError(f"{process.name} (pid {process.pid}) survived SIGKILL")


def _gone_within(process: Started, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while True:
        _reap(process.pid)
        if not is_running(process):
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.05)


def _reap(pid: int) -> None:
    """Collect the exit status when the process is our own child, so it leaves no zombie."""
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)


class ProcessTable:
    """The processes of one cluster, saved to a JSON file after every change."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.processes: list[Started] = []
        if path.exists():
            self.processes = [Started(**p) for p in json.loads(path.read_text())]

    def add(self, process: Started) -> None:
        self.processes.append(process)
        self._save()

    def remove(self, process: Started) -> None:
        self.processes = [p for p in self.processes if p != process]
        self._save()

    def stop_all(self) -> None:
        """Stop in reverse start order (kwok before the API server, etcd last)."""
        for process in reversed(self.processes):
            stop(process)
        self.processes = []
        self._save()

    def _save(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps([asdict(p) for p in self.processes], indent=2))
        tmp.replace(self.path)
