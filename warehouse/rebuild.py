"""Recreate the whole warehouse from the lake alone: no API request, the same tables.

The lake keeps every batch (rows, rejects, and the batch facts in the file metadata), so
replaying each run's batches in extraction order through the same `Warehouse.load` gives
back the same clinical, history and ops tables. The new file is built beside the old one
and renamed over it at the end, so a failed rebuild leaves the old warehouse intact.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from itertools import groupby
from pathlib import Path

from connectors.clinical_records.catalogue import ALL_ENTITIES, EntitySet
from warehouse.lake import FORMAT_VERSION, BatchInfo, Lake
from warehouse.load import LoadResult, Warehouse
from warehouse.migrations import RETYPED_WHY, read_whole_next

REBUILT = "rebuilt"


def _remove(path: Path) -> None:
    for leftover in (path, path.with_name(path.name + ".wal")):
        leftover.unlink(missing_ok=True)


def rebuild(
    lake_root: str | Path,
    warehouse_path: str | Path,
    *,
    entities: Sequence[EntitySet] = ALL_ENTITIES,
) -> dict[str, LoadResult]:
    """Rebuild `warehouse_path` from `lake_root`; returns what was loaded per entity set."""
    lake = Lake(lake_root)
    target = Path(warehouse_path)
    if target.exists():
        with Warehouse(target, entities=entities):  # raises WarehouseLocked while in use
            pass
    building = target.with_name(target.name + ".rebuild")
    _remove(building)
    results: dict[str, LoadResult] = {}
    runs: dict[str, set[str]] = {}
    older: list[str] = []
    with Warehouse(building, entities=entities) as wh:
        wh.ensure_schema()
        source = lake.source()
        if source is not None:
            wh.check_source(source["base_url"], source["customer"])
        for ent in entities:
            total = LoadResult()
            listed = [(p, Lake.info(p)) for p in lake.files(ent)]
            for run_id, group in groupby(listed, key=lambda pair: pair[1].run_id):
                files, infos = map(list, zip(*group, strict=True))
                total += wh.load(
                    ent,
                    files,
                    run_id=run_id,
                    snapshot=any(i.snapshot_complete for i in infos),
                    watermark=_last_watermark(infos),
                )
                runs.setdefault(run_id, set()).add(ent.name)
            results[ent.name] = total
            if _under_an_older_rule([info for _, info in listed]):
                older.append(ent.name)
        read_whole_next(
            wh.con, older, f"rebuilt from lake batches of an older format; {RETYPED_WHY}"
        )
        for run_id, names in runs.items():
            wh.record_run(run_id, sorted(names))
            wh.finish_run(run_id, REBUILT)
    _remove(target)
    os.replace(building, target)
    return results


def _under_an_older_rule(infos: Sequence[BatchInfo]) -> bool:
    """Whether a set's batches include one written under an older typing rule that no full
    read since has replaced (what that rule merged or rejected is missing)."""
    old = [i.order for i in infos if i.format < FORMAT_VERSION]
    return bool(old) and not any(
        i.snapshot_complete and i.format >= FORMAT_VERSION and i.order > max(old) for i in infos
    )


def _last_watermark(infos: Sequence[BatchInfo]) -> str | None:
    return next((i.watermark for i in reversed(infos) if i.watermark is not None), None)
