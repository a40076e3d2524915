"""The learned pre-warm's Prometheus adapter: request-rate history by range query, fitted and
cached per service, within a fixed query budget per endpoint.

Why it exists: the learned pre-warm (`autoscaling.learned`) needs each opted-in service's
request rate over the past weeks. History changes slowly, so a service's fit is refreshed once
an hour (`REFRESH_SECONDS`), and the range queries are budgeted per Prometheus endpoint, not
per service: at most one every `QUERY_GAP_SECONDS` (one evaluation cycle), each covering up to
`SERVICES_PER_QUERY` services. So whatever the number of services, an endpoint answers at most
one history query per cycle on top of the autoscaler's instant queries, and 1,000 services are
all refreshed in 40 queries, ten minutes of cycles within each hour (`next_batch` is the pure
planning, tested against that budget).

An evaluation never waits for history: it takes the fit cached (None until the first read)
and, when the budget allows, starts the next batch's query on this endpoint's own thread (a
slow range query delays neither the instant queries nor other endpoints). Failures become
data: a fit whose reason is LearnedHistoryUnreadable, retried after `RETRY_SECONDS`.
"""

import asyncio
import math
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import requests
from prometheus_api_client import PrometheusConnect
from prometheus_api_client.exceptions import PrometheusApiClientException
from requests.adapters import Retry

from kiln_operator import telemetry
from kiln_operator.api.v1alpha1.autoscaling import LearnedPrewarmSpec
from kiln_operator.autoscaling import reasons
from kiln_operator.autoscaling.learned import STEP_SECONDS, LearnedFit, Sample, fit, unreadable
from kiln_operator.autoscaling.signals import ServiceKey

QUERY_TIMEOUT_SECONDS = 30
"""One range query's limit (14 days of 25 services at a 5-minute step: about 100,000 points)."""
QUERY_GAP_SECONDS = 15.0
"""At most one history query per endpoint per this many seconds: one default evaluation cycle."""
SERVICES_PER_QUERY = 25
"""Services whose history one range query returns (a regex on their names)."""
REFRESH_SECONDS = 3600.0
"""A service's fit is refreshed hourly: the shape of weeks changes slowly."""
RETRY_SECONDS = 360.0
"""After a failed read, the service's history is asked for again this much later."""


@dataclass(frozen=True)
class Fitted:
    """A service's latest fit and when (monotonic seconds) its history was read."""

    read_at: float
    fit: LearnedFit


def next_batch(
    wanted: Mapping[ServiceKey, LearnedPrewarmSpec],
    fitted: Mapping[ServiceKey, Fitted],
    clock: float,
    last_query_at: float,
) -> list[ServiceKey]:
    """The services the next history query should read at monotonic `clock`: none while the
    gap since the last query is not over; else up to `SERVICES_PER_QUERY` of the services due
    (never read first, then the oldest reads), all with the same `historyDays` (one range)."""
    if clock - last_query_at < QUERY_GAP_SECONDS:
        return []
    due: list[tuple[float, ServiceKey]] = []
    for key in wanted:
        entry = fitted.get(key)
        if entry is None:
            due.append((-math.inf, key))
            continue
        failed = entry.fit.reason == reasons.LEARNED_HISTORY_UNREADABLE
        age = RETRY_SECONDS if failed else REFRESH_SECONDS
        if clock - entry.read_at >= age:
            due.append((entry.read_at, key))
    if not due:
        return []
    due.sort()
    days = wanted[due[0][1]].history_days
    return [key for _, key in due if wanted[key].history_days == days][:SERVICES_PER_QUERY]


def history_query(keys: list[ServiceKey]) -> str:
    """The PromQL of one batch: each service's request rate over each 5-minute step. Names and
    namespaces are DNS labels (letters, digits, '-'), so they need no regex escaping."""
    namespaces = "|".join(sorted({namespace for namespace, _ in keys}))
    names = "|".join(sorted({name for _, name in keys}))
    selector = f'{{namespace=~"{namespaces}",inferenceservice=~"{names}"}}'
    return (
        f"sum by (namespace, inferenceservice) "
        f"(rate(kiln_requests_total{selector}[{STEP_SECONDS}s]))"
    )


class HistoryCache:
    """One Prometheus endpoint's history reads and the fits of its services."""

    def __init__(self, url: str, clock: Callable[[], float] = time.monotonic) -> None:
        self.url = url
        self._clock = clock
        self._prometheus = PrometheusConnect(
            url=url, disable_ssl=True, timeout=QUERY_TIMEOUT_SECONDS, retry=Retry(total=0)
        )
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="prometheus-history")
        self._wanted: dict[ServiceKey, LearnedPrewarmSpec] = {}
        self._fitted: dict[ServiceKey, Fitted] = {}
        self._last_query_at = -math.inf
        self._running: asyncio.Future[None] | None = None

    def fit_for(
        self, key: ServiceKey, spec: LearnedPrewarmSpec, now: datetime
    ) -> LearnedFit | None:
        """The service's latest fit (None until its history was read); starts the next batch's
        read when the budget allows. Never waits for Prometheus."""
        if self._wanted.get(key) != spec:
            self._wanted[key] = spec
            self._fitted.pop(key, None)  # a changed spec is fitted afresh
        self._start_next(now)
        entry = self._fitted.get(key)
        return None if entry is None else entry.fit

    def forget(self, key: ServiceKey) -> None:
        """The service is gone or no longer opts in."""
        self._wanted.pop(key, None)
        self._fitted.pop(key, None)

    def _start_next(self, now: datetime) -> None:
        if self._running is not None and not self._running.done():
            return
        clock = self._clock()
        batch = next_batch(self._wanted, self._fitted, clock, self._last_query_at)
        if not batch:
            return
        self._last_query_at = clock
        specs = {key: self._wanted[key] for key in batch}
        loop = asyncio.get_running_loop()
        self._running = loop.run_in_executor(self._thread, self._read, specs, now, clock)

    def _read(
        self, specs: dict[ServiceKey, LearnedPrewarmSpec], now: datetime, clock: float
    ) -> None:
        """Blocking, on this endpoint's thread: one range query, then each service's fit."""
        days = next(iter(specs.values())).history_days
        end = datetime.fromtimestamp(now.timestamp() // STEP_SECONDS * STEP_SECONDS, UTC)
        # Whole days: from midnight `historyDays` days ago (UTC), as the fit counts them.
        today = now.astimezone(UTC).replace(hour=0, minute=0, second=0, microsecond=0)
        start = today - timedelta(days=days) + timedelta(seconds=STEP_SECONDS)
        try:
            with telemetry.prometheus_query("history"):
                result = self._prometheus.custom_query_range(
                    history_query(list(specs)),
                    start_time=start,
                    end_time=end,
                    step=str(STEP_SECONDS),
                )
        except (requests.RequestException, PrometheusApiClientException, ValueError) as error:
            failed = unreadable(
                now, f"Prometheus at {self.url} did not return the history: {error}"
            )
            for key in specs:
                self._fitted[key] = Fitted(clock, failed)
            return
        series: dict[ServiceKey, list[Sample]] = {key: [] for key in specs}
        for item in result:
            labels = item.get("metric") or {}
            key = (str(labels.get("namespace", "")), str(labels.get("inferenceservice", "")))
            if key in series:
                series[key] = [(float(at), float(value)) for at, value in item.get("values", [])]
        for key, spec in specs.items():
            if self._wanted.get(key) == spec:  # not forgotten or changed meanwhile
                self._fitted[key] = Fitted(clock, fit(series[key], now, spec))

    def close(self) -> None:
        self._thread.shutdown(wait=False, cancel_futures=True)
