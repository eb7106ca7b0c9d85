"""Recreate the whole warehouse from the lake alone: no API request, the same tables.

The lake keeps every batch (rows, rejects, and the batch facts in the file metadata), so
replaying each run's batches in extraction order through the same `Warehouse.load` gives
back the same clinical, history and ops tables. The new file is built beside the old one
and renamed over it at the end, so a failed rebuild leaves the old warehouse intact.

The rebuild holds the warehouse's writer lock (`warehouse/writer.py`) from before it reads
the lake to after the rename: a sync's load waits for it (or is refused, the rebuild named),
so nothing committed to the old file while the new one was built is deleted with it; the
load then commits into the new file, which holds every batch the lake held before. The
analytics models are built on the new file before the rename, under the same lock.
"""

from __future__ import annotations

import logging
import os
import uuid
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from itertools import groupby
from pathlib import Path

import duckdb

from connectors.clinical_records.catalogue import ALL_ENTITIES, EntitySet
from warehouse import kept, models
from warehouse.dbt_project import Project
from warehouse.lake import FORMAT_VERSION, BatchInfo, Lake
from warehouse.load import LoadResult, Warehouse
from warehouse.migrations import RETYPED_WHY, read_whole_next
from warehouse.runs import REBUILT, UNKNOWN, RunEnding, restore_runs, run_row
from warehouse.writer import writing

log = logging.getLogger(__name__)


def _remove(path: Path) -> None:
    for leftover in (path, path.with_name(path.name + ".wal")):
        leftover.unlink(missing_ok=True)


def rebuild(
    lake_root: str | Path,
    warehouse_path: str | Path,
    *,
    entities: Sequence[EntitySet] = ALL_ENTITIES,
    wait: float = 0.0,
    say: Callable[[str], object] | None = None,
    project: Project | None = None,
) -> dict[str, LoadResult]:
    """Rebuild `warehouse_path` from `lake_root` and its models (`project`'s, by default
    transform/'s), its writer lock held throughout (waiting up to `wait` s for another
    writer; `say` hears that it waits, and what the models' build did); returns what was
    loaded per entity set."""
    with writing(warehouse_path, wait=wait, what="rebuild", say=say):
        return _rebuild(Lake(lake_root), Path(warehouse_path), entities, project, say)


def _rebuild(
    lake: Lake,
    target: Path,
    entities: Sequence[EntitySet],
    project: Project | None,
    say: Callable[[str], object] | None,
) -> dict[str, LoadResult]:
    started = datetime.now(UTC)
    if target.exists():
        with Warehouse(target, entities=entities):  # WarehouseLocked while a program holds it
            pass
        kept.replaced(target)  # read below as a file of its own, then replaced
    building = target.with_name(target.name + ".rebuild")
    _remove(building)
    results: dict[str, LoadResult] = {}
    batches: dict[str, list[BatchInfo]] = {}  # per run, in extraction order
    loaded: dict[str, LoadResult] = {}  # per run, what its batches loaded
    older: list[str] = []
    with Warehouse(building, entities=entities, lock=target) as wh:
        wh.ensure_schema()
        source = lake.source()
        if source is not None:
            wh.check_source(source["base_url"], source["customer"])
        for ent in entities:
            total = LoadResult()
            listed = [(p, Lake.info(p)) for p in lake.files(ent)]
            for run_id, group in groupby(listed, key=lambda pair: pair[1].run_id):
                files, infos = map(list, zip(*group, strict=True))
                result = wh.load(
                    ent,
                    files,
                    run_id=run_id,
                    snapshot=any(i.snapshot_complete for i in infos),
                    watermark=_last_watermark(infos),
                )
                total += result
                loaded[run_id] = loaded.get(run_id, LoadResult()) + result
                batches.setdefault(run_id, []).extend(infos)
            results[ent.name] = total
            if _under_an_older_rule([info for _, info in listed]):
                older.append(ent.name)
        read_whole_next(
            wh.con, older, f"rebuilt from lake batches of an older format; {RETYPED_WHY}"
        )
        _keep_the_record(wh, target, lake, batches, loaded)
        own = RunEnding(
            f"rebuild-{started:%Y%m%dT%H%M%S}-{uuid.uuid4().hex[:8]}",
            REBUILT,
            started,
            entities=tuple(e.name for e in entities),
            message=f"rebuilt from the lake: {sum(map(len, batches.values()))} batches of "
            f"{len(batches)} runs",
        )
        wh.end_run(own, figures=vars(sum(results.values(), LoadResult())))
        if (row := run_row(wh.con, own.run_id)) is not None:
            lake.record_run(row)
    built = models.build(building, project, lock=target)
    log.info("rebuild: models %s", built.summary())
    if say is not None:
        say(f"models: {built.summary()}")
    kept.replaced(target)  # this process's instance of the old file closes first
    _remove(target)
    os.replace(building, target)
    return results


def _keep_the_record(
    wh: Warehouse,
    old: Path,
    lake: Lake,
    batches: dict[str, list[BatchInfo]],
    loaded: dict[str, LoadResult],
) -> None:
    """The record of the runs: the old file's (every run's row and set results) when it
    opens; the lake's rows of runs it lacks (how each ended, kept when it ended); a run the
    lake knows by its batches alone, `unknown`, from its first to its last extraction."""
    if old.exists():
        try:
            wh.con.execute('ATTACH ? AS "_old" (READ_ONLY)', [str(old)])
        except duckdb.Error as error:
            log.warning(
                "rebuild: the record of the runs in %s is unreadable (%s): rebuilt from the lake",
                old,
                type(error).__name__,
            )
        else:
            try:
                for table in ("sync_runs", "set_results"):
                    wh.con.execute(
                        f'INSERT INTO "ops"."{table}" BY NAME SELECT * FROM "_old"."ops"."{table}"'
                    )
            except duckdb.CatalogException:
                pass  # a file no sync set up: no record to keep
            finally:
                wh.con.execute('DETACH "_old"')
    restore_runs(wh.con, lake.runs())
    for run_id, infos in batches.items():
        wh.end_run(
            RunEnding(
                run_id,
                UNKNOWN,
                min(i.extracted for i in infos),
                max(i.extracted for i in infos),
                entities=tuple(dict.fromkeys(i.entity for i in infos)),
                message="rebuilt from the lake's batches: how this run ended was not recorded",
            ),
            figures=vars(loaded[run_id]),
        )


def _under_an_older_rule(infos: Sequence[BatchInfo]) -> bool:
    """Whether a set's batches include one written under an older typing rule that no full
    read since has replaced (what that rule merged or rejected is missing)."""
    old = [i.order for i in infos if i.format < FORMAT_VERSION]
    return bool(old) and not any(
        i.snapshot_complete and i.format >= FORMAT_VERSION and i.order > max(old) for i in infos
    )


def _last_watermark(infos: Sequence[BatchInfo]) -> str | None:
    return next((i.watermark for i in reversed(infos) if i.watermark is not None), None)
