"""What reconciliation costs when the source moves: a full sync of a still source against the
same sync while it drifts, in requests, and how exact each ends.

Run: .venv/bin/python benchmarks/reconcile_cost.py [--scale 10] [--drift-every 100 50 20]
Target: at most 5% more requests with drift than without, at the first rate given. Drift:
every N collection requests the set being read loses a record, gains one anywhere in key
order and has one updated (connectors/sandbox/store.py). At 5 requests/s N = 100 is 9 writes
a minute in the set being read; a clinic of this size changing 1% of its records a day makes
about 3 a minute across all sets. N = 50 and 20 show the cost curve past that.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import record, sandbox_process
from benchmarks.truth import compare_warehouse
from connectors.clinical_records.catalogue import ENTITY_SETS
from connectors.sandbox.control import SandboxControl
from pipelines.runner import SyncReport, sync


def full_sync(scale: float, drift_every: int) -> tuple[SyncReport, dict[str, str], int]:
    """A full sync against a fresh sandbox drifting every `drift_every` requests (0: still):
    the report, per set how it compares with the source at the end, and drift's changes."""
    args = ("--scale", f"{scale:g}", "--rate", "0", "--drift-every", str(drift_every))
    with sandbox_process(*args) as env, tempfile.TemporaryDirectory() as d:
        env = {
            **env,
            "CLINICAL_RATE_LIMIT": "1000",
            "CLINICAL_BURST": "200",
            "CLINICAL_LIMITER_PATH": f"{d}/ratelimit.sqlite",
        }
        warehouse = Path(d) / "warehouse.duckdb"
        report = sync(
            env, log_level="ERROR", full=True, lake_root=f"{d}/lake", warehouse_path=str(warehouse)
        )
        assert report.success, report.failure
        control = SandboxControl.from_env(env)
        diffs = compare_warehouse(warehouse, control.truth())
        changes = len(control.changes())
    return report, {n: d.describe() for n, d in diffs.items()}, changes


def figure(report: SyncReport, name: str, key: str) -> int:
    return int(float(report.entities.get(name, {}).get(key, 0)))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--scale", type=float, default=10.0)
    parser.add_argument("--drift-every", type=int, nargs="+", default=[100, 50, 20])
    args = parser.parse_args()

    still, _, _ = full_sync(args.scale, 0)
    runs = {n: full_sync(args.scale, n) for n in args.drift_every}
    figures: dict[str, object] = {"scale": args.scale, "still_requests": still.requests}
    print(f"scale {args.scale:g}: a full sync, still and drifting")
    for every, (report, diffs, changes) in runs.items():
        extra = report.requests - still.requests
        share = extra / still.requests
        print(
            f"\ndrift every {every} requests: {changes} changes at the source, "
            f"{report.requests} requests against {still.requests} still (+{share:.1%})"
        )
        print(
            f"{'entity set':<24} {'still':>6} {'drift':>6} {'reconc':>7} {'found':>6}  at the end"
        )
        for ent in ENTITY_SETS:
            found = sum(
                figure(report, ent.name, f"reconcile_{k}")
                for k in ("caught_up", "inserted", "deleted")
            )
            print(
                f"{ent.name:<24} {figure(still, ent.name, 'requests'):>6} "
                f"{figure(report, ent.name, 'requests'):>6} "
                f"{figure(report, ent.name, 'reconcile_requests'):>7} {found:>6}  {diffs[ent.name]}"
            )
        figures[f"drift_every_{every}"] = {
            "changes": changes,
            "requests": report.requests,
            "extra_share": round(share, 4),
            "at_the_end": diffs,
        }
    first = runs[args.drift_every[0]][0]
    share = (first.requests - still.requests) / still.requests
    print(f"\nextra requests at drift every {args.drift_every[0]}: {share:.1%} (target <= 5%)")
    record("reconcile_cost", figures)
    return 0 if share <= 0.05 else 1


if __name__ == "__main__":
    sys.exit(main())
