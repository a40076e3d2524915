"""The fake pod range's routes: added and removed with iproute2, only for the ranges given."""

import subprocess
from typing import Any

import pytest

from kiln_localcluster import podnet


def test_isolate_and_release_touch_only_the_given_ranges(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[list[str]] = []

    def run(argv: list[str], **_: Any) -> subprocess.CompletedProcess[str]:
        calls.append(argv)
        return subprocess.CompletedProcess(argv, 0, "", "")

    monkeypatch.setattr(subprocess, "run", run)
    podnet.isolate(["10.244.0.0/16"])
    podnet.release(["10.244.0.0/16"])
    assert calls == [
        ["ip", "route", "replace", "unreachable", "10.244.0.0/16"],
        ["ip", "route", "del", "unreachable", "10.244.0.0/16"],
    ]


def test_a_route_that_cannot_be_added_says_why(monkeypatch: pytest.MonkeyPatch) -> None:
    def run(argv: list[str], **_: Any) -> subprocess.CompletedProcess[str]:
        return subprocess.CompletedProcess(
            argv, 2, "", "RTNETLINK answers: Operation not permitted"
        )

    monkeypatch.setattr(subprocess, "run", run)
    with pytest.raises(RuntimeError, match="Operation not permitted"):
        podnet.isolate(["10.244.0.0/16"])
