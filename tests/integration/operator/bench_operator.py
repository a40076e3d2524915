"""`make bench-operator`: how fast the operator converges many InferenceServices, how much
memory it takes, how many writes a resync of converged objects costs, and what the autoscaler
costs at steady load.

For each count N: a fresh namespace, one operator process serving it, N InferenceServices
applied in one `kubectl apply`; measured: the time until every child (Deployment, Service)
exists and every status is written, the operator's peak RSS (VmHWM), and the operator's writes
(from the API server's audit log) during one full resync of the converged objects.

The autoscaler at steady load (`--autoscaler-counts`): N InferenceServices whose pods' metrics
are served by one synthetic exporter (`synthetic_runtimes.py`) and scraped by a real
Prometheus every 15 s, as the runtime's are; measured over a steady window: the operator's API
writes (audit log), the queries Prometheus answered (its own /metrics), the evaluation lag
(the operator's /metrics), RSS and CPU.
Results go to a Markdown report (and a JSON file beside it); the sections other benchmarks
wrote into that page between their markers are kept.
"""

import argparse
import asyncio
import contextlib
import json
import multiprocessing
import os
import platform
import re
import statistics
import sys
import time
import urllib.request
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import yaml

from kiln_localcluster.cluster import LocalCluster
from kiln_localcluster.processes import free_ports, spawn, stop, wait_started
from kiln_localcluster.waiting import http_ok, wait_for
from kiln_operator.builders import Owner, build_deployment, build_service
from kiln_operator.builders.naming import grpc_address, http_url, label_selector_string
from kiln_operator.handlers.inferenceservice import CHILD_LABELS
from kiln_operator.k8s.client import ApiError, KubeClient, load_configuration
from kiln_operator.k8s.events import post_event
from kiln_operator.k8s.platform import PlatformObjects
from kiln_operator.k8s.reconciler import STATUS_MANAGER
from kiln_operator.k8s.resources import (
    DEPLOYMENTS,
    INFERENCE_SERVICES,
    PDBS,
    PLATFORM_RESOURCES,
    PODS,
    SERVICES,
)
from kiln_operator.status import compute_status
from kiln_operator.status.compute import ReconcileObservation
from tests.integration.benchpage import write_page
from tests.integration.conftest import Cluster
from tests.integration.operator.conftest import (
    AuditLog,
    OperatorProcess,
    install_crds,
    pending_service,
)
from tests.integration.operator.synthetic_runtimes import SyntheticRuntimes
from tests.sessioncluster import REPO

TARGET_SECONDS_1000 = 60.0
TARGET_BARE_RATIO = 1.1
"""Issue 18: where the API server's creates are the bound, the operator within 1.1x of a bare
client making the same requests in the same run."""
TARGET_RSS_MB = 300.0
PLACEMENT = (
    "Placement: the control plane (etcd, kube-apiserver, controller-manager, scheduler, kwok) "
    "runs on the first half of the CPUs, the clients under test (the bare clients, the "
    "operator) and the benchmark's own checks on the other half, as in a cluster, where the "
    "operator runs on a worker node and not on the API server's cores, and as the runtime's "
    "benchmark places its server and its clients. The control plane is started on its CPUs, so "
    "the Go runtime sizes itself to them (GOMAXPROCS). On this host that is one CPU each, so "
    "every time is longer than with the control plane on both. The earlier way, every process "
    "on both CPUs and the clients under SCHED_IDLE, still let the operator's 14 to 19 s of CPU "
    "per 1,000 services run on the cores the API server needed (the CPUs were under 2 % idle): "
    "the operator measured 1.38x the bare client there (2026-11-26, medians of 3 rounds). In a "
    "trial the same day with the control plane on CPU 0 and the client on CPU 1, 1,000 "
    "services, one fresh control plane per run, in this order: bare client 117.8 s, operator "
    "106.3 s, watching bare client 107.2 s, operator 100.5 s, bare client 89.8 s (the bare "
    "client then ran in a thread of the benchmark's process, whose checks parse every "
    "service's objects each second under the same GIL; it now runs in a process of its own, "
    "as the operator does). After the "
    "rounds, the operator and the bare client each run once more with every process on every "
    "CPU at equal priority: reported, not judged."
)
"""Why the control plane and the clients under test get CPUs of their own, and what was
measured to decide."""
CREATE_CONCURRENCY = 64
QUIET_SECONDS = 10.0
RESYNC_SECONDS = 300.0
"""The operator's default: a service's first resync (which reads the API server) comes 150 to
450 s after it is first seen, so none starts while converging."""
SCRAPE_SECONDS = 15.0
"""Prometheus' default scrape interval, and the autoscaler's default evaluation interval."""
STEADY_SECONDS = 120.0
TARGET_WRITES_PER_MINUTE = 5.0
TARGET_QUERIES_PER_CYCLE = 10.0
TARGET_CPU_CORES = 0.25
WATCH_SECONDS = 3600
"""The bare client's watches' request timeout: they last its whole run."""


def peak_rss_mb(pid: int) -> float:
    """VmHWM: the high-water mark of the process's resident set."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmHWM for pid {pid}")


WRITE_LOG = re.compile(r" ((created|updated|deleted) \S+|status of) \S+/\S+ \[\w+\]$", re.M)
"""The reconcile loop logs each write it makes on one line of these forms."""
RESYNC_WRITE_LOG = re.compile(
    r" ((created|updated|deleted) \S+|status of) \S+/\S+ \[resync\]$", re.M
)
"""... and tags those the resync timer's reconciles made."""


def create_latencies(audit: AuditLog, since: int, namespace: str) -> dict[str, float]:
    """The API server's median time to answer the operator's creates of Deployments and
    Services in the namespace (from the audit log): what bounds how fast children appear."""
    with audit.path.open("rb") as log:
        log.seek(since)
        lines = log.read().decode().splitlines()
    seconds: dict[str, list[float]] = {"deployments": [], "services": []}
    for line in lines:
        entry = json.loads(line) if line.strip() else {}
        ref = entry.get("objectRef") or {}
        if (
            entry.get("verb") == "create"
            and ref.get("namespace") == namespace
            and ref.get("resource") in seconds
            and entry.get("userAgent", "").startswith("kiln-operator/")
        ):
            received = datetime.fromisoformat(entry["requestReceivedTimestamp"])
            answered = datetime.fromisoformat(entry["stageTimestamp"])
            seconds[ref["resource"]].append((answered - received).total_seconds())
    return {kind: round(statistics.median(v), 3) for kind, v in seconds.items() if v}


def writes_by_client(audit: AuditLog, since: int, until: int, namespace: str) -> dict[str, int]:
    """Every write in the namespace between two marks of the audit log, counted by client
    (user agent without its version) and request: what the API server did meanwhile."""
    with audit.path.open("rb") as log:
        log.seek(since)
        lines = log.read(until - since).decode().splitlines()
    counts: Counter[str] = Counter()
    for line in lines:
        entry = json.loads(line) if line.strip() else {}
        ref = entry.get("objectRef") or {}
        if entry.get("verb") in ("get", "list", "watch") or ref.get("namespace") != namespace:
            continue
        agent = entry.get("userAgent", "").split(" ", 1)[0]
        client = agent if agent.startswith("kiln-operator/") else agent.split("/", 1)[0]
        sub = f"/{ref['subresource']}" if ref.get("subresource") else ""
        counts[f"{client} {entry['verb']} {ref.get('resource')}{sub}"] += 1
    return dict(counts.most_common())


def reconcile_writes(process: OperatorProcess) -> int:
    """How many writes the reconcile loop has logged so far."""
    return len(WRITE_LOG.findall(process.output()))


def reconcile_quiet(process: OperatorProcess) -> bool:
    """True once the reconcile loop has logged no write for QUIET_SECONDS in a row."""
    before = reconcile_writes(process)
    time.sleep(QUIET_SECONDS)
    return reconcile_writes(process) == before


def cpu_seconds(pid: int) -> float:
    """User + system CPU time the process has used so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def create_all(cluster: Cluster, namespace: str, manifests: list[dict[str, Any]]) -> None:
    """POST every InferenceService at once (bounded to CREATE_CONCURRENCY requests in flight):
    kubectl apply would send them one by one under its client-side rate limit."""
    async with KubeClient(await load_configuration(str(cluster.kubeconfig))) as kube:
        gate = asyncio.Semaphore(CREATE_CONCURRENCY)

        async def create(manifest: dict[str, Any]) -> None:
            async with gate:
                await kube.create(INFERENCE_SERVICES, namespace, manifest)

        await asyncio.gather(*(create(m) for m in manifests))


async def watch_and_discard(kube: KubeClient, namespace: str) -> None:
    """Hold the watches the operator holds on a namespace (InferenceServices; Deployments,
    Services, PDBs and pods by Kiln's label, as `handlers.inferenceservice` asks kopf to), in
    JSON as kopf asks, reading every event and parsing none: what serving a controller's watches
    costs the API server, without the controller's own work."""
    selector = ",".join(f"{key}={value}" for key, value in CHILD_LABELS.items())
    watches: list[tuple[str, list[tuple[str, str]]]] = [
        (INFERENCE_SERVICES.path(namespace), []),
        *(
            (r.path(namespace), [("labelSelector", selector)])
            for r in (DEPLOYMENTS, SERVICES, PDBS, PODS)
        ),
    ]

    async def one(path: str, query: list[tuple[str, str]]) -> None:
        response = await kube._api.call_api(
            path, "GET", query_params=[("watch", "true"), *query],
            header_params={"Accept": "application/json"}, auth_settings=["BearerToken"],
            _preload_content=False, _request_timeout=WATCH_SECONDS,
        )  # fmt: skip
        async for _ in response.content.iter_any():
            pass

    await asyncio.gather(*(one(path, query) for path, query in watches))


async def bare_client(
    kubeconfig: str,
    namespace: str,
    manifests: list[dict[str, Any]],
    watching: bool,
    started: Callable[[float], None],
) -> None:
    """The API server's bound, without the operator: the same requests a new service costs the
    operator, from one client with the same concurrency. InferenceServices POSTed as
    `create_all` does; as each is created, one of CREATE_CONCURRENCY workers (the operator's
    reconcile workers) creates its Deployment and Service concurrently (as the operator's
    builders make them), then server-side-applies the status the operator's first reconcile
    writes and posts its events. `watching`: meanwhile it holds the operator's watches
    (`watch_and_discard`), the bound for any controller that watches what it owns. `started`
    gets the time (monotonic) of its first POST."""
    platform = PlatformObjects()
    async with KubeClient(await load_configuration(kubeconfig)) as kube:
        watches: asyncio.Task[None] | None = (
            asyncio.create_task(watch_and_discard(kube, namespace)) if watching else None
        )
        await asyncio.sleep(1.0 if watching else 0.0)  # the watches are up before the clock
        started(time.monotonic())
        posts = asyncio.Semaphore(CREATE_CONCURRENCY)
        workers = asyncio.Semaphore(CREATE_CONCURRENCY)

        async def one(manifest: dict[str, Any]) -> None:
            async with posts:
                body = await kube.create(INFERENCE_SERVICES, namespace, manifest)
            async with workers:
                meta = body["metadata"]
                owner = Owner(name=meta["name"], namespace=namespace, uid=meta["uid"])
                spec = platform.effective(body).spec
                assert spec is not None, f"{owner.name}: the sample's spec does not resolve"
                deployment, _ = await asyncio.gather(
                    kube.create(
                        DEPLOYMENTS, namespace,
                        build_deployment(spec, owner, spec.autoscaling.min_replicas),
                    ),
                    kube.create(SERVICES, namespace, build_service(owner, scrape_annotations=True)),
                )  # fmt: skip
                observation = ReconcileObservation(
                    generation=int(meta.get("generation") or 0), spec_error=None,
                    deployment=deployment, min_replicas=spec.autoscaling.min_replicas,
                    selector=label_selector_string(owner.name), url=http_url(owner),
                    grpc_address=grpc_address(owner),
                )  # fmt: skip
                update = compute_status({}, observation, datetime.now(UTC))
                await kube.apply_status(
                    INFERENCE_SERVICES, namespace, owner.name, update.applied, STATUS_MANAGER
                )
                for event in update.events:
                    await post_event(
                        kube, body, type=event.type, reason=event.reason, message=event.message
                    )

        await asyncio.gather(*(one(m) for m in manifests))
        if watches is not None:
            watches.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watches


async def crds_served(cluster: Cluster) -> bool:
    """Whether every kind the operator lists at start-up can be listed."""
    async with KubeClient(await load_configuration(str(cluster.kubeconfig)), "bench") as kube:
        try:
            for resource in (INFERENCE_SERVICES, *PLATFORM_RESOURCES):
                await kube.list(resource, None)
        except ApiError:
            return False
    return True


async def _convergence(kubeconfig: str, namespace: str, count: int) -> tuple[bool, bool]:
    async with KubeClient(await load_configuration(kubeconfig), component="bench") as kube:
        services = await kube.list(INFERENCE_SERVICES, namespace)
        if len(services) != count or any(
            (s.get("status") or {}).get("observedGeneration") != s["metadata"]["generation"]
            for s in services
        ):
            return False, False
        deployments = {d["metadata"]["name"]: d for d in await kube.list(DEPLOYMENTS, namespace)}
        if len(deployments) != count or len(await kube.list(SERVICES, namespace)) != count:
            return False, False
    for service in services:
        status = service.get("status") or {}
        deployment = deployments[service["metadata"]["name"]]
        reported = deployment.get("status") or {}
        if (
            reported.get("observedGeneration") != deployment["metadata"]["generation"]
            or status.get("replicas") != int(reported.get("replicas") or 0)
            or status.get("updatedReplicas") != int(reported.get("updatedReplicas") or 0)
        ):
            return True, False
    return True, True


def convergence(cluster: Cluster, namespace: str, count: int) -> tuple[bool, bool]:
    """(written, settled). Written: every child exists and every status is written for the
    current generation (the issue's definition). Settled: moreover every status reflects its
    Deployment as the Deployment controller last reported it, which waits for the
    controller-manager to create every ReplicaSet and Pod and report on them."""
    return asyncio.run(_convergence(str(cluster.kubeconfig), namespace, count))


@dataclass(frozen=True)
class Placement:
    """The CPUs of one run: the control plane's, and the clients' (the bare client or the
    operator, and the benchmark's own checks). See PLACEMENT."""

    control_plane: frozenset[int]
    clients: frozenset[int]


def own_cpus(available: set[int]) -> Placement:
    """The control plane on the first half of the CPUs, the clients on the rest."""
    if len(available) < 2:
        raise ValueError(f"placing the control plane and the clients apart needs 2 CPUs, not "
                         f"{len(available)}")  # fmt: skip
    ordered = sorted(available)
    half = len(ordered) // 2
    return Placement(frozenset(ordered[:half]), frozenset(ordered[half:]))


def shared_cpus(available: set[int]) -> Placement:
    """Every process on every CPU."""
    return Placement(frozenset(available), frozenset(available))


def pin_this_process(cpus: frozenset[int]) -> None:
    """Every thread of this process to `cpus`; the threads and processes it starts later
    inherit them."""
    for thread in os.listdir("/proc/self/task"):
        with contextlib.suppress(ProcessLookupError):  # a thread that ended meanwhile
            os.sched_setaffinity(int(thread), cpus)


def fresh_cluster(local: LocalCluster, placement: Placement) -> Cluster:
    """The local control plane started anew (a running one is stopped) on the placement's
    control-plane CPUs, Kiln's CRDs served; this process then on the clients' CPUs: every run
    starts from the same state. On one control plane a run measured slower the more runs came
    before it (the bare client at 1,000: 57.6 s first, 65.8 s three runs later; the API
    server's memory grew from run to run), which favoured whichever run came first."""
    local.down()
    pin_this_process(placement.control_plane)  # what it starts inherits the CPUs
    try:
        cluster = Cluster(local.up())
    finally:
        pin_this_process(placement.clients)
    install_crds(cluster)
    # Established is not yet served: for a moment a new CRD's requests answer 429 ("storage is
    # (re)initializing"); the bare client's creates are not retried.
    wait_for(lambda: asyncio.run(crds_served(cluster)), timeout=120, interval=2,
             description="the CRDs served")  # fmt: skip
    return cluster


def _bare_client_process(
    kubeconfig: str, namespace: str, count: int, watching: bool, times: Connection
) -> None:
    """`bare_client` in a process of its own, as the operator runs in its own: the benchmark's
    checks (each parses three LISTs of every service) hold the benchmark's GIL, not the
    client's. Sends the time of its first POST, then the time of its last answer."""
    manifests = [pending_service(f"svc-{i:04d}") for i in range(count)]
    asyncio.run(bare_client(kubeconfig, namespace, manifests, watching, times.send))
    times.send(time.monotonic())


def run_bare(cluster: Cluster, count: int, watching: bool = False) -> dict[str, Any]:
    """`bare_client` for N services in a fresh namespace, in a process of its own: its time
    until the same check as the operator's run (`convergence`, polled the same way) sees every
    child and status written. The clock starts at its first POST (with `watching`, once the
    watches are up)."""
    namespace = f"bench-bare-{count}-{uuid.uuid4().hex[:6]}"
    cluster.kubectl("create", "namespace", namespace)
    audit = AuditLog(cluster.audit_log)
    audit_start = audit.mark()
    load_before = os.getloadavg()[0]
    spawning = multiprocessing.get_context("spawn")  # no fork of a process with threads
    times, sender = spawning.Pipe(duplex=False)
    client = spawning.Process(
        target=_bare_client_process,
        args=(str(cluster.kubeconfig), namespace, count, watching, sender),
        daemon=True,
    )
    client.start()
    started: list[float] = []

    def written_or_failed() -> bool:
        if not started and times.poll():
            started.append(times.recv())
        if client.exitcode not in (None, 0):
            return True
        return bool(started) and convergence(cluster, namespace, count)[0]

    try:
        wait_for(
            written_or_failed,
            timeout=900,
            interval=1.0,
            description=f"{count} services written by the bare client",
        )
        if client.exitcode not in (None, 0):
            raise RuntimeError(f"the bare client exited with {client.exitcode}")
        written = time.monotonic() - started[0]
        audit_written = audit.mark()
        last_answer = times.recv() if times.poll(60) else None
    finally:
        client.join(timeout=60)
        if client.is_alive():
            client.kill()
    latencies = create_latencies(audit, audit_start, namespace)
    return {
        "written_seconds": round(written, 1),
        "client_seconds": round(last_answer - started[0], 1) if last_answer else None,
        "create_p50_seconds": latencies,
        "writes_until_written": writes_by_client(audit, audit_start, audit_written, namespace),
        "load_average": [round(load_before, 1), round(os.getloadavg()[0], 1)],
    }


def run_one(
    cluster: Cluster,
    count: int,
    work: Path,
    reconcile_only: bool,
    *,
    measure_resync: bool = True,
) -> dict[str, Any]:
    """One operator process serving N new services: time until written and settled, its CPU
    and peak RSS, and (with `measure_resync`) the writes of one full resync afterwards. The
    operator inherits this process's CPUs (`fresh_cluster` placed it)."""
    namespace = f"bench-{count}-{uuid.uuid4().hex[:6]}"
    cluster.kubectl("create", "namespace", namespace)
    audit = AuditLog(cluster.audit_log)
    (port,) = free_ports(1)
    operator = OperatorProcess(
        cluster,
        work / f"operator-{count}.log",
        [namespace],
        resync_seconds=RESYNC_SECONDS,
        liveness=f"http://127.0.0.1:{port}/healthz",
        reconcile_only=reconcile_only,
    )
    try:
        wait_for(
            lambda: http_ok(f"http://127.0.0.1:{port}/healthz"),
            timeout=60,
            description="the operator's liveness endpoint",
        )
        # a sentinel proves the operator's watches are up before the clock starts
        asyncio.run(create_all(cluster, namespace, [pending_service("sentinel")]))
        wait_for(
            lambda: convergence(cluster, namespace, 1)[1],
            timeout=120,
            interval=0.5,
            description="the sentinel service converged",
        )
        manifests = [pending_service(f"svc-{i:04d}") for i in range(count)]
        audit_start = audit.mark()
        cpu_before = cpu_seconds(operator.pid)
        load_before = os.getloadavg()[0]
        started = time.monotonic()
        asyncio.run(create_all(cluster, namespace, manifests))
        applied = time.monotonic() - started
        written_at: list[float] = []
        audit_written: list[int] = []

        def settled() -> bool:
            written, done = convergence(cluster, namespace, count + 1)
            if written and not written_at:
                written_at.append(time.monotonic() - started)
                audit_written.append(audit.mark())
            return done

        wait_for(
            settled,
            timeout=900,
            interval=1.0,
            description=f"{count} services converged",
        )
        converge_seconds = time.monotonic() - started
        converge_cpu = cpu_seconds(operator.pid) - cpu_before
        latencies = create_latencies(audit, audit_start, namespace)
        load_after = os.getloadavg()[0]
        result: dict[str, Any] = {
            "count": count,
            "operator": "reconcile loop only" if reconcile_only else "whole operator",
            "cpus": sorted(os.sched_getaffinity(0)),
            "apply_seconds": round(applied, 1),
            "written_seconds": round(written_at[0], 1),
            "writes_until_written": writes_by_client(
                audit, audit_start, audit_written[0], namespace
            ),
            "converge_seconds": round(converge_seconds, 1),
            "peak_rss_mb": round(peak_rss_mb(operator.pid), 1),
            "create_p50_seconds": latencies,
            "operator_cpu_seconds": round(converge_cpu, 1),
            "load_average": [round(load_before, 1), round(load_after, 1)],
        }
        if not measure_resync:
            return result

        # let trailing events (Deployment status updates) settle, then one full resync
        wait_for(
            lambda: reconcile_quiet(operator),
            timeout=300,
            interval=0,
            description="no reconcile write for a while",
        )
        mark = audit.mark()
        resync_writes_before = len(RESYNC_WRITE_LOG.findall(operator.output()))
        timers_before = operator.output().count(" resynced ")
        wait_for(
            lambda: operator.output().count(" resynced ") >= timers_before + count + 1,
            timeout=RESYNC_SECONDS * 4 + count / 10,
            interval=1,
            description="a resync of every object",
        )
        resync_writes = audit.operator_writes(mark, namespace)
        resync_reconcile_writes = (
            len(RESYNC_WRITE_LOG.findall(operator.output())) - resync_writes_before
        )
        result["peak_rss_mb"] = round(peak_rss_mb(operator.pid), 1)  # the resync's included
    finally:
        operator.stop()
        cluster.kubectl("delete", "namespace", namespace, "--wait=false", check=False)
    return {
        **result,
        "writes_per_resync": resync_reconcile_writes,
        "all_operator_writes_during_resync": len(resync_writes),
        "writes_sample": resync_writes[:10],
    }


def start_prometheus_for(exporter: SyntheticRuntimes, directory: Path) -> tuple[Any, str]:
    """A real Prometheus scraping the synthetic exporter every SCRAPE_SECONDS, keeping the pod
    labels it serves (as Kubernetes discovery and relabelling would attach them)."""
    directory.mkdir(parents=True, exist_ok=True)
    interval = f"{round(SCRAPE_SECONDS)}s"
    config = {
        "global": {"scrape_interval": interval, "evaluation_interval": interval},
        "scrape_configs": [{
            "job_name": "kiln-runtime", "honor_labels": True,
            "scrape_timeout": f"{round(min(10.0, SCRAPE_SECONDS))}s",
            "static_configs": [{"targets": [f"127.0.0.1:{exporter.port}"]}],
        }],
    }  # fmt: skip
    (directory / "prometheus.yml").write_text(yaml.safe_dump(config))
    (port,) = free_ports(1)
    url = f"http://127.0.0.1:{port}"
    process = spawn("prometheus", [
        "prometheus", f"--config.file={directory / 'prometheus.yml'}",
        f"--storage.tsdb.path={directory / 'data'}", f"--web.listen-address=127.0.0.1:{port}",
        "--storage.tsdb.retention.time=2h", "--log.level=warn",
    ], directory / "prometheus.log")  # fmt: skip
    wait_started(process, lambda: http_ok(f"{url}/-/ready"), timeout=60)
    return process, url


def scrape(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as response:
        text: str = response.read().decode()
        return text


def metric_sum(text: str, name: str, must_contain: str = "") -> float:
    """The sum of every sample of `name` (with `must_contain` in its labels) in a scrape."""
    total = 0.0
    for line in text.splitlines():
        if line.startswith((name + "{", name + " ")) and must_contain in line:
            total += float(line.rsplit(" ", 1)[1])
    return total


def histogram_buckets(text: str, name: str) -> dict[float, float]:
    """Cumulative bucket counts of an unlabelled histogram, by upper bound."""
    buckets = {}
    for line in text.splitlines():
        if line.startswith(name + "_bucket{"):
            le = line.split('le="', 1)[1].split('"', 1)[0]
            buckets[float(le)] = float(line.rsplit(" ", 1)[1])
    return buckets


def quantile_bound(before: dict[float, float], after: dict[float, float], q: float) -> float:
    """The upper bound of the bucket holding the q-quantile of the observations in between."""
    delta = {le: after.get(le, 0.0) - before.get(le, 0.0) for le in after}
    total = delta.get(float("inf"), 0.0)
    if total <= 0:
        return float("nan")
    return min(le for le, count in delta.items() if count >= q * total)


def metrics_available(cluster: Cluster, namespace: str) -> int:
    async def count() -> int:
        config = await load_configuration(str(cluster.kubeconfig))
        async with KubeClient(config, component="bench") as kube:
            services = await kube.list(INFERENCE_SERVICES, namespace)
        return sum(
            1
            for s in services
            if ((s.get("status") or {}).get("autoscaling") or {}).get("metricsAvailable")
        )

    return asyncio.run(count())


def run_autoscaler(cluster: Cluster, count: int, work: Path) -> dict[str, Any]:
    """`count` services at steady load: the operator's writes, queries, lag, RSS and CPU."""
    namespace = f"bench-scale-{count}-{uuid.uuid4().hex[:6]}"
    names = [f"svc-{i:04d}" for i in range(count)]
    cluster.kubectl("create", "namespace", namespace)
    audit = AuditLog(cluster.audit_log)
    exporter = SyntheticRuntimes(namespace, names).start()
    prometheus, prometheus_url = start_prometheus_for(exporter, work / f"prometheus-{count}")
    liveness_port, metrics_port = free_ports(2)
    os.environ["KILN_OPERATOR_METRICS_PORT"] = str(metrics_port)
    try:
        operator = OperatorProcess(
            cluster,
            work / f"operator-autoscaler-{count}.log",
            [namespace],
            resync_seconds=RESYNC_SECONDS,
            liveness=f"http://127.0.0.1:{liveness_port}/healthz",
        )
    finally:
        os.environ.pop("KILN_OPERATOR_METRICS_PORT", None)
    operator_metrics = f"http://127.0.0.1:{metrics_port}/metrics"
    try:
        wait_for(
            lambda: http_ok(f"http://127.0.0.1:{liveness_port}/healthz"),
            timeout=60, description="the operator's liveness endpoint",
        )  # fmt: skip
        autoscaling = {"minReplicas": 1, "maxReplicas": 4, "prometheusUrl": prometheus_url}
        started = time.monotonic()
        asyncio.run(create_all(cluster, namespace, [
            pending_service(name, autoscaling=autoscaling) for name in names
        ]))  # fmt: skip
        wait_for(
            lambda: metrics_available(cluster, namespace) == count,
            timeout=900, interval=5, description=f"{count} services reading their metrics",
        )  # fmt: skip
        sighted_seconds = time.monotonic() - started
        # The first decisions settle (capacity fitted, health since): then the steady window.
        with contextlib.suppress(TimeoutError):  # the window shows whatever keeps writing
            audit.wait_quiet(namespace, seconds=2 * SCRAPE_SECONDS, timeout=300)
        mark = audit.mark()
        queries_before = metric_sum(
            scrape(f"{prometheus_url}/metrics"), "prometheus_http_requests_total",
            'handler="/api/v1/query"',
        )  # fmt: skip
        own = scrape(operator_metrics)
        lag_before = histogram_buckets(own, "kiln_operator_autoscaler_evaluation_lag_seconds")
        evaluations_before = metric_sum(own, "kiln_operator_autoscaler_evaluations_total")
        cpu_before, window_started = cpu_seconds(operator.pid), time.monotonic()
        time.sleep(STEADY_SECONDS)
        elapsed = time.monotonic() - window_started
        cpu = cpu_seconds(operator.pid) - cpu_before
        queries = (
            metric_sum(
                scrape(f"{prometheus_url}/metrics"), "prometheus_http_requests_total",
                'handler="/api/v1/query"',
            )
            - queries_before
        )  # fmt: skip
        own = scrape(operator_metrics)
        lag_after = histogram_buckets(own, "kiln_operator_autoscaler_evaluation_lag_seconds")
        evaluations = metric_sum(own, "kiln_operator_autoscaler_evaluations_total")
        writes = audit.operator_writes(mark, namespace)
        decided = metric_sum(own, "kiln_operator_autoscaler_evaluations_total", "decided")
        rss_now = 0.0
        for line in Path(f"/proc/{operator.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                rss_now = int(line.split()[1]) / 1024
        peak = peak_rss_mb(operator.pid)
    finally:
        operator.stop()
        stop(prometheus)
        exporter.stop()
        cluster.kubectl("delete", "namespace", namespace, "--wait=false", check=False)
    cycles = elapsed / SCRAPE_SECONDS
    return {
        "benchmark": "autoscaler",
        "count": count,
        "sighted_seconds": round(sighted_seconds, 1),
        "window_seconds": round(elapsed, 1),
        "writes": len(writes),
        "writes_per_minute": round(len(writes) / (elapsed / 60), 2),
        "writes_sample": writes[:10],
        "queries": int(queries),
        "queries_per_cycle": round(queries / cycles, 2),
        "evaluations_per_service_per_cycle": round(
            (evaluations - evaluations_before) / count / cycles, 2
        ),
        "decided_total": int(decided),
        "evaluation_lag_p99_seconds": quantile_bound(lag_before, lag_after, 0.99),
        "evaluation_lag_p50_seconds": quantile_bound(lag_before, lag_after, 0.5),
        "rss_mb": round(rss_now, 1),
        "peak_rss_mb": round(peak, 1),
        "cpu_cores": round(cpu / elapsed, 3),
        "exporter_scrapes": exporter.scrapes,
    }


def autoscaler_report(results: list[dict[str, Any]]) -> list[str]:
    """The steady-load section (its own, so other sections of the page can change apart)."""
    if not results:
        return []
    lines = [
        "",
        "## The autoscaler at steady load (issue 18)",
        "",
        "- Workload: N copies of `manifests/samples/cpu-test.yaml` with "
        "`spec.autoscaling.prometheusUrl` set, created at once; their pods stay Pending (no "
        "runtime process). One synthetic exporter (`tests/integration/operator/"
        "synthetic_runtimes.py`) serves the metrics of one runtime pod per service — every "
        "family the autoscaler reads, with the runtime's buckets, 70 series per pod — at a "
        "steady 20 req/s per pod modulated by +-3 %; a real Prometheus (Debian's) scrapes it "
        f"every {SCRAPE_SECONDS:.0f} s. Every service is evaluated every 15 s (the default).",
        f"- Window: once every service reads its metrics and the operator made no write for "
        f"{2 * SCRAPE_SECONDS:.0f} s, {STEADY_SECONDS:.0f} s of steady load. Writes: every API "
        "write of the operator in the namespace (audit log). Queries: instant queries "
        'Prometheus answered (`prometheus_http_requests_total{handler="/api/v1/query"}`, its '
        f"own /metrics), per {SCRAPE_SECONDS:.0f} s cycle. Evaluation lag: how much later than "
        "its interval each service's pass started after the previous one "
        "(`kiln_operator_autoscaler_evaluation_lag_seconds`: the upper bound of the bucket "
        "holding the quantile). RSS at the end and peak; CPU over the window.",
        "",
        "| services | all sighted (s) | writes in window | writes/min | queries/cycle | "
        "evaluations/service/cycle | lag p50 (s) | lag p99 (s) | RSS (MB) | peak RSS (MB) | "
        "CPU (cores) |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in results:
        lines.append(
            f"| {r['count']} | {r['sighted_seconds']} | {r['writes']} | "
            f"{r['writes_per_minute']} | {r['queries_per_cycle']} | "
            f"{r['evaluations_per_service_per_cycle']} | {r['evaluation_lag_p50_seconds']} | "
            f"{r['evaluation_lag_p99_seconds']} | {r['rss_mb']} | {r['peak_rss_mb']} | "
            f"{r['cpu_cores']} |"
        )
    lines += ["", "Targets, checked on each run:", ""]
    for r in results:
        checks = [
            (f"writes/min {r['writes_per_minute']} <= {TARGET_WRITES_PER_MINUTE:g}",
             r["writes_per_minute"] <= TARGET_WRITES_PER_MINUTE),
            (f"queries/cycle {r['queries_per_cycle']} <= {TARGET_QUERIES_PER_CYCLE:g}",
             r["queries_per_cycle"] <= TARGET_QUERIES_PER_CYCLE),
            (f"lag p99 {r['evaluation_lag_p99_seconds']} s within the 15 s interval",
             r["evaluation_lag_p99_seconds"] <= SCRAPE_SECONDS),
            (f"RSS {r['peak_rss_mb']} MB <= {TARGET_RSS_MB:g}", r["peak_rss_mb"] <= TARGET_RSS_MB),
            (f"CPU {r['cpu_cores']} <= {TARGET_CPU_CORES:g} core",
             r["cpu_cores"] <= TARGET_CPU_CORES),
        ]  # fmt: skip
        verdicts = "; ".join(f"{text}: {'met' if ok else '**missed**'}" for text, ok in checks)
        lines.append(f"- {r['count']} services: {verdicts}")
    lines += [
        "",
        "Reading: the operator holds one grouped query per endpoint and window for all services "
        "(`autoscaling/signals.py`), so queries per cycle do not grow with services (before the "
        "fix that made the operator's Autoscaler one shared instance, the 100-service run "
        "measured 96 per cycle: each service had its own client). A snapshot serves the passes "
        "of half an interval, so when the services' passes are spread over the whole interval "
        "(each service's phase is set by when it was first seen) an endpoint answers two "
        "queries per cycle and window, never more. The passes run in one operator-wide "
        "scheduler, at most 16 at once; the lag is how much later than due (its interval after "
        "the start of the service's previous pass) each pass started. Status and state are written "
        "only on a change a reader acts on (`autoscaling/quiet.py`): a steady load writes "
        "nothing. RSS is the whole operator's: its watch cache of N InferenceServices, "
        "Deployments, Services and Pods and the reconcile loop included.",
        "",
        "Where the memory goes. Measured 2026-11-25 at 1,000 services with metrics flowing "
        "(tracemalloc started before the services were created, and glibc's mallinfo2, in the "
        "operator process), before the operator-wide scheduler: the libraries took about 93 MB "
        "of anonymous memory at import (kopf with kubernetes_asyncio's models 75 MB of RSS, "
        "tritonclient and numpy for the warm-up probe 33 MB). Of what the services added, the "
        "largest live parts were kopf's: a parsed copy of each InferenceService as last seen, "
        "with its managedFields, kept for its daemons (about 39 MB), and per object its memory, "
        "memo copy, and for each of the two daemons per service (the autoscaler's loop, the "
        "resync timer) a task, logger and stopper (about 15 MB); then the operator's "
        "ObjectCache (11 MB of compact JSON) and 146 open TLS connections with asyncio's 256 "
        "KiB read buffer each (18 MiB). Beyond the live objects, glibc kept 100 to 120 MB freed "
        "but resident in its per-thread arenas. Fixed since: the operator runs with "
        "`MALLOC_ARENA_MAX=2` (the image's environment; the freed-but-resident part fell to "
        "about 30 MB), its client for the autoscaler, the warm-up gate and events keeps at most "
        "16 connections (the reconcile loop's 64), kopf keeps no diff base (a deep copy of every "
        "event's body, for create/update handlers the operator does not have), the autoscaler's "
        "passes and the resync run in one operator-wide scheduler (`k8s/scheduler.py`: no kopf "
        "daemon, timer, body copy or finalizer per service), and the warm-up probe's libraries "
        "load at the first warm-up (importing every handler module: 138 MB of RSS before, 95 MB "
        "after, with `MALLOC_ARENA_MAX=2`). Of those 95 MB: kopf 30 MB, kubernetes_asyncio's "
        "client and its models 38 MB (imported by the operator's KubeClient for kubeconfig and "
        "connections, and by kopf whenever it is installed), aiohttp 23 MB, pydantic with the "
        "API models 11 MB.",
    ]
    if any(r["writes_sample"] for r in results):
        lines += ["", "Writes seen in the window (first ten per run):", ""]
        for r in results:
            lines.extend(f"- {r['count']}: `{w}`" for w in r["writes_sample"])
    return lines


def _written(result: dict[str, Any], run: str = "operator") -> float:
    """The written time a target judges: the median over the rounds (`operator`, `bare`,
    `bare_watching`), or the one run's of a result measured in one round."""
    medians = result.get("median_written_seconds")
    if medians is not None:
        return float(medians[run])
    seconds = result["written_seconds"] if run == "operator" else result[run]["written_seconds"]
    return float(seconds)


def _ratio(result: dict[str, Any], bound: str = "bare") -> float:
    """The operator's written time over a bare client's (`bare`, or `bare_watching`), same N,
    same run (the medians of the rounds)."""
    return round(_written(result) / _written(result, bound), 2)


def _writes(result: dict[str, Any]) -> str:
    counts: dict[str, int] = result.get("writes_until_written") or {}
    return f"{sum(counts.values())} in all; " + ", ".join(f"{k}: {v}" for k, v in counts.items())


def _latencies(result: dict[str, Any]) -> str:
    found = result.get("create_p50_seconds") or {}
    return f"{found.get('deployments', '-')} / {found.get('services', '-')}"


def report(every: list[dict[str, Any]], when: datetime | None = None) -> str:
    """The page for these results, measured at `when` (default: now)."""
    results = [r for r in every if r.get("benchmark") != "autoscaler"]
    lines = [
        "# Operator benchmark",
        "",
        "Generated by `make bench-operator` (`tests/integration/operator/bench_operator.py`); raw "
        "numbers in `operator.json`. Do not edit by hand: re-run the benchmark.",
        "",
        f"- When: {(when or datetime.now(UTC)).strftime('%Y-%m-%d %H:%M UTC')}",
        f"- Machine: {os.cpu_count()} CPUs ({platform.machine()}): in the rounds the local "
        "control plane (etcd, kube-apiserver, controller-manager, scheduler, kwok) on the first "
        "half, the client under test (bare client or operator) on the other (see Placement "
        "below); after the rounds, one run of each per count shares all of them",
        "- Cluster: the local control plane, 4 kwok GPU nodes x 8 GPUs, started anew for each "
        "run (a cluster already running is stopped first)",
        "- Workload: N copies of `manifests/samples/cpu-test.yaml` (1 replica each) created at "
        f"once ({CREATE_CONCURRENCY} POSTs in flight) into a fresh namespace served by one "
        "operator process (standalone). Their pods stay Pending (every node carries the GPU "
        "taint), so no runtime process competes for the CPUs. A sentinel InferenceService "
        "converges first, so the clock starts with the watches up.",
        "- Written (the target's definition): every Deployment and Service exists and every "
        "InferenceService has a status written for its current generation. Time from the first "
        "POST.",
        "- Settled: moreover every status reflects its Deployment as the Deployment controller "
        "last reported it; this waits for kube-controller-manager to create 1 ReplicaSet and 1 "
        "Pod per service and report on them, work that is not the operator's.",
        "- Peak RSS: the operator process's VmHWM. Operator CPU: its user+system time from the "
        "first POST until settled.",
        f"- Writes per resync: after {QUIET_SECONDS:.0f} s without any reconcile write, every "
        "object is reconciled once more by the periodic resync (from the API server, not the "
        "cache); counted are the writes those reconciles made (the operator tags each write it "
        "logs with its trigger) and every write of the operator process in the API server's "
        "audit log meanwhile (the autoscaler's included: a service whose Deployment its first "
        "pass did not yet see writes MetricsAvailable at its next pass, 15 s later, which can "
        "fall in this window). The first resync of a service comes 0.5 to 1.5 resync intervals "
        "after it was first seen, fixed by its name, so the resync of N services created at "
        "once is spread over a whole interval.",
        "- API create p50: the API server's median time to answer the operator's creates "
        "(audit log): Deployment / Service. A Service waits for its cluster IP.",
        "",
        "The operator's run of the last round (the rounds' written times are below), which also "
        "measured the resync:",
        "",
        "| operator | InferenceServices | all created (s) | written (s) | settled (s) | "
        "operator CPU (s) | load average (start, end) | peak RSS (MB) | "
        "API create p50 (s) | reconcile writes per resync | all operator writes meanwhile |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in results:
        lines.append(
            f"| {r['operator']} | {r['count']} | {r['apply_seconds']} | "
            f"{r.get('written_seconds', '-')} | {r['converge_seconds']} | "
            f"{r['operator_cpu_seconds']} | {r['load_average'][0]}, {r['load_average'][1]} | "
            f"{r['peak_rss_mb']} | {_latencies(r)} | {r['writes_per_resync']} | "
            f"{r['all_operator_writes_during_resync']} |"
        )
    lines += [
        "",
        "The bound: a bare client (`bare_client`: the operator's KubeClient and builders, no "
        "operator, in a process of its own) makes the same requests for the same N services "
        "just before the operator's run. Each run (the bare client's, the operator's) has a "
        "control plane started anew, "
        "so neither inherits the other's objects, events or the API server's grown memory (on "
        "one control plane a later run measured up to 15 % slower). The InferenceServices are "
        f"POSTed {CREATE_CONCURRENCY} at a "
        f"time, and as each is created, one of {CREATE_CONCURRENCY} workers creates its "
        "Deployment and Service concurrently, then applies the status the operator's first "
        "reconcile writes and posts its events. Written is checked the same way in both runs.",
        "",
        "The second bound, the bare client holding the operator's watches while it makes the "
        "same requests (`watch_and_discard`: InferenceServices, and Deployments, Services, "
        "PDBs and pods by Kiln's label, in JSON, every event read and none parsed): what any "
        "controller that watches what it owns costs the API server before doing any work of its "
        "own. The API server encodes and sends every event of those watches, on the same CPU "
        "as the Service creates the bound consists of.",
        "",
        PLACEMENT,
        "",
        "Rounds: each round runs the bare client, the watching bare client and the operator, "
        "each on a control plane started anew, so the three are measured side by side. Each "
        "round starts one run later than the one before (`rotated`): the host drifts within a "
        "benchmark (in an earlier run of fixed order, the bare client at 1,000 services took "
        "45.7, 50.7, then 56.1 s), and a fixed order would charge that drift to the run that "
        "always comes last. The targets judge the medians.",
        "",
        "| InferenceServices | round | bare client: written (s) | bare client + watches: "
        "written (s) | operator: written (s) | operator CPU (s) | operator / bare | "
        "operator / bare + watches |",
        "|---:|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in results:
        for number, one in enumerate(r.get("rounds") or [], start=1):
            lines.append(
                f"| {r['count']} | {number}{_order(one)} | {one['bare']} | "
                f"{one['bare_watching']} | {one['operator']} | {one['operator_cpu_seconds']} | "
                f"{round(one['operator'] / one['bare'], 2)} | "
                f"{round(one['operator'] / one['bare_watching'], 2)} |"
            )
        if r.get("rounds"):
            lines.append(
                f"| {r['count']} | **median** | {_written(r, 'bare')} | "
                f"{_written(r, 'bare_watching')} | {_written(r)} | - | {_ratio(r)} | "
                f"{_ratio(r, 'bare_watching')} |"
            )
    for r in results:
        if len(r.get("rounds") or []) > 1:
            bares = [one["bare"] for one in r["rounds"]]
            ratios = [round(one["operator"] / one["bare"], 2) for one in r["rounds"]]
            lines += [
                "",
                f"{r['count']} services: the bare client's time moved from {min(bares)} to "
                f"{max(bares)} s between rounds (the host's own drift, every run on a fresh "
                f"control plane); the operator's ratio to the bare client of its own round "
                f"stayed within {min(ratios)} to {max(ratios)}.",
            ]
    for r in results:
        if (shared := r.get("shared_cpus")) is not None:
            lines.append("")
            lines.append(
                f"Every process on every CPU at equal priority, {r['count']} services (after "
                f"the rounds, one run each, not judged): the bare client written in "
                f"{_written(shared, 'bare')} s, the operator in {_written(shared)} s, "
                f"{_ratio(shared)}x; "
                f"operator CPU {shared['operator_cpu_seconds']} s; API create p50 "
                f"{_latencies(shared)} s; load average {shared['load_average'][0]}, "
                f"{shared['load_average'][1]}."
            )
    lines += [
        "",
        "The last round in detail:",
        "",
        "| InferenceServices | bare client: written (s) | its last answer (s) | "
        "API create p50 (s) | load average (start, end) | bare client + watches: written (s) | "
        "operator: written (s) | operator / bare | operator / bare + watches |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in results:
        if (bare := r.get("bare")) is not None:
            watching = r.get("bare_watching")
            lines.append(
                f"| {r['count']} | {bare['written_seconds']} | {bare['client_seconds']} | "
                f"{_latencies(bare)} | {bare['load_average'][0]}, {bare['load_average'][1]} | "
                f"{watching['written_seconds'] if watching else '-'} | "
                f"{r['written_seconds']} | {_ratio(r)} | "
                f"{_ratio(r, 'bare_watching') if watching else '-'} |"
            )
    for r in results:
        if (bare := r.get("bare")) is not None and r["count"] == max(x["count"] for x in results):
            lines += [
                "",
                f"Writes in the namespace from the first POST until written, {r['count']} "
                "services (audit log; client, verb, resource):",
                "",
                f"- operator's run: {_writes(r)}",
                f"- bare client's run: {_writes(bare)}",
            ]
    lines += [
        "",
        f"Targets: 1000 written in <= {TARGET_SECONDS_1000:.0f} s, or, where the API server's "
        f"creates are the bound, <= {TARGET_BARE_RATIO:g}x the bare client's time in the same "
        f"run; peak RSS <= {TARGET_RSS_MB:.0f} MB; 0 writes per converged resync.",
        "",
    ]
    for r in results:
        written = _written(r) if r.get("written_seconds") is not None else None
        if r["count"] == 1000 and written is not None:
            met = written <= TARGET_SECONDS_1000
            rules = [f"{'within' if met else 'over'} {TARGET_SECONDS_1000:.0f} s"]
            for bound, name in (("bare", "bare client"), ("bare_watching", "watching bare client")):
                if r.get(bound) is not None:
                    ratio = _ratio(r, bound)
                    bounded = ratio <= TARGET_BARE_RATIO
                    met = met or (bound == "bare" and bounded)  # the watching client: a reference
                    rules.append(
                        f"{ratio}x the {name}'s {_written(r, bound)} s, "
                        f"{'within' if bounded else 'over'} {TARGET_BARE_RATIO:g}x"
                    )
            median = " (median of the rounds)" if r.get("rounds") else ""
            lines.append(
                f"- {r['operator']}, 1000 written in {written} s{median}: "
                + "; ".join(rules)
                + f"; the target ({TARGET_SECONDS_1000:.0f} s, or {TARGET_BARE_RATIO:g}x the bare "
                "client): " + ("met" if met else "**missed**")
            )
        lines.append(
            f"- {r['operator']}, {r['count']}: peak RSS {r['peak_rss_mb']} MB "
            + ("met" if r["peak_rss_mb"] <= TARGET_RSS_MB else "**missed**")
            + f"; writes per resync {r['writes_per_resync']} "
            + ("met" if r["writes_per_resync"] == 0 else "**missed**")
        )
    lines += [
        "",
        "## Reading the numbers",
        "",
        "- The operator reconciles from a watch-fed cache through a work queue of 64 workers; "
        "each new service costs it one Deployment create, one Service create (concurrently) "
        "and its status write. Every Service create allocates a cluster IP, and the API "
        "server allocates them one at a time: its allocator holds one lock while it creates "
        "the IPAddress object through its own API (Kubernetes 1.33 to 1.37, "
        "`ipallocator.MetaAllocator.AllocateNextService`), so Service creates proceed at one "
        "IPAddress create's pace (with the control plane on one CPU about 8 per second, 1,000 "
        "Services in about 120 s with 64 in flight; on two CPUs about twice that) while "
        "Deployments are created in tens of milliseconds each. That pace is the bound, "
        "and whatever else the API server does on its CPUs slows it: the bare client, "
        "making the same requests with the same concurrency, measures it in the same run.",
        "- What a controller cannot avoid: serving its watches. The watching bare client holds "
        "the operator's four watches and parses nothing; what the operator adds beyond it is "
        "its own work (`operator CPU`: kopf receiving and parsing the "
        "watch events, the reconcile, the autoscaler's first passes) and its requests: per "
        "new service one status write (its status is computed from the newest Deployment the "
        "watch delivered while the Service's create waited for its cluster IP, so the "
        "Deployment controller's first report is in it; before, a second write followed it) "
        "and an event when its pods cannot be placed (here they never can). "
        "The autoscaler says nothing on a service before its first ready replica, first "
        "metrics or first change of replicas (before: one MetricsAvailable write per new "
        "service). kopf writes nothing: the autoscaler's passes and the resync run in the "
        "operator's own scheduler (`k8s/scheduler.py`), so kopf puts no finalizer on the "
        "InferenceServices.",
        "- The watches carry Kiln's objects only: the operator asks the API server for "
        "Deployments, Services, PDBs and pods labelled "
        "`app.kubernetes.io/managed-by=kiln-operator` (kopf's "
        "`settings.watching.label_selectors`). Here every such object is Kiln's, so "
        "this changes nothing in these numbers; in a shared cluster the API server no longer "
        "encodes, and the operator no longer parses, every other workload's events.",
        "- The local cluster already allocates cluster IPs without the legacy bitmap "
        "(`DisableAllocatorDualWrite`) and without the ServiceCIDR controller, which rewrote "
        "the ServiceCIDR's status per allocated IP.",
    ]
    lines += autoscaler_report([r for r in every if r.get("benchmark") == "autoscaler"])
    return "\n".join(lines) + "\n"


RUNS = {"bare": "bare", "bare_watching": "watching", "operator": "operator"}
"""The runs of a round, and their short names in the page's round column."""


def rotated(runs: list[str], by: int) -> list[str]:
    """The round's order of its runs: each round starts one run later, so over as many rounds
    as runs each run takes every place once. The host drifts within a benchmark (the bare
    client at 1,000 services: 45.7, 50.7, then 56.1 s in rounds of a fixed order), and a fixed
    order would charge that drift to whichever run comes last."""
    by %= len(runs)
    return runs[by:] + runs[:by]


def _order(one: dict[str, Any]) -> str:
    return f" ({', '.join(RUNS[run] for run in one['order'])})" if one.get("order") else ""


def combine_rounds(rounds: list[dict[str, Any]], shared: dict[str, Any]) -> dict[str, Any]:
    """One count's result: the last round's runs in full (its operator's run measured the
    resync), the written times of every round, their medians (what the targets judge), and the
    runs of the operator and the bare client sharing every CPU with the control plane
    (`shared`: the operator's result, the bare client's under "bare")."""
    last = rounds[-1]

    def median(run: str) -> float:
        return round(statistics.median(float(r[run]["written_seconds"]) for r in rounds), 1)

    return {
        **last["operator"],
        "bare": last["bare"],
        "bare_watching": last["bare_watching"],
        "rounds": [
            {
                "bare": r["bare"]["written_seconds"],
                "bare_watching": r["bare_watching"]["written_seconds"],
                "operator": r["operator"]["written_seconds"],
                "operator_cpu_seconds": r["operator"]["operator_cpu_seconds"],
                "order": r["order"],
            }
            for r in rounds
        ],
        "median_written_seconds": {
            run: median(run) for run in ("bare", "bare_watching", "operator")
        },
        "shared_cpus": shared,
    }


def _key(result: dict[str, Any]) -> tuple[str, int]:
    return (result.get("benchmark") or result["operator"], result["count"])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--counts", type=int, nargs="*", default=[100, 1000])
    parser.add_argument(
        "--autoscaler-counts",
        type=int,
        nargs="*",
        default=[],
        help="services for the autoscaler's steady-load run (real Prometheus, synthetic pods)",
    )
    parser.add_argument(
        "--rounds",
        type=int,
        default=3,
        help="rounds of (bare client, watching bare client, operator) per count, interleaved; "
        "the targets are judged on the medians",
    )
    parser.add_argument(
        "--reconcile-only",
        action="store_true",
        help="run only the reconcile loop's handlers (no autoscaler, no warm-up gate)",
    )
    parser.add_argument("--out", type=Path, default=REPO / "docs" / "benchmarks" / "operator.md")
    parser.add_argument(
        "--render-only",
        action="store_true",
        help="measure nothing: write the page again from the last run's raw numbers (the "
        ".json beside --out, which the run wrote at its end) with the page's current prose",
    )
    args = parser.parse_args(argv)
    json_path = args.out.with_suffix(".json")
    if args.render_only:
        written = datetime.fromtimestamp(json_path.stat().st_mtime, UTC)
        write_page(args.out, report(json.loads(json_path.read_text()), when=written))
        print(f"wrote {args.out} from {json_path}")
        return 0
    local = LocalCluster(REPO / ".kiln")
    available = os.sched_getaffinity(0)
    apart, together = own_cpus(available), shared_cpus(available)
    work = REPO / ".kiln" / "bench-operator"
    work.mkdir(parents=True, exist_ok=True)
    results = []
    try:
        for count in args.counts:
            rounds = []
            for number in range(1, args.rounds + 1):
                order = rotated(list(RUNS), number - 1)
                one: dict[str, Any] = {}
                for run in order:
                    if run == "operator":
                        one[run] = run_one(
                            fresh_cluster(local, apart), count, work, args.reconcile_only,
                            measure_resync=number == args.rounds,
                        )  # fmt: skip
                    else:
                        one[run] = run_bare(
                            fresh_cluster(local, apart), count, watching=run == "bare_watching"
                        )
                rounds.append({**one, "order": order})
                print(json.dumps(rounds[-1]), flush=True)
            shared = {
                **run_one(
                    fresh_cluster(local, together), count, work, args.reconcile_only,
                    measure_resync=False,
                ),
                "bare": run_bare(fresh_cluster(local, together), count),
            }  # fmt: skip
            result = combine_rounds(rounds, shared)
            results.append(result)
        for count in args.autoscaler_counts:
            result = run_autoscaler(fresh_cluster(local, together), count, work)
            print(json.dumps(result), flush=True)
            results.append(result)
    finally:
        local.down()  # the benchmark started it: no control plane left behind
    args.out.parent.mkdir(parents=True, exist_ok=True)
    earlier = json.loads(json_path.read_text()) if json_path.exists() else []
    merged = [r for r in earlier if _key(r) not in {_key(n) for n in results}] + results
    write_page(args.out, report(merged))  # keeps the warm-up memory section
    json_path.write_text(json.dumps(merged, indent=2) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
