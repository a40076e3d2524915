"""Processes are stopped by PID only while the PID still names the process that was started."""

import dataclasses
import os
import signal
import subprocess
import sys
from pathlib import Path

from kiln_localcluster.processes import ProcessTable, is_running, spawn, stop


def test_spawned_process_survives_until_stopped(tmp_path: Path) -> None:
    table = ProcessTable(tmp_path / "p.json")
    table.add(spawn("sleeper", ["sleep", "60"], tmp_path / "sleeper.log"))
    process = ProcessTable(tmp_path / "p.json").processes[0]  # reloaded from disk
    assert is_running(process)
    table.stop_all()
    assert not is_running(process)
    assert ProcessTable(tmp_path / "p.json").processes == []


def test_a_reused_pid_is_never_signalled(tmp_path: Path) -> None:
    bystander = subprocess.Popen(["sleep", "60"])
    try:
        recorded = spawn("ours", ["sleep", "60"], tmp_path / "ours.log")
        os.kill(recorded.pid, signal.SIGKILL)
        os.waitpid(recorded.pid, 0)
        # Pretend the bystander got our old PID: same PID number, different start time.
        impostor = dataclasses.replace(recorded, pid=bystander.pid)
        assert not is_running(impostor)
        stop(impostor)
        assert bystander.poll() is None
    finally:
        bystander.kill()
        bystander.wait()


def test_stubborn_process_is_killed_after_the_grace(tmp_path: Path) -> None:
    ignores_term = [
        sys.executable,
        "-c",
        "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
        "print('armed', flush=True); time.sleep(60)",
    ]
    log = tmp_path / "stubborn.log"
    process = spawn("stubborn", ignores_term, log)
    from kiln_localcluster.waiting import wait_for

    wait_for(lambda: "armed" in log.read_text(), timeout=10, description="handler installed")
    stop(process, grace=0.3)
    assert not is_running(process)
