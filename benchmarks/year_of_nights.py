"""A year of nights: whether the nightly's cost grows with the day's changes or with the years.

The sandbox's data (its `Store`, in this process: no HTTP) is loaded once, as a first sync
would, then every day changes as `Store.advance` changes it (1% of the records inserted, 1%
updated, 0.2% hard-deleted, and 1% of the documents uploaded and as many deleted, the day of
benchmarks/expansion_cost.py) and the day's records go down the nightly's loading path: one
lake batch per set (normalised, with the keys found deleted), `Warehouse.load` (merge,
history, soft deletes), the analytics models and a publication. The day's fractions are of
the sets' sizes on the first day: every night brings as many changes, so a night that costs
more than the first did pays for the years behind it, not for a bigger day.

Per night: seconds in the warehouse (lake, loads, models), publication seconds, the working
file's MiB, history rows, and its dead space (DuckDB's free blocks over all its blocks).

The nightly's work runs in a process of its own (`Nightly`), as in production, where the
source is another service: holding the source's records (a million at the year's end at scale
10) made the same nights 30% slower in the process that held them, a cost that grew with the
year and was the benchmark's, not the nightly's (docs/SIZING.md).

The year's two ends are compared twice. As run: the first 30 nights against the last 30, a
quarter of an hour apart at scale 10, on a host whose speed moves by a sixth within an hour.
And side by side (`--replay`): copies of the warehouse after the first sync and after the last
night take the ten days that follow each, each end in a new process, one end's night then the
other's, so that both are measured in the same minutes.

Run: nice -n 10 .venv/bin/python benchmarks/year_of_nights.py --scale 10 --days 365 [--json PATH]
Targets: the last 30 nights' warehouse seconds within 1.5x of the first 30; dead space never
above a fifth of the file; `--scale 2 --days 365` in under 10 minutes on 2 cores.
"""

from __future__ import annotations

import argparse
import functools
import json
import multiprocessing
import os
import shutil
import statistics
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import record
from connectors.clinical_records.catalogue import ALL_ENTITIES, DOCUMENTS, PATIENTS, EntitySet
from connectors.sandbox.document_store import DocumentStore
from connectors.sandbox.store import Store
from warehouse import dbt_project, ddl, models
from warehouse.lake import Lake
from warehouse.load import Warehouse
from warehouse.normalise import normalise
from warehouse.publish import publish, working_path
from warehouse.writer import writing

MIB = 1024 * 1024
DAY = {"insert_fraction": 0.01, "update_fraction": 0.01, "delete_fraction": 0.002}
DOCUMENT_FRACTION = 0.01
WINDOW = 30  # nights compared at each end of the year
PUBLISHED = "warehouse.duckdb"  # in each nightly's folder
REPLAY = 10  # nights replayed side by side at each end (after one more, not counted)
RATIO_TARGET, DEAD_TARGET = 1.5, 0.2


@functools.cache
def _project(database: str) -> dbt_project.Project:
    """transform/ prepared once for the year (`prepare` fingerprints every file of it)."""
    return dbt_project.prepare(database=database)


def build_models(work: Path) -> dict[str, int]:
    """The nightly's models step (dbt, in process, the models the night's changes made stale):
    the rows of each model built; a failed one stops the year."""
    built = models.build(work, _project(dbt_project.catalog(work)))
    if built.failed:
        raise RuntimeError(f"the models failed: {built.summary()}")
    return built.built


@dataclass
class Night:
    night: int
    changes: int  # records inserted, updated or deleted at the source that day
    warehouse_s: float  # lake + loads + models
    warehouse_cpu_s: float  # the same stages' CPU, every thread of this process
    lake_s: float
    load_s: float
    models_s: float
    publish_s: float
    file_mib: float
    history_rows: int
    clinical_rows: int
    dead_space: float  # free blocks / total blocks of the working file


class DayLog:
    """The keys a day touched, per set: every table's upserts and deletes, and the documents'
    uploads and deletes, seen as the store makes them."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.touched: dict[str, set[Any]] = {e.name: set() for e in ALL_ENTITIES}
        self.gone: dict[str, set[Any]] = {e.name: set() for e in ALL_ENTITIES}
        for name, table in store.tables.items():
            table.upsert = self._watch(table.upsert, self.touched[name], self.gone[name])
            table.delete = self._watch(table.delete, self.gone[name], self.touched[name])
        docs = store.documents
        patients = store.tables[PATIENTS.name]
        patients.delete = self._with_documents(patients.delete, docs)
        docs.add = self._watch_document(docs.add)
        docs.delete = self._watch(
            docs.delete,
            self.gone[DOCUMENTS.name],
            self.touched[DOCUMENTS.name],
            key_of=lambda args: args[1],
        )

    @staticmethod
    def _watch(
        method: Callable[..., Any],
        into: set[Any],
        out_of: set[Any],
        key_of: Callable[[tuple[Any, ...]], Any] | None = None,
    ) -> Callable[..., Any]:
        entity_key = getattr(getattr(method, "__self__", None), "entity", None)

        def watched(*args: Any) -> Any:
            if key_of is not None:
                key = key_of(args)
            elif entity_key is not None and isinstance(args[0], dict):
                key = args[0].get(entity_key.key)
            else:
                key = args[0]
            into.add(key)
            out_of.discard(key)
            return method(*args)

        return watched

    def _with_documents(
        self, delete: Callable[[Any], bool], docs: DocumentStore
    ) -> Callable[[Any], bool]:
        """A patient deleted takes its documents with it: the API reaches them only through
        their patient (404 for it), and the nightly marks them deleted (the store keeps them)."""

        def watched(key: Any) -> bool:
            for meta in docs.list(str(key)):
                self.gone[DOCUMENTS.name].add(meta["id"])
                self.touched[DOCUMENTS.name].discard(meta["id"])
            return delete(key)

        return watched

    def _watch_document(self, add: Callable[..., dict]) -> Callable[..., dict]:
        def watched(**fields: Any) -> dict:
            meta = add(**fields)
            self.touched[DOCUMENTS.name].add(meta["id"])
            return meta

        return watched

    def take(self) -> dict[str, tuple[list[dict], list[str]]]:
        """The day's records (as served now) and deleted keys, per set; starts a new day."""
        out: dict[str, tuple[list[dict], list[str]]] = {}
        documents = {m["id"]: m for m in self.store.documents.all()}
        for entity in ALL_ENTITIES:
            held = documents if entity is DOCUMENTS else self.store.tables[entity.name].by_key
            records = [dict(held[k]) for k in self.touched[entity.name] if k in held]
            gone = [str(k) for k in self.gone[entity.name]]
            if records or gone:
                out[entity.name] = (records, gone)
            self.touched[entity.name].clear()
            self.gone[entity.name].clear()
        return out


def every_record(store: Store) -> dict[str, tuple[list[dict], list[str]]]:
    truth = store.ground_truth()
    return {e.name: (truth[e.name], []) for e in ALL_ENTITIES}


def one_day(store: Store, first_size: int) -> None:
    """A day at the source, as large as a day at the sets' first sizes."""
    size = sum(len(t) for t in store.tables.values())
    share = first_size / size if size else 1.0
    store.advance(seconds=86400, **{k: v * share for k, v in DAY.items()})
    store.advance(
        seconds=0,
        insert_fraction=0,
        update_fraction=0,
        delete_fraction=0,
        document_fraction=DOCUMENT_FRACTION,
    )


def lake_batches(
    lake: Lake, day: dict[str, tuple[list[dict], list[str]]], run_id: str, now: datetime
) -> list[tuple[EntitySet, Path]]:
    """The day's records of each set as one lake batch, normalised as the extraction does
    (`now`: the source's clock at the day's end)."""
    written = []
    for entity in ALL_ENTITIES:
        if entity.name not in day:
            continue
        records, gone = day[entity.name]
        batch = normalise(entity, records)
        path = lake.write(
            entity,
            batch.table,
            run_id=run_id,
            extracted_at=now + timedelta(hours=2),  # the nightly runs after the day
            rejects=batch.rejects,
            deletes=gone,
        )
        written.append((entity, path))
    return written


def file_figures(work: Path) -> tuple[float, int, int, float]:
    """The working file's MiB, history rows, clinical rows and free share of its blocks."""
    with Warehouse(work, read_only=True) as wh:
        total, free = wh.con.execute(
            "SELECT total_blocks, free_blocks FROM pragma_database_size() "
            "WHERE database_name = current_database()"
        ).fetchone()
        history = sum(
            wh.con.execute(f'SELECT count(*) FROM "{ddl.HISTORY}"."{name}"').fetchone()[0]
            for (name,) in wh.con.execute(
                "SELECT table_name FROM duckdb_tables() WHERE schema_name = ?", [ddl.HISTORY]
            ).fetchall()
        )
        clinical = sum(
            wh.con.execute(f'SELECT count(*) FROM "{ddl.CLINICAL}"."{e.table}"').fetchone()[0]
            for e in ALL_ENTITIES
        )
    mib = os.path.getsize(work) / MIB
    return round(mib, 2), history, clinical, round(free / total, 4) if total else 0.0


def equals_source(work: Path, store: Store) -> bool:
    """Whether every set's live keys in the warehouse are the source's, no more, no less."""
    truth = store.ground_truth()
    with Warehouse(work, read_only=True) as wh:
        for entity in ALL_ENTITIES:
            held = wh.con.execute(
                f'SELECT CAST("{entity.key}" AS VARCHAR) FROM "{ddl.CLINICAL}"."{entity.table}" '
                'WHERE "_deleted_at" IS NULL'
            ).fetchall()
            if {k for (k,) in held} != {str(r[entity.key]) for r in truth[entity.name]}:
                return False
    return True


def night(
    number: int,
    day: dict[str, tuple[list[dict], list[str]]],
    now: datetime,
    lake: Lake,
    published: Path,
) -> Night:
    """The nightly's warehouse work for one day's records, timed by stage."""
    work = working_path(published)
    run_id = f"night-{number:04d}"
    started, cpu = time.perf_counter(), time.process_time()
    with writing(work):  # held for the night, as `clinical-sync sync` holds it for its run
        batches = lake_batches(lake, day, run_id, now)
        lake_done = time.perf_counter()
        with Warehouse(work) as wh:
            wh.ensure_schema()
            for entity, path in batches:
                wh.load(entity, [path], run_id=run_id, snapshot=number == 0)
        loads_done = time.perf_counter()
        build_models(work)
        models_done, models_cpu = time.perf_counter(), time.process_time()
        publish(work, published)
        published_at = time.perf_counter()
        mib, history, clinical, dead = file_figures(work)
    return Night(
        night=number,
        changes=sum(len(r) + len(g) for r, g in day.values()),
        warehouse_s=round(models_done - started, 3),
        warehouse_cpu_s=round(models_cpu - cpu, 3),
        lake_s=round(lake_done - started, 3),
        load_s=round(loads_done - lake_done, 3),
        models_s=round(models_done - loads_done, 3),
        publish_s=round(published_at - models_done, 3),
        file_mib=mib,
        history_rows=history,
        clinical_rows=clinical,
        dead_space=dead,
    )


Day = tuple[datetime, dict[str, tuple[list[dict], list[str]]]]  # the source's clock, its records


class Nightly:
    """The nightly's warehouse work for one warehouse (`folder`), in a process of its own: the
    source's records stay in this one, which sends it each day's."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        context = multiprocessing.get_context("spawn")  # a new process, none of this one's memory
        self._pipe, theirs = context.Pipe()
        self._process = context.Process(target=_serve, args=(theirs, folder), daemon=True)
        self._process.start()
        theirs.close()

    @property
    def published(self) -> Path:
        return self.folder / PUBLISHED

    def night(self, number: int, day: Day) -> Night:
        self._pipe.send((number, *day))
        done, value = self._pipe.recv()
        if not done:
            raise RuntimeError(f"night {number} failed in the nightly's process:\n{value}")
        return value

    def close(self) -> None:
        self._pipe.send(None)
        self._process.join(timeout=60)


def _serve(pipe: Any, folder: Path) -> None:
    """A nightly's process: each (night, source clock, records) received is run as `night`."""
    lake = Lake(folder / "lake")
    while (task := pipe.recv()) is not None:
        number, now, day = task
        try:
            done = night(number, day, now, lake, folder / PUBLISHED)
            pipe.send((True, done))
        except Exception:
            pipe.send((False, traceback.format_exc(limit=6)))


@dataclass
class End:
    """One end of the year: a copy of the warehouse as it was there and the days that
    followed it."""

    folder: Path
    first_night: int
    days: list[Day] = field(default_factory=list)

    @classmethod
    def kept(cls, published: Path, folder: Path, first_night: int) -> End:
        end = cls(folder, first_night)
        copy_path = working_path(folder / PUBLISHED)
        copy_path.parent.mkdir(parents=True)
        shutil.copy2(working_path(published), copy_path)
        return end

    def keep(self, now: datetime, day: dict[str, tuple[list[dict], list[str]]]) -> None:
        self.days.append((now, day))  # the nightly's process gets a copy; nothing here changes it


def side_by_side(ends: tuple[End, End]) -> dict[str, Any]:
    """The days after each end again, each end in a new process, one end's night then the
    other's; the first night of each (a cold copy) is not counted."""
    nightlies = [Nightly(end.folder) for end in ends]
    runs: tuple[list[Night], list[Night]] = ([], [])
    try:
        for index in range(len(ends[0].days)):
            for end, nightly, nights in zip(ends, nightlies, runs, strict=True):
                nights.append(nightly.night(end.first_night + index, end.days[index]))
    finally:
        for nightly in nightlies:
            nightly.close()
    first, last = (round(statistics.fmean(n.warehouse_s for n in nights[1:]), 4) for nights in runs)
    return {
        "nights": len(runs[0]) - 1,
        "first_s": first,
        "last_s": last,
        "ratio": round(last / first, 2),
        "first_nights": [asdict(n) for n in runs[0]],
        "last_nights": [asdict(n) for n in runs[1]],
    }


def summary(nights: list[Night], window: int) -> dict[str, Any]:
    """The year's figures: the first and last `window` nights side by side."""
    first, last = nights[:window], nights[-window:]

    def mean(rows: list[Night], name: str) -> float:
        return round(statistics.fmean(getattr(n, name) for n in rows), 4)

    figures: dict[str, Any] = {
        "window": window,
        "first_30_nights_s": mean(first, "warehouse_s"),
        "last_30_nights_s": mean(last, "warehouse_s"),
        "file_mib_first": nights[0].file_mib,
        "file_mib_last": nights[-1].file_mib,
        "dead_space_fraction_max": max(n.dead_space for n in nights),
        "history_rows_first": nights[0].history_rows,
        "history_rows_last": nights[-1].history_rows,
        "clinical_rows_first": nights[0].clinical_rows,
        "clinical_rows_last": nights[-1].clinical_rows,
    }
    for stage in ("warehouse_cpu_s", "lake_s", "load_s", "models_s", "publish_s", "changes"):
        figures[f"{stage}_first"] = mean(first, stage)
        figures[f"{stage}_last"] = mean(last, stage)
    figures["ratio"] = round(figures["last_30_nights_s"] / figures["first_30_nights_s"], 2)
    figures["cpu_ratio"] = round(
        figures["warehouse_cpu_s_last"] / figures["warehouse_cpu_s_first"], 2
    )
    figures["compactions"] = sum(1 for n in nights if n.dead_space == 0.0)
    return figures


def write_json(
    args: argparse.Namespace,
    full: Night,
    nights: list[Night],
    seconds: float,
    exact: bool | None,
    replayed: dict[str, Any] | None = None,
) -> None:
    """The year so far (written after every night: a run stopped early keeps its nights) or
    whole; `equals_source` is null until the last night is checked."""
    window = min(WINDOW, len(nights) // 2)
    document = {
        "scale": args.scale,
        "days": args.days,
        "nights_done": len(nights),
        "seconds": seconds,
        "equals_source": exact,
        "first_sync": asdict(full),
        **(summary(nights, window) if window else {}),
        "side_by_side": replayed,
        "nights": [asdict(n) for n in nights],
    }
    tmp = args.json.with_name(args.json.name + ".tmp")
    tmp.write_text(json.dumps(document, indent=1) + "\n", encoding="utf-8")
    tmp.replace(args.json)


def run_year(
    args: argparse.Namespace,
    year: Nightly,
    full: Night,
    first: End | None,
    log: DayLog,
    first_size: int,
    began: float,
) -> tuple[list[Night], bool]:
    """The year's nights, each printed as it ends (and the JSON written after it); whether the
    warehouse's live records are the source's at the end. `first` keeps the first days."""
    store = log.store
    print(
        f"first sync: {full.changes:,} records, {full.warehouse_s:.2f} s in the warehouse, "
        f"{full.publish_s:.2f} s publishing, {full.file_mib:.1f} MiB",
        flush=True,
    )
    print(
        f"{'night':>5} {'changes':>8} {'warehouse s':>11} {'CPU s':>6} {'loads s':>8} "
        f"{'models s':>8} {'publish s':>9} {'file MiB':>9} {'history rows':>12} {'dead space':>10}"
    )
    nights: list[Night] = []
    for number in range(1, args.days + 1):
        one_day(store, first_size)
        day = log.take()
        if first is not None and len(first.days) <= args.replay:
            first.keep(store.now, day)
        n = year.night(number, (store.now, day))
        nights.append(n)
        print(
            f"{n.night:>5} {n.changes:>8,} {n.warehouse_s:>11.3f} {n.warehouse_cpu_s:>6.2f} "
            f"{n.load_s:>8.3f} {n.models_s:>8.3f} {n.publish_s:>9.3f} {n.file_mib:>9.1f} "
            f"{n.history_rows:>12,} {n.dead_space:>10.3f}",
            flush=True,
        )
        if args.json:
            write_json(args, full, nights, round(time.perf_counter() - began, 1), None)
    return nights, equals_source(working_path(year.published), store)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scale", type=float, default=10)
    parser.add_argument("--days", type=int, default=365)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--json", type=Path, help="write every night and the summary here")
    parser.add_argument("--record", action="store_true", help="keep the summary in results.json")
    parser.add_argument(
        "--replay",
        type=int,
        help=f"nights replayed side by side at each end after the year (default {REPLAY}, "
        "or --days - 1 if fewer; 0: none)",
    )
    args = parser.parse_args(argv)
    if args.days < 2:
        parser.error("--days: at least 2 nights to compare")
    if args.replay is None:
        args.replay = min(REPLAY, args.days - 1)
    if not 0 <= args.replay < args.days:
        parser.error(f"--replay: from 0 to {args.days - 1} (--days - 1), got {args.replay}")
    began = time.perf_counter()
    store = Store(seed=args.seed, scale=args.scale)
    log = DayLog(store)
    first_size = sum(len(t) for t in store.tables.values())
    with tempfile.TemporaryDirectory(prefix="bench-year-") as tmp:
        year = Nightly(Path(tmp) / "year")
        try:
            full = year.night(0, (store.now, every_record(store)))
            first = End.kept(year.published, Path(tmp) / "first", 1) if args.replay else None
            nights, exact = run_year(args, year, full, first, log, first_size, began)
        finally:
            year.close()
        seconds = round(time.perf_counter() - began, 1)  # the year's, without the replay
        if first is not None:
            last = End.kept(year.published, Path(tmp) / "last", args.days + 1)
            for _ in range(args.replay + 1):
                one_day(store, first_size)
                last.keep(store.now, log.take())
            replayed = side_by_side((first, last))
    window = min(WINDOW, len(nights) // 2)
    figures = summary(nights, window)
    if first is not None:
        figures["side_by_side"] = {
            k: v for k, v in replayed.items() if k not in ("first_nights", "last_nights")
        }
    print(
        f"\nscale {args.scale:g}, {args.days} nights in {seconds} s: warehouse s a night "
        f"{figures['first_30_nights_s']:.3f} (first {window}) -> {figures['last_30_nights_s']:.3f} "
        f"(last {window}) = {figures['ratio']}x (target <= {RATIO_TARGET}), CPU s "
        f"{figures['warehouse_cpu_s_first']:.3f} -> {figures['warehouse_cpu_s_last']:.3f} = "
        f"{figures['cpu_ratio']}x; {figures['compactions']} compactions; "
        f"file {figures['file_mib_first']:.1f} -> {figures['file_mib_last']:.1f} MiB; "
        f"history rows {figures['history_rows_first']:,} -> {figures['history_rows_last']:,}; "
        f"clinical rows {figures['clinical_rows_first']:,} -> {figures['clinical_rows_last']:,}; "
        f"dead space at most {figures['dead_space_fraction_max']:.3f} (target <= {DEAD_TARGET}); "
        f"live records equal the source's: {'yes' if exact else 'NO'}"
    )
    if first is not None:
        print(
            f"side by side, {replayed['nights']} nights after each end (alternately, after one "
            f"not counted): {replayed['first_s']:.3f} -> {replayed['last_s']:.3f} s = "
            f"{replayed['ratio']}x"
        )
    if args.json:
        write_json(args, full, nights, seconds, exact, replayed if first is not None else None)
    if args.record:
        record(
            "year_of_nights",
            {
                "scale": args.scale,
                "days": args.days,
                "seconds": seconds,
                "equals_source": exact,
                **figures,
            },
        )
    return 0 if exact else 1


if __name__ == "__main__":
    raise SystemExit(main())
