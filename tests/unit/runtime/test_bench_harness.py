"""The runtime benchmark's pure parts: CPU accounting from /proc, the JSON poster's body, the
servers' turns, an A/B's pairing of rounds, and the report's tables and target checks (like for
like, rows a short run did not measure skipped).

The load itself needs servers and compiled clients (`make bench-runtime`); what is pinned here
is what turns its numbers into the report's verdicts.
"""

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from bench import ab, abuse_page, client_ceiling, history_ab, loadgen, proc, report, run, servers
from bench import profile as profiling
from kiln_runtime.protocol.rest import decode_infer

STAT = "4242 (a (weird) name) S 17 4242 4242 0 -1 4194560 100 0 0 0 {u} {s} 0 0 20 0 3 0"


def test_stat_fields_are_counted_from_the_last_parenthesis() -> None:
    assert proc.parse_stat(STAT.format(u=150, s=25)) == (17, 175)


def test_a_tree_is_the_root_and_every_descendant() -> None:
    parents = {1: 0, 10: 1, 11: 10, 12: 10, 13: 11, 20: 1, 30: 99}

    assert sorted(proc.tree(10, parents)) == [10, 11, 12, 13]
    assert proc.tree(13, parents) == [13]


def test_this_process_cpu_time_grows_with_work() -> None:
    before = proc.tree_cpu_seconds(os.getpid())
    deadline = time.process_time() + 0.05
    while time.process_time() < deadline:
        pass

    assert proc.tree_cpu_seconds(os.getpid()) > before


def test_the_plain_json_body_is_what_the_runtime_parses() -> None:
    x = np.random.default_rng(20).standard_normal((2, 3)).astype(np.float32)

    request = decode_infer("mlp", "", {}, loadgen.json_body("INPUT__0", "FP32", x), 1 << 20)

    np.testing.assert_array_equal(request.inputs[0].data, x)
    assert request.inputs[0].datatype == "FP32"


def test_server_cost_per_request_survives_a_run_without_answers() -> None:
    result = loadgen.LoadResult(0, 5, 1.0, 0.0, 0.0, 0.1, server_cpu_seconds=0.002)

    assert result.server_us_per_request == 2000


def row(path: str, clients: int, throughput: float, client_cpu: float = 0.2) -> dict[str, Any]:
    return {
        "path": path, "protocol": "grpc" if "grpc" in path or path == "h2load" else "http",
        "concurrency": clients, "requests": int(throughput), "errors": 0, "seconds": 1.0,
        "p50_ms": 0.5, "p99_ms": 1.0, "client_cpu": client_cpu, "throughput": throughput,
        "server_us_per_request": 150.0,
    }  # fmt: skip


def results(servers: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    return {
        "host": {"cpus": 2, "machine": "x86_64", "python": "3.11"},
        "seconds_per_run": 1.0,
        "models": {
            "mlp": {
                "raw_forward_seconds": {"fp32": {"1": 1e-4, "16": 1e-3}},
                "servers": {**servers},
                "load_average": {},
                "steal": {},
            }
        },
    }


def checks_by_target(measured: dict[str, Any]) -> dict[str, tuple[str, bool]]:
    return {target: (text, met) for target, text, met in report.targets(measured)}


def test_user_paths_are_judged_against_triton_on_the_same_path_and_precision() -> None:
    measured = results({
        "kiln (fp32)": [row("tritonclient-http", 16, 3100), row("tritonclient-grpc", 16, 3900)],
        "triton (fp32)": [row("tritonclient-http", 16, 1000), row("tritonclient-grpc", 16, 1000)],
        "kiln (int8)": [row("tritonclient-http", 16, 2000)],
        "triton (int8)": [row("tritonclient-http", 16, 1000, client_cpu=0.95)],
    })  # fmt: skip

    checks = checks_by_target(measured)

    http = "MLP HTTP JSON (tritonclient.http) {0} vs {0}: throughput at c=16 >= 3x Triton's"
    grpc = "MLP gRPC (tritonclient.grpc, threads) fp32 vs fp32: throughput at c=16 >= 4x Triton's"
    assert checks[http.format("fp32")] == ("3100 vs 1000 req/s = 3.10x", True)
    assert checks[grpc] == ("3900 vs 1000 req/s = 3.90x", False)
    assert checks[http.format("int8")] == (
        "2000 vs 1000 req/s = 2.00x (client saturated: triton)",
        False,
    )
    # nothing measured on the other paths, at c=1, or for the transformer: no verdict on them
    assert len(checks) == 3


def test_rows_written_before_paths_existed_count_as_the_ceilings() -> None:
    old = {k: v for k, v in row("wrk", 16, 5000).items() if k != "path"}
    measured = results({"kiln (fp32)": [old], "triton (fp32)": [{**old, "throughput": 1000}]})

    [(target, text, met)] = report.targets(measured)

    assert target.startswith("MLP HTTP binary tensors (wrk) fp32 vs fp32")
    assert (text, met) == ("5000 vs 1000 req/s = 5.00x", True)


def test_the_table_lists_path_by_server_with_kiln_over_triton() -> None:
    measured = results({
        "kiln (fp32)": [row("tritonclient-grpc-aio", 16, 3000), row("wrk", 1, 1000),
                        {"rss_bytes": 1}],
        "triton (fp32)": [row("tritonclient-grpc-aio", 16, 1000, client_cpu=0.97),
                          row("wrk", 1, 500)],
    })  # fmt: skip

    lines = report.load_table(measured, "mlp")

    assert lines[2:] == [
        "| HTTP binary tensors (wrk) | kiln (fp32) | 1 | 1000 | 2.00x | 0.500 | 1.000 | 0 "
        "| 0.20 | 150 |",
        "| HTTP binary tensors (wrk) | triton (fp32) | 1 | 500 | - | 0.500 | 1.000 | 0 "
        "| 0.20 | 150 |",
        "| gRPC (tritonclient.grpc.aio) | kiln (fp32) | 16 | 3000 | 3.00x | 0.500 | 1.000 | 0 "
        "| 0.20 | 150 |",
        "| gRPC (tritonclient.grpc.aio) | triton (fp32) | 16 | 1000 | - | 0.500 | 1.000 | 0 "
        "| **0.97** | 150 |",
    ]


def test_a_short_run_renders_a_whole_report(tmp_path: Path) -> None:
    paths = list(report.PATH_NAMES)
    measured = results({
        label: [row(path, clients, 100.0) for path in paths for clients in (1, 4)]
        for label in ("kiln (fp32)", "triton (fp32)")
    })  # fmt: skip

    report.write_report(measured, tmp_path / "runtime.md")

    text = (tmp_path / "runtime.md").read_text()
    assert text.count("| kiln (fp32) |") == len(paths) * 2
    assert "server CPU µs/req" in text


@pytest.mark.parametrize("value", [0.89, 0.9])
def test_a_client_is_saturated_from_ninety_percent(value: float) -> None:
    measured = results({"kiln (fp32)": [row("wrk", 1, 10, client_cpu=value)]})

    bold = "**" in report.load_table(measured, "mlp")[2]

    assert bold == (value >= report.SATURATED_CLIENT)


def test_the_abuse_page_has_both_ports_tables_and_judges_the_probe_target() -> None:
    measured = {"probes": 174, "probe_failures": 0}
    http = {"attack": "131 MB header", "result": "431", "start_rss_mib": 569,
            "peak_rss_mib": 571, "probe_p99_ms": 17.7, **measured}  # fmt: skip
    grpc = {"port": "grpc", "attack": "ping", "result": "goaway 11", "peak_rss_mib": 0.0,
            "probe_p99_ms": 6.0, "probes": 300, "probe_failures": 0, "load": 1.5}  # fmt: skip
    slow = {**grpc, "attack": "unread-answers", "probe_p99_ms": 61.0}
    runs = [slow, {**slow, "probe_p99_ms": 12.0}, {**slow, "probe_p99_ms": 70.0}]
    ready = {"ready_p99_ms": 4.0, "ready_max_ms": 9.0, "ready_probes": 30, "ready_failures": 0}
    late = {**grpc, **ready, "attack": "settings", "ready_max_ms": 300.0}
    page = abuse_page.render([http, grpc, *runs, {**http, **ready}, late], "2026-11-26")
    assert "## Abuse (HTTP/1.1, MLP)" in page and "## Abuse (HTTP/2, the gRPC port)" in page
    assert (
        "| 131 MB header | 571 MiB (569 MiB) | 17.7 ms (174, 0) | not measured |  | 431 |" in page
    )
    assert "| 17.7 ms (174, 0) | 4.0 / 9.0 ms (30, 0) |  | 431 |" in page
    assert (
        "| PING flood | goaway 11 | 0.0 MiB | 6.0 ms (300, 0) | not measured | 1.5 | ok |" in page
    )
    settings = next(line for line in page.splitlines() if "SETTINGS flood" in line)
    assert "**4.0 / 300.0 ms (30, 0)**" in settings  # over the 250 ms maximum
    assert "readiness over its target" in settings
    unread = next(line for line in page.splitlines() if "never read (windows" in line)
    assert "61.0 / 12.0 / 70.0 ms (900, 0)" in unread and "over the 50 ms target" in unread
    assert "goaway 11" not in report.abuse_section([grpc])  # each table its own port's rows


LOOP = "main (app.py);run_forever (asyncio/base_events.py)"
RAW_STACKS = "\n".join([
    f"{LOOP};EpollSelector.select (selectors.py) 50",
    f"{LOOP};Receiving._parse (kiln_runtime/protocol/http2/receiving.py) 20",
    f"{LOOP};DataPlane._process (kiln_runtime/dataplane.py);"
    "ModelRunner.forward (kiln_runtime/model.py);Module._call_impl (torch/nn/modules/module.py) 30",
    f"{LOOP};Handle._run (asyncio/events.py) 10",
    "_bootstrap (threading.py);_worker (concurrent/futures/thread.py) 40",
])  # fmt: skip


def test_a_profile_keeps_the_busy_samples_and_counts_each_under_its_innermost_part() -> None:
    stacks = profiling.busy(profiling.parse_collapsed(RAW_STACKS))

    assert sum(stacks.values()) == 60  # the epoll wait and the idle model thread dropped
    assert profiling.breakdown(stacks) == {
        "model forward (torch)": 0.5,
        "HTTP/2 frames (in and out)": pytest.approx(1 / 3),
        "asyncio (tasks, futures, event loop)": pytest.approx(1 / 6),
    }


def test_a_flame_graph_has_a_box_per_frame_with_its_share() -> None:
    stacks = profiling.busy(profiling.parse_collapsed(RAW_STACKS))

    svg = profiling.flamegraph(stacks, "a <title>")

    assert svg.startswith("<svg") and "a &lt;title&gt;" in svg
    assert "ModelRunner.forward (kiln_runtime/model.py) (30 samples, 50.0%)" in svg
    assert svg.count("<rect") == 1 + 7  # the background, then one box per distinct frame


def test_the_report_shows_each_profile_with_its_flame_graph() -> None:
    found = {
        "name": "grpc-tritonclient", "title": "gRPC through tritonclient.grpc (threads)",
        "clients": 16, "svg": "profile-grpc-tritonclient.svg", "throughput": 4000.0,
        "server_us_per_request": 200.0, "busy_samples": 900,
        "breakdown": {"model forward (torch)": 0.25, "HTTP/2 frames (in and out)": 0.2},
    }  # fmt: skip

    lines = report.profile_section([found])

    assert "[profile-grpc-tritonclient.svg](profile-grpc-tritonclient.svg)" in "\n".join(lines)
    assert "| model forward (torch) | 25.0% | 50 |" in lines
    assert report.profile_section([]) == []


def test_the_report_names_the_build_it_measured(tmp_path: Path) -> None:
    tree = tmp_path / "runtime_image"
    (tree / "kiln_runtime").mkdir(parents=True)
    (tree / "kiln_runtime" / "dataplane.py").write_text("")
    assert servers.build_of(tree) == "pure"
    (tree / "kiln_runtime" / "_compiled__mypyc.cpython-311-x86_64-linux-gnu.so").write_text("")
    assert servers.build_of(tree) == "compiled"

    copy = servers.pure_copy(tmp_path / "copy")
    assert not list((copy / "kiln_runtime").rglob("*.so"))
    assert (copy / "kiln_runtime" / "dataplane.py").exists()

    page = tmp_path / "runtime.md"
    measured = results({})
    report.write_report(measured, page)  # a run from before the field: pure Python
    assert "kiln_runtime as pure Python (not compiled" in page.read_text()
    measured["host"]["runtime_build"] = "compiled"
    report.write_report(measured, page)
    assert "its request path compiled by mypyc" in page.read_text()


class _IdleServer:
    """A server whose process tree's CPU time the test sets."""

    def __init__(self) -> None:
        self.cpu = 0.0

    def cpu_seconds(self) -> float:
        return self.cpu


def test_the_servers_take_turns_in_an_order_reversed_at_every_run(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    running = {"kiln": _IdleServer(), "triton": _IdleServer()}
    now = [0.0]
    calls: list[tuple[str, str, int]] = []

    def one_run(server: Any, model: str, x: Any, *, label: str, **run_of: Any) -> dict[str, Any]:
        calls.append((label, run_of["path"], run_of["clients"]))
        now[0] += 2.0  # each run lasts 2 s
        server.cpu += 1.5  # the server under load
        for other in running.values():
            if other is not server:
                other.cpu += 0.02 if other is running["triton"] else 0.0  # Triton idles at 1 %
        return {"path": run_of["path"], "concurrency": run_of["clients"]}

    monkeypatch.setattr(run, "measure", one_run)
    rows, host = run.measure_interleaved(
        running,  # type: ignore[arg-type]
        "mlp",
        np.zeros((1, 4), np.float32),
        paths=["wrk", "h2load"],
        concurrency=[1, 16],
        seconds=2.0,
        max_requests=100,
        clock=lambda: now[0],
    )

    assert calls == [
        ("kiln", "wrk", 1), ("triton", "wrk", 1),
        ("triton", "wrk", 16), ("kiln", "wrk", 16),
        ("kiln", "h2load", 1), ("triton", "h2load", 1),
        ("triton", "h2load", 16), ("kiln", "h2load", 16),
    ]  # fmt: skip
    assert [(r["path"], r["concurrency"]) for r in rows["triton"]] == [
        ("wrk", 1), ("wrk", 16), ("h2load", 1), ("h2load", 16)
    ]  # fmt: skip
    # the CPU a server used while the other was measured, per second of those runs
    assert host["triton"]["idle_cpu"] == pytest.approx(0.01)
    assert host["kiln"]["idle_cpu"] == 0.0


def test_the_transformer_is_judged_against_the_raw_forward_timed_beside_its_runs(
    tmp_path: Path,
) -> None:
    measured = results({})
    measured["models"]["transformer"] = {
        "raw_forward_seconds": {"fp32": {"16": 16 / 200}},  # around all the runs: 200 rows/s
        "raw_forward_beside": {"wrk@16": {"16": 16 / 190}},  # right after the wrk runs
        "servers": {"kiln (fp32)": [row("wrk", 16, 185.0), row("h2load", 16, 185.0)]},
    }

    checks = checks_by_target(measured)

    share = "transformer {}: throughput at c=16 >= 0.95x raw batch-16 forward"
    assert checks[share.format("HTTP binary tensors (wrk)")] == (
        "185.0 vs 190.0 rows/s = 0.974x",
        True,
    )
    # no limit timed beside the h2load runs: the one around all of them
    assert checks[share.format("gRPC raw frames (h2load)")] == (
        "185.0 vs 200.0 rows/s = 0.925x",
        False,
    )
    report.write_report(measured, tmp_path / "runtime.md")
    assert (
        "after HTTP binary tensors (wrk) at 16 clients 190.0 rows/s"
        in (tmp_path / "runtime.md").read_text()
    )


def test_the_transformers_tail_through_each_python_client_is_held_to_tritons() -> None:
    def tail(path: str, p99: float) -> dict[str, Any]:
        return {**row(path, 16, 300.0), "p99_ms": p99}

    measured = results({})
    measured["models"]["transformer"] = {
        "raw_forward_seconds": {"fp32": {"16": 16 / 300}},
        "servers": {
            "kiln (fp32)": [tail("tritonclient-grpc", 60.0), tail("tritonclient-grpc-aio", 70.0)],
            "triton (fp32)": [tail("tritonclient-grpc", 60.0), tail("tritonclient-grpc-aio", 65.0)],
        },
    }

    checks = checks_by_target(measured)

    target = "transformer {}: p99 at c=16 <= Triton's"
    assert checks[target.format("gRPC (tritonclient.grpc, threads)")] == ("60.0 vs 60.0 ms", True)
    assert checks[target.format("gRPC (tritonclient.grpc.aio)")] == ("70.0 vs 65.0 ms", False)
    assert target.format("HTTP JSON (tritonclient.http)") not in checks  # not measured


def test_an_ab_pairs_each_variant_with_the_first_round_by_round() -> None:
    def runs(*throughputs: float) -> list[dict[str, float]]:
        return [{"throughput": t} for t in throughputs]

    results = {
        ("base", "h2load", 16): runs(1000, 2000, 1000),  # the host twice as fast in round 2
        ("new", "h2load", 16): runs(1100, 2200, 900),
        ("new", "wrk", 16): runs(500),  # no base run to pair with
    }

    [(name, path, clients, ratios, mean)] = ab.paired_ratios(results, "base")

    assert (name, path, clients) == ("new", "h2load", 16)
    assert ratios == pytest.approx([1.1, 1.1, 0.9])
    assert mean == pytest.approx((1.1 * 1.1 * 0.9) ** (1 / 3))


def test_today_is_judged_by_paired_rounds_against_its_history(tmp_path: Path) -> None:
    def runs(*throughputs: float) -> list[dict[str, float]]:
        return [
            {"throughput": t, "p50_ms": 1.0, "p99_ms": 2.0, "server_us": 100.0} for t in throughputs
        ]

    measured = {}
    for path in history_ab.PATHS:
        # the host twice as fast in round 2; today loses 5 % then wins 3 % against issue 39's
        # base: within the noise; tracing's commit 0.995x its parent (met); traced 0.9x off
        # (missed); today against the tracing base is shown, not judged
        measured[("before issue 39", path, 16)] = runs(1000, 2000)
        measured[("before tracing", path, 16)] = runs(955, 1990)
        measured[("tracing added, off", path, 16)] = runs(950, 1980)
        measured[(history_ab.OFF, path, 16)] = runs(950, 1980)
        measured[(history_ab.TRACED, path, 16)] = runs(855, 1782)

    summary = history_ab.summarize(measured, rounds=2, seconds=5.0)
    checks = report.history_targets(summary)

    assert [met for _, _, met in checks] == [True, True, True, True, False, False]
    assert "no throughput lost to the runtime's limits beyond the noise" in checks[0][0]
    page = results({})
    page["history_ab"] = summary
    report.write_report(page, tmp_path / "runtime.md")
    text = (tmp_path / "runtime.md").read_text()
    assert "## Today's runtime against its history (A/B in one run)" in text
    assert (
        f"| {history_ab.TRACED} | {history_ab.OFF} | gRPC raw frames (h2load) | 0.900, 0.900 |"
        in (text)
    )


def test_a_paired_ratio_interval_widens_with_the_rounds_spread() -> None:
    low, mean, high = history_ab.ratio_interval([0.95, 1.03])
    assert low < mean < high and low < 1 < high
    tight = history_ab.ratio_interval([0.95, 0.95, 0.95])
    assert tight == pytest.approx((0.95, 0.95, 0.95))
    wide = history_ab.ratio_interval([0.90, 0.95, 1.00])
    assert wide[0] < 0.90 and wide[2] > 1.0


def test_the_report_says_when_the_run_stood_above_the_hosts_other_work(tmp_path: Path) -> None:
    page = results({})
    page["host"]["nice"] = -20
    report.write_report(page, tmp_path / "runtime.md")
    assert "at nice -20" in (tmp_path / "runtime.md").read_text()


def _ceiling_results(throughputs: dict[str, list[float]]) -> dict[str, Any]:
    """A client-ceiling run of tritonclient.grpc.aio at 16 clients, one row per round."""
    rounds = len(next(iter(throughputs.values())))
    return {
        "host": {"cpus": 2, "machine": "x86_64", "python": "3.11", "runtime_build": "compiled"},
        "seconds_per_run": 5.0, "rounds_run": rounds, "paths": ["tritonclient-grpc-aio"],
        "concurrency": [16],
        "rounds": [
            {
                label: [{"path": "tritonclient-grpc-aio", "concurrency": 16,
                         "throughput": values[r], "client_cpu": 0.99}]
                for label, values in throughputs.items()
            }
            for r in range(rounds)
        ],
    }  # fmt: skip


def test_a_ceiling_ratio_is_paired_round_by_round() -> None:
    # The host halves its speed in round 2: the rounds' own ratios stay 5x, the medians don't.
    results = _ceiling_results({"constant": [6000, 3000, 5000], "triton (fp32)": [1200, 600, 1000]})
    ratio = client_ceiling.paired_ratio(
        results, "constant", "triton (fp32)", "tritonclient-grpc-aio", 16
    )
    assert ratio == pytest.approx(5.0)
    assert client_ceiling.median_throughput(
        results, "constant", "tritonclient-grpc-aio", 16
    ) == pytest.approx(5000)
    per_call = client_ceiling.client_us_per_call(results, "constant", "tritonclient-grpc-aio", 16)
    assert per_call == pytest.approx(0.99 / 5000 * 1e6)


def test_a_target_beyond_the_clients_ceiling_is_called_unreachable() -> None:
    results = _ceiling_results({
        "constant": [6000], "triton (fp32)": [1000], "kiln (fp32)": [3500],
        "triton (int8)": [1600], "kiln (int8)": [4000],
    })  # fmt: skip
    page = client_ceiling.render(results)
    # 4 x 1000 = 4000 of a 6000 ceiling; 4 x 1600 = 6400 is beyond it
    assert "| 4000 calls/s (4 x 1000) | 6000 calls/s (constant) | yes, at 67% of it |" in page
    assert "| 6400 calls/s (4 x 1600) | 6000 calls/s (constant) | **no**: 1.07x of it |" in page
    assert "| 6.00x, 3.75x | 3.50x, 2.50x | 0.58x, 0.67x |" in page


def test_a_server_that_beats_the_constant_one_raises_what_the_client_can_do() -> None:
    # Answers in batches can let a client do more per wake-up than instant answers do.
    results = _ceiling_results({
        "constant": [5000], "triton (int8)": [1300], "kiln (int8)": [5400],
        "triton (fp32)": [1100], "kiln (fp32)": [3800],
    })  # fmt: skip
    assert client_ceiling.client_most(results, "tritonclient-grpc-aio", 16) == (5400, "kiln (int8)")
    page = client_ceiling.render(results)
    assert "| 5200 calls/s (4 x 1300) | 5400 calls/s (kiln (int8)) | yes, at 96% of it |" in page


def test_the_cache_page_reads_the_targets_off_its_measurements() -> None:
    """bench.cache's page: every ratio's pair of rows, the in-process verdicts from the data."""
    from bench import cache

    def one(server_us: float, hits: float | None) -> dict[str, Any]:
        return {
            "requests": 1000, "errors": 0, "throughput": 1000.0, "p50_ms": 1.0, "p99_ms": 2.0,
            "server_us": server_us, "server_cpu_us": server_us,
            "lookup_us": None if hits is None else 3.0, "hit_ratio": hits, "batches": 10.0,
        }  # fmt: skip

    results = {
        "none": {r: [one(200.0, None)] for r in cache.RATIOS},
        "cache": {r: [one(200.0 * (1 - r / 100) + 30, r / 100)] for r in cache.RATIOS},
    }
    page = cache.render(
        {
            "rounds": 1,
            "seconds": 4.0,
            "concurrency": 8,
            "host": "x86_64",
            "date": "today",
            "results": results,
            "load": [1.0, 2.0],
            "in_process": {
                "hit_us": 31.5,
                "miss_us": {"none": 150.0, "cache": 152.0},
                "miss_mean_us": {"none": 160.0, "cache": 163.0},
                "miss_lookup_us": 2.5,
                "misses": 5000,
                "calls": 100,
                "blocks": 50,
            },
        }
    )
    assert page.count("| no cache |") == len(cache.RATIOS) == page.count("| cache |")
    assert "**A hit's server time**: 31.5 µs" in page
    assert "+1.3%" in page  # 152 against 150
    assert "2.5 µs, 1.7% of a request" in page


def test_a_benchmark_under_a_negative_nice_gives_its_session_the_same_weight() -> None:
    """Run in a session of its own, as the benchmark's servers are: its autogroup takes the
    nice value, or (a kernel without autogroups) the call says it did nothing."""
    script = (
        "import os, pathlib; from bench import proc; os.nice(-5); "
        "done = proc.match_autogroup(os.getpid()); "
        "group = pathlib.Path('/proc/self/autogroup'); "
        "print(done, group.read_text().split()[-1] if group.exists() else 'none')"
    )
    out = subprocess.run(
        [sys.executable, "-c", script], cwd=servers.BENCH_DIR.parent, capture_output=True,
        text=True, check=True, start_new_session=True,
    ).stdout.split()  # fmt: skip
    assert out in (["True", "-5"], ["False", "none"])
