"""Many tenants at once on one machine: are they truly side by side, each within its limit?

A sandbox (its own process) serves ten customers at scale 1, each with its own API key limited
to 5 requests/s (burst 10). `clinical-sync sync --all-tenants --parallel 10` runs every
tenant's full sync at once, each in its own process on one Dagster instance. Then the tenant
that took longest runs alone, on a fresh warehouse, against the same data.

Prints: the total wall time against that tenant alone (target: within 1.5x), how many tenants
requested at the same moment (all of them, when none waits in a queue), the floor the CPU sets
(all runs' CPU seconds over the cores, against the tenant alone; then with the sandbox's CPU
too, which serves the ten on the same cores), each tenant's
rate as its service measured it (every window within rate * window + burst; its mean over its
active span), where a run's time goes (start-up before its first request, requests, the loads
and publication after its last), CPU seconds and peak memory per concurrent run, and from
those how many tenants one 2-core worker serves in a night. With `--timeline`, also each
tenant's steps (start after the launch + seconds, from its run's events) and how busy the
machine's cores were each second: where tenants move in step and the cores idle together.

Run (the machine is shared: under nice, and say so):
    nice -n 10 .venv/bin/python benchmarks/tenants_parallel.py [--tenants 10] [--scale 1]
        [--rate 5] [--burst 10] [--night-hours 8] [--postgres] [--timeline] [--record]
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import threading
import time
from contextlib import ExitStack
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import add_record_option, record, sandbox_server
from benchmarks.measure import MIB, child_env, console_script, failure, run_measured
from connectors.clinical_records.postgres import POSTGRES_VARIABLE
from connectors.sandbox.control import SandboxControl
from connectors.sandbox.ratelimit import most_in_window
from pipelines.partitions import PARTITION_TAG
from tests.postgres import postgres_server

WINDOWS = (1.0, 2.0, 5.0, 10.0)
TARGET = 1.5


def tenant_env(tenants_file: Path, postgres_url: str | None) -> dict[str, str]:
    """A tenants deployment's environment: the file, and its instance beside it (SQLite) or
    in PostgreSQL (the shared rate limit with it)."""
    chosen = {"CLINICAL_TENANTS_FILE": str(tenants_file)}
    if postgres_url is not None:
        chosen[POSTGRES_VARIABLE] = postgres_url
    return child_env(chosen)


def spans(arrivals: dict[str, list[float]]) -> dict[str, tuple[float, float, int]]:
    """Per customer: its first and last request (monotonic seconds) and how many."""
    return {name: (min(t), max(t), len(t)) for name, t in arrivals.items() if t}


def most_at_once(active: dict[str, tuple[float, float, int]]) -> int:
    """The most tenants between their first and last request at one moment: how many truly
    ran side by side (a queue would show 1)."""
    edges = [(first, 1) for first, _, _ in active.values()]
    edges += [(last, -1) for _, last, _ in active.values()]
    edges.sort(key=lambda edge: (edge[0], -edge[1]))
    most = current = 0
    for _, step in edges:
        current += step
        most = max(most, current)
    return most


def rate_figures(times: list[float], rate: float, burst: int) -> tuple[float, bool, dict[str, int]]:
    """The mean rate over the active span, whether every window held, the worst windows."""
    span = max(times) - min(times)
    worst = {f"{w:g}s": most_in_window(times, w) for w in WINDOWS}
    within = all(most_in_window(times, w) <= rate * w + burst for w in WINDOWS)
    return (len(times) / span if span > 0 else 0.0), within, worst


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tenants", type=int, default=10)
    parser.add_argument("--scale", type=float, default=1.0)
    parser.add_argument("--rate", type=float, default=5.0)
    parser.add_argument("--burst", type=int, default=10)
    parser.add_argument("--night-hours", type=float, default=8.0)
    parser.add_argument(
        "--postgres",
        action="store_true",
        help="the instance (and the rate limit) in a throwaway PostgreSQL, as deployed",
    )
    parser.add_argument(
        "--timeline",
        action="store_true",
        help="print each tenant's steps and the cores' busy share per second (not recorded)",
    )
    add_record_option(parser)
    args = parser.parse_args()
    cli = console_script("clinical-sync")
    work = Path(tempfile.mkdtemp(prefix="tenants-bench-"))
    together = work / "together" / "tenants.toml"
    sandbox = [
        *("--customers", str(args.tenants), "--tenants-file", str(together)),
        *("--scale", f"{args.scale:g}", "--rate", f"{args.rate:g}", "--burst", str(args.burst)),
    ]
    try:
        with ExitStack() as stack:
            server = stack.enter_context(postgres_server()) if args.postgres else None
            env, sandbox_proc = stack.enter_context(sandbox_server(*sandbox))
            urls = [server.database(), server.database()] if server else [None, None]
            control = SandboxControl.from_env(env)
            served = cpu_seconds(sandbox_proc)
            busy: list[float] = []
            sampling = threading.Event()
            if args.timeline:
                threading.Thread(target=sample_busy, args=(sampling, busy), daemon=True).start()
            launched, launched_at = time.monotonic(), time.time()
            run = run_measured(
                [cli, "sync", "--all-tenants", "--parallel", str(args.tenants)],
                tenant_env(together, urls[0]),
                work,
            )
            if run.returncode != 0:
                raise failure("sync --all-tenants", run)
            ended = time.monotonic()
            sampling.set()
            if args.timeline:
                print_timeline(together.with_suffix(".dagster"), urls[0], launched_at, busy)
            sandbox_all = cpu_seconds(sandbox_proc) - served
            seen = {n: c["requests"] for n, c in control.call("customers").items()}
            throttled = {n: c["throttled"] for n, c in control.call("customers").items()}
            per_tenant = parse_table(run.stdout)
            slowest = max(per_tenant, key=lambda name: per_tenant[name])
            alone_file = work / "alone" / "tenants.toml"  # same secrets, fresh data beside it
            alone_file.parent.mkdir(parents=True)
            shutil.copy(together, alone_file)
            before = {n: len(c["requests"]) for n, c in control.call("customers").items()}
            served = cpu_seconds(sandbox_proc)
            alone = run_measured(
                [cli, "sync", "--tenant", slowest], tenant_env(alone_file, urls[1]), work
            )
            if alone.returncode != 0:
                raise failure(f"sync --tenant {slowest}", alone)
            sandbox_alone = cpu_seconds(sandbox_proc) - served
            after = {n: len(c["requests"]) for n, c in control.call("customers").items()}
    finally:
        shutil.rmtree(work, ignore_errors=True)

    total = round(ended - launched, 1)
    ratio = round(total / alone.seconds, 2)
    active = spans(seen)
    startup = [first - launched for first, _, _ in active.values()]
    tail = [ended - last for _, last, _ in active.values()]
    rates = {n: rate_figures(t, args.rate, args.burst) for n, t in seen.items() if t}
    cpu_per_run = run.cpu_seconds / args.tenants
    night = args.night_hours * 3600
    memory = psutil.virtual_memory().total / MIB
    by_cpu = int(psutil.cpu_count() * night / cpu_per_run)
    at_once = min(args.tenants, int(memory * 0.8 / max(run.largest_rss_mib, 1)))
    by_wall = int(at_once * night / total)
    figures = {
        "tenants": args.tenants,
        "instance": "postgresql" if args.postgres else "sqlite",
        "scale": args.scale,
        "rate_per_tenant": args.rate,
        "burst_per_tenant": args.burst,
        "wall_all_at_once_s": total,
        "slowest_tenant": slowest,
        "slowest_in_parallel_s": round(per_tenant[slowest], 1),
        "slowest_alone_s": alone.seconds,
        "ratio_all_to_slowest_alone": ratio,
        "target_ratio": TARGET,
        "met": ratio <= TARGET,
        "alone_requests": after[slowest] - before[slowest],
        "tenants_requesting_at_once_max": most_at_once(active),
        "cpu_floor_all_at_once_s": round(run.cpu_seconds / psutil.cpu_count(), 1),
        "cpu_floor_ratio_to_alone": round(run.cpu_seconds / psutil.cpu_count() / alone.seconds, 2),
        "sandbox_cpu_s_all_at_once": round(sandbox_all, 1),
        "sandbox_cpu_s_alone": round(sandbox_alone, 1),
        "cpu_floor_with_sandbox_ratio": round(
            (run.cpu_seconds + sandbox_all) / psutil.cpu_count() / alone.seconds, 2
        ),
        "requests_per_tenant": {n: c for n, (_, _, c) in active.items()},
        "http_429_per_tenant": throttled,
        "mean_rate_per_tenant": {n: round(r[0], 2) for n, r in rates.items()},
        "every_window_within_limit": all(r[1] for r in rates.values()),
        "most_in_window_worst": {
            w: max(r[2][w] for r in rates.values()) for w in next(iter(rates.values()))[2]
        },
        "startup_s_min_max": [round(min(startup), 1), round(max(startup), 1)],
        "after_last_request_s_min_max": [round(min(tail), 1), round(max(tail), 1)],
        "requesting_s_min_max": [
            round(min(last - first for first, last, _ in active.values()), 1),
            round(max(last - first for first, last, _ in active.values()), 1),
        ],
        "cpu_s_total": run.cpu_seconds,
        "cpu_s_per_run": round(cpu_per_run, 1),
        "cpu_s_alone": alone.cpu_seconds,
        "peak_rss_mib_all": run.peak_rss_mib,
        "peak_rss_mib_per_run": run.largest_rss_mib,
        "peak_rss_mib_alone": alone.largest_rss_mib,
        "cores": psutil.cpu_count(),
        "memory_mib": round(memory),
        "load_average_at_end": run.load_average,
        "night_hours": args.night_hours,
        "tenants_per_night_by_cpu": by_cpu,
        "runs_at_once_by_memory": at_once,
        "tenants_per_night_at_this_pace": by_wall,
    }
    for name, value in figures.items():
        print(f"{name:32} {value}")
    if args.record:
        record("tenants_parallel_postgres" if args.postgres else "tenants_parallel", figures)


def sample_busy(done: threading.Event, busy: list[float]) -> None:
    """The share of the machine's cores busy in each second until `done`."""
    psutil.cpu_percent(interval=None)
    while not done.wait(1.0):
        busy.append(psutil.cpu_percent(interval=None))


def print_timeline(
    home: Path, postgres_url: str | None, launched: float, busy: list[float]
) -> None:
    """Each tenant's steps as its run's events have them: start after the launch + seconds."""
    from dagster import DagsterEventType, DagsterInstance

    if postgres_url is not None:  # the home's dagster.yaml names the variable
        os.environ[POSTGRES_VARIABLE] = postgres_url
    kinds = {
        DagsterEventType.STEP_START,
        DagsterEventType.STEP_SUCCESS,
        DagsterEventType.STEP_FAILURE,
    }
    print("timeline: per tenant, each step's start (s after the launch) + its seconds")
    with DagsterInstance.from_config(str(home)) as instance:
        for found in sorted(instance.get_runs(), key=lambda r: r.tags.get(PARTITION_TAG, "")):
            started: dict[str, float] = {}
            steps = []
            for entry in instance.all_logs(found.run_id, of_type=kinds):
                at = entry.timestamp - launched
                if entry.dagster_event_type is DagsterEventType.STEP_START:
                    started[entry.step_key] = at
                else:
                    begun = started.get(entry.step_key, at)
                    steps.append(f"{entry.step_key} {begun:.1f}+{at - begun:.1f}")
            print(f"  {found.tags.get(PARTITION_TAG, found.run_id)}: " + ", ".join(steps))
    print("cores busy, % each second: " + " ".join(f"{b:.0f}" for b in busy))


def cpu_seconds(process: psutil.Process) -> float:
    """User and system CPU seconds a process has spent so far."""
    times = process.cpu_times()
    return times.user + times.system


def parse_table(stdout: str) -> dict[str, float]:
    """Each tenant's seconds from `sync --all-tenants`' table (tenant, exit, result, seconds)."""
    found = {}
    for line in stdout.splitlines():
        cells = line.split()
        if len(cells) >= 4 and cells[1].isdigit() and cells[2] == "ok":
            found[cells[0]] = float(cells[3])
    return found


if __name__ == "__main__":
    main()
