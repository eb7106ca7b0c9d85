"""Load throughput: appointment pages through decode, normalise, Parquet and the DuckDB merge.

Two cases on the same records: an initial load into empty tables, and a merge of the same
records again with 10% changed. The same pages go through dlt (`pip install -e '.[bench]'`)
into DuckDB with `write_disposition="merge"`, in the same run, for the ratio. A third case
of ours, a merge with another 25% changed, shows what a larger day costs (no load vacuums
the rows earlier merges replaced: the publication compacts the file, warehouse/vacuum.py).
Each engine runs in its own process, so each peak RSS is its own.

Run: .venv/bin/python benchmarks/load_throughput.py [--records 1000000] [--workers 2]
Targets: >= 100,000 records/s initial, >= 50,000 merge, >= 3x dlt, peak RSS < 1 GiB.
"""

from __future__ import annotations

import argparse
import json
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import add_record_option, record
from benchmarks.measure import last_json_line
from connectors.clinical_records.catalogue import APPOINTMENTS, PAGE_SIZE
from connectors.clinical_records.decode import decode_json
from sync.extract import FILE_ROWS, NORMALISE_ROWS

try:  # dlt brings orjson with the bench extra
    import orjson
except ImportError:  # pragma: no cover
    orjson = json

# Both engines decode the pages as our connector does (see connectors/.../decode.py for why
# that is not orjson); --decoder orjson shows what a faster, lossier decoder would give.
DECODERS = {"connector": decode_json, "orjson": orjson.loads}
DECODER = "connector"

GIB = 1024**3


STATUSES = ("Scheduled", "Completed", "Checked Out")  # by version


def appointment(i: int, version: int = 0) -> dict[str, object]:
    """One record as the sandbox sends it: string ids, offsets, fractions, unicode, quotes.
    Each later version has another status and a newer `updated_at`."""
    return {
        "id": f"apt-{i:08d}",
        "patient_id": str(1000 + i % 50_000),
        "appointment_date": f"2026-{1 + i % 12:02d}-{1 + i % 28:02d}",
        "start_time": f"{8 + i % 9:02d}:{i % 60:02d}:00",
        "end_time": f"{9 + i % 9:02d}:{i % 60:02d}:00",
        "start_time_new": None,
        "end_time_new": None,
        "start_datetime": f"2026-01-{1 + i % 28:02d}T09:30:00.{i % 1000:03d}+02:00",
        "end_datetime": f"2026-01-{1 + i % 28:02d}T10:00:00-05:00",
        "status": STATUSES[version],
        "visit_type": "Telehealth" if i % 3 else "In-Person",
        "appointment_type_id": f"type-{i % 20}",
        "branch_id": str(1 + i % 40),
        "user_id": str(500 + i % 300),
        "user_two_id": None,
        "user_three_id": None,
        "user_four_id": None,
        "user_type": "Clinician",
        "user_type_id": str(i % 5),
        "notes": f'Zoë said "see you" — visit {i}',
        "prescription_id": str(10_000 + i % 80_000),
        "prescription_two_id": None,
        "recurring": i % 7 == 0,
        "recurring_appointment_id": None,
        "custom_recurrence": False,
        "rescheduled_from": None,
        "rescheduled_to": None,
        "confirmation_code": f"C{i:09d}",
        "confirmation_sent": True,
        "confirmation_status": "Confirmed",
        "confirmation_updated_at": "2025-12-31T23:59:59.1234567Z",
        "confirmation_request_sent_date": "2025-12-30",
        "confirmation_request_sent_status": "Sent",
        "survey_sent_date": None,
        "survey_sent_status": None,
        "survey_completed": False,
        "delivery_location_id": str(i % 10),
        "calendar_event_id": f"evt-{i}",
        "source_id": str(i),
        "source_name": "legacy",
        "created_at": "2025-11-01T08:00:00+00:00",
        "updated_at": f"2026-01-{1 + 4 * version:02d}T10:00:00+01:00",
        "created_by_id": "5",
        "updated_by_id": "6",
    }


def lengths_file(path: Path) -> Path:
    return path.with_name(path.name + ".lengths.json")


# Each case's pages: the version each record is sent in.
CASES: dict[str, Callable[[int], int]] = {
    "initial": lambda i: 0,
    "merge": lambda i: 1 if i % 10 == 0 else 0,  # 10% changed
    "merge_vacuum": lambda i: 2 if i % 4 == 0 else (1 if i % 10 == 0 else 0),  # 25% more
}
COMPARED = ("initial", "merge")  # the cases dlt runs too, and the targets


def write_pages(path: Path, records: int, version_of: Callable[[int], int]) -> None:
    """The API's pages, one JSON envelope per line, and each line's length beside them
    (generated before any clock starts, so no clock times indexing the file)."""
    lengths = []
    with path.open("wb") as out:
        for start in range(0, records, PAGE_SIZE):
            rows = [
                appointment(i, version_of(i)) for i in range(start, min(start + PAGE_SIZE, records))
            ]
            page = {"@odata.context": "$metadata#Appointments", "value": rows}
            line = json.dumps(page, ensure_ascii=False).encode() + b"\n"
            out.write(line)
            lengths.append(len(line))
    lengths_file(path).write_text(json.dumps(lengths))


def tasks(path: Path, pages_per_task: int) -> Iterator[tuple[int, int]]:
    """(offset, pages) of each run of `pages_per_task` lines: workers read their own."""
    lengths = json.loads(lengths_file(path).read_text())
    offset = 0
    for first in range(0, len(lengths), pages_per_task):
        run = lengths[first : first + pages_per_task]
        yield offset, len(run)
        offset += sum(run)


def warm_up() -> None:
    """Import what a worker needs, so the clock times the work, not starting processes
    (the product's extraction runs in a process that is already up)."""
    import sync.extract  # noqa: F401


def cpu_seconds() -> float:
    """User + system CPU of this process and its finished children (the extract workers)."""
    own = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def peak_rss() -> int:
    own = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    children = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    return max(own, children) * 1024


# -- our pipeline -----------------------------------------------------------------------


def extract_pages(
    pages: str, task: tuple[int, int], lake_root: str, run_id: str, decoder: str = DECODER
) -> list[str]:
    """Decode pages one at a time into the extraction's own writer, which normalises and
    writes the lake files as a sync does; returns the files."""
    from sync.extract import BatchWriter
    from sync.strategy import Mode, Plan
    from warehouse.lake import Lake

    loads = DECODERS[decoder]
    plan = Plan(APPOINTMENTS, Mode.INCREMENTAL, "benchmark")
    writer = BatchWriter(Lake(lake_root), plan, run_id, previous_watermark=None)
    offset, count = task
    with open(pages, "rb") as src:
        src.seek(offset)
        for _, line in zip(range(count), src, strict=False):
            writer.add(loads(line)["value"])
    writer.finish()
    return writer.files


def run_ours(work: Path, workers: int, decoder: str = DECODER) -> dict[str, dict[str, float]]:
    from warehouse.load import Warehouse

    lake, out = work / "lake", {}
    shutil.rmtree(lake, ignore_errors=True)
    (work / "ours.duckdb").unlink(missing_ok=True)
    for case in CASES:
        pages = work / f"{case}.jsonl"
        pool = ProcessPoolExecutor(workers)
        for ready in [pool.submit(warm_up) for _ in range(workers)]:
            ready.result()
        started, cpu_started = time.perf_counter(), cpu_seconds()
        runs = list(tasks(pages, FILE_ROWS // PAGE_SIZE))  # a lake file's worth each
        with pool:
            futures = [
                pool.submit(extract_pages, str(pages), task, str(lake), f"bench-{case}", decoder)
                for task in runs
            ]
            paths = [path for f in futures for path in f.result()]
        extracted, cpu_extracted = time.perf_counter(), cpu_seconds()
        with Warehouse(work / "ours.duckdb") as wh:
            wh.ensure_schema()
            result = wh.load(APPOINTMENTS, paths, run_id=f"bench-{case}")
        seconds = time.perf_counter() - started
        out[case] = {
            "seconds": seconds,
            "extract_seconds": extracted - started,
            "load_seconds": seconds - (extracted - started),
            "extract_cpu_seconds": cpu_extracted - cpu_started,
            "load_cpu_seconds": cpu_seconds() - cpu_extracted,
            "records": result.fetched,
            "inserted": result.inserted,
            "updated": result.updated,
            "unchanged": result.unchanged,
            "peak_rss": peak_rss(),
        }
    return out


# -- dlt --------------------------------------------------------------------------------


def run_dlt(work: Path, records: int, decoder: str = DECODER) -> dict[str, dict[str, float]]:
    import dlt

    loads = DECODERS[decoder]

    @dlt.resource(name="appointments", write_disposition="merge", primary_key="id")
    def appointments(pages: Path) -> Iterator[list[dict[str, object]]]:
        with pages.open("rb") as src:
            for _, line in zip(range(-(-records // PAGE_SIZE)), src, strict=False):
                yield loads(line)["value"]

    shutil.rmtree(work / "dlt", ignore_errors=True)
    pipeline = dlt.pipeline(
        pipeline_name="bench_load",
        pipelines_dir=str(work / "dlt"),
        destination=dlt.destinations.duckdb(str(work / "dlt.duckdb")),
        dataset_name="clinical",
    )
    (work / "dlt.duckdb").unlink(missing_ok=True)
    out = {}
    for case in COMPARED:
        pages = work / f"{case}.jsonl"
        started = time.perf_counter()
        pipeline.run(appointments(pages))
        seconds = time.perf_counter() - started
        rows = pipeline.last_trace.last_normalize_info.row_counts.get("appointments", 0)
        out[case] = {"seconds": seconds, "records": min(rows, records), "peak_rss": peak_rss()}
    return out


# -- driver -----------------------------------------------------------------------------


def child(engine: str, work: Path, args: argparse.Namespace) -> None:
    if engine == "ours":
        figures = run_ours(work, args.workers, args.decoder)
    else:
        figures = run_dlt(work, args.dlt_records, args.decoder)
    print(json.dumps(figures))


def in_child(engine: str, work: Path, args: argparse.Namespace) -> dict[str, dict[str, float]]:
    cmd = [
        sys.executable,
        __file__,
        "--child",
        engine,
        "--work",
        str(work),
        "--workers",
        str(args.workers),
        "--dlt-records",
        str(args.dlt_records),
        "--decoder",
        args.decoder,
    ]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"{engine} failed:\n{done.stderr[-3000:]}")
    return last_json_line(done.stdout)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--workers", type=int, default=2, help="extraction processes")
    parser.add_argument("--skip-dlt", action="store_true")
    parser.add_argument(
        "--dlt-records",
        type=int,
        default=100_000,
        help="records dlt loads (the first pages); ~1,000 rec/s here, so 1M takes half an hour",
    )
    parser.add_argument(
        "--decoder",
        choices=sorted(DECODERS),
        default=DECODER,
        help="JSON decoder for the pages (connector: the one our transport uses)",
    )
    parser.add_argument("--child", choices=["ours", "dlt"], help=argparse.SUPPRESS)
    parser.add_argument("--work", type=Path, help=argparse.SUPPRESS)
    add_record_option(parser)
    args = parser.parse_args()
    if args.child:
        child(args.child, args.work, args)
        return

    work = Path(tempfile.mkdtemp(prefix="load-throughput-"))
    try:
        started = time.perf_counter()
        for case, version_of in CASES.items():
            write_pages(work / f"{case}.jsonl", args.records, version_of)
        print(
            f"{args.records:,} appointment records in {args.records // PAGE_SIZE:,} pages "
            f"(generated in {time.perf_counter() - started:.1f} s; decoder {args.decoder}; "
            f"normalised {NORMALISE_ROWS:,} at a time into lake files of {FILE_ROWS:,})"
        )
        engines = {"ours": in_child("ours", work, args)}
        if not args.skip_dlt:
            engines["dlt"] = in_child("dlt", work, args)
        figures: dict[str, object] = {
            "records": args.records,
            "decoder": args.decoder,
            "records_per_file": FILE_ROWS,
        }
        for case in CASES:
            for engine, results in engines.items():
                if case not in results:
                    continue
                r = results[case]
                rate = r["records"] / r["seconds"]
                figures[f"{engine}_{case}_records_per_s"] = round(rate)
                figures[f"{engine}_{case}_peak_rss_mib"] = round(r["peak_rss"] / 2**20)
                extra = ""
                if engine == "ours":
                    cpu = r["extract_cpu_seconds"] + r["load_cpu_seconds"]
                    figures[f"ours_{case}_cpu_seconds"] = round(cpu, 1)
                    extra = (
                        f" (extract {r['extract_seconds']:.1f} s, load {r['load_seconds']:.1f} s;"
                        f" CPU extract {r['extract_cpu_seconds']:.1f} s, load"
                        f" {r['load_cpu_seconds']:.1f} s;"
                        f" inserted {r['inserted']:,}, updated {r['updated']:,},"
                        f" unchanged {r['unchanged']:,})"
                    )
                print(
                    f"{case:12} {engine:5} {r['records']:>9,} rec {r['seconds']:7.1f} s {rate:9,.0f} rec/s "
                    f"peak RSS {r['peak_rss'] / 2**20:6,.0f} MiB{extra}"
                )
            if "dlt" in engines and case in COMPARED:
                ratio = figures[f"ours_{case}_records_per_s"] / figures[f"dlt_{case}_records_per_s"]
                figures[f"{case}_ratio_vs_dlt"] = round(ratio, 2)
                print(f"{case:12} ratio ours/dlt throughput: {ratio:.2f}x")
        targets = {
            "initial >= 100,000 rec/s": figures["ours_initial_records_per_s"] >= 100_000,
            "merge >= 50,000 rec/s": figures["ours_merge_records_per_s"] >= 50_000,
            "peak RSS < 1 GiB": max(r["peak_rss"] for r in engines["ours"].values()) < GIB,
        }
        if "dlt" in engines:
            targets[">= 3x dlt"] = (
                min(figures["initial_ratio_vs_dlt"], figures["merge_ratio_vs_dlt"]) >= 3
            )
        for target, met in targets.items():
            print(f"target {target}: {'met' if met else 'NOT met'}")
        if args.record:
            record("load_throughput", figures)
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
