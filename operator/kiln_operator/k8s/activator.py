"""The operator's side of the activator: read the requests it holds, report the ready pods.

Why it exists: a service at `minReplicas: 0` has no pod that Prometheus could count requests
on, so the autoscaler (the only writer of replicas) wakes it from the activator's count of held
requests (`GET /v1/demand` on each activator pod's control port, summed); and the activator
releases those requests only to pods the operator reports as ready, i.e. past their warm-up gate
(`PUT /v1/services/NAMESPACE/NAME/backends`). The activator pods are found by resolving one
DNS name (`KILN_ACTIVATOR_CONTROL`, the chart's headless Service `host:port`): every address it
resolves to is one activator pod, so no API read and no RBAC is needed; where no cluster DNS
answers (an operator run outside the cluster, the local cluster), a comma-separated list of
`host:port` names the pods one by one. Every call is bounded
by a timeout; a pod that does not answer is left out (the others' counts stand), and when none
answers the demand is unknown (None), which `decide` treats as no news, never as zero.

A service's pass runs every `evaluationIntervalSeconds`, too late for a request waiting at
zero: `watch_demand` keeps a long poll open on each activator pod (`GET /v1/demand?after=G&
wait=S`), which answers as soon as a service's first request is held, and asks for that
service's pass at once.
"""

import asyncio
import logging
import socket
import time
from collections.abc import Callable
from typing import Any

import aiohttp

logger = logging.getLogger(__name__)

TIMEOUT_SECONDS = 2.0
"""Each call to an activator pod."""
DEMAND_MAX_AGE_SECONDS = 1.0
"""One demand read serves every service's pass within this age."""
LONG_POLL_SECONDS = 20.0
"""How long an activator pod keeps a demand long poll open when nothing is held anew."""
RESOLVE_SECONDS = 10.0
"""How often `watch_demand` looks for activator pods that came or went."""
RETRY_SECONDS = 1.0
"""After an activator that answers without a generation (a version before the long poll: its
demand is then polled at this interval), and after a first failed long poll."""
MAX_RETRY_SECONDS = 10.0
"""The longest wait between the long polls of an activator pod that keeps failing (the wait
doubles from RETRY_SECONDS with each failure in a row): a pod that is down costs a warning in
the log every 10 s, not every second."""

ServiceKey = tuple[str, str]


def parse_control(control: str) -> list[tuple[str, int]]:
    """(host, port) of each `host:port` in KILN_ACTIVATOR_CONTROL (comma-separated)."""
    targets: list[tuple[str, int]] = []
    for item in control.split(","):
        host, _, port = item.strip().rpartition(":")
        host = host.removeprefix("[").removesuffix("]")
        if not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError(
                f"KILN_ACTIVATOR_CONTROL must be host:port[,host:port...], not {control!r}"
            )
        targets.append((host, int(port)))
    return targets


class Activators:
    """Every activator pod behind one DNS name, read and told through its control port."""

    def __init__(self, control: str, timeout: float = TIMEOUT_SECONDS) -> None:
        self.targets = parse_control(control)
        self._timeout = aiohttp.ClientTimeout(total=timeout)
        self._session: aiohttp.ClientSession | None = None
        self._demand: dict[ServiceKey, int] | None = None
        self._read_at = -1e9
        self._reading: asyncio.Lock = asyncio.Lock()
        self._reported: dict[ServiceKey, tuple[tuple[str, ...], tuple[str, ...]]] = {}

    async def addresses(self) -> list[str]:
        """`ip:port` of every activator pod the names resolve to now (none if they do not)."""
        loop = asyncio.get_running_loop()
        found: set[tuple[str, int]] = set()
        for host, port in self.targets:
            try:
                infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM)
            except OSError as error:
                logger.warning(f"activator control {host} does not resolve: {error}")
                continue
            found.update((str(info[4][0]), port) for info in infos)
        return [f"[{ip}]:{port}" if ":" in ip else f"{ip}:{port}" for ip, port in sorted(found)]

    async def held(self, key: ServiceKey) -> int | None:
        """Requests the activators hold for the service now; None when none answered."""
        async with self._reading:
            if time.monotonic() - self._read_at > DEMAND_MAX_AGE_SECONDS:
                self._demand = await self._read_demand()
                self._read_at = time.monotonic()
        if self._demand is None:
            return None
        return self._demand.get(key, 0)

    async def report(self, key: ServiceKey, http: list[str], grpc: list[str]) -> None:
        """Tell every activator pod where the service's ready pods are (empty: none). Sent
        again only when it changed, or to activators that did not take it last time."""
        wanted = (tuple(sorted(http)), tuple(sorted(grpc)))
        if self._reported.get(key) == wanted:
            return
        body = {"http": list(wanted[0]), "grpc": list(wanted[1])}
        path = f"/v1/services/{key[0]}/{key[1]}/backends"
        results = await asyncio.gather(
            *(self._call("PUT", address, path, body) for address in await self.addresses())
        )
        if results and all(result is not None for result in results):
            self._reported[key] = wanted
        else:
            self._reported.pop(key, None)

    async def watch_demand(self, woken: Callable[[ServiceKey], None]) -> None:
        """Until cancelled: call `woken` with each service an activator pod begins to hold
        requests for, as soon as it does (a long poll on every pod, found anew every
        `RESOLVE_SECONDS`)."""
        polls: dict[str, asyncio.Task[None]] = {}
        try:
            while True:
                found = set(await self.addresses())
                for address in found - polls.keys():
                    polls[address] = asyncio.create_task(
                        self._long_poll(address, woken), name=f"kiln-demand-{address}"
                    )
                for address in polls.keys() - found:
                    polls.pop(address).cancel()
                await asyncio.sleep(RESOLVE_SECONDS)
        finally:
            for task in polls.values():
                task.cancel()
            await asyncio.gather(*polls.values(), return_exceptions=True)

    async def _long_poll(self, address: str, woken: Callable[[ServiceKey], None]) -> None:
        generation: int | None = None
        failures = 0
        while True:
            query = "" if generation is None else f"?after={generation}&wait={LONG_POLL_SECONDS:g}"
            asked = time.monotonic()
            answer = await self._call(
                "GET", address, f"/v1/demand{query}", seconds=LONG_POLL_SECONDS + TIMEOUT_SECONDS
            )
            if not isinstance(answer, dict):  # no answer, or not a demand's
                failures += 1
                generation = None
                await asyncio.sleep(min(RETRY_SECONDS * 2 ** (failures - 1), MAX_RETRY_SECONDS))
                continue
            failures = 0
            latest = answer.get("generation")
            if not isinstance(latest, int):
                generation = None
                await asyncio.sleep(RETRY_SECONDS)
            elif latest == generation:
                # the wait ended without news; one that did not wait is never asked again at once
                if time.monotonic() - asked < LONG_POLL_SECONDS / 2:
                    await asyncio.sleep(RETRY_SECONDS)
                continue
            generation = latest
            self._read_at = -1e9  # the passes it wakes read every pod's count afresh
            for key, held in _entries(answer):
                if held > 0:
                    woken(key)

    def forget(self, key: ServiceKey) -> None:
        self._reported.pop(key, None)

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()

    async def _read_demand(self) -> dict[ServiceKey, int] | None:
        answers = await asyncio.gather(
            *(self._call("GET", address, "/v1/demand") for address in await self.addresses())
        )
        known = [answer for answer in answers if isinstance(answer, dict)]
        if not known:
            return None
        demand: dict[ServiceKey, int] = {}
        for answer in known:
            for key, held in _entries(answer):
                if held > 0:
                    demand[key] = demand.get(key, 0) + held
        return demand

    async def _call(
        self,
        method: str,
        address: str,
        path: str,
        body: dict[str, Any] | None = None,
        *,
        seconds: float | None = None,
    ) -> Any:
        """The JSON answer (True for an empty one), or None when the pod did not answer well
        (within `seconds`, if given, else TIMEOUT_SECONDS)."""
        if self._session is None:
            self._session = aiohttp.ClientSession(timeout=self._timeout, trust_env=False)
        url = f"http://{address}{path}"
        limit = self._timeout if seconds is None else aiohttp.ClientTimeout(total=seconds)
        try:
            async with self._session.request(method, url, json=body, timeout=limit) as got:
                if got.status >= 300:
                    logger.warning(f"activator {address} answered {method} {path}: {got.status}")
                    return None
                if got.status == 204:
                    return True
                return await got.json()
        except (TimeoutError, aiohttp.ClientError, ValueError) as error:
            logger.warning(f"activator {address} did not answer {method} {path}: {error}")
            return None


def _entries(answer: dict[str, Any]) -> list[tuple[ServiceKey, int]]:
    """(service, held) of each well-formed entry of a demand answer; anything else is left out."""
    services = answer.get("services")
    return [
        ((str(entry.get("namespace")), str(entry.get("name"))), entry["held"])
        for entry in (services if isinstance(services, list) else [])
        if isinstance(entry, dict) and isinstance(entry.get("held"), int)
    ]
