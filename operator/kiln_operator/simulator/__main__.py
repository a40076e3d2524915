"""`python -m kiln_operator.simulator`: run the autoscaling benchmark or a single simulation.

Why it exists: the thin effectful shell around the pure simulator — argument parsing, the
process pool, progress on stderr, and writing the report. The wall clock is read here only to
print progress; results never depend on it.
"""

import argparse
import sys
import time
from collections.abc import Sequence
from dataclasses import replace
from multiprocessing import Pool
from pathlib import Path

from kiln_operator.simulator.bench import (
    DEFAULT_KNOBS,
    POLICIES,
    SWEEPS,
    Case,
    Row,
    capacity_bound_hours,
    run_case,
)
from kiln_operator.simulator.learned import (
    LEARNED_POLICIES,
    learned_days,
    render_learned,
    run_learned_case,
    with_section,
)
from kiln_operator.simulator.model import ClusterModel, ServiceModel
from kiln_operator.simulator.report import render, sweep_points, write_plots, write_report
from kiln_operator.simulator.traffic import SPARSE_DAY, Scenario, standard_scenarios
from kiln_operator.simulator.zero import (
    HOLD_SECONDS,
    IDLE_SECONDS,
    ZeroRow,
    render_zero,
    run_zero_case,
    with_zero_section,
)

SWEPT_SCENARIO = "peak-on-time"


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point; returns the exit status."""
    parser = argparse.ArgumentParser(prog="python -m kiln_operator.simulator", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    bench = commands.add_parser("bench", help="the full benchmark; writes the Markdown report")
    bench.add_argument("--seeds", type=int, default=20, help="seeds per scenario (default 20)")
    bench.add_argument("--sweep-seeds", type=int, default=4, help="seeds per knob setting")
    bench.add_argument("--processes", type=int, default=2)
    bench.add_argument("--scenarios", default="", help="comma-separated subset of scenarios")
    bench.add_argument("--hours", type=float, default=24.0, help="length of each scenario")
    bench.add_argument("--out", type=Path, default=Path("docs/benchmarks"))
    learned = commands.add_parser(
        "bench-learned", help="the learned pre-warm's comparison; writes its section of the report"
    )
    learned.add_argument("--seeds", type=int, default=10, help="seeds per day (default 10)")
    learned.add_argument("--processes", type=int, default=2)
    learned.add_argument("--out", type=Path, default=Path("docs/benchmarks"))
    zero = commands.add_parser(
        "bench-zero",
        help="scale to zero against always-on on a sparse day and the busy days; writes its "
        "section of scale-to-zero.md",
    )
    zero.add_argument("--seeds", type=int, default=5, help="seeds per day (default 5)")
    zero.add_argument("--processes", type=int, default=2)
    zero.add_argument("--out", type=Path, default=Path("docs/benchmarks"))
    single = commands.add_parser("run", help="one policy on one scenario and seed")
    single.add_argument("--scenario", default=SWEPT_SCENARIO)
    single.add_argument("--policy", default="kiln", choices=POLICIES)
    single.add_argument("--knob", type=float, default=None)
    single.add_argument("--seed", type=int, default=0)
    single.add_argument("--hours", type=float, default=24.0)
    args = parser.parse_args(argv)
    if args.command == "run":
        return _run_one(args.scenario, args.policy, args.knob, args.seed, args.hours)
    if args.command == "bench-learned":
        return _bench_learned(args.seeds, args.processes, args.out)
    if args.command == "bench-zero":
        return _bench_zero(args.seeds, args.processes, args.out)
    return _bench(
        args.seeds, args.sweep_seeds, args.processes, args.scenarios, args.hours, args.out
    )


def _scenarios(names: str, hours: float) -> list[Scenario]:
    every = [replace(scenario, hours=hours) for scenario in standard_scenarios()]
    if not names:
        return every
    wanted = [name.strip() for name in names.split(",") if name.strip()]
    known = {scenario.name for scenario in every}
    unknown = [name for name in wanted if name not in known]
    if unknown:
        raise SystemExit(f"unknown scenario(s) {unknown}; known: {sorted(known)}")
    return [scenario for scenario in every if scenario.name in wanted]


def _run_one(scenario_name: str, policy: str, knob: float | None, seed: int, hours: float) -> int:
    scenarios = _scenarios(scenario_name, hours)
    index = [s.name for s in standard_scenarios()].index(scenario_name)
    chosen = DEFAULT_KNOBS[policy] if knob is None else knob
    (row,) = run_case(Case(scenarios[0], index, seed, ((policy, chosen),)))
    score = row.score
    print(
        f"{scenario_name} seed {seed} {policy} ({chosen:g}): "
        f"attainment {100 * score.attainment:.3f} %, violation minutes {score.violation_minutes}, "
        f"replica-hours {score.replica_hours:.1f}, flaps/h {score.flaps_per_hour:.2f}, "
        f"rejects {score.rejects}, pre-warm lead {score.prewarm_lead_seconds}"
    )
    return 0


def _bench(  # noqa: PLR0917 (one per command-line option)
    seeds: int, sweep_seeds: int, processes: int, names: str, hours: float, out: Path
) -> int:
    if seeds < 1 or sweep_seeds < 0 or processes < 1:
        raise SystemExit("--seeds and --processes must be >= 1, --sweep-seeds >= 0")
    scenarios = _scenarios(names, hours)
    all_names = [s.name for s in standard_scenarios()]
    cases = []
    for scenario in scenarios:
        index = all_names.index(scenario.name)
        for seed in range(seeds):
            runs = [(policy, DEFAULT_KNOBS[policy]) for policy in POLICIES]
            if scenario.name == SWEPT_SCENARIO and seed < sweep_seeds:
                runs += [
                    (policy, knob)
                    for policy, knobs in SWEEPS.items()
                    for knob in knobs
                    if knob != DEFAULT_KNOBS[policy]
                ]
            keep = scenario.name == SWEPT_SCENARIO and seed == 0
            cases.append(Case(scenario, index, seed, tuple(runs), keep_timeline=keep))
    cases.sort(key=lambda case: -len(case.runs))  # longest first: better packing
    total_runs = sum(len(case.runs) for case in cases)
    print(
        f"simulating {len(cases)} cases ({total_runs} runs) on {processes} process(es)",
        file=sys.stderr,
    )
    started = time.monotonic()
    rows: list[Row] = []
    done_runs = 0
    with Pool(processes) as pool:
        for finished, case_rows in enumerate(pool.imap_unordered(run_case, cases), start=1):
            rows.extend(case_rows)
            done_runs += len(case_rows)
            elapsed = time.monotonic() - started
            print(
                f"[{finished}/{len(cases)}] {case_rows[0].scenario} seed {case_rows[0].seed}: "
                f"{len(case_rows)} runs; {done_runs}/{total_runs} done, {elapsed:.0f} s elapsed",
                file=sys.stderr,
                flush=True,
            )
    rows.sort(key=lambda row: (row.scenario, row.seed, row.policy, row.knob))
    elapsed = time.monotonic() - started
    service, cluster = ServiceModel(), ClusterModel()
    bounds = {
        scenario.name: sum(
            capacity_bound_hours(scenario, seed, all_names.index(scenario.name), service)
            for seed in range(seeds)
        )
        / seeds
        for scenario in scenarios
    }
    timelines = {
        row.policy: row.timeline
        for row in rows
        if row.timeline is not None and row.knob == DEFAULT_KNOBS[row.policy]
    }
    points = sweep_points([r for r in rows if r.scenario == SWEPT_SCENARIO], SWEPT_SCENARIO)
    plots = write_plots(points, timelines, service.slo_p99_seconds, out) if points else []
    facts = (
        f"Run: {len(scenarios)} scenarios x {seeds} seeds x {len(POLICIES)} policies, plus "
        f"knob sweeps on {sweep_seeds} seeds: {total_runs} simulated days of {hours:g} h, "
        f"{elapsed:.0f} s wall time on {processes} process(es)."
    )
    document = render(
        rows,
        scenarios,
        bounds,
        service=service,
        cluster=cluster,
        run_facts=facts,
        plots=plots,
    )
    path = write_report(document, out)
    print(f"wrote {path} and {len(plots)} plot(s) in {elapsed:.0f} s", file=sys.stderr)
    return 0


def _run_zero(case: tuple[Scenario, int, int]) -> list[ZeroRow]:
    return run_zero_case(*case)


def _bench_zero(seeds: int, processes: int, out: Path) -> int:
    if seeds < 1 or processes < 1:
        raise SystemExit("--seeds and --processes must be >= 1")
    days = [SPARSE_DAY, *standard_scenarios()]
    cases = [(day, index, seed) for index, day in enumerate(days) for seed in range(seeds)]
    started = time.monotonic()
    rows: list[ZeroRow] = []
    with Pool(processes) as pool:
        for finished, case_rows in enumerate(pool.imap_unordered(_run_zero, cases), 1):
            rows.extend(case_rows)
            print(f"[{finished}/{len(cases)}] {time.monotonic() - started:.0f} s", file=sys.stderr)
    order = {day.name: index for index, day in enumerate(days)}
    rows.sort(key=lambda row: (order[row.scenario], row.seed, row.policy))
    elapsed = time.monotonic() - started
    facts = (
        f"Simulated with `python -m kiln_operator.simulator bench-zero --seeds {seeds}`: "
        f"{len(days)} days x {seeds} seeds, means over the seeds ({elapsed:.0f} s wall time on "
        f"{processes} process(es)); cold start {ClusterModel().cold_start_seconds:.0f} s, "
        f"idleSeconds {IDLE_SECONDS}, hold deadline {HOLD_SECONDS:.0f} s, SLO p99 "
        f"{ServiceModel().slo_p99_seconds:.0f} s."
    )
    section = "## Simulated days\n\n" + facts + "\n\n" + render_zero(rows)
    path = out / "scale-to-zero.md"
    page = path.read_text(encoding="utf-8") if path.exists() else "# Scale to zero\n"
    path.write_text(with_zero_section(page, section), encoding="utf-8")
    print(f"wrote the simulated section of {path} in {elapsed:.0f} s", file=sys.stderr)
    return 0


def _bench_learned(seeds: int, processes: int, out: Path) -> int:
    if seeds < 1 or processes < 1:
        raise SystemExit("--seeds and --processes must be >= 1")
    days = learned_days()
    cases = [(day, index, seed) for index, day in enumerate(days) for seed in range(seeds)]
    started = time.monotonic()
    rows: list[Row] = []
    with Pool(processes) as pool:
        for finished, case_rows in enumerate(pool.imap_unordered(run_learned_case, cases), 1):
            rows.extend(case_rows)
            print(
                f"[{finished}/{len(cases)}] {case_rows[0].scenario} seed {case_rows[0].seed}: "
                f"{time.monotonic() - started:.0f} s elapsed",
                file=sys.stderr,
                flush=True,
            )
    rows.sort(key=lambda row: (row.scenario, row.seed, row.policy))
    elapsed = time.monotonic() - started
    facts = (
        f"Run: {len(days)} days x {seeds} seeds x {len(LEARNED_POLICIES)} policies "
        f"({len(rows)} simulated days of 24 h, {elapsed:.0f} s wall time on {processes} "
        f"process(es)); fewer seeds than the sections above (20), to keep the run short on the "
        f"2 shared cores it was measured on."
    )
    path = out / "autoscaling.md"
    page = path.read_text(encoding="utf-8") if path.exists() else ""
    path.write_text(with_section(page, render_learned(rows, days, facts)), encoding="utf-8")
    print(f"wrote the learned section of {path} in {elapsed:.0f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
