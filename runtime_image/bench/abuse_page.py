"""Render docs/benchmarks/runtime-abuse.md from the rows the runtime's abuse tests write.

Why it exists: the abuse tables are measured by integration tests, not by `make bench-runtime`
(which links the page). With ``KILN_ABUSE_OUT=FILE`` set, the HTTP/1.1 tests
(``tests/integration/runtime/test_http_limits.py``) and the gRPC port's
(``tests/integration/runtime/test_abuse.py``) append one JSON line per attack to FILE; this turns
those lines into the page, so the tables are the last run's, never hand-copied:

    KILN_ABUSE_OUT=/tmp/abuse.jsonl pytest tests/integration/runtime/test_http_limits.py \\
        tests/integration/runtime/test_abuse.py tests/integration/runtime/test_large_bodies.py \\
        tests/integration/runtime/test_container_limits.py
    cd runtime_image && python -m bench.abuse_page --rows /tmp/abuse.jsonl \\
        --out ../docs/benchmarks/runtime-abuse.md

Pure apart from reading and writing the two files.
"""

from __future__ import annotations

import argparse
import json
import statistics
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench.report import abuse_section, readiness_cell

# The gRPC test's attacks, as the page names them, in its order.
GRPC_ATTACKS = {
    "rapid-reset": "rapid reset (HEADERS + RST_STREAM, CVE-2023-44487)",
    "empty-data": "empty DATA flood",
    "empty-continuation": "empty CONTINUATION flood",
    "ping": "PING flood",
    "settings": "SETTINGS flood",
    "unread-answers": "calls whose answers are never read (windows granted, one connection)",
    "streams-over-limit": "calls whose answers are never read, default windows (streams past "
    "the concurrency limit)",
    "connections": "connection flood (2000 connections), then a health check on a new one",
    "slowloris": "slowloris (200 connections, half a preface)",
    "big-metadata": "20 KiB of metadata per call",
    "huge-metadata": "64 KiB of metadata per call (4x the limit)",
    "huge-prefix": "a ModelInfer message whose length prefix declares 4 GiB, and its first 16 KiB",
    "idle-connections": "1,100 connections that send a preface and nothing more, then a "
    "new client's health check",
}
PROBE_TARGET_MS = 50.0


def grpc_section(rows: list[dict[str, Any]]) -> list[str]:
    """The gRPC port's table: attack, the server's answer, peak RSS over the baseline, probe p99
    (several runs of an attack are one row, each run's number in order, judged on their
    median: one run on a busy shared host does not decide it)."""
    if not rows:
        return []
    runs: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        runs.setdefault(row["attack"], []).append(row)
    lines = [
        "",
        "## Abuse (HTTP/2, the gRPC port)",
        "",
        "From `tests/integration/runtime/test_abuse.py`: the attacks of",
        "`tests/integration/runtime/attacks.py`, each in its own process, bounded in time",
        "(2.5-10 s) and count, against a runtime serving the MLP on loopback with `http2:",
        "{maxConnections: 64, healthConnections: 4, headerTimeoutSeconds: 1,",
        "connectionBufferBytes: 16 MiB, processBufferBytes: 64 MiB}`, while a probe client",
        "(tritonclient gRPC, its channel opened before the attack) calls ModelInfer about 150",
        "times a second, a readiness probe asks `/v2/health/ready` every 100 ms on a new",
        "connection (as the kubelet does; target p99 <= 50 ms, maximum <= 250 ms), and the",
        "runtime's RSS is sampled every 20 ms. Target: every probe",
        f"answered, p99 <= {PROBE_TARGET_MS:.0f} ms, judged on the median of an attack's runs",
        "(each run's p99 is listed). The attacker, the server and the probe share the host's",
        "CPUs (its load average is in the host load column). The probe's tail under",
        'the unread answers, and what was done about it: [runtime.md](../runtime.md), "A client',
        'that does not read its answers".',
        "",
        "| attack | server's answer | peak RSS over baseline | probe p99 (probes, failures) | "
        "readiness p99 / max (probes, failures) | host load | result |",
        "|---|---|---|---|---|---|---|",
    ]
    for attack in [*GRPC_ATTACKS, *sorted(set(runs) - set(GRPC_ATTACKS))]:
        if attack not in runs:
            continue
        done = runs[attack]
        p99s = [row["probe_p99_ms"] for row in done]
        met = statistics.median(p99s) <= PROBE_TARGET_MS and not any(
            row["probe_failures"] for row in done
        )
        ready = not any(readiness_cell(row).startswith("**") for row in done)
        result = "ok" if met else f"**probe p99 over the {PROBE_TARGET_MS:.0f} ms target**"
        if not ready:
            result = ("probe ok" if met else result) + "; **readiness over its target**"
        lines.append(
            f"| {GRPC_ATTACKS.get(attack, attack)} | {done[-1]['result']} | "
            f"{max(row['peak_rss_mib'] for row in done):.1f} MiB | "
            + " / ".join(f"{p99:.1f}" for p99 in p99s)
            + f" ms ({sum(r['probes'] for r in done)}, {sum(r['probe_failures'] for r in done)})"
            + f" | {'; '.join(readiness_cell(r) for r in done)}"
            + f" | {' / '.join(str(r.get('load', '')) for r in done)} | {result} |"
        )
    return lines


def render(rows: list[dict[str, Any]], measured: str) -> str:
    http = [row for row in rows if row.get("port", "http") == "http"]
    grpc = [row for row in rows if row.get("port") == "grpc"]
    lines = [
        "# Runtime abuse tables",
        "",
        "What a hostile or careless client costs the runtime and its well-behaved clients: "
        "attack, peak RSS, probe p99, result. Not generated by `make bench-runtime` (its page, "
        "[runtime.md](runtime.md), links here): the runtime's integration tests run the attacks "
        "and assert the limits, and with `KILN_ABUSE_OUT=FILE` write these rows; "
        "`python -m bench.abuse_page` (in `runtime_image/`) renders them. Measured "
        f"{measured}.",
        *abuse_section(http),
        *grpc_section(grpc),
        "",
    ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=Path, required=True, help="KILN_ABUSE_OUT's JSON lines")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--notes", type=Path, help="Markdown appended after the tables")
    args = parser.parse_args()
    rows = [json.loads(line) for line in args.rows.read_text().splitlines() if line.strip()]
    measured = datetime.fromtimestamp(args.rows.stat().st_mtime, UTC).strftime("%Y-%m-%d")
    text = render(rows, measured)
    if args.notes is not None:
        text += "\n" + args.notes.read_text()
    args.out.write_text(text)
    print(f"wrote {args.out} ({len(rows)} rows)", flush=True)


if __name__ == "__main__":
    main()
