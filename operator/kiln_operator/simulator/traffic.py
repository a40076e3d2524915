"""Traffic scenarios: a request-rate curve per second, its Poisson arrivals, its known windows.

Why it exists: the evidence is only as good as the traffic. Each scenario is a day (or part of
one) of diurnal 5:1 traffic with one twist — a scheduled business-hours peak that arrives on
time, 10 minutes early or not at all, an unannounced 3x or 5x spike, a Prometheus outage, or
model-load failures. Arrivals are drawn from a seeded generator: same seed, same requests.
"""

from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray


@dataclass(frozen=True)
class ScheduledPeak:
    """A business-hours peak announced by a pre-warm schedule (cron, UTC)."""

    cron: str = "0 9 * * 1-5"
    opens_hour: float = 9.0
    duration_minutes: int = 120
    extra_rate: float = 30.0
    """Requests per second added on top of the diurnal curve while the peak lasts."""
    arrival_offset_minutes: float = 0.0
    """When the traffic really comes relative to the announced opening (negative: early)."""
    cancelled: bool = False


@dataclass(frozen=True)
class Spike:
    """An unannounced burst: the rate multiplies by `factor` for `minutes`."""

    factor: float
    minutes: float = 15.0
    earliest_hour: float = 10.0
    latest_hour: float = 16.0


@dataclass(frozen=True)
class Scenario:
    """One kind of day."""

    name: str
    title: str
    hours: float = 24.0
    mean_rate: float = 6.0
    """Mean of the diurnal curve (req/s); peak/trough is 5:1, trough at 02:00, peak 14:00."""
    peak: ScheduledPeak | None = None
    spike: Spike | None = None
    outage: tuple[float, float] | None = None
    """Prometheus is down between these hours of the day."""
    load_failure_probability: float = 0.0
    sessions: tuple[float, ...] = ()
    """Hours at which a short session of traffic starts (a sparse day: set `mean_rate` 0)."""
    session_minutes: float = 5.0
    session_rate: float = 0.5
    """Requests per second during a session."""

    def rate_curve(self, rng: np.random.Generator) -> NDArray[np.float64]:
        """Requests per second for each second of the scenario (the true intensity)."""
        seconds = np.arange(int(self.hours * 3600), dtype=np.float64)
        amplitude = 2.0 / 3.0  # (1 + a) / (1 - a) = 5
        phase = (seconds / 3600.0 - 8.0) / 24.0
        rate = self.mean_rate * (1.0 + amplitude * np.sin(2.0 * np.pi * phase))
        if self.peak is not None and not self.peak.cancelled:
            start = (self.peak.opens_hour * 60 + self.peak.arrival_offset_minutes) * 60
            end = start + self.peak.duration_minutes * 60
            # One minute of ramp at each edge: people log in, not a step function.
            ramp = np.clip(
                np.minimum(seconds - start, end - seconds) / 60.0,
                0.0,
                1.0,
            )
            rate = rate + self.peak.extra_rate * ramp
        if self.spike is not None:
            onset = rng.uniform(self.spike.earliest_hour, self.spike.latest_hour) * 3600
            inside = (seconds >= onset) & (seconds < onset + self.spike.minutes * 60)
            rate = np.where(inside, rate * self.spike.factor, rate)
        for hour in self.sessions:
            inside = (seconds >= hour * 3600) & (seconds < hour * 3600 + self.session_minutes * 60)
            rate = np.where(inside, rate + self.session_rate, rate)
        return rate

    def outage_seconds(self) -> tuple[float, float] | None:
        """The Prometheus outage in seconds since the start, if any."""
        if self.outage is None:
            return None
        return (self.outage[0] * 3600, self.outage[1] * 3600)


def poisson_arrivals(rate: NDArray[np.float64], rng: np.random.Generator) -> NDArray[np.float64]:
    """Sorted arrival times of a Poisson process with a per-second piecewise-constant rate."""
    counts = rng.poisson(rate)
    starts = np.repeat(np.arange(rate.size, dtype=np.float64), counts)
    arrivals = starts + rng.random(starts.size)
    arrivals.sort()
    return arrivals


SPARSE_DAY = Scenario(
    "sparse",
    "Sparse: six 5-minute sessions of 0.5 req/s, nothing in between",
    mean_rate=0.0,
    sessions=(3.5, 8.25, 11.0, 14.5, 17.75, 21.0),
)
"""A model used a few times a day: the day scale to zero is for."""


def standard_scenarios(mean_rate: float = 6.0) -> list[Scenario]:
    """The scenarios of the benchmark (issue 7)."""
    peak = ScheduledPeak(extra_rate=2.0 * mean_rate)
    return [
        Scenario("peak-on-time", "Diurnal + business peak on time", mean_rate=mean_rate, peak=peak),
        Scenario(
            "peak-early",
            "Diurnal + business peak 10 min early",
            mean_rate=mean_rate,
            peak=ScheduledPeak(extra_rate=2.0 * mean_rate, arrival_offset_minutes=-10),
        ),
        Scenario(
            "peak-cancelled",
            "Diurnal + business peak cancelled",
            mean_rate=mean_rate,
            peak=ScheduledPeak(extra_rate=2.0 * mean_rate, cancelled=True),
        ),
        Scenario(
            "spike-3x", "Diurnal + unannounced 3x spike", mean_rate=mean_rate, spike=Spike(3.0)
        ),
        Scenario(
            "spike-5x", "Diurnal + unannounced 5x spike", mean_rate=mean_rate, spike=Spike(5.0)
        ),
        Scenario(
            "prometheus-outage",
            "Peak on time, Prometheus down 10 min as it ends",
            mean_rate=mean_rate,
            peak=peak,
            outage=(11.0, 11.0 + 10 / 60),
        ),
        Scenario(
            "load-failures",
            "Peak on time, 30 % of pod starts fail once",
            mean_rate=mean_rate,
            peak=peak,
            load_failure_probability=0.3,
        ),
    ]
