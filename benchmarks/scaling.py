"""How a full sync's cost grows with the data: scale 1, 10 and 50, rate limit off, no latency.

Each scale gets its own sandbox (no rate limit, no latency) and a fresh warehouse; our side
runs as the operator runs it (`clinical-sync sync --full`, CLINICAL_RATE_LIMIT=1000, burst
1000) in a child process, measured over its whole process tree. Wall time should grow about
linearly with the records (records/s roughly constant) and peak RSS should stay flat.

Run: .venv/bin/python benchmarks/scaling.py [--scales 1 10 50]
Target: peak RSS at scale 50 within 1.5x of scale 1.
"""

from __future__ import annotations

import argparse
import itertools
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import duckdb

from benchmarks.common import add_record_option, record, sandbox_process
from benchmarks.measure import console_script, failure, run_measured, server_figures, sync_env
from benchmarks.truth import compare_warehouse, summary
from connectors.clinical_records.catalogue import ENTITY_SETS
from connectors.sandbox.control import SandboxControl

UNLIMITED = 1000  # requests per second and burst: the rate limit off


def loaded_records(warehouse: Path) -> int:
    with duckdb.connect(str(warehouse), read_only=True) as con:
        return sum(
            con.execute(f'SELECT count(*) FROM "clinical"."{e.table}"').fetchone()[0]
            for e in ENTITY_SETS
        )


def one_scale(scale: float, root: Path, check: bool) -> dict[str, Any]:
    """A full sync at `scale` into a fresh warehouse; its cost, and its match with the truth."""
    with sandbox_process("--scale", f"{scale:g}") as sandbox:
        control = SandboxControl.from_env(sandbox)
        env = sync_env(sandbox, root, rate=UNLIMITED, burst=UNLIMITED)
        before = control.stats()
        run = run_measured([console_script("clinical-sync"), "sync", "--full"], env, root)
        server = server_figures(before, control.stats())
        if run.returncode != 0:
            raise failure(f"sync at scale {scale:g}", run)
        warehouse = root / "warehouse.duckdb"
        equal = summary(compare_warehouse(warehouse, control.truth())) if check else "not checked"
        records = loaded_records(warehouse)
    return {
        "scale": scale,
        "records": records,
        "requests": server.requests,
        "wall_s": run.seconds,
        "records_per_s": round(records / run.seconds),
        "peak_rss_mib": run.peak_rss_mib,
        "largest_process_rss_mib": run.largest_rss_mib,
        "cpu_s": run.cpu_seconds,
        "load_average": run.load_average,
        "equals_truth": equal,
    }


def marginal(before: dict[str, Any], after: dict[str, Any]) -> int:
    """Records per second of the extra records between two scales: linear cost keeps it flat."""
    seconds = after["wall_s"] - before["wall_s"]
    return round((after["records"] - before["records"]) / seconds) if seconds > 0 else 0


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scales", type=float, nargs="+", default=[1, 10, 50])
    parser.add_argument(
        "--check-up-to",
        type=float,
        default=10,
        help="compare with the ground truth up to this scale (the check is slow beyond)",
    )
    add_record_option(parser)
    args = parser.parse_args(argv)
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-scaling-") as tmp:
        for scale in args.scales:
            root = Path(tmp) / f"scale-{scale:g}"
            root.mkdir()
            rows.append(one_scale(scale, root, check=scale <= args.check_up_to))
            r = rows[-1]
            print(
                f"scale {scale:>4g}: {r['records']:>9,} records, {r['requests']:>6,} requests, "
                f"{r['wall_s']:>7.1f} s, {r['records_per_s']:>7,} records/s, "
                f"peak RSS {r['peak_rss_mib']:>7.1f} MiB (largest process "
                f"{r['largest_process_rss_mib']:.1f}), CPU {r['cpu_s']:.1f} s, "
                f"machine load {r['load_average']}, "
                f"equals truth: {r['equals_truth']}",
                flush=True,
            )
    for before, after in itertools.pairwise(rows):
        after["marginal_records_per_s"] = marginal(before, after)
        print(
            f"scale {before['scale']:g} -> {after['scale']:g}: "
            f"{after['marginal_records_per_s']:,} records/s for the records added "
            "(the fixed start-up cost taken out)"
        )
    first, last = rows[0], rows[-1]
    growth = round(last["peak_rss_mib"] / first["peak_rss_mib"], 2)
    print(
        f"peak RSS at scale {last['scale']:g} / scale {first['scale']:g} = {growth} "
        f"(target <= 1.5); records/s from {first['records_per_s']:,} to {last['records_per_s']:,}"
    )
    if args.record:
        record("scaling", {"scales": rows, "rss_growth": growth})


if __name__ == "__main__":
    main()
