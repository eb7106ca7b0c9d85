"""Us against the rate-limit floor and against dlt, on the same sandbox in the same run.

One sandbox (scale 10, 5 requests/s, burst 10, 300 ms latency with 100 ms jitter). Each tool
runs in its own process into its own DuckDB file: ours as the operator runs it
(`clinical-sync sync --full`, then `clinical-sync sync`), dlt's `rest_api` source as
`benchmarks/dlt_source.py` configures it. Between the full and the incremental run the
source changes by 1% (inserts and updates in every set, and 0.2% hard deletes unless
`--no-deletes`). After each run both files are compared with the sandbox's ground truth.
Last, our periodic snapshot (`sync --full`) runs once more, to show that it converges
(`--no-reconcile` skips it).

Requests, 429s and retries are what the sandbox counted for each run (its counters read
before and after); peak RSS and CPU seconds cover each tool's whole process tree.

Run: .venv/bin/python benchmarks/e2e_vs_dlt.py [--quick | --scale 10] [--no-reconcile]
Targets: efficiency (floor / our full wall time) >= 0.9; faster than dlt on the full sync;
no 429s where dlt has them; >= 5x fewer requests than dlt on the incremental run; lower
peak RSS; equal to the ground truth where dlt is not.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import (
    add_record_option,
    add_sandbox_options,
    record,
    sandbox_args,
    sandbox_process,
)
from benchmarks.measure import (
    ProcessFigures,
    ServerFigures,
    child_env,
    console_script,
    failure,
    last_json_line,
    minimum_pages,
    record_counts,
    run_measured,
    server_figures,
    sync_env,
)
from benchmarks.truth import SetDiff, compare_warehouse, key_types, summary, type_drift
from connectors.clinical_records.catalogue import BY_NAME, Canonical, Strategy
from connectors.sandbox.control import SandboxControl

HERE = Path(__file__).resolve().parent
OURS, DLT = "ours", "dlt"

# Why a set can differ from the source after an incremental run, by design of each tool.
WHY_OURS: dict[Strategy, str] = {
    Strategy.CURSOR: "updated_at cursor; hard deletes wait for the periodic snapshot",
    Strategy.CREATED: "new rows by created_at; updates and deletes wait for the periodic snapshot",
    Strategy.PERIODIC_SNAPSHOT: "no cursor: skipped until the periodic snapshot is due",
    Strategy.SNAPSHOT: "snapshot every run: should be equal",
}
WHY_DLT_MERGE = "merge never removes a row the source hard-deleted"
WHY_DLT_CURSOR = (
    "dlt's incremental keeps the largest cursor *string*; with mixed UTC offsets that is not "
    "the latest instant, and later changes compare lower and are dropped"
)


@dataclass
class ToolRun:
    """One run of one tool: its cost, what the sandbox saw, and how it matches the truth."""

    tool: str
    phase: str
    process: ProcessFigures
    server: ServerFigures
    diffs: dict[str, SetDiff]
    client_retries: int | None = None  # as the tool itself reports them, where it does
    notes: dict[str, Any] = field(default_factory=dict)

    @property
    def equal(self) -> str:
        return summary(self.diffs)

    def figures(self) -> dict[str, Any]:
        return {
            "wall_s": self.process.seconds,
            "requests": self.server.requests,
            "http_429": self.server.http_429,
            "retries": self.server.retries,
            "client_retries": self.client_retries,
            "token_requests": self.server.token_requests,
            "peak_rss_mib": self.process.peak_rss_mib,
            "largest_process_rss_mib": self.process.largest_rss_mib,
            "cpu_s": self.process.cpu_seconds,
            "load_average": self.process.load_average,
            "equals_truth": self.equal,
            **self.notes,
        }


@dataclass(frozen=True)
class Workspace:
    """Everything one benchmark run writes, under one temporary directory."""

    root: Path

    @property
    def ours_warehouse(self) -> Path:
        return self.root / "ours" / "warehouse.duckdb"

    @property
    def dlt_warehouse(self) -> Path:
        return self.root / "dlt" / "warehouse.duckdb"

    def ours_env(self, sandbox: Mapping[str, str], rate: float, burst: int) -> dict[str, str]:
        ours = self.root / "ours"
        ours.mkdir(parents=True, exist_ok=True)
        return sync_env(sandbox, ours, rate, burst)

    def dlt_env(self, sandbox: Mapping[str, str]) -> dict[str, str]:
        (self.root / "dlt").mkdir(parents=True, exist_ok=True)
        return child_env(dict(sandbox))

    def dlt_command(self, parallel: bool) -> list[str]:
        cmd = [
            sys.executable,
            str(HERE / "dlt_source.py"),
            "--duckdb",
            str(self.dlt_warehouse),
            "--pipelines-dir",
            str(self.root / "dlt" / "pipelines"),
        ]
        return [*cmd, "--parallel"] if parallel else cmd


def our_command(full: bool) -> list[str]:
    return [console_script("clinical-sync"), "sync", *(["--full"] if full else [])]


def parse_sync_table(stdout: str) -> dict[str, int]:
    """Sum the `429s` and `retries` columns of `clinical-sync sync`'s per-set table.

    The table's dashed rule gives the column spans (headers such as "wait s" hold spaces).
    """
    lines = stdout.splitlines()
    rule = next((i for i, line in enumerate(lines) if line.startswith("---")), None)
    if rule is None or rule == 0:
        return {}
    spans, at = [], 0
    for dashes in lines[rule].split(" "):
        if dashes:
            spans.append((at, at + len(dashes)))
        at += len(dashes) + 1

    def cells(line: str) -> list[str]:
        return [line[start:end].strip() for start, end in spans]

    header = cells(lines[rule - 1])
    totals = {"429s": 0, "retries": 0}
    for line in lines[rule + 1 :]:
        if not line.strip() or line.startswith("total"):  # the table ends here
            break
        row = dict(zip(header, cells(line), strict=True))
        for column in totals:
            totals[column] += int(row.get(column, "").replace(",", "") or 0)
    return totals


def measured(
    control: SandboxControl,
    tool: str,
    phase: str,
    cmd: list[str],
    env: Mapping[str, str],
    cwd: Path,
    warehouse: Path,
) -> ToolRun:
    """Run one tool once, read the sandbox's counters around it, compare with the truth."""
    before = control.stats()
    process = run_measured(cmd, env, cwd)
    server = server_figures(before, control.stats())
    if process.returncode != 0 and tool == OURS:
        raise failure(f"{tool} {phase} run", process)
    diffs = compare_warehouse(warehouse, control.truth(), live_only=tool == OURS)
    run = ToolRun(tool, phase, process, server, diffs)
    if warehouse.exists():
        run.notes["columns_not_canonical"] = dict(type_drift(warehouse))
        families = key_types(warehouse)
        run.notes["keys_typed_differently"] = sorted(k for k, v in families.items() if len(v) > 1)
    if process.returncode != 0:  # dlt giving up is a result too: report it, go on
        run.notes["failed"] = last_error(process.stderr)
    elif tool == OURS:
        run.client_retries = parse_sync_table(process.stdout).get("retries")
    else:
        run.notes["rows_loaded"] = sum(last_json_line(process.stdout)["rows"].values())
    return run


def last_error(stderr: str) -> str:
    """The exception line of a traceback, without the URL (it may carry identifiers)."""
    lines = [line for line in stderr.strip().splitlines() if "Error" in line]
    return (lines[-1] if lines else "exit status non-zero").split(" for url:")[0][:200]


def ratio(numerator: float, denominator: float) -> float | None:
    return round(numerator / denominator, 2) if denominator else None


def print_phase(phase: str, ours: ToolRun, dlt: ToolRun) -> None:
    rows = [
        ("wall time (s)", ours.process.seconds, dlt.process.seconds),
        ("requests", ours.server.requests, dlt.server.requests),
        ("429s", ours.server.http_429, dlt.server.http_429),
        ("retries (non-200 answers)", ours.server.retries, dlt.server.retries),
        ("token requests", ours.server.token_requests, dlt.server.token_requests),
        ("peak RSS, tree (MiB)", ours.process.peak_rss_mib, dlt.process.peak_rss_mib),
        ("largest process (MiB)", ours.process.largest_rss_mib, dlt.process.largest_rss_mib),
        ("CPU seconds", ours.process.cpu_seconds, dlt.process.cpu_seconds),
        ("machine load at the end", ours.process.load_average, dlt.process.load_average),
    ]
    print(f"\n{phase} sync        {'ours':>10} {'dlt':>10} {'dlt/ours':>9}")
    for label, a, b in rows:
        r = ratio(b, a) if "load" not in label else None
        print(f"  {label:<26}{a:>10} {b:>10} {'' if r is None else f'{r:>8}x'}")
    for run in (ours, dlt):
        if "failed" in run.notes:
            print(f"  {run.tool} FAILED: {run.notes['failed']}")
        print(f"  equals ground truth ({run.tool}): {'yes' if run.equal == 'yes' else 'no'}")
        for line in why(run):
            print(line)
    for run in (ours, dlt):
        drift = run.notes.get("columns_not_canonical", {})
        keys = run.notes.get("keys_typed_differently", [])
        shown = ", ".join(f"{n} {what}" for what, n in drift.items()) or "none"
        print(f"  columns not in the canonical type ({run.tool}): {shown}")
        if keys:
            print(f"    key families typed differently across sets: {', '.join(keys)}")


def why(run: ToolRun) -> list[str]:
    """One line per set that differs from the source: what differs and the tool's reason."""
    lines = []
    for name, diff in run.diffs.items():
        if diff.equal:
            continue
        entity = BY_NAME[name]
        if run.tool == OURS:
            reason = WHY_OURS[entity.strategy]
        else:
            reasons = [WHY_DLT_MERGE] if diff.extra else []
            typed = entity.cursor and entity.field(entity.cursor).canonical
            if entity.strategy is Strategy.CURSOR and typed is Canonical.TIMESTAMPTZ:
                reasons += [WHY_DLT_CURSOR] if diff.missing or diff.changed else []
            reason = "; ".join(reasons) or "unexplained"
        lines.append(f"    {name}: {diff.describe()} -- {reason}")
    return lines


def comparison(ours: ToolRun, dlt: ToolRun) -> dict[str, float | None]:
    return {
        "speedup_vs_dlt": ratio(dlt.process.seconds, ours.process.seconds),
        "request_ratio_dlt_over_ours": ratio(dlt.server.requests, ours.server.requests),
        "rss_ratio_dlt_over_ours": ratio(dlt.process.peak_rss_mib, ours.process.peak_rss_mib),
        "cpu_ratio_dlt_over_ours": ratio(dlt.process.cpu_seconds, ours.process.cpu_seconds),
    }


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_sandbox_options(parser, scale=10, latency=0.3)
    parser.add_argument("--quick", action="store_true", help="scale 1 (about a minute per tool)")
    parser.add_argument("--jitter", type=float, default=0.1)
    parser.add_argument("--no-deletes", action="store_true", help="mutate without hard deletes")
    parser.add_argument("--no-reconcile", action="store_true", help="skip our closing sync --full")
    parser.add_argument("--dlt-parallel", action="store_true", help="dlt's parallelized=True")
    parser.add_argument("--workdir", type=Path, help="keep the files here (default: temp)")
    add_record_option(parser)
    args = parser.parse_args(argv)
    if args.quick:
        args.scale = 1
    return args


def mutation(no_deletes: bool) -> dict[str, float]:
    return {
        "seconds": 86400,
        "insert_fraction": 0.01,
        "update_fraction": 0.01,
        "delete_fraction": 0 if no_deletes else 0.002,
    }


def benchmark(args: argparse.Namespace, root: Path) -> dict[str, Any]:
    space = Workspace(root)
    with sandbox_process(*sandbox_args(args), "--jitter", f"{args.jitter:g}") as sandbox:
        control = SandboxControl.from_env(sandbox)
        counts = record_counts(control.truth())
        pages = minimum_pages(counts)
        floor = pages / args.rate
        ours_env = space.ours_env(sandbox, args.rate, args.burst)
        dlt_env = space.dlt_env(sandbox)
        dlt_cmd = space.dlt_command(args.dlt_parallel)

        def ours(phase: str, full: bool) -> ToolRun:
            cmd = our_command(full)
            return measured(
                control, OURS, phase, cmd, ours_env, root / "ours", space.ours_warehouse
            )

        def dlt(phase: str) -> ToolRun:
            return measured(
                control, DLT, phase, dlt_cmd, dlt_env, root / "dlt", space.dlt_warehouse
            )

        runs = {"full": (ours("full", True), dlt("full"))}
        changes = control.advance(**mutation(args.no_deletes))
        runs["incremental"] = (ours("incremental", False), dlt("incremental"))
        reconcile = None if args.no_reconcile else ours("reconcile", True)
    return {
        "counts": counts,
        "pages": pages,
        "floor": floor,
        "changes": changes,
        "runs": runs,
        "reconcile": reconcile,
    }


def report(args: argparse.Namespace, result: dict[str, Any]) -> dict[str, Any]:
    """Print the figures and return them for results.json."""
    runs: dict[str, tuple[ToolRun, ToolRun]] = result["runs"]
    full_ours = runs["full"][0]
    efficiency = round(result["floor"] / full_ours.process.seconds, 3)
    records = sum(result["counts"].values())
    print(
        f"sandbox: scale {args.scale:g}, {records:,} records, rate {args.rate:g}/s, "
        f"burst {args.burst}, latency {args.latency:g} s +- {args.jitter:g} s"
    )
    print(
        f"floor: {result['pages']:,} pages / {args.rate:g} per s = {result['floor']:.1f} s; "
        f"our efficiency on the full sync = floor / wall = {efficiency}"
    )
    changed = {k: sum(v.values()) for k, v in result["changes"].items()}
    print(f"mutation between runs (records touched per set): {changed}")
    figures: dict[str, Any] = {
        "scale": args.scale,
        "records": records,
        "rate": args.rate,
        "burst": args.burst,
        "latency_s": args.latency,
        "jitter_s": args.jitter,
        "floor_pages": result["pages"],
        "floor_s": round(result["floor"], 1),
        "efficiency": efficiency,
        "mutation": mutation(args.no_deletes),
    }
    for phase, (ours, dlt) in runs.items():
        print_phase(phase, ours, dlt)
        figures[phase] = {OURS: ours.figures(), DLT: dlt.figures(), **comparison(ours, dlt)}
    reconcile: ToolRun | None = result["reconcile"]
    if reconcile is not None:
        print(
            f"\nour weekly snapshot after the incremental run (sync --full): "
            f"{reconcile.process.seconds} s, {reconcile.server.requests} requests, "
            f"equals ground truth: {reconcile.equal}"
        )
        figures["reconcile"] = reconcile.figures()
    print(
        "\ntargets: efficiency >= 0.9; faster than dlt on the full sync; no 429s; >= 5x fewer "
        "requests on the incremental run; lower peak RSS; equal where dlt is not"
    )
    return figures


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.workdir:
        args.workdir.mkdir(parents=True, exist_ok=True)
        result = benchmark(args, args.workdir.resolve())
    else:
        with tempfile.TemporaryDirectory(prefix="bench-e2e-") as tmp:
            result = benchmark(args, Path(tmp))
    if args.record:
        record("e2e_vs_dlt", report(args, result))


if __name__ == "__main__":
    main()
