"""Processes are stopped by PID only while the PID still names the process that was started."""

import dataclasses
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
    bystander = spawn("bystander", ["sleep", "60"], tmp_path / "bystander.log")
    try:
        # A record of an earlier process that had the bystander's PID: same PID, older start.
        stale = dataclasses.replace(bystander, start_ticks=bystander.start_ticks - 1)
        assert not is_running(stale)
        stop(stale)
        assert is_running(bystander)
    finally:
        stop(bystander)


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
