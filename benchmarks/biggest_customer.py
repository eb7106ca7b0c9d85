"""The biggest customer, end to end: a full sync, a day of changes and a nightly, scale by scale.

Each scale gets its own sandbox process (rate limit off, no latency) and a fresh warehouse;
our side runs as the operator runs it, in a child process measured over its whole process
tree (benchmarks/measure.py): `clinical-sync sync --full`, then the sandbox's day of changes
(`Store.advance`'s own rate: 1% of every set inserted, 1% updated, 0.2% hard-deleted, and 1%
of the documents uploaded and as many deleted), then `clinical-sync sync`. The client's
limit is raised to 1,000 requests/s (burst 1,000), and nothing sets WAREHOUSE_MEMORY_LIMIT:
the warehouse runs under the default this machine gives one run (warehouse/memory.py).

Per stage: wall and CPU seconds, peak RSS of the process tree (and of its largest process),
requests, records read and records per second; per scale: the published file's MiB. The
largest scale runs `--repeat` times (each on a new sandbox and warehouse); a failed run is
counted and reported, never retried.

Run: nice -n 10 .venv/bin/python benchmarks/biggest_customer.py [--scales 1 10 50 300]
     [--repeat 3]
Target: every run at every scale ends exact, with the defaults; 0 failures.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import duckdb

from benchmarks import key_types
from benchmarks.common import RESULTS, record, sandbox_process
from benchmarks.measure import (
    MIB,
    child_env,
    console_script,
    run_measured,
    server_figures,
    sync_env,
)
from connectors.sandbox.control import SandboxControl
from warehouse import ddl
from warehouse.memory import MEMORY_LIMIT_VARIABLE, memory_limit
from warehouse.publish import publish

UNLIMITED = 1000  # the client's requests per second and burst: the rate limit off
DAY_TIMEOUT = 3600  # seconds the sandbox may take to make a day (minutes at scale 300)
DAY = {
    "seconds": 86400,
    "insert_fraction": 0.01,
    "update_fraction": 0.01,
    "delete_fraction": 0.002,
    "document_fraction": 0.01,
}


def last_run(warehouse: Path) -> tuple[int, str]:
    """Records the last run read from its lake batches, and how it ended."""
    with duckdb.connect(str(warehouse), read_only=True) as con:
        fetched, status = con.execute(
            'SELECT "fetched", "status" FROM "ops"."sync_runs" ORDER BY "started_at" DESC LIMIT 1'
        ).fetchone()
    return int(fetched or 0), str(status)


def stage(name: str, cmd: list[str], env: dict[str, str], root: Path, control: SandboxControl):
    """One sync, measured; its figures, or its failure (the last lines of its stderr)."""
    before = control.stats()
    run = run_measured(cmd, env, root, timeout=4 * 3600)
    seen = server_figures(before, control.stats())
    published = root / "warehouse.duckdb"
    fetched, status = last_run(published) if published.exists() else (0, "none")
    figures: dict[str, Any] = {
        "stage": name,
        "wall_s": run.seconds,
        "cpu_s": run.cpu_seconds,
        "peak_rss_mib": run.peak_rss_mib,
        "largest_process_rss_mib": run.largest_rss_mib,
        "requests": seen.requests,
        "records": fetched,
        "records_per_s": round(fetched / run.seconds) if run.seconds else 0,
        "file_mib": round(published.stat().st_size / MIB, 1) if published.exists() else 0.0,
        "exit": run.returncode,
        "status": status,
        "load_average": run.load_average,
    }
    if run.returncode != 0:
        figures["error"] = "\n".join(run.stderr.strip().splitlines()[-12:])
    return figures


def one_run(scale: float, root: Path) -> dict[str, Any]:
    """Full sync, a day of changes, nightly: on a new sandbox and a fresh warehouse."""
    started = time.perf_counter()
    with sandbox_process("--scale", f"{scale:g}") as sandbox:
        source_s = round(time.perf_counter() - started, 1)
        control = SandboxControl.from_env(sandbox, timeout=DAY_TIMEOUT)
        env = sync_env(sandbox, root, rate=UNLIMITED, burst=UNLIMITED)
        sync = console_script("clinical-sync")
        full = stage("full", [sync, "sync", "--full"], env, root, control)
        print(f"  scale {scale:g} full sync: {full}", flush=True)  # before hours more
        day_started = time.perf_counter()
        changed = control.advance(**DAY)
        day = {
            "stage": "day of changes (source)",
            "wall_s": round(time.perf_counter() - day_started, 2),
            "changes": sum(sum(kinds.values()) for kinds in changed.values()),
        }
        nightly = stage("nightly", [sync, "sync"], env, root, control) if not full["exit"] else {}
    failed = [s for s in (full, nightly) if s.get("exit")]
    return {
        "scale": scale,
        "sandbox_start_s": source_s,
        "stages": [full, day, nightly] if nightly else [full, day],
        "failed": len(failed) + (0 if nightly else 1),
    }


def models_builds(scale: float, builds: int, root: Path) -> dict[str, Any]:
    """The step that ran out of memory at scale 300, alone: the scale's records made in SQL
    (benchmarks/key_types.py, today's types), then the models built `builds` times, each in
    a child process under the default cap (`warehouse.models.build`, dbt as a run's step), and
    the file published once."""
    path = root / "warehouse.duckdb"
    started = time.perf_counter()
    key_types.build(path, key_types.after, scale)
    with duckdb.connect(str(path)) as con:
        for statement in ddl.ops_table("models"):
            con.execute(statement)
    made_s = round(time.perf_counter() - started, 1)
    runs = []
    for _ in range(builds):
        cmd = [sys.executable, key_types.__file__, "--build", "tables", str(path)]
        run = run_measured(cmd, child_env({}), root, timeout=3600)
        runs.append(
            {
                "wall_s": run.seconds,
                "cpu_s": run.cpu_seconds,
                "peak_rss_mib": run.peak_rss_mib,
                "exit": run.returncode,
                "error": "\n".join(run.stderr.strip().splitlines()[-3:]) if run.returncode else "",
            }
        )
        print(f"  models built: {runs[-1]}", flush=True)
    published = publish(path, root / "published.duckdb")
    return {
        "scale": scale,
        "made_s": made_s,
        "builds": runs,
        "failures": sum(1 for r in runs if r["exit"]),
        "publish_s": published.seconds,
        "file_mib": round(published.bytes / MIB, 1),
    }


def show(run: dict[str, Any]) -> None:
    print(
        f"\nscale {run['scale']:g} (sandbox ready in {run['sandbox_start_s']} s), "
        f"failures: {run['failed']}"
    )
    print(
        f"  {'stage':<24}{'wall s':>9}{'CPU s':>8}{'peak RSS MiB':>13}{'largest':>9}"
        f"{'requests':>10}{'records':>10}{'records/s':>10}{'file MiB':>9}  status"
    )
    for s in run["stages"]:
        if "changes" in s:
            print(f"  {s['stage']:<24}{s['wall_s']:>9.1f}  {s['changes']:,} records changed")
            continue
        print(
            f"  {s['stage']:<24}{s['wall_s']:>9.1f}{s['cpu_s']:>8.1f}{s['peak_rss_mib']:>13.1f}"
            f"{s['largest_process_rss_mib']:>9.1f}{s['requests']:>10,}{s['records']:>10,}"
            f"{s['records_per_s']:>10,}{s['file_mib']:>9.1f}  {s['status']} (exit {s['exit']})"
        )
        if s.get("error"):
            print("    " + s["error"].replace("\n", "\n    "))
    sys.stdout.flush()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scales", type=float, nargs="+", default=[1, 10, 50, 300])
    parser.add_argument("--repeat", type=int, default=3, help="runs at the largest scale")
    parser.add_argument("--record", action="store_true", help="keep the figures in results.json")
    parser.add_argument(
        "--models-builds",
        type=int,
        metavar="N",
        help="only the models step at each scale, N times, on records made in SQL",
    )
    args = parser.parse_args(argv)
    if os.environ.get(MEMORY_LIMIT_VARIABLE):
        parser.error(f"unset {MEMORY_LIMIT_VARIABLE}: this measures the default")
    print(f"memory limit by default on this machine: {memory_limit()}")
    if args.models_builds:
        steps = []
        for scale in args.scales:
            with tempfile.TemporaryDirectory(prefix=f"bench-models-{scale:g}-") as tmp:
                steps.append(models_builds(scale, args.models_builds, Path(tmp)))
            print(f"scale {scale:g}: {steps[-1]}", flush=True)
        failed = sum(s["failures"] for s in steps)
        print(f"{sum(len(s['builds']) for s in steps)} builds, {failed} failed (target 0)")
        if args.record:
            record("biggest_customer_models", {"memory_limit": memory_limit(), "scales": steps})
        return 1 if failed else 0
    runs: list[dict[str, Any]] = []
    kept = [r for r in recorded_runs() if r["scale"] not in args.scales] if args.record else []
    largest = max(args.scales)
    for scale in args.scales:
        for attempt in range(args.repeat if scale == largest else 1):
            with tempfile.TemporaryDirectory(prefix=f"bench-biggest-{scale:g}-") as tmp:
                runs.append({**one_run(scale, Path(tmp)), "attempt": attempt + 1})
            show(runs[-1])
            if args.record:  # after every run: a scale of hours stopped keeps the rest
                every = sorted([*kept, *runs], key=lambda r: (r["scale"], r.get("attempt", 1)))
                failed = sum(r["failed"] for r in every)
                figures = {"memory_limit": memory_limit(), "runs": every, "failures": failed}
                record("biggest_customer", figures)
    failures = sum(r["failed"] for r in runs)
    print(f"\n{len(runs)} runs, {failures} failed (target 0)")
    print(side_by_side(sorted([*kept, *runs], key=lambda r: (r["scale"], r["attempt"]))))
    return 1 if failures else 0


def side_by_side(runs: list[dict[str, Any]]) -> str:
    """One line per run, every scale measured (this invocation's and results.json's): how
    time and memory grow with the data."""
    lines = [
        "\nscale  run    records   full s  CPU s  peak MiB  records/s   nightly s  CPU s  "
        "peak MiB   file MiB  failed"
    ]
    for run in runs:
        stages = {s["stage"]: s for s in run["stages"]}
        full, night = stages["full"], stages.get("nightly", {})
        lines.append(
            f"{run['scale']:>5g}  {run.get('attempt', 1):>3}  {full['records']:>9,}  "
            f"{full['wall_s']:>7.1f}  {full['cpu_s']:>5.1f}  {full['peak_rss_mib']:>8.1f}  "
            f"{full['records_per_s']:>9,}   {night.get('wall_s', 0):>9.1f}  "
            f"{night.get('cpu_s', 0):>5.1f}  {night.get('peak_rss_mib', 0):>8.1f}   "
            f"{night.get('file_mib', full['file_mib']):>8.1f}  {run['failed']:>6}"
        )
    return "\n".join(lines)


def recorded_runs() -> list[dict[str, Any]]:
    """The runs results.json holds: a scale measured alone (300 takes hours) joins the rest."""
    if not RESULTS.exists():
        return []
    held = json.loads(RESULTS.read_text()).get("biggest_customer", {})
    return held.get("figures", {}).get("runs", [])


if __name__ == "__main__":
    raise SystemExit(main())
