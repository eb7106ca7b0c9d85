"""Requests a nightly sync spends against a full sync, after 1% of the records change.

Run: .venv/bin/python benchmarks/incremental_cost.py [--scale 10] [--change 0.01]
Targets: nightly at most 15% of full; the cursor sets (Appointments, Claims) at most 3% of
their own full cost. Requests, not seconds, are the cost: the API allows 2-5 per second.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import record, sandbox_process
from connectors.clinical_records.catalogue import ENTITY_SETS, Strategy
from connectors.sandbox.control import SandboxControl
from pipelines.runner import SyncReport, sync


def requests_of(report: SyncReport, name: str) -> int:
    return int(float(report.entities.get(name, {}).get("requests", 0)))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--scale", type=float, default=10.0)
    parser.add_argument("--change", type=float, default=0.01, help="share inserted and updated")
    args = parser.parse_args()

    with sandbox_process("--scale", f"{args.scale:g}") as env, tempfile.TemporaryDirectory() as d:
        env = {
            **env,
            "CLINICAL_RATE_LIMIT": "1000",
            "CLINICAL_BURST": "200",
            "CLINICAL_LIMITER_PATH": f"{d}/ratelimit.sqlite",
        }
        paths = {"lake_root": f"{d}/lake", "warehouse_path": f"{d}/warehouse.duckdb"}
        full = sync(env, log_level="WARNING", **paths)
        assert full.success, full.failure
        SandboxControl.from_env(env).advance(
            seconds=86400,
            insert_fraction=args.change,
            update_fraction=args.change,
            delete_fraction=args.change / 5,
        )
        nightly = sync(env, log_level="WARNING", **paths)
        assert nightly.success, nightly.failure

    print(f"scale {args.scale:g}, {args.change:.0%} of records inserted and updated")
    print(f"{'entity set':<24} {'strategy':<18} {'full':>6} {'nightly':>8} {'share':>7}")
    per_set: dict[str, dict[str, object]] = {}
    for ent in ENTITY_SETS:
        f, n = requests_of(full, ent.name), requests_of(nightly, ent.name)
        share = n / f if f else 0.0
        per_set[ent.name] = {"full": f, "nightly": n, "share": round(share, 4)}
        print(f"{ent.name:<24} {ent.strategy.value:<18} {f:>6} {n:>8} {share:>7.1%}")
    ratio = nightly.requests / full.requests
    cursor = [e.name for e in ENTITY_SETS if e.strategy is Strategy.CURSOR]
    cursor_full = sum(requests_of(full, n) for n in cursor)
    cursor_ratio = sum(requests_of(nightly, n) for n in cursor) / cursor_full
    print(f"{'total':<43} {full.requests:>6} {nightly.requests:>8} {ratio:>7.1%}")
    print(f"nightly/full: {ratio:.1%} (target <= 15%); cursor sets: {cursor_ratio:.1%} (<= 3%)")
    record(
        "incremental_cost",
        {
            "scale": args.scale,
            "change": args.change,
            "full_requests": full.requests,
            "nightly_requests": nightly.requests,
            "ratio": round(ratio, 4),
            "cursor_sets_ratio": round(cursor_ratio, 4),
            "per_set": per_set,
            "full_seconds": full.seconds,
            "nightly_seconds": nightly.seconds,
        },
    )
    return 0 if ratio <= 0.15 and cursor_ratio <= 0.03 else 1


if __name__ == "__main__":
    sys.exit(main())
