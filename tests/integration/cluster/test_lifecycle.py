"""Starting the local cluster is idempotent, and a failed start leaves no process behind."""

import os
import subprocess
from pathlib import Path

import pytest

from kiln_localcluster import podnet
from kiln_localcluster.cluster import LocalCluster
from kiln_localcluster.processes import ProcessTable, is_running
from tests.integration.conftest import Cluster
from tests.sessioncluster import REPO

pytestmark = pytest.mark.integration


def test_starting_twice_reuses_the_running_cluster(cluster: Cluster) -> None:
    table_before = ProcessTable(REPO / ".kiln" / "cluster" / "processes.json").processes
    again = LocalCluster(REPO / ".kiln").up()
    assert again.server == cluster.server
    assert ProcessTable(REPO / ".kiln" / "cluster" / "processes.json").processes == table_before
    assert all(is_running(p) for p in table_before)


def test_a_crashed_start_stops_what_it_started(
    cluster: Cluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Real binaries, except an API server that dies at once: etcd will have started.
    bins = tmp_path / "bin"
    bins.mkdir()
    for name in ("etcd", "kube-controller-manager", "kube-scheduler", "kubectl", "kwok"):
        (bins / name).symlink_to(cluster.bin_dir / name)
    broken = bins / "kube-apiserver"
    broken.write_text("#!/bin/sh\necho 'simulated crash' >&2\nexit 1\n")
    broken.chmod(0o755)
    monkeypatch.setenv("KILN_K8S_BIN_DIR", str(bins))

    doomed = LocalCluster(tmp_path / "state")
    with pytest.raises(RuntimeError, match="kube-apiserver exited during start"):
        doomed.up()

    recorded = ProcessTable(tmp_path / "state" / "cluster" / "processes.json").processes
    assert recorded == []  # stop_all ran and saved an empty table
    assert (tmp_path / "state" / "cluster" / "logs" / "etcd.log").exists()  # etcd did start
    assert _pids_of(str(bins / "etcd")) == []  # and is gone
    if podnet.available() is None:  # the running cluster's routes were left alone
        shown = subprocess.run(["ip", "route", "show", "10.244.0.0/16"], capture_output=True,
                               text=True, check=False)  # fmt: skip
        assert "unreachable" in shown.stdout


def _pids_of(executable: str) -> list[int]:
    """PIDs whose command line starts with ``executable`` (read from /proc; signals nothing)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv0 = (entry / "cmdline").read_bytes().split(b"\0")[0].decode()
        except OSError:
            continue
        if argv0 == executable:
            found.append(int(entry.name))
    return found


def test_cluster_state_stays_inside_the_checkout(cluster: Cluster) -> None:
    assert cluster.kubeconfig == REPO / ".kiln" / "kubeconfig"
    assert os.stat(cluster.kubeconfig).st_mode & 0o077 == 0
