"""The runtime's limits derived at start-up from the container's own: memory and open files.

Why: fixed defaults ignored the pod. The HTTP/1.1 port's request buffers defaulted to 1 GiB
(32 unfinished 60 MiB bodies added 930 MB of resident memory, past many pods' limits: an OOM
kill, not a refusal), and the default connection caps (1,024 per port, plus the health
budgets) exceed the 1,024 descriptors a container often gets, so under ``ulimit -n 1024`` the
process ran out of descriptors (accept failed, readiness probes were refused) before any cap
was reached. Limits the config sets stay as set; the others are derived here:

- **Memory**: the request buffers of the two serving ports together take at most
  ``MEMORY_SHARE`` (a quarter) of the cgroup's memory limit, half each (each port's
  ``processBufferBytes``: the smaller of its default and an eighth of the limit, and never less
  than one largest request plus 1 MiB, so a legal request always fits). No limit (or none
  readable): the defaults.
- **Open files**: the soft ``RLIMIT_NOFILE`` is first raised to the hard one (what the
  container allows; the soft is often 1,024 by convention only). ``FD_RESERVE`` descriptors are
  kept for the model's files, the logs, the decoding process's socket and the listening
  sockets; the metrics port gets up to 64 connections (at least 4); the rest is shared by the
  HTTP and gRPC ports equally, each keeping up to 32 of its share for health checks and the
  other for ``maxConnections`` (at most the default 1,024).

The pure part (``fit``) decides from the numbers; ``read_memory_limit`` and ``raise_open_files``
read and change the process's limits.
"""

from __future__ import annotations

import dataclasses
import resource
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kiln_runtime.config import RuntimeConfig

MEMORY_SHARE = 4  # the request buffers of both ports: at most 1/MEMORY_SHARE of the limit
FD_RESERVE = 64
METRICS_CONNECTIONS = 64
HEALTH_CONNECTIONS = 32
CGROUP_FILES = (
    Path("/sys/fs/cgroup/memory.max"),  # cgroup v2
    Path("/sys/fs/cgroup/memory/memory.limit_in_bytes"),  # v1
)
UNLIMITED = 1 << 60  # v1 writes "no limit" as a huge number (9223372036854771712)


@dataclass(frozen=True)
class Fit:
    """The config with derived limits, the metrics port's cap, and what was decided (for the
    start-up log and the statistics endpoint)."""

    config: RuntimeConfig
    metrics_connections: int
    report: dict[str, Any]


def fit(config: RuntimeConfig, memory_limit: int | None, open_files: int) -> Fit:
    """The limits ``config`` leaves unset, derived from the container's memory limit (bytes;
    None: unlimited) and its open-file limit (after raising the soft one to the hard)."""
    explicit = config.explicit
    http, http2 = config.http, config.http2
    one_request = config.max_request_bytes() + (1 << 20)
    if memory_limit is not None:
        share = max(memory_limit // (2 * MEMORY_SHARE), one_request)
        if "http.processBufferBytes" not in explicit:
            process = min(http.process_buffer_bytes, share)
            http = dataclasses.replace(
                http,
                process_buffer_bytes=process,
                connection_buffer_bytes=min(http.connection_buffer_bytes, process),
            )
        if "http2.processBufferBytes" not in explicit:
            process = min(http2.process_buffer_bytes, share)
            http2 = dataclasses.replace(
                http2,
                process_buffer_bytes=process,
                connection_buffer_bytes=min(http2.connection_buffer_bytes, process),
            )
    available = max(open_files - FD_RESERVE, 0)
    metrics_connections = max(4, min(METRICS_CONNECTIONS, available // 32))
    per_port = max((available - metrics_connections) // 2, 2)
    health = min(HEALTH_CONNECTIONS, per_port // 8)
    capped = max(per_port - health, 1)
    if "http.maxConnections" not in explicit:
        http = dataclasses.replace(http, max_connections=min(http.max_connections, capped))
    if "http.healthConnections" not in explicit:
        http = dataclasses.replace(http, health_connections=min(http.health_connections, health))
    if "http2.maxConnections" not in explicit:
        http2 = dataclasses.replace(http2, max_connections=min(http2.max_connections, capped))
    if "http2.healthConnections" not in explicit:
        http2 = dataclasses.replace(http2, health_connections=min(http2.health_connections, health))
    report = {
        "memory_limit_bytes": memory_limit,
        "open_files": open_files,
        "http": {
            "max_connections": http.max_connections,
            "health_connections": http.health_connections,
            "process_buffer_bytes": http.process_buffer_bytes,
            "connection_buffer_bytes": http.connection_buffer_bytes,
        },
        "grpc": {
            "max_connections": http2.max_connections,
            "health_connections": http2.health_connections,
            "process_buffer_bytes": http2.process_buffer_bytes,
            "connection_buffer_bytes": http2.connection_buffer_bytes,
        },
        "metrics": {"max_connections": metrics_connections},
        "explicit": sorted(explicit),
    }
    fitted = dataclasses.replace(config, http=http, http2=http2)
    return Fit(fitted, metrics_connections, report)


def read_memory_limit(files: tuple[Path, ...] = CGROUP_FILES) -> int | None:
    """The cgroup's memory limit in bytes, or None when there is none (or none is readable)."""
    for path in files:
        try:
            text = path.read_text().strip()
        except OSError:
            continue
        if text == "max":
            return None
        try:
            value = int(text)
        except ValueError:
            continue
        return None if value >= UNLIMITED else value
    return None


def raise_open_files() -> int:
    """Raise the soft open-file limit to the hard one; the soft limit now in force."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    most = 1 << 20  # what Linux lets a process have at most (fs.nr_open's default)
    if soft == resource.RLIM_INFINITY:
        return most
    wanted = most if hard == resource.RLIM_INFINITY else hard
    if soft < wanted:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
            soft = wanted
        except (ValueError, OSError):
            pass
    return soft
