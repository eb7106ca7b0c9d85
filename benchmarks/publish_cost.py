"""What publishing the warehouse costs (warehouse/publish.py), at scale 10 and 50.

Each scale: a full sync (`clinical-sync sync --full`, rate limit off) into a fresh working
copy, which the run publishes; then `publish` timed again here, three times (CHECKPOINT, the
copy beside WAREHOUSE_PATH, fsync, rename), against the alternative of DuckDB rewriting the
database (`ATTACH` a new file, `COPY FROM DATABASE`), which also must keep the comments.

Run: .venv/bin/python benchmarks/publish_cost.py [--scales 10 50]
Target: a few seconds at scale 50, a small share of the sync.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import duckdb

from benchmarks.common import add_record_option, record, sandbox_process
from benchmarks.measure import console_script, failure, run_measured, sync_env
from benchmarks.scaling import loaded_records
from warehouse.publish import publish, working_path

UNLIMITED = 1000
TIMES = 3
COMMENTS = "SELECT count(*) FROM duckdb_columns() WHERE comment IS NOT NULL"


def rewrite_seconds(work: Path, target: Path) -> tuple[float, int]:
    """DuckDB's own copy into a new file; its time and the comments it kept."""
    started = time.perf_counter()
    with duckdb.connect() as con:
        con.execute(f"ATTACH '{work}' AS work (READ_ONLY)")
        con.execute(f"ATTACH '{target}' AS copy")
        con.execute("COPY FROM DATABASE work TO copy")
        con.execute("DETACH copy")
    seconds = time.perf_counter() - started
    with duckdb.connect(str(target), read_only=True) as con:
        (comments,) = con.execute(COMMENTS).fetchone()
    return round(seconds, 3), comments


def one_scale(scale: float, root: Path) -> dict[str, Any]:
    with sandbox_process("--scale", f"{scale:g}") as sandbox:
        env = sync_env(sandbox, root, rate=UNLIMITED, burst=UNLIMITED)
        run = run_measured([console_script("clinical-sync"), "sync", "--full"], env, root)
        if run.returncode != 0:
            raise failure(f"sync at scale {scale:g}", run)
    published = root / "warehouse.duckdb"
    work = working_path(published)
    times = [publish(work, published).seconds for _ in range(TIMES)]
    with duckdb.connect(str(published), read_only=True) as con:
        (comments,) = con.execute(COMMENTS).fetchone()
    rewrite, kept = rewrite_seconds(work, root / "rewritten.duckdb")
    return {
        "scale": scale,
        "records": loaded_records(published),
        "file_mib": round(published.stat().st_size / 2**20, 1),
        "sync_wall_s": run.seconds,
        "publish_s": statistics.median(times),
        "publish_runs_s": times,
        "publish_share_of_sync": round(statistics.median(times) / run.seconds, 4),
        "comments": comments,
        "copy_from_database_s": rewrite,
        "copy_from_database_comments": kept,
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scales", type=float, nargs="+", default=[10, 50])
    add_record_option(parser)
    args = parser.parse_args(argv)
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-publish-") as tmp:
        for scale in args.scales:
            root = Path(tmp) / f"scale-{scale:g}"
            root.mkdir()
            r = one_scale(scale, root)
            rows.append(r)
            print(
                f"scale {scale:>3g}: {r['records']:>9,} records, {r['file_mib']:>7.1f} MiB; "
                f"publish {r['publish_s']:.3f} s (runs {r['publish_runs_s']}), "
                f"{100 * r['publish_share_of_sync']:.1f}% of the {r['sync_wall_s']:.1f} s sync; "
                f"COPY FROM DATABASE {r['copy_from_database_s']:.3f} s, kept "
                f"{r['copy_from_database_comments']} of {r['comments']} column comments",
                flush=True,
            )
    if args.record:
        record("publish_cost", {"scales": rows})


if __name__ == "__main__":
    main()
