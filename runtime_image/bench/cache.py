"""The response cache's benchmark: the same runtime with and without ``cache``, side by side.

Two kiln_runtime servers serve the example MLP, pinned to one core, one with a response cache
and one without; wrk, pinned to the other core, posts binary-tensor bodies. Each run draws a
popular body (16 of them, sent once to the cached server before the run) with the row's hit
ratio, else a body no request sent before (a counter in its first two floats, new for every
run), so the cached server sees that hit ratio and the plain one the same mix. The two servers
take turns run by run, so a pair is measured seconds apart. Per run: throughput, p50/p99 at the
client, the server's own mean time per request (``kiln_request_duration_seconds``, decode to
encode), its CPU per request, and the cache's lookup time and observed hit ratio (its metrics).
The full ``make bench-runtime`` (Triton beside Kiln, ~16 minutes) is not needed for this A/B.

    cd runtime_image && python -m bench.cache --out ../docs/benchmarks/cache.md
"""

from __future__ import annotations

import argparse
import asyncio
import http.client
import json
import math
import os
import platform
import re
import statistics
import struct
import subprocess
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import numpy as np

from bench import loadgen, servers
from kiln_runtime.examples import write_example

SERVER_CORE = 0
CLIENT_CORE = 1
RATIOS = (0, 50, 90, 99, 100)
POPULAR = 16
CACHE = {"maxBytes": 64 << 20, "ttlSeconds": 3600}

_SCRIPT = """
local f = io.open("{bodies}", "rb")
local data = f:read("*all")
f:close()
local size = {size}
local popular = {{}}
for i = 0, {count} - 1 do popular[i + 1] = data:sub(i * size + 1, (i + 1) * size) end
local base = popular[1]
local offset = {offset}
local run = {run}
local ratio = {ratio}
local counter = 0
wrk.method = "POST"
wrk.headers["Inference-Header-Content-Length"] = "{header_length}"
wrk.headers["Content-Type"] = "application/octet-stream"
local function bytes4(n)
  return string.char(n % 256, math.floor(n / 256) % 256, math.floor(n / 65536) % 256, 0x3c)
end
request = function()
  local body
  if math.random() * 100 < ratio then
    body = popular[math.random(#popular)]
  else
    counter = counter + 1
    body = base:sub(1, offset) .. bytes4(counter) .. bytes4(run) .. base:sub(offset + 9)
  end
  return wrk.format(nil, nil, nil, body)
end
done = function(summary, latency, requests)
  io.write(string.format("KILN %d %d %d %d %d\\n", summary.requests, summary.duration,
    summary.errors.status + summary.errors.connect + summary.errors.read +
    summary.errors.write + summary.errors.timeout,
    latency:percentile(50), latency:percentile(99)))
end
"""


def scrape(server: servers.Server) -> dict[str, float]:
    """The sums this benchmark reads from the server's metrics (each over all labels)."""
    connection = http.client.HTTPConnection(servers.HOST, server.metrics_port, timeout=10)
    connection.request("GET", "/metrics")
    text = connection.getresponse().read().decode()
    names = (
        "kiln_request_duration_seconds_sum", "kiln_request_duration_seconds_count",
        "kiln_cache_lookup_duration_seconds_sum", "kiln_cache_lookup_duration_seconds_count",
        "kiln_cache_hits_total", "kiln_cache_misses_total", "kiln_batch_size_count",
    )  # fmt: skip
    totals = dict.fromkeys(names, 0.0)
    for line in text.splitlines():
        match = re.match(r"^(\w+)(?:\{.*\})? (\S+)$", line)
        if match and match.group(1) in totals:
            totals[match.group(1)] += float(match.group(2))
    return totals


def run_once(
    server: servers.Server,
    scratch: Path,
    bodies: list[bytes],
    header_length: int,
    offset: int,
    *,
    ratio: int,
    run: int,
    seconds: float,
    concurrency: int,
) -> dict[str, Any]:
    (scratch / "bodies.bin").write_bytes(b"".join(bodies))
    script = scratch / "mix.lua"
    settings = {
        "bodies": scratch / "bodies.bin", "size": len(bodies[0]), "count": len(bodies),
        "offset": offset, "run": run, "ratio": ratio, "header_length": header_length,
    }  # fmt: skip
    script.write_text(_SCRIPT.format(**settings))
    url = f"http://{servers.HOST}:{server.http_port}/v2/models/mlp/infer"
    command = [
        "taskset", "-c", str(CLIENT_CORE), "wrk", "-t1", f"-c{concurrency}",
        f"-d{max(1, round(seconds))}s", "--timeout", "10s", "-s", str(script), url,
    ]  # fmt: skip
    before, cpu_before = scrape(server), server.cpu_seconds()
    completed = subprocess.run(
        command, capture_output=True, text=True, timeout=seconds + 60, check=True
    )
    cpu = server.cpu_seconds() - cpu_before
    after = scrape(server)
    match = re.search(r"^KILN (\d+) (\d+) (\d+) (\d+) (\d+)", completed.stdout, re.MULTILINE)
    if match is None:
        raise RuntimeError(f"wrk printed no summary:\n{completed.stdout}\n{completed.stderr}")
    requests, duration_us, errors, p50_us, p99_us = (int(g) for g in match.groups())
    delta = {k: after[k] - before[k] for k in after}
    counted = max(delta["kiln_request_duration_seconds_count"], 1.0)
    lookups = delta["kiln_cache_lookup_duration_seconds_count"]
    cache_total = delta["kiln_cache_hits_total"] + delta["kiln_cache_misses_total"]
    return {
        "requests": requests,
        "errors": errors,
        "throughput": requests / (duration_us / 1e6),
        "p50_ms": p50_us / 1e3,
        "p99_ms": p99_us / 1e3,
        "server_us": delta["kiln_request_duration_seconds_sum"] / counted * 1e6,
        "server_cpu_us": cpu / max(requests, 1) * 1e6,
        "lookup_us": (
            delta["kiln_cache_lookup_duration_seconds_sum"] / lookups * 1e6 if lookups else None
        ),
        "hit_ratio": delta["kiln_cache_hits_total"] / cache_total if cache_total else None,
        "batches": delta["kiln_batch_size_count"],
    }


def warm(server: servers.Server, bodies: list[bytes], header_length: int) -> None:
    """Each popular body once, so that the cached server holds them before a run."""
    for body in bodies:
        connection = http.client.HTTPConnection(servers.HOST, server.http_port, timeout=30)
        connection.request(
            "POST",
            "/v2/models/mlp/infer",
            body,
            {"Inference-Header-Content-Length": str(header_length)},
        )
        response = connection.getresponse()
        response.read()
        assert response.status == 200, response.status
        connection.close()


def _patched(body: bytes, offset: int, counter: int) -> bytes:
    """``body`` with its first two input floats replaced: a request no one sent before."""
    return body[:offset] + struct.pack("<II", counter, 0x3C000000) + body[offset + 8 :]


async def _in_process(model_dir: Path, bodies: list[bytes], header_length: int, calls: int,
                      blocks: int) -> dict[str, Any]:  # fmt: skip
    """A request's time inside the runtime, no socket: ``RestAdapter.handle`` as the HTTP server
    calls it, on a data plane built as ``serve`` builds it, with a cache. Hits: the same body
    again (the fastest of ``blocks`` blocks: what a hit costs when the host does not
    interrupt). Misses: blocks of new bodies, the cache off then on, block by block, compared
    pair by pair: the same model, batcher and inline choice, only the cache differs."""
    import torch

    from kiln_runtime.config import parse_config
    from kiln_runtime.metrics import RuntimeMetrics
    from kiln_runtime.model import ModelRunner
    from kiln_runtime.protocol.rest import RestAdapter
    from kiln_runtime.server import serving_dataplane

    torch.set_num_threads(1)
    document = json.loads((model_dir / "config.json").read_text())
    executor = ThreadPoolExecutor(max_workers=1)
    # No queue delay: a lone request is computed at once, so a miss's time is the runtime's
    # work and the model's, not the batcher's wait for company.
    batching = {**document.get("batching", {}), "maxQueueDelayMicroseconds": 0}
    config = parse_config({**document, "batching": batching, "cache": CACHE})
    dataplane = serving_dataplane(config, RuntimeMetrics("mlp"), executor)
    await dataplane.start(lambda: ModelRunner(config, model_dir / "model.pt"))
    cache = dataplane.cache
    adapter = RestAdapter(dataplane)
    headers = {"inference-header-content-length": str(header_length)}
    path = "/v2/models/mlp/infer"

    async def timed(sent: list[bytes]) -> float:
        started = time.perf_counter()
        for body in sent:
            answer = await adapter.handle("POST", path, headers, body)
            assert answer.status == 200, answer.body
        return (time.perf_counter() - started) / len(sent)

    await timed(bodies[:1])
    hit = min([await timed(bodies[:1] * calls) for _ in range(blocks)])
    counter = 1 << 20
    times: dict[str, list[float]] = {"none": [], "cache": []}
    for _ in range(blocks * calls):
        for label in ("none", "cache"):
            # the same data plane (model, batcher, inline choice), its cache off, then on,
            # request by request: the host's drift falls on both alike
            dataplane.cache = None if label == "none" else cache
            counter += 1
            times[label].append(await timed([_patched(bodies[0], header_length, counter)]))
    assert cache is not None
    # The cache's own work on a miss, alone: key, lookup, store (a copy of the answer), on
    # decoded new requests; the fastest of the blocks, as for the hit.
    from kiln_runtime.protocol.rest import decode_infer
    from kiln_runtime.protocol.types import Tensor

    batch_out = np.zeros((32, 10), np.float32)
    work = []
    for _ in range(blocks):
        requests = []
        for _ in range(calls):
            counter += 1
            body = _patched(bodies[0], header_length, counter)
            requests.append(decode_infer("mlp", "", headers, body, len(body)))
        started = time.perf_counter()
        for request in requests:
            key = cache.key(request, [request.inputs[0].data])
            assert key is not None and cache.lookup(key) is None
            cache.store(key, [Tensor("OUTPUT__0", "FP32", batch_out[3:4])])
        work.append((time.perf_counter() - started) / calls)
    miss_lookup = min(work)
    await dataplane.stop()
    executor.shutdown()
    return {
        "hit_us": hit * 1e6,
        "miss_us": {k: statistics.median(v) * 1e6 for k, v in times.items()},
        "miss_mean_us": {k: statistics.fmean(v) * 1e6 for k, v in times.items()},
        "miss_lookup_us": miss_lookup * 1e6,
        "misses": len(times["cache"]),
        "calls": calls,
        "blocks": blocks,
    }


def measure(rounds: int, seconds: float, concurrency: int) -> dict[str, Any]:
    results: dict[str, dict[int, list[dict[str, Any]]]] = {
        "cache": {r: [] for r in RATIOS},
        "none": {r: [] for r in RATIOS},
    }
    load_before = os.getloadavg()[1]
    with tempfile.TemporaryDirectory() as scratch_name, ExitStack() as stack:
        scratch = Path(scratch_name)
        model_dir = scratch / "mlp"
        write_example("mlp", model_dir)
        plain = stack.enter_context(
            servers.kiln(model_dir, "mlp", SERVER_CORE, scratch / "plain.log")
        )
        cached = stack.enter_context(
            servers.kiln(
                model_dir, "mlp", SERVER_CORE, scratch / "cached.log", sections={"cache": CACHE}
            )
        )
        rng = np.random.default_rng(0)
        bodies = []
        header_length = 0
        for _ in range(POPULAR):
            x = rng.standard_normal((1, 512)).astype(np.float32)
            body, header_length = loadgen.http_body("mlp", "INPUT__0", "FP32", x)
            bodies.append(body)
        offset = header_length  # the first float of the raw tensor
        warm(cached, bodies, header_length)
        warm(plain, bodies, header_length)
        in_process = asyncio.run(_in_process(model_dir, bodies, header_length, 100, 50))
        run = 0
        for _ in range(rounds):
            for ratio in RATIOS:
                for label, server in (("none", plain), ("cache", cached)):
                    run += 1
                    measured = run_once(
                        server, scratch, bodies, header_length, offset,
                        ratio=ratio, run=run, seconds=seconds, concurrency=concurrency,
                    )  # fmt: skip
                    results[label][ratio].append(measured)
    return {
        "rounds": rounds,
        "seconds": seconds,
        "concurrency": concurrency,
        "host": f"{platform.machine()}, {platform.python_version()}",
        "date": time.strftime("%Y-%m-%d", time.gmtime()),
        "results": results,
        "in_process": in_process,
        "load": [load_before, os.getloadavg()[1]],
    }


def _median(runs: list[dict[str, Any]], key: str) -> float:
    values = [r[key] for r in runs if r[key] is not None]
    return statistics.median(values) if values else float("nan")


def render(measured: dict[str, Any]) -> str:
    results = measured["results"]
    lines = [
        "# Response cache: the same runtime with and without `spec.runtime.cache`",
        "",
        "Written by `make bench-cache` (`runtime_image/bench/cache.py`); measured on "
        f"{measured['date']} ({measured['host']}), a shared 2-core host. Two kiln_runtime "
        "servers (compiled build) serve the example MLP (512 → 10, fp32, CPU), pinned to one "
        "core; wrk on the other posts binary-tensor bodies over "
        f"{measured['concurrency']} connections, {measured['seconds']:.0f} s a run. A run draws "
        f"one of {POPULAR} popular bodies with the row's probability, else a body never sent "
        "before; the two servers take turns run by run, and each row is the median of "
        f"{measured['rounds']} runs. The cache's own metrics give the observed hit ratio and "
        "its lookup time (hash and LRU, hit or miss); `server µs` is the runtime's mean "
        "`kiln_request_duration_seconds` (decode to encode, in process); `CPU µs` its process's "
        "CPU per request.",
        "",
        "| hit ratio | server | throughput (req/s) | p50 (ms) | p99 (ms) | server µs | CPU µs "
        "| lookup µs | observed hits | errors |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for ratio in RATIOS:
        for label in ("none", "cache"):
            runs = results[label][ratio]
            hits = _median(runs, "hit_ratio")
            lookup = _median(runs, "lookup_us")
            lines.append(
                f"| {ratio} % | {'cache' if label == 'cache' else 'no cache'} "
                f"| {_median(runs, 'throughput'):,.0f} | {_median(runs, 'p50_ms'):.2f} "
                f"| {_median(runs, 'p99_ms'):.2f} | {_median(runs, 'server_us'):.1f} "
                f"| {_median(runs, 'server_cpu_us'):.0f} "
                f"| {'' if math.isnan(lookup) else f'{lookup:.1f}'} "
                f"| {'' if math.isnan(hits) else f'{hits:.1%}'} "
                f"| {sum(r['errors'] for r in runs)} |"
            )
    miss = results["cache"][0]
    none = results["none"][0]
    ratios = [c["server_us"] / n["server_us"] for c, n in zip(miss, none, strict=True)]
    cpu_ratios = [c["server_cpu_us"] / n["server_cpu_us"] for c, n in zip(miss, none, strict=True)]
    local = measured["in_process"]
    none_us, cache_us = local["miss_us"]["none"], local["miss_us"]["cache"]
    lines += [
        "",
        "## Against the targets",
        "",
        "In process (`RestAdapter.handle` on a data plane built as `serve` builds it, no "
        "socket, one request at a time, no queue delay):",
        "",
        f"- **A hit's server time**: {local['hit_us']:.1f} µs (the fastest of {local['blocks']} "
        f"blocks of {local['calls']}; target ≤ 50 µs): decoding the body, the key's hash, the "
        "lookup, encoding.",
        f"- **A miss against no cache**: {cache_us / none_us - 1:+.1%} (median request "
        f"{cache_us:.1f} µs against {none_us:.1f} µs over {local['misses']} new requests each, "
        "the same data plane with its cache off and on by turns; means "
        f"{local['miss_mean_us']['cache']:.1f} and {local['miss_mean_us']['none']:.1f} µs). "
        f"The cache's own work on a miss (key, lookup and storing a copy of the answer, timed "
        f"alone, fastest of {local['blocks']} blocks of {local['calls']}): "
        f"{local['miss_lookup_us']:.1f} µs, "
        f"{local['miss_lookup_us'] / none_us:.1%} of a request without a cache (target "
        "≤ +2 %).",
        "",
        "Over loopback (the table): a hit's mean server time "
        f"{_median(results['cache'][100], 'server_us'):.1f} µs at 100 % hits; at 0 % hits "
        f"the cached server's mean time {statistics.median(ratios) - 1:+.1%} and CPU per request "
        f"{statistics.median(cpu_ratios) - 1:+.1%} against the plain one (run pairs). The "
        "host's 5-minute load average was "
        f"{measured['load'][0]:.1f} before and {measured['load'][1]:.1f} after the run, on "
        "2 cores: other processes took turns on the servers' core, so the loopback times "
        "(and the metrics' lookup times, wall clock) carry their waits, and a pair's ratio at "
        "0 % hits moves by tens of percent either way from run to run. The in-process numbers, "
        "the fastest block or the median of requests taken by turns, are the targets' "
        "measure.",
        "",
        "## How to read it",
        "",
        "A hit skips the batcher and the model: its time is decoding, hashing, the lookup and "
        "encoding. At 0 % hits the cached server does everything the plain one does plus the "
        "key's hash, the lookup and a copy of the answer into the cache (the plain server "
        "still sees the same bodies). Between 0 and 100 % the cached server's throughput is "
        "bounded by its misses: each still costs a forward pass.",
        "",
    ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="the Markdown page to write")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=4.0)
    parser.add_argument("--concurrency", type=int, default=8)
    args = parser.parse_args()
    measured = measure(args.rounds, args.seconds, args.concurrency)
    args.out.with_suffix(".json").write_text(json.dumps(measured, indent=1) + "\n")
    args.out.write_text(render(measured))
    print(args.out.read_text())


if __name__ == "__main__":
    main()
