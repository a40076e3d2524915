"""Where the server's time goes: py-spy flame graphs of kiln_runtime under the users' clients.

Server CPU per request says how much a path costs; a profile says where. This serves the MLP
(fp32, pinned to the server core as in the benchmark), drives it with one of the Python
clients of ``bench.clients`` at 16 clients, and samples the server with ``py-spy record`` for
the length of the run. py-spy's own flame graph counts a thread blocked in a system call
(``epoll_wait``, a queue's ``get``) as busy, so the stacks are taken raw and those whose
innermost frame is such a wait are dropped (``IDLE_LEAVES``): what remains is close to CPU
time. From them this writes a flame graph (an SVG, ``flamegraph``) and a breakdown: each sample
goes to the category of its innermost frame that names one (``CATEGORIES``).

    cd runtime_image && python -m bench.profile --out ../docs/benchmarks [--seconds 10]

Writes ``profile-<name>.svg`` per profile and ``runtime-profile.json`` (the breakdowns, the
busiest frames, each run's throughput and server CPU per request). ``bench.run --profile``
does the same at the end of a benchmark run, and the report shows the breakdowns.
"""

from __future__ import annotations

import argparse
import html
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import zlib
from collections import Counter
from pathlib import Path
from typing import Any

from bench import loadgen, servers
from kiln_runtime.examples import example_input, write_example

SERVER_CORE = 0
CLIENT_CORE = 1
RATE = 200  # samples per second: py-spy pauses the server briefly for each

# name -> (load path of bench.clients, clients, what the profile is of)
PROFILES: dict[str, tuple[str, int, str]] = {
    "grpc-tritonclient": ("tritonclient-grpc", 16, "gRPC through tritonclient.grpc (threads)"),
    "http-json-tritonclient": (
        "tritonclient-http", 16, "HTTP JSON through tritonclient.http (binary_data=False)",
    ),
}  # fmt: skip

# Innermost frames that are a thread waiting, not working (py-spy cannot always tell).
IDLE_LEAVES = (
    "EpollSelector.select (selectors.py",
    "_PollLikeSelector.select (selectors.py",
    "_worker (concurrent/futures/thread.py",
    "Condition.wait (threading.py",
    "Event.wait (threading.py",
    "Thread._wait_for_tstate_lock",
    "serve_forever (socketserver.py",
)
# (category, substrings of a frame): a sample goes to the first category, in this order, that
# names its innermost matching frame; frames are searched from the innermost out.
CATEGORIES: list[tuple[str, tuple[str, ...]]] = [
    ("model forward (torch)", ("ModelRunner.forward", "(torch/")),
    ("socket writes (send, kernel loopback)", ("_SelectorSocketTransport.write",
                                               "_SelectorSocketTransport._write_ready")),
    ("socket reads", ("_read_ready__data_received", "_read_ready__get_buffer")),
    ("model thread hand-off (executor, self-pipe)", ("concurrent/futures", "_write_to_self",
                                                     "_read_from_self", "call_soon_threadsafe",
                                                     "run_in_executor")),
    ("JSON (orjson, numpy)", ("kiln_runtime/protocol/rest.py", "kiln_runtime/datatypes.py")),
    ("HTTP/1.1 server (httptools)", ("kiln_runtime/protocol/httpserver.py",)),
    ("protobuf decode/encode", ("parse_message", "decode_infer", "encode_infer",
                                "SerializeToString", "service_pb2")),
    ("HPACK", ("kiln_runtime/protocol/hpack",)),
    ("HTTP/2 frames (in and out)", ("kiln_runtime/protocol/http2/",)),
    ("gRPC layer (routing, framing, status)", ("kiln_runtime/protocol/grpcserver.py",
                                               "kiln_runtime/protocol/grpc.py")),
    ("batcher and data plane (validation, metrics)", ("kiln_runtime/batcher.py",
                                                      "kiln_runtime/batch_policy.py",
                                                      "kiln_runtime/dataplane.py",
                                                      "kiln_runtime/metrics.py",
                                                      "kiln_runtime/protocol/types.py")),
    ("asyncio (tasks, futures, event loop)", ("asyncio/",)),
]  # fmt: skip
OTHER = "other"


def parse_collapsed(text: str) -> Counter[tuple[str, ...]]:
    """py-spy's raw output: ``frame;frame;... count`` per line, outermost frame first."""
    stacks: Counter[tuple[str, ...]] = Counter()
    for line in text.splitlines():
        stack, _, count = line.rstrip().rpartition(" ")
        if stack and count.isdigit():
            stacks[tuple(stack.split(";"))] += int(count)
    return stacks


def busy(stacks: Counter[tuple[str, ...]]) -> Counter[tuple[str, ...]]:
    """The samples of threads that were working (``IDLE_LEAVES`` dropped)."""
    return Counter({s: n for s, n in stacks.items() if not s[-1].startswith(IDLE_LEAVES)})


def category(stack: tuple[str, ...]) -> str:
    for frame in reversed(stack):
        for name, needles in CATEGORIES:
            if any(needle in frame for needle in needles):
                return name
    return OTHER


def breakdown(stacks: Counter[tuple[str, ...]]) -> dict[str, float]:
    """Each category's share of the busy samples, largest first."""
    total = sum(stacks.values()) or 1
    shares: Counter[str] = Counter()
    for stack, count in stacks.items():
        shares[category(stack)] += count
    return {name: count / total for name, count in shares.most_common()}


def top_frames(stacks: Counter[tuple[str, ...]], count: int = 12) -> dict[str, float]:
    """The innermost frames taking most of the busy samples (self time), with their shares."""
    total = sum(stacks.values()) or 1
    leaves: Counter[str] = Counter()
    for stack, samples in stacks.items():
        leaves[stack[-1]] += samples
    return {frame: samples / total for frame, samples in leaves.most_common(count)}


def flamegraph(stacks: Counter[tuple[str, ...]], title: str) -> str:
    """A flame graph as a standalone SVG: one box per frame, as wide as its samples, callers
    below callees; hover a box for its frame, samples and share."""
    tree: dict[str, Any] = {"n": 0, "kids": {}}
    for stack, count in stacks.items():
        node = tree
        node["n"] += count
        for frame in stack:
            node = node["kids"].setdefault(frame, {"n": 0, "kids": {}})
            node["n"] += count
    total = tree["n"] or 1

    def depth(node: dict[str, Any]) -> int:
        return 1 + max((depth(k) for k in node["kids"].values()), default=0)

    width, row, top = 1200.0, 16, 40
    height = top + row * depth(tree) + 10
    boxes: list[str] = []

    def draw(node: dict[str, Any], frame: str, x: float, level: int) -> None:
        w = width * node["n"] / total
        if w < 0.3:
            return
        y = height - 10 - row * (level + 1)
        label = html.escape(frame)
        share = 100 * node["n"] / total
        hue = 20 + zlib.crc32(frame.split(" (", maxsplit=1)[0].encode()) % 40
        text = ""
        if w > 40:
            short = html.escape(frame.split(" (", maxsplit=1)[0][: int(w / 6.5)])
            text = f'<text x="{x + 3:.1f}" y="{y + 12}">{short}</text>'
        boxes.append(
            f"<g><title>{label} ({node['n']} samples, {share:.1f}%)</title>"
            f'<rect x="{x:.1f}" y="{y}" width="{w:.1f}" height="{row - 1}" '
            f'fill="hsl({hue},90%,60%)"/>{text}</g>'
        )
        child_x = x
        for kid_frame, kid in sorted(node["kids"].items()):
            draw(kid, kid_frame, child_x, level + 1)
            child_x += width * kid["n"] / total

    x = 0.0
    for frame, kid in sorted(tree["kids"].items()):
        draw(kid, frame, x, 0)
        x += width * kid["n"] / total
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width:.0f}" height="{height}" '
        f'font-family="monospace" font-size="11">'
        f'<rect width="100%" height="100%" fill="#fafafa"/>'
        f'<text x="10" y="20" font-size="14">{html.escape(title)}</text>'
        f'<text x="10" y="34">{total} busy samples; hover a box for its frame and share</text>'
        + "".join(boxes)
        + "</svg>\n"
    )


def profile(
    model_dir: Path,
    name: str,
    out: Path,
    *,
    seconds: float,
    rate: int,
    log: Path,
    code: Path,
    precision: str = "fp32",
) -> dict[str, Any]:
    """One profile: serve the MLP from ``code`` (a pure copy: py-spy sees no frame inside
    compiled code), load it through the profile's client, sample with py-spy."""
    path, clients, title = PROFILES[name]
    beside = Path(sys.executable).with_name("py-spy")  # the virtualenv's, off PATH under make
    spy = str(beside) if beside.exists() else shutil.which("py-spy")
    if spy is None:
        raise RuntimeError("py-spy not found: pip install py-spy (the runtime's bench extra)")
    x = example_input("mlp", 1).numpy()
    optimization = {"precision": precision}
    with (
        servers.kiln(model_dir, "mlp", SERVER_CORE, log, optimization, code=code) as server,
        tempfile.TemporaryDirectory() as scratch,
    ):
        port = server.grpc_port if path.startswith("tritonclient-grpc") else server.http_port
        url = f"{servers.HOST}:{port}"
        loadgen.run_python_client(path, url, "mlp", x, concurrency=clients, seconds=1.0,
                                  max_requests=100_000, core=CLIENT_CORE,
                                  server_pid=server.process.pid)  # fmt: skip
        raw = Path(scratch) / "stacks.txt"
        sampler = subprocess.Popen(
            [spy, "record", "--pid", str(server.process.pid), "--rate", str(rate),
             "--duration", str(round(seconds)), "--nolineno", "--format", "raw",
             "--output", str(raw)],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        time.sleep(0.5)  # py-spy attached
        result = loadgen.run_python_client(
            path, url, "mlp", x, concurrency=clients, seconds=seconds - 1, max_requests=1_000_000,
            core=CLIENT_CORE, server_pid=server.process.pid,
        )  # fmt: skip
        _, stderr = sampler.communicate(timeout=seconds + 60)
        if sampler.returncode != 0 or not raw.exists():
            raise RuntimeError(f"py-spy failed ({sampler.returncode}): {stderr[-2000:]}")
        stacks = parse_collapsed(raw.read_text())
    working = busy(stacks)
    title_line = (
        f"kiln_runtime (pure source), MLP {precision}, {title}, {clients} clients: "
        f"{result.throughput:.0f} req/s, server {result.server_us_per_request:.0f} µs CPU/request"
    )
    svg = out / f"profile-{name}{'' if precision == 'fp32' else '-' + precision}.svg"
    svg.write_text(flamegraph(working, title_line))
    return {
        "name": name,
        "title": title,
        "precision": precision,
        "clients": clients,
        "svg": svg.name,
        "throughput": result.throughput,
        "server_us_per_request": result.server_us_per_request,
        "client_cpu": result.client_cpu,
        "samples": sum(stacks.values()),
        "busy_samples": sum(working.values()),
        "breakdown": breakdown(working),
        "top_frames": top_frames(working),
    }


def run_profiles(
    out: Path, *, seconds: float, rate: int, names: list[str], precision: str = "fp32"
) -> list[dict[str, Any]]:
    with tempfile.TemporaryDirectory() as scratch:
        model_dir = Path(scratch) / "mlp"
        write_example("mlp", model_dir)
        pure = servers.pure_copy(Path(scratch) / "source")  # once for all the profiles
        found = []
        for name in names:
            print(f"profile: {name}", flush=True)
            found.append(profile(model_dir, name, out, seconds=seconds, rate=rate,
                                 log=Path(scratch) / f"{name}.log", code=pure,
                                 precision=precision))  # fmt: skip
            for category_name, share in found[-1]["breakdown"].items():
                print(f"  {share:6.1%} {category_name}", flush=True)
            for frame, share in found[-1]["top_frames"].items():
                print(f"  {share:6.1%} self: {frame}", flush=True)
    (out / "runtime-profile.json").write_text(json.dumps(found, indent=1))
    return found


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--rate", type=int, default=RATE, help="samples per second")
    parser.add_argument("--profiles", nargs="+", choices=list(PROFILES), default=list(PROFILES))
    parser.add_argument("--precision", choices=["fp32", "int8"], default="fp32")
    args = parser.parse_args()
    os.sched_setaffinity(0, {CLIENT_CORE})
    args.out.mkdir(parents=True, exist_ok=True)
    run_profiles(
        args.out, seconds=args.seconds, rate=args.rate, names=args.profiles,
        precision=args.precision,
    )  # fmt: skip


if __name__ == "__main__":
    main()
