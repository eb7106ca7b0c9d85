"""One writer, many readers: the sync writes a working copy and publishes it atomically.

DuckDB lets one process write a file and nobody open it meanwhile, and any connection held
on a file makes the next writer wait. So the sync never writes `WAREHOUSE_PATH`: it loads
into its working copy, `<folder>/<stem>.work/<name>` (`data/warehouse.work/warehouse.duckdb`
for the default), a private folder that also holds DuckDB's write-ahead log and spill files.
When a run has committed, `publish` checkpoints the working copy (the file then holds every
commit; when its dead space is due, a fifth of a table's rows dead or of the file's blocks
free, it is first written anew, compactly: `_compact`, warehouse/vacuum.py),
copies its bytes beside `WAREHOUSE_PATH` under a private temporary name while it
still holds the write lock, syncs them and renames the copy over `WAREHOUSE_PATH`.

The analytics tables are built by a run's models step after its loads. A model older than a
table it reads (its build failed, or the run did not build it: a backfill, a selection in the
UI) is published as it is, and says so: `analytics.model_health` marks it stale, and the
publication names it (`Published.stale_models`, a warning in the log).

A connection already open on `WAREHOUSE_PATH` keeps reading the file it opened (the rename
leaves its inode alone); a connection opened afterwards reads the new night. Analysts'
read-only connections take no lock the sync needs, and a run that fails publishes nothing.
"""

from __future__ import annotations

import logging
import os
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import duckdb

from warehouse import kept, vacuum
from warehouse.ddl import ANALYTICS, MODEL_HEALTH_VIEW
from warehouse.ident import literal, qualified, quote
from warehouse.load import Warehouse
from warehouse.private import create_private, make_private, private_dir, tighten

log = logging.getLogger(__name__)

WORK_SUFFIX = ".work"
PUBLISHING = ".publishing"  # suffix of a copy on its way to WAREHOUSE_PATH
COMPACTING = "compacting"  # the compact copy's catalog while it is written


@dataclass(frozen=True)
class Published:
    path: Path
    bytes: int
    seconds: float
    stale_models: tuple[str, ...] = ()


def working_path(published: str | os.PathLike[str]) -> Path:
    """The working copy of a published warehouse: `<folder>/<stem>.work/<name>`."""
    path = Path(published)
    return path.with_name(path.stem + WORK_SUFFIX) / path.name


def _wal(path: Path) -> Path:
    return path.with_name(path.name + ".wal")


def working_copy(
    published: str | os.PathLike[str], *, adopt: bool = True, wait: float = 0.0
) -> Path:
    """The working copy, ready to open: its private folder made, files from before the
    owner-only rule tightened, and a warehouse from before the working copy (a single file
    at WAREHOUSE_PATH) adopted on first use, so its history and sync state carry over."""
    target = Path(published)
    work = working_path(target)
    private_dir(work.parent)
    tighten([target, _wal(target), work.parent], f"warehouse {target}")
    if adopt and not work.exists() and target.exists():
        _adopt(target, work, wait)
    return work


def _adopt(published: Path, work: Path, wait: float) -> None:
    """Copy an old single-file warehouse to the working copy; two steps starting at once
    both copy, and the first one's link wins (a later copy never replaces a written one)."""
    if _wal(published).exists():  # commits not yet in the file: write them there first
        with Warehouse(published, wait=wait) as old:
            old.con.execute("CHECKPOINT")
    partial = work.with_name(f".{work.name}.{uuid.uuid4().hex}.adopting")
    try:
        _copy(published, partial)
        os.link(partial, work)
        log.warning("warehouse %s: adopted as the working copy %s", published, work)
    except FileExistsError:
        pass
    finally:
        partial.unlink(missing_ok=True)


def publish(
    working: str | os.PathLike[str], published: str | os.PathLike[str], *, wait: float = 0.0
) -> Published:
    """Publish the working copy's committed state at `published`, atomically."""
    started = time.monotonic()
    work, target = Path(working), Path(published)
    private_dir(target.parent)
    with Warehouse(work, wait=wait) as wh:  # held to the end: nobody writes meanwhile
        if stale := stale_models(wh.con):
            log.warning(
                "published with analytics models older than the tables they read (see "
                "analytics.model_health): %s",
                ", ".join(stale),
            )
        wh.con.execute("CHECKPOINT")
        for leftover in target.parent.glob(f".{target.name}.*{PUBLISHING}"):
            leftover.unlink(missing_ok=True)  # left by a publisher killed halfway
        partial = target.with_name(f".{target.name}.{uuid.uuid4().hex}{PUBLISHING}")
        try:
            if vacuum.file_is_due(wh.con):
                try:
                    _compact(wh, work)
                except (duckdb.Error, OSError) as exc:  # a full disk: publish it as it is
                    log.warning("warehouse %s not written compactly: %s", work.name, exc)
            size = _copy(work, partial)
            os.replace(partial, target)
        finally:
            partial.unlink(missing_ok=True)
    _sync_folder(target.parent)
    make_private(target)
    return Published(target, size, round(time.monotonic() - started, 3), tuple(stale))


def stale_models(con: duckdb.DuckDBPyConnection) -> list[str]:
    """The models `analytics.model_health` calls stale (none in a file without it)."""
    if not con.execute(
        "SELECT count(*) FROM duckdb_views() WHERE schema_name = ? AND view_name = ?",
        [ANALYTICS, MODEL_HEALTH_VIEW],
    ).fetchone()[0]:
        return []
    rows = con.execute(
        f"SELECT name FROM {qualified(ANALYTICS, MODEL_HEALTH_VIEW)} WHERE stale ORDER BY name"
    ).fetchall()
    return [name for (name,) in rows]


def _compact(wh: Warehouse, work: Path) -> None:
    """Write the working copy anew without its free blocks and dead rows (DuckDB's COPY FROM
    DATABASE: every schema, table, view and comment), and put it in the working copy's
    place while `wh` still holds the old file's lock; the publication copies it."""
    started = time.monotonic()
    before = work.stat().st_size
    compact = work.with_name(f".{work.name}.{uuid.uuid4().hex}.compacting")
    (name,) = wh.con.execute("SELECT current_database()").fetchone()
    try:
        wh.con.execute(f"ATTACH {literal(str(compact))} AS {COMPACTING}")
        try:
            wh.con.execute(f"COPY FROM DATABASE {quote(name)} TO {COMPACTING}")
        finally:
            wh.con.execute(f"DETACH {COMPACTING}")
        make_private(compact)
        kept.replaced(work)  # the instance `wh` reads closes with it, never to write again
        os.replace(compact, work)
    finally:
        compact.unlink(missing_ok=True)
    log.info(
        "warehouse %s written compactly: %.1f MiB to %.1f MiB in %.1f s",
        work.name,
        before / 2**20,
        work.stat().st_size / 2**20,
        time.monotonic() - started,
    )


def _copy(source: Path, target: Path) -> int:
    """Copy `source` into a new private file `target` (in the kernel), synced; its size."""
    fd = create_private(target)
    try:
        with source.open("rb") as src:
            size = os.fstat(src.fileno()).st_size
            offset = 0
            while offset < size:
                sent = os.sendfile(fd, src.fileno(), offset, size - offset)
                if sent == 0:
                    break
                offset += sent
        os.fsync(fd)
    finally:
        os.close(fd)
    return size


def _sync_folder(folder: Path) -> None:
    """Make the rename itself durable."""
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
