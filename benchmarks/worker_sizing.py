"""What one tenant's run costs a worker, alone and beside another: the figures of docs/SIZING.md.

Each tenant has its own sandbox (its own API key, limited to --rate and --burst: the spec's top
plan by default) and its own warehouse; the Dagster instance and the shared rate limit are in
one throwaway PostgreSQL (tests/postgres.py, Debian's postgresql). Per scenario (1 tenant, then
2 at once): a full sync (the first night), a day of changes at the source, a nightly sync. Each
run is `clinical-sync sync` in its own process, as a worker runs a tenant's run in process.

Per run it prints: wall seconds; start-up (process start to its first request at the service);
requests; requests per second at the service (first to last request) and the busiest window
against rate + burst; 429s; CPU seconds and peak RSS of the run's process. Then how many tenants
a worker of --worker-cores and --worker-memory-gib serves in a night of --night-hours.

Run: nice -n 10 .venv/bin/python benchmarks/worker_sizing.py [--scale 1] [--rate 5] [--burst 10]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import add_record_option, record, sandbox_process
from benchmarks.measure import child_env
from connectors.sandbox.control import SandboxControl
from connectors.sandbox.ratelimit import most_in_window
from tests.deployment import (
    base_env,
    code_server,
    daemon,
    instance_home,
    launch,
    run_span,
    wait_for_runs,
    webserver,
    workspace_file,
)
from tests.postgres import postgres_server

# The run in its own process, its own resource use reported on its last stderr line.
RUN = """
import json, resource, sys
from cli.main import main
code = main(["sync", *sys.argv[1:]])
usage = resource.getrusage(resource.RUSAGE_SELF)
children = resource.getrusage(resource.RUSAGE_CHILDREN)
cpu = usage.ru_utime + usage.ru_stime + children.ru_utime + children.ru_stime
peak = max(usage.ru_maxrss, children.ru_maxrss) / 1024
print(json.dumps({"code": code, "cpu_seconds": cpu, "peak_rss_mib": peak}), file=sys.stderr)
sys.exit(code)
"""
WINDOWS = (1.0, 5.0, 30.0)


@dataclass
class RunFigures:
    tenant: int
    kind: str
    wall_seconds: float
    startup_seconds: float
    requests: int
    requests_per_second: float
    busiest_window_over_allowed: float  # most requests in a window less rate*w + burst (<= 0)
    http_429: int
    cpu_seconds: float
    peak_rss_mib: float


def run_sync(env: dict[str, str], cwd: Path, flags: list[str]) -> tuple[float, float, dict]:
    """One `clinical-sync sync`; when it started (monotonic), its wall time, its own figures."""
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-c", RUN, *flags], env=env, cwd=cwd, capture_output=True, text=True
    )
    wall = time.monotonic() - started
    last = done.stderr.strip().splitlines()[-1] if done.stderr.strip() else "{}"
    if done.returncode != 0 or not last.startswith("{"):
        raise SystemExit(f"sync failed ({done.returncode}):\n{done.stderr[-3000:]}")
    return started, wall, json.loads(last)


def scenario(tenants: int, args: argparse.Namespace, postgres_url: str) -> list[RunFigures]:
    """`tenants` tenants at once: a full sync each, a day of changes, a nightly sync each."""
    figures: list[RunFigures] = []
    with tempfile.TemporaryDirectory() as tmp:
        sandbox_args = ["--scale", f"{args.scale:g}", "--rate", f"{args.rate:g}"]
        sandbox_args += ["--burst", str(args.burst)]
        with _sandboxes(tenants, sandbox_args) as services:
            envs = []
            for n, service in enumerate(services):
                root = Path(tmp) / f"tenant{n}"
                root.mkdir()
                envs.append(
                    child_env(
                        {
                            **service,
                            "CLINICAL_RATE_LIMIT": f"{args.rate:g}",
                            "CLINICAL_BURST": str(args.burst),
                            "WAREHOUSE_PATH": str(root / "warehouse.duckdb"),
                            "LAKE_ROOT": str(root / "lake"),
                            "DAGSTER_HOME": str(root / "dagster"),
                            "DAGSTER_POSTGRES_URL": postgres_url,
                        }
                    )
                )
            for kind, flags in (("full", ["--full"]), ("nightly", [])):
                if kind == "nightly":
                    for service in services:
                        SandboxControl.from_env(service).advance(seconds=86400)
                figures += _at_once(kind, flags, services, envs, Path(tmp), args)
    return figures


class _sandboxes:
    """`n` sandbox processes, one per tenant."""

    def __init__(self, n: int, sandbox_args: list[str]) -> None:
        self.managers = [sandbox_process(*sandbox_args) for _ in range(n)]

    def __enter__(self) -> list[dict[str, str]]:
        return [manager.__enter__() for manager in self.managers]

    def __exit__(self, *exc: object) -> None:
        for manager in self.managers:
            manager.__exit__(None, None, None)


def _at_once(kind, flags, services, envs, cwd, args) -> list[RunFigures]:
    controls = [SandboxControl.from_env(service) for service in services]
    begun = time.monotonic()  # the sandboxes' clock too: one machine's monotonic clock
    before = [control.stats().get("status_429", 0) for control in controls]
    results: list[tuple[float, float, dict] | None] = [None] * len(envs)

    def one(n: int) -> None:
        results[n] = run_sync(envs[n], cwd, flags)

    threads = [threading.Thread(target=one, args=(n,)) for n in range(len(envs))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    figures = []
    for n, (control, result) in enumerate(zip(controls, results, strict=True)):
        if result is None:
            raise SystemExit(f"tenant {n}'s {kind} sync did not finish")
        started, wall, own = result
        arrivals = [at for at in control.arrivals() if at >= begun]  # the log keeps the newest
        span = max(arrivals) - min(arrivals) if len(arrivals) > 1 else 0.0
        over = max(most_in_window(arrivals, w) - (args.rate * w + args.burst) for w in WINDOWS)
        figures.append(
            RunFigures(
                tenant=n,
                kind=kind,
                wall_seconds=round(wall, 1),
                startup_seconds=round(min(arrivals) - started, 1),
                requests=len(arrivals),
                requests_per_second=round(len(arrivals) / span, 2) if span else 0.0,
                busiest_window_over_allowed=over,
                http_429=control.stats().get("status_429", 0) - before[n],
                cpu_seconds=round(own["cpu_seconds"], 1),
                peak_rss_mib=round(own["peak_rss_mib"], 1),
            )
        )
    return figures


def tenants_per_worker(
    alone: list[RunFigures], nightly: list[RunFigures], args: argparse.Namespace
) -> dict[str, float]:
    """A night's tenants on one worker, the lower of two bounds. CPU: the night's core-seconds
    at 75% over the CPU seconds of the dearest nightly run. Memory and time: the runs its memory
    holds at once (80%, the largest peak) times the nightly runs one slot does in a night, at
    the wall time of a tenant alone (rate-bound: a tenant's requests at its own key's rate)."""
    wall = max(f.wall_seconds for f in alone)
    cpu = max(f.cpu_seconds for f in nightly)
    rss_gib = max(f.peak_rss_mib for f in nightly) / 1024
    night = args.night_hours * 3600
    by_cpu = math.floor(args.worker_cores * 0.75 * night / cpu)
    at_once = max(1, math.floor(args.worker_memory_gib * 0.8 / rss_gib))
    by_memory = at_once * math.floor(night / wall)
    return {
        "nightly_wall_seconds_alone": wall,
        "nightly_cpu_seconds": cpu,
        "nightly_peak_rss_mib": round(rss_gib * 1024, 1),
        "tenants_by_cpu": by_cpu,
        "runs_at_once_by_memory": at_once,
        "tenants_by_memory_and_time": by_memory,
        "tenants_per_worker_per_night": min(by_cpu, by_memory),
    }


def deployed_run(args: argparse.Namespace, postgres_url: str) -> dict[str, float]:
    """One tenant's first night as the daemon launches it on a code server with Dagster's
    multiprocess executor (a process per step), as a deployment runs it: wall, CPU seconds of
    the run and its steps (reaped into the code server's child times), peak RSS of the code
    server's tree while the run lasts."""
    sandbox_args = ["--scale", f"{args.scale:g}", "--rate", f"{args.rate:g}"]
    with tempfile.TemporaryDirectory() as tmp, sandbox_process(*sandbox_args) as service:
        root = Path(tmp)
        env = base_env(
            **{
                **service,
                "CLINICAL_RATE_LIMIT": f"{args.rate:g}",
                "CLINICAL_BURST": str(args.burst),
                "DAGSTER_POSTGRES_URL": postgres_url,
                "DAGSTER_HOME": str(instance_home(root / "worker-home", postgres_url)),
                "WAREHOUSE_PATH": str(root / "data" / "warehouse.duckdb"),
                "LAKE_ROOT": str(root / "data" / "lake"),
            }
        )
        home = instance_home(root / "instance", postgres_url)
        with code_server("worker", env, root / "worker") as worker:
            server = psutil.Process(worker.pid)
            before = server.cpu_times()
            workspace = workspace_file(root / "workspace.yaml", [worker])
            plain = base_env(DAGSTER_POSTGRES_URL=postgres_url)
            with daemon(home, workspace, plain), webserver(home, workspace, plain) as url:
                run_id = launch(url, "worker", "nightly_sync")
                peak, status = 0, "not ended in an hour"
                deadline = time.monotonic() + 3600
                while time.monotonic() < deadline:
                    sizes = []
                    for proc in [server, *server.children(recursive=True)]:
                        with contextlib.suppress(psutil.Error):
                            sizes.append(proc.memory_info().rss)
                    peak = max(peak, sum(sizes))
                    with contextlib.suppress(AssertionError):
                        status = wait_for_runs(url, [run_id], timeout=0.5)[run_id]
                        break
                start, end = run_span(url, run_id)
            after = server.cpu_times()
    if status != "SUCCESS":
        raise SystemExit(f"the deployed run ended {status}")
    cpu = sum(after[i] - before[i] for i in (2, 3))  # children_user, children_system
    return {
        "wall_seconds": round(end - start, 1),
        "cpu_seconds": round(cpu, 1),
        "peak_rss_mib": round(peak / (1024 * 1024), 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scale", type=float, default=1.0)
    parser.add_argument("--rate", type=float, default=5.0)
    parser.add_argument("--burst", type=int, default=10)
    parser.add_argument("--tenants", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--worker-cores", type=float, default=2.0)
    parser.add_argument("--worker-memory-gib", type=float, default=8.0)
    parser.add_argument("--night-hours", type=float, default=6.0)
    parser.add_argument(
        "--deployed", action="store_true", help="also one run through the daemon (multiprocess)"
    )
    add_record_option(parser)
    args = parser.parse_args()
    results: dict[str, object] = {"load_average_at_start": round(os.getloadavg()[0], 1)}
    with postgres_server() as server:
        for tenants in args.tenants:
            figures = scenario(tenants, args, server.database(f"sizing{tenants}"))
            results[f"{tenants}_at_once"] = [asdict(f) for f in figures]
            print(f"\n{tenants} tenant(s) at once, scale {args.scale:g}, {args.rate:g}/s each:")
            header = "  ".join(f"{name:>10}" for name in list(asdict(figures[0]))[1:])
            print(f"{'tenant':>6}  {header}")
            for f in figures:
                cells = "  ".join(f"{v!s:>10}" for v in list(asdict(f).values())[1:])
                print(f"{f.tenant:>6}  {cells}")

    def nightly_of(tenants: int) -> list[RunFigures]:
        runs = results[f"{tenants}_at_once"]  # type: ignore[union-attr]
        return [RunFigures(**f) for f in runs if f["kind"] == "nightly"]  # type: ignore[arg-type]

    results["sizing"] = tenants_per_worker(
        nightly_of(min(args.tenants)), nightly_of(max(args.tenants)), args
    )
    if args.deployed:
        with postgres_server() as server:
            results["deployed_run"] = deployed_run(args, server.database("deployed"))
        print(f"one run launched by the daemon, multiprocess: {results['deployed_run']}")
    results["load_average_at_end"] = round(os.getloadavg()[0], 1)
    print(f"\nsizing: {json.dumps(results['sizing'])}")
    print(
        f"load average: {results['load_average_at_start']} at start, "
        f"{results['load_average_at_end']} at end (the machine is shared)"
    )
    if args.record:
        record("worker_sizing", results)


if __name__ == "__main__":
    main()
