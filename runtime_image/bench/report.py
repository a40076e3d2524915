"""Render the benchmark results as docs/benchmarks/runtime.md. Pure: results in, text out."""

from __future__ import annotations

from pathlib import Path
from typing import Any

# Each load path, as the report names it, in the order of its tables. The first two are the
# ceilings; the rest are the paths users take.
PATH_NAMES = {
    "wrk": "HTTP binary tensors (wrk)",
    "wrk-json": "HTTP JSON, plain poster (wrk)",
    "tritonclient-http": "HTTP JSON (tritonclient.http)",
    "h2load": "gRPC raw frames (h2load)",
    "tritonclient-grpc": "gRPC (tritonclient.grpc, threads)",
    "tritonclient-grpc-aio": "gRPC (tritonclient.grpc.aio)",
}
# A client using this much of its core may be what limits its row, not the server.
SATURATED_CLIENT = 0.9


def path_of(row: dict[str, Any]) -> str:
    """A row's load path; rows written before there were several paths name only a protocol."""
    path: str = row.get("path") or {"http": "wrk", "grpc": "h2load"}[row["protocol"]]
    return path


def find_row(
    results: dict[str, Any], model: str, label: str, path: str, clients: int
) -> dict[str, Any] | None:
    """The row of one server on one path at one concurrency, if the run measured it."""
    rows: list[dict[str, Any]] = results["models"][model]["servers"].get(label, [])
    for row in rows:
        if "protocol" in row and path_of(row) == path and row["concurrency"] == clients:
            return row
    return None


def _ratio_check(
    results: dict[str, Any], precision: str, path: str, floor: float, target: str
) -> tuple[str, str, bool] | None:
    """Kiln against Triton at c=16 on the MLP, same path and precision; None if not measured."""
    kiln = find_row(results, "mlp", f"kiln ({precision})", path, 16)
    triton = find_row(results, "mlp", f"triton ({precision})", path, 16)
    if kiln is None or triton is None:
        return None
    ratio = kiln["throughput"] / triton["throughput"]
    measured = f"{kiln['throughput']:.0f} vs {triton['throughput']:.0f} req/s = {ratio:.2f}x"
    saturated = [
        who for who, row in (("kiln", kiln), ("triton", triton))
        if row["client_cpu"] >= SATURATED_CLIENT
    ]  # fmt: skip
    if saturated:
        measured += f" (client saturated: {', '.join(saturated)})"
    return target, measured, ratio >= floor


# Kiln fp32 over Triton fp32 at c=16 on the MLP, from the run before the comparison was made
# like for like (docs/benchmarks/runtime.json of that run): a later run may lose at most 10 %.
BASELINE_RATIOS = {"wrk": 4820 / 1643, "h2load": 5677 / 1366}
ALLOWED_REGRESSION = 0.9
OFF_TARGET = 0.99  # tracing off: at least 99 % of the throughput of the runtime without tracing
SAMPLED_TARGET = 0.95  # tracing at 1 % sampling: at least 95 % of off's
# Issue 20's targets on the paths users take: Kiln's throughput over Triton's at c=16.
USER_PATH_FLOORS = {
    "wrk-json": 3.0,
    "tritonclient-http": 3.0,
    "tritonclient-grpc": 4.0,
    "tritonclient-grpc-aio": 4.0,
}


def targets(results: dict[str, Any]) -> list[tuple[str, str, bool]]:
    """(target, measured, met) for each target whose rows the run measured.

    Throughput is judged like for like: Kiln and Triton serving the same program at the same
    precision (fp32 with fp32, the same INT8 program with INT8) on the same path. The
    ceilings (wrk, h2load) are each held to today's fp32 ratio less 10 %; the paths users
    take to issue 20's: JSON over HTTP at least 3x Triton, gRPC through tritonclient at least
    4x. A row whose client used most of its core says so: that ratio is the clients', not the
    servers'.
    """
    checks: list[tuple[str, str, bool]] = []
    if "mlp" not in results["models"]:
        return checks
    floors = [
        (path, ALLOWED_REGRESSION * baseline,
         f"{ALLOWED_REGRESSION * baseline:.2f}x Triton's (0.9 x the {baseline:.2f}x baseline)")
        for path, baseline in BASELINE_RATIOS.items()
    ] + [
        (path, floor, f"{floor:.0f}x Triton's") for path, floor in USER_PATH_FLOORS.items()
    ]  # fmt: skip
    for precision in ("fp32", "int8"):
        for path, floor, bound in floors:
            check = _ratio_check(
                results, precision, path, floor,
                f"MLP {PATH_NAMES[path]} {precision} vs {precision}: throughput at c=16 >= {bound}",
            )  # fmt: skip
            checks += [check] if check else []
    for path in ("wrk", "h2load"):  # the target names no protocol: both are held to it
        row = find_row(results, "mlp", "kiln (int8)", path, 1)
        if row is not None:
            p50 = row["p50_ms"]
            checks.append(
                (f"MLP {PATH_NAMES[path]}: p50 at c=1 <= 0.6 ms", f"{p50:.3f} ms", p50 <= 0.6)
            )
    checks += history_targets(results.get("history_ab"))
    if "transformer" not in results["models"]:
        return checks
    transformer = results["models"]["transformer"]
    for path in ("tritonclient-http", "tritonclient-grpc", "tritonclient-grpc-aio"):
        ours = find_row(results, "transformer", "kiln (fp32)", path, 16)
        theirs = find_row(results, "transformer", "triton (fp32)", path, 16)
        if ours is not None and theirs is not None:  # issue 39: the tail a compute-bound model
            checks.append((  # gets through the clients users run, against Triton's
                f"transformer {PATH_NAMES[path]}: p99 at c=16 <= Triton's",
                f"{ours['p99_ms']:.1f} vs {theirs['p99_ms']:.1f} ms",
                ours["p99_ms"] <= theirs["p99_ms"],
            ))  # fmt: skip
    for path in ("wrk", "h2load"):
        found = find_row(results, "transformer", "kiln (fp32)", path, 16)
        if found is None:
            continue
        row = found
        # the raw forward timed right after these runs, or else around all the servers
        limit = transformer.get("raw_forward_beside", {}).get(f"{path}@16")
        raw16 = 16 / (limit or transformer["raw_forward_seconds"]["fp32"])["16"]
        ratio = row["throughput"] / raw16
        checks.append((
            f"transformer {PATH_NAMES[path]}: throughput at c=16 >= 0.95x raw batch-16 forward",
            f"{row['throughput']:.1f} vs {raw16:.1f} rows/s = {ratio:.3f}x", ratio >= 0.95,
        ))  # fmt: skip
        tail = row["p99_ms"] / row["p50_ms"]
        checks.append((
            f"transformer {PATH_NAMES[path]}: p99 <= 1.5x p50 at c=16",
            f"p50 {row['p50_ms']:.1f} ms, p99 {row['p99_ms']:.1f} ms = {tail:.2f}x", tail <= 1.5,
        ))  # fmt: skip
    return checks


def load_table(results: dict[str, Any], model: str) -> list[str]:
    """One model's closed-loop runs: path x server x concurrency, Kiln's rows with their ratio
    to Triton's on the same path, precision and concurrency."""
    servers: dict[str, list[dict[str, Any]]] = results["models"][model]["servers"]
    lines = [
        "| path | server | clients | req/s | x Triton | p50 ms | p99 ms | errors "
        "| client CPU s/s | server CPU µs/req |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    measured = {path_of(row) for rows in servers.values() for row in rows if "protocol" in row}
    for path in [p for p in PATH_NAMES if p in measured]:
        for label, rows in servers.items():
            for row in rows:
                if "protocol" not in row or path_of(row) != path:
                    continue
                ratio = "-"
                if label.startswith("kiln "):
                    peer = label.replace("kiln ", "triton ", 1)
                    other = find_row(results, model, peer, path, row["concurrency"])
                    if other is not None and other["throughput"] > 0:
                        ratio = f"{row['throughput'] / other['throughput']:.2f}x"
                server_us = row.get("server_us_per_request")
                client = f"{row['client_cpu']:.2f}"
                if row["client_cpu"] >= SATURATED_CLIENT:
                    client = f"**{client}**"
                lines.append(
                    f"| {PATH_NAMES[path]} | {label} | {row['concurrency']} | "
                    f"{row['throughput']:.0f} | {ratio} | {row['p50_ms']:.3f} | "
                    f"{row['p99_ms']:.3f} | {row['errors']} | {client} | "
                    f"{'-' if server_us is None else f'{server_us:.0f}'} |"
                )
    return lines


def _shares(by_server: dict[str, float], spec: str) -> str:
    """'label: share, ...' of a per-server figure, each share formatted by ``spec``."""
    return ", ".join(f"{label}: {share:{spec}}" for label, share in by_server.items())


# What the host line says of the kiln_runtime build measured (``servers.build_of``).
BUILDS = {
    "compiled": "kiln_runtime as the image ships it: its request path compiled by mypyc "
    "(`make native`).",
    "pure": "kiln_runtime as pure Python (not compiled: not the build the image ships).",
}


def niceness(nice: int) -> str:
    """How the run stood against the host's other work: ``nice -n -20 make bench-runtime`` on
    a shared host gives the servers and clients the CPU whenever they want it."""
    if nice >= 0:
        return ""
    return (
        f"; servers and clients at nice {nice}, their sessions' autogroups too "
        "(`bench/proc.py`), so the host's other work at nice 0 gets about 1 % of a CPU they "
        "want (the CPUs' shared caches and memory are still shared)"
    )


def write_report(results: dict[str, Any], path: Path) -> None:
    lines = [
        "# kiln_runtime benchmark",
        "",
        "Generated by `make bench-runtime` (`runtime_image/bench/`); raw numbers in",
        "`runtime.json`, plot in `runtime.png`. Do not edit by hand: re-run the benchmark.",
        "",
        f"Host: {results['host']['cpus']} CPUs ({results['host']['machine']}), Python "
        f"{results['host']['python']}. {BUILDS[results['host'].get('runtime_build', 'pure')]} "
        "Server pinned to CPU 0 with one compute thread, every "
        "client to CPU 1" + niceness(results["host"].get("nice", 0)) + ". Closed loops of "
        f"{results['seconds_per_run']:g} s each on every path: the ceilings, `wrk` "
        "(binary-tensor HTTP bodies) and `h2load` (raw ModelInfer frames), and the paths users "
        "take: `wrk` posting the KServe v2 JSON body `curl` sends (the plain JSON poster), "
        "`tritonclient.http` with JSON tensors both ways (`binary_data=False`), and "
        "`tritonclient.grpc`, blocking from one thread per client and `.aio` (the Python "
        "clients in their own process, `bench/clients.py`; grpcio puts a client's streams on "
        "one connection). Triton is served by nvidia-pytriton with the same batching limits "
        "(max batch 32, max queue delay 2 ms) and the same TorchScript program at the same "
        "precision. A model's servers are all up together and take turns: for each path and "
        "concurrency each server gets one run, one after another, in an order reversed at "
        "every turn, so a ratio to Triton compares runs seconds apart, not minutes.",
        "",
        "## Targets",
        "",
        "| target | measured | met |",
        "|---|---|---|",
    ]
    for target, measured, met in targets(results):
        lines.append(f"| {target} | {measured} | {'yes' if met else '**no**'} |")
    lines += [
        "",
        "What each Python client can reach at all on this host, against a server that answers "
        "in no time, beside Kiln and Triton in the same run, and so which of these targets one "
        "client core allows: [client-ceiling.md](client-ceiling.md) (`make "
        "bench-client-ceiling`).",
    ]
    for model, data in results["models"].items():
        lines += ["", f"## {model}", ""]
        if data.get("load_average"):
            loads = ", ".join(
                f"{label}: {before:.1f} → {after:.1f}"
                for label, (before, after) in data["load_average"].items()
            )
            lines += [
                "Host load average (1 min) at the start of each server's runs, lowest → "
                f"highest: {loads}.",
                "",
            ]
        if data.get("steal"):
            lines += [
                "CPU time taken by the hypervisor for other guests (steal) while each server "
                f"ran: {_shares(data['steal'], '.0%')}. Above a few percent every number of "
                "that server is depressed.",
                "",
            ]
        if data.get("idle_cpu"):
            lines += [
                "CPU each server used of the server core while another was measured (what the "
                f"idle servers took from the one under load): {_shares(data['idle_cpu'], '.1%')}.",
                "",
            ]
        lines += ["Raw in-process forward (the limit), one thread (fp32: mean of before and "
                  "after the servers):", ""]  # fmt: skip
        lines += ["| program | batch | ms per batch | rows/s |", "|---|---|---|---|"]
        for program, timings in data["raw_forward_seconds"].items():
            for rows, seconds in timings.items():
                lines.append(
                    f"| {program} | {rows} | {seconds * 1e3:.3f} | {int(rows) / seconds:.0f} |"
                )
        if data.get("raw_forward_beside"):
            beside = ", ".join(
                f"after {PATH_NAMES[run.split('@')[0]]} at {run.split('@')[1]} clients "
                f"{16 / timings['16']:.1f} rows/s"
                for run, timings in data["raw_forward_beside"].items()
            )
            lines += [
                "",
                f"The raw batch-16 forward timed again right after the runs its target compares "
                f"with (the targets above use these): {beside}.",
            ]
        lines += ["", *load_table(results, model)]
    if "overload" in results:
        o = results["overload"]
        statuses = ", ".join(f"{code}: {count}" for code, count in sorted(o["statuses"].items()))
        after = o["after"]
        lines += [
            "",
            "## Overload (transformer, HTTP, open loop)",
            "",
            f"{o['rate']:.0f} requests/s (5x the measured capacity) for {o['seconds']:.0f} s: "
            f"{o['sent']} sent; answers by status: {statuses}; "
            f"{o['client_dropped']} not sent (client's connection bound reached).",
            "",
            f"- memory: server RSS {o['rss_baseline_bytes'] / 2**20:.0f} MiB before, at most "
            f"{o['rss_max_bytes'] / 2**20:.0f} MiB during the run (bounded queue).",
            f"- accepted requests: p50 {o['ok_p50_ms']:.1f} ms, p99 {o['ok_p99_ms']:.1f} ms.",
            f"- afterwards: {after['throughput']:.1f} req/s at c=1, p50 {after['p50_ms']:.1f} ms, "
            f"{after['errors']} errors; server still running: {o['still_running']}.",
        ]
    lines += history_section(results.get("history_ab"))
    lines += profile_section(results.get("profiles", []))
    lines += abuse_section(results.get("abuse", []))
    lines += [
        "",
        "## Reading the numbers",
        "",
        "- `client CPU` is the load generator's CPU seconds per second of the run (1.00 = its",
        f"  whole core; bold from {SATURATED_CLIENT:.2f}): there the client, not the server, may",
        "  limit the row, and a ratio to Triton is the clients' as much as the servers'.",
        "- `server CPU µs/req` is the CPU time of the server's process tree (Triton's children",
        "  included) over the run, from the kernel's accounting, per answered request: a",
        "  path's cost, less moved by a busy host than throughput. At low concurrency it also",
        "  carries the server's time between requests (event loop, batcher), so it is highest",
        "  at c=1.",
        "- The host is shared: other work competing with the server and the clients inflates",
        "  tails (p99) and lowers throughput for every server alike, and the host's speed",
        "  drifts over minutes; compare rows of one run, not runs. The load averages above",
        "  count the benchmark's own client threads too (up to 64 at the highest",
        "  concurrency), so they show other work only when far above that.",
        "- Overload: accepted requests wait behind up to `maxQueueSize` (256) others, so their",
        "  latency is about queue size / throughput; size the queue to the latency objective.",
        "- kiln (int8) is the MLP with dynamic INT8 quantization (`precision: int8`), the",
        "  optimization a CPU deployment should use; triton (int8) serves the same quantized",
        "  TorchScript program (`bench/int8.py`), so each precision is compared like for like.",
        "  INT8 changes outputs slightly (max abs error ~1e-2 on this model).",
        "- Abuse: what hostile clients cost (attack, peak RSS, probe p99, result) on both ports is",
        "  in [runtime-abuse.md](runtime-abuse.md), from the runtime's integration tests.",
        "",
    ]
    path.write_text("\n".join(lines))


def history_targets(ab: dict[str, Any] | None) -> list[tuple[str, str, bool]]:
    """Issue 39's (the limits cost no throughput beyond the noise: the 95 % interval of the
    paired ratio reaches 1) and issue 44's (the commit that added tracing, off, at least 0.99x
    its parent; today at 1 % sampling at least 0.95x off); the paired rounds of one run
    (``bench.history_ab``). A ratio with no target is shown in the section only."""
    if not ab:
        return []
    checks = []
    for ratio in ab["ratios"]:
        path = f"MLP {PATH_NAMES[ratio['path']]} c={ab['clients']}"
        low, high = ratio["interval_95"]
        mean = ratio["geometric_mean"]
        measured = (
            f"{mean:.3f}x (95 % interval {low:.3f}-{high:.3f}, {len(ratio['rounds'])} rounds)"
        )
        kind = ratio.get("target")
        if kind == "no loss beyond the noise":
            target = f"{path}: no throughput lost to the runtime's limits beyond the noise"
            met = high >= 1.0
        elif kind == "off":
            target = f"{path}: tracing off >= {OFF_TARGET:.2f}x the runtime without tracing"
            met = mean >= OFF_TARGET
        elif kind == "sampled":
            target = f"{path}: 1 % sampling >= {SAMPLED_TARGET:.2f}x tracing off"
            met = mean >= SAMPLED_TARGET
        else:
            continue
        checks.append((target, measured, met))
    return checks


def history_section(ab: dict[str, Any] | None) -> list[str]:
    """Today's runtime against its history: medians and paired ratios (``bench.history_ab``)."""
    if not ab:
        return []
    revisions = ", ".join(f"{name} (`{rev}`)" for name, rev in ab["history"].items())
    lines = [
        "",
        "## Today's runtime against its history (A/B in one run)",
        "",
        "`bench/history_ab.py`: the MLP (fp32) served by runtimes up together on the server "
        f"core, taking turns, {ab['rounds']} rounds of {ab['seconds']:g} s per path at "
        f"{ab['clients']} clients: {revisions}, each compiled as the working tree is, and "
        f"today's with tracing off and sampling {ab['sampling']:.0%} of requests to a real "
        "Jaeger (all-in-one, on the client core). Each ratio pairs runs of the same round, "
        "seconds apart; the targets above read the geometric mean over the rounds and its "
        "95 % interval (Student's t on the logarithms). Load average at the end: "
        f"{ab['load_average']:.1f}.",
        "",
        "| runtime | path | req/s | p50 ms | p99 ms | server µs/req |",
        "|---|---|---|---|---|---|",
    ]
    for row in ab["rows"]:
        lines.append(
            f"| {row['variant']} | {PATH_NAMES[row['path']]} | {row['throughput']:.0f} | "
            f"{row['p50_ms']:.3f} | {row['p99_ms']:.3f} | {row['server_us']:.0f} |"
        )
    lines += [
        "",
        "| runtime | against | path | per round | geometric mean | 95 % interval |",
        "|---|---|---|---|---|---|",
    ]
    for ratio in ab["ratios"]:
        each = ", ".join(f"{r:.3f}" for r in ratio["rounds"])
        low, high = ratio["interval_95"]
        lines.append(
            f"| {ratio['variant']} | {ratio['base']} | {PATH_NAMES[ratio['path']]} | {each} | "
            f"{ratio['geometric_mean']:.3f}x | {low:.3f}-{high:.3f} |"
        )
    return lines


def abuse_section(rows: list[dict[str, Any]]) -> list[str]:
    """The HTTP/1.1 abuse table: rows the integration tests write (``KILN_ABUSE_OUT``; the gRPC
    port's rows, ``port: grpc``, are ``bench.abuse_page``'s)."""
    rows = [row for row in rows if row.get("port", "http") == "http"]
    if not rows:
        return []
    lines = [
        "",
        "## Abuse (HTTP/1.1, MLP)",
        "",
        "From `tests/integration/runtime/test_http_limits.py` (a real runtime on loopback,",
        "limits lowered so each attack lasts ~2.5 s), `test_large_bodies.py` (the MLP with",
        "`maxBatchSize` 2048: a request may carry a million numbers) and",
        "`test_container_limits.py` (the runtime under `ulimit -n 1024`, default limits).",
        "A probe client sends one MLP inference",
        "every 10 ms throughout on its own keep-alive connection, and a readiness probe asks",
        "`/v2/health/ready` every 100 ms on a new connection, as the kubelet does; target:",
        "every probe answered, probe p99 <= 50 ms, readiness p99 <= 50 ms and maximum <= 250 ms.",
        "RSS is the runtime process's, sampled every 20 ms.",
        "",
        "| attack | peak RSS (start) | probe p99 (probes, failures) | readiness p99 / max "
        "(probes, failures) | host load | result |",
        "|---|---|---|---|---|---|",
    ]
    for row in rows:
        lines.append(
            f"| {row['attack']} | {row['peak_rss_mib']} MiB ({row['start_rss_mib']} MiB) | "
            f"{row['probe_p99_ms']:.1f} ms ({row['probes']}, {row['probe_failures']}) | "
            f"{readiness_cell(row)} | {row.get('load', '')} | {row['result']} |"
        )
    return lines


def readiness_cell(row: dict[str, Any]) -> str:
    """The readiness probe's p99 / maximum (probes, failures), marked when over its target."""
    if "ready_p99_ms" not in row:
        return "not measured"
    cell = (
        f"{row['ready_p99_ms']:.1f} / {row['ready_max_ms']:.1f} ms "
        f"({row['ready_probes']}, {row['ready_failures']})"
    )
    over = row["ready_p99_ms"] > 50 or row["ready_max_ms"] > 250 or row["ready_failures"]
    return f"**{cell}**" if over else cell


def profile_section(profiles: list[dict[str, Any]]) -> list[str]:
    """Where the server's time goes on the paths users take: the py-spy breakdowns
    (``bench.profile``), each with its flame graph, and what was done about them."""
    if not profiles:
        return []
    lines = [
        "",
        "## Where the server's time goes (py-spy)",
        "",
        "The server sampled with py-spy while 16 clients drive the MLP (fp32) through each",
        "path (`bench/profile.py`; `make bench-runtime-profile` writes only these), serving the",
        "pure-Python source: py-spy reads Python frames, and a function compiled by mypyc has",
        "none (its samples would all fall to the event loop). The compiled build runs the same",
        "functions; the runtime's own parts below are what it shortens. Samples of",
        "a thread waiting (in `epoll_wait`, or the model thread idle) are dropped, so the",
        "shares are of the server's busy time; each sample is counted under the innermost",
        "frame that names a part of the runtime, and µs/request is that share of the run's",
        "server CPU per request. Hover a box of a flame graph for its frame and share. Two",
        "cautions: py-spy pauses the server for each sample, so a profiled run's CPU per",
        "request is above the unprofiled rows'; and a thread that is runnable but waiting for",
        "its core (other work on a shared host) counts as busy, which inflates the share of",
        "long stretches of compute, the model's forward above all.",
    ]
    for found in profiles:
        lines += [
            "",
            f"**{found['title']}**, {found['clients']} clients: {found['throughput']:.0f} req/s, "
            f"server {found['server_us_per_request']:.0f} µs CPU/request, "
            f"{found['busy_samples']} busy samples; flame graph "
            f"[{found['svg']}]({found['svg']}).",
            "",
            "| part | share of busy time | ≈ µs/request |",
            "|---|---|---|",
        ]
        for part, share in found["breakdown"].items():
            us = share * found["server_us_per_request"]
            lines.append(f"| {part} | {share:.1%} | {us:.0f} |")
    lines += [
        "",
        "What these profiles led to (measured A/B against the runtime before them with",
        '`bench/ab.py`, numbers in docs/runtime.md, "Per-request CPU on the gRPC path"):',
        "",
        "- **The model thread hand-off.** The fp32 MLP's largest warm-up batch (32 rows) takes",
        "  about 1.4 ms, over the 1 ms inline limit, so every batch went to the model thread:",
        "  an executor submit, a wake-up through the event loop's self-pipe and GIL hand-overs",
        "  on the one core the server has, about a tenth of its busy time under tritonclient,",
        "  and batches that took twice their compute time while the loop kept waking for the",
        "  client's frames. The inline decision is now per batch: the warm-up sizes are timed,",
        "  the time of a batch between two of them interpolated, and a batch expected under",
        "  1 ms computes on the event loop (the MLP fp32 here: batches up to about 18 of its",
        "  32 rows; INT8 every batch, as before; the transformer every batch in its thread).",
        "- **One write per loop turn.** Each answer used to leave in its own `send`; the answers",
        "  of one batch on one connection (tritonclient's 16 streams share one) now leave",
        "  together at the end of the loop turn that completed them.",
        "- **grpcio's WINDOW_UPDATEs** (about 1.6 per call) no longer walk the blocked and",
        "  queued streams when none is waiting; repeated header lists are checked",
        "  (RFC 9113 8.2-8.3) once per connection; a unary answer that fits the peer's windows",
        "  goes out without being parked and accounted.",
        "- **The JSON path**: orjson already parses and writes the tensors (its share above is",
        "  the floor of that work); the HTTP/1.1 server and the hand-off are the rest. The",
        "  tritonclient.http rows stay client-bound (its core is saturated before the server's).",
        "- **Halves for clients slower than the server.** tritonclient.grpc sends a batch's 16",
        "  follow-up requests over about 1.8 ms of its own CPU (.aio: after answering all 16",
        "  replies), so with whole batches the server and the clients worked in turn. When the",
        "  server's idle time per batch exceeds twice the fixed cost of one more batch, batches",
        "  are now halves: one computes while the clients answer and send the other",
        '  (docs/runtime.md, "Halves for clients slower than the server").',
        "- **The compiled request path.** After all of the above, no single function of the",
        "  runtime's own took more than a few µs per call; together they were about half of",
        "  the server's CPU per call under tritonclient. mypyc now compiles the modules a",
        "  request runs through (runtime_image/setup.py), as the image ships them",
        '  (docs/runtime.md, "The compiled request path").',
        "- **A longer inline limit when the thread cannot overlap.** On a slower host the fp32",
        "  MLP's halves of 8 rows took 1.4 ms, over 1 ms, and went to the model thread, where",
        "  on the server's one CPU they took about twice that while the loop read the other",
        "  half. A model computing on the CPU with a thread per CPU of the server leaves the",
        "  loop no CPU of its own, so the thread buys nothing there; such a model now computes",
        "  batches expected under 4 ms inline (bench/ab.py, same session, 3 rounds: 1.29x",
        "  through tritonclient.grpc and 1.32x through .aio at 16 clients, the other paths",
        '  within the noise; docs/runtime.md, "Inline compute").',
        "- **Answers out before the next inline batch.** After an inline batch, the next batch",
        "  (already queued: the other half, or the next 32 rows under 64 clients) was formed and",
        "  computed in the turn its callers resumed, before the HTTP/2 connection's end-of-turn",
        "  write, so the answered clients also waited for the next batch's compute. The batcher",
        "  now gives the loop that turn first (bench/ab.py, 64 clients fp32, 12 rounds:",
        "  tritonclient.grpc.aio 1.06x, h2load 1.04x; at 16 clients within the noise).",
        "- **Per-call objects built by compiled code.** The dataclasses and NamedTuples a call",
        "  made (tensors, the request and response, the HTTP/2 stream, the batch policy's",
        "  stats) had constructors mypyc leaves interpreted, and each request updated",
        "  prometheus_client objects; they are now plain compiled classes and scrape-time",
        "  reads (bench/replay.py INT8: 124 to 103 µs per call; bench/ab.py, 16 clients, 3",
        "  rounds: every path whose client is not saturated 1.08-1.23x, .aio 1.16x INT8;",
        '  docs/runtime.md, "What mypyc left interpreted").',
        "- **Repeated protobuf fields read as slices; each call's task named.** A profile of",
        "  the server's C functions (perf) showed protobuf's repeated fields iterated through a",
        "  formatted IndexError each, and uvloop formatting a Task-N name per call; the request",
        "  decoder now slices those fields and builds each call's task named (bench/replay.py,",
        "  CPU per call before over after, paired medians of 10: INT8 1.02x and 1.07x, fp32",
        '  1.05x; docs/runtime.md, "Two costs found in the server\'s own profile").',
    ]
    return lines
