"""What reconciliation costs when the source moves: a full sync of a still source against the
same sync while it drifts, in requests, and how exact each ends.

Run: .venv/bin/python benchmarks/reconcile_cost.py [--scale 10] [--drift-every 100 50 20]
    [--drift-seeds 1 2 3 4 5 6 7 8]
Target: at most 5% more requests with drift than without, on average over the drift seeds at
the first rate given. Drift: every N collection requests the set being read loses a record,
gains one anywhere in key order and has one updated (connectors/sandbox/store.py); its seed
picks which records and where, so one seed is one draw: a delete behind the read costs about
log2(pages) requests to find, one ahead of it none, and the seeds show the spread. At 5
requests/s N = 100 is 9 writes a minute in the set being read; a clinic of this size changing
1% of its records a day makes about 3 a minute across all sets. N = 50 and 20 show the cost
curve past that.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import add_record_option, record, sandbox_process
from benchmarks.truth import compare_warehouse
from connectors.clinical_records.catalogue import ENTITY_SETS
from connectors.sandbox.control import SandboxControl
from pipelines.runner import SyncReport, sync


def full_sync(
    scale: float, drift_every: int, drift_seed: int = 5
) -> tuple[SyncReport, dict[str, str], int]:
    """A full sync against a fresh sandbox drifting every `drift_every` requests (0: still):
    the report, per set how it compares with the source at the end, and drift's changes."""
    args = ("--scale", f"{scale:g}", "--drift-every", str(drift_every))
    with (
        sandbox_process(*args, "--drift-seed", str(drift_seed)) as env,
        tempfile.TemporaryDirectory() as d,
    ):
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
    parser.add_argument("--drift-seeds", type=int, nargs="+", default=list(range(1, 9)))
    add_record_option(parser)
    args = parser.parse_args()

    still, _, _ = full_sync(args.scale, 0)
    figures: dict[str, object] = {"scale": args.scale, "still_requests": still.requests}
    print(f"scale {args.scale:g}: a full sync, still ({still.requests:,} requests) and drifting")
    spreads: list[tuple[int, float, float, float]] = []  # (every, mean, lowest, highest)
    for every in args.drift_every:
        shares = []
        for seed in args.drift_seeds:
            report, diffs, changes = full_sync(args.scale, every, seed)
            share = (report.requests - still.requests) / still.requests
            shares.append(share)
            print(
                f"\ndrift every {every} requests, seed {seed}: {changes} changes at the source, "
                f"{report.requests} requests against {still.requests} still (+{share:.1%})"
            )
            _print_sets(still, report, diffs)
            figures[f"drift_every_{every}_seed_{seed}"] = {
                "changes": changes,
                "requests": report.requests,
                "extra_share": round(share, 4),
                "at_the_end": diffs,
            }
        mean = sum(shares) / len(shares)
        spreads.append((every, mean, min(shares), max(shares)))
        figures[f"drift_every_{every}"] = {
            "mean_extra_share": round(mean, 4),
            "min_extra_share": round(min(shares), 4),
            "max_extra_share": round(max(shares), 4),
            "seeds": args.drift_seeds,
        }
    print()
    for every, mean, low, high in spreads:
        print(
            f"drift every {every}: +{mean:.1%} on average over {len(args.drift_seeds)} seeds "
            f"(+{low:.1%} to +{high:.1%})"
        )
    verdict = "PASS" if spreads[0][1] <= 0.05 else "FAIL"
    print(f"target: at most +5.0% on average at drift every {args.drift_every[0]}: {verdict}")
    if args.record:
        record("reconcile_cost", figures)
    return 0 if verdict == "PASS" else 1


def _print_sets(still: SyncReport, report: SyncReport, diffs: dict[str, str]) -> None:
    print(f"{'entity set':<24} {'still':>6} {'drift':>6} {'reconc':>7} {'found':>6}  at the end")
    for ent in ENTITY_SETS:
        found = sum(
            figure(report, ent.name, f"reconcile_{k}") for k in ("caught_up", "inserted", "deleted")
        )
        print(
            f"{ent.name:<24} {figure(still, ent.name, 'requests'):>6} "
            f"{figure(report, ent.name, 'requests'):>6} "
            f"{figure(report, ent.name, 'reconcile_requests'):>7} {found:>6}  {diffs[ent.name]}"
        )


if __name__ == "__main__":
    sys.exit(main())
