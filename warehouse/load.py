"""Loading lake batches into DuckDB: one writer, one transaction per load, SQL over Parquet.

A load stages the batches' rows with `read_parquet`, keeps the newest version per key
(cursor, then extraction time), compares content hashes with `clinical`, and applies the
plan: inserts, updates, resurrections, type-2 history, soft deletes of a snapshot, rejects,
the batch ledger and the watermark, all committed together or not at all.

A fresh load (an empty table, no key twice) skips all that and streams the rows into
`clinical`. DuckDB keeps no insertion order (`preserve_insertion_order`): no table here
promises one, and keeping it doubled the time of a large insert under the memory cap.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import time
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import astuple, dataclass
from datetime import datetime
from importlib import resources
from pathlib import Path
from types import TracebackType

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq

from connectors.clinical_records.catalogue import ALL_ENTITIES, EntitySet
from connectors.clinical_records.errors import ConfigError
from warehouse import ddl, vacuum
from warehouse.errors import SourceMismatch, WarehouseLocked
from warehouse.ident import column_list, qualified, quote
from warehouse.lake import DELETES, REJECTS, BatchInfo, Lake, side_path
from warehouse.normalise import REJECT
from warehouse.private import make_private, private_dir
from warehouse.schema import EXTRAS

__all__ = ["EntityStatus", "LoadResult", "SourceMismatch", "Warehouse", "WarehouseLocked", "status"]

LOCK_WORDS = ("could not set lock", "conflicting lock")
SUCCESS, FAILED = "success", "failed"  # ops.sync_runs statuses
RUN_FIGURES = ("fetched", "inserted", "updated", "soft_deleted", "rejected")  # summed per run
# What the extractions' reconciliation found and spent, summed per run as well.
RECONCILE_FIGURES = ("reconciled", "reconcile_requests", "unreconciled")


@dataclass(frozen=True)
class LoadResult:
    """What one load did; `fetched` counts every row the batches hold, rejects included."""

    fetched: int = 0
    inserted: int = 0
    updated: int = 0
    unchanged: int = 0
    soft_deleted: int = 0
    resurrected: int = 0
    rejected: int = 0

    def __add__(self, other: LoadResult) -> LoadResult:
        return LoadResult(*(a + b for a, b in zip(astuple(self), astuple(other), strict=True)))


@dataclass(frozen=True)
class EntityStatus:
    entity: str
    table: str
    rows: int
    deleted: int
    rejects: int
    watermark: str | None
    last_run_id: str | None
    last_loaded_at: datetime | None


# DuckDB's own default is 80% of RAM, so a large merge grew the sync's memory with the
# data; under this cap it spills to `<file>.tmp` (private) instead and memory stays flat.
MEMORY_LIMIT_VARIABLE = "WAREHOUSE_MEMORY_LIMIT"
DEFAULT_MEMORY_LIMIT = "128MB"
_MEMORY_LIMIT_RE = re.compile(r"^[0-9]+(\.[0-9]+)?\s*(KB|MB|GB|KiB|MiB|GiB)$", re.IGNORECASE)


def memory_limit() -> str:
    """WAREHOUSE_MEMORY_LIMIT, checked before DuckDB sees it; ConfigError names it otherwise."""
    value = (os.environ.get(MEMORY_LIMIT_VARIABLE) or DEFAULT_MEMORY_LIMIT).strip()
    if not _MEMORY_LIMIT_RE.match(value):
        raise ConfigError(MEMORY_LIMIT_VARIABLE, "a size such as 256MB or 2GB")
    return value


HOLDER_RE = re.compile(r"Conflicting lock is held in (?P<program>.*?) \(PID (?P<pid>\d+)\)")


def _command(pid: int) -> str | None:
    """A short name for process `pid` from /proc: the program and the words that say what it
    runs (`python3.11 -m pipelines.cli sync`), stopping at the first option: options may carry
    secrets, and `-c` code anything."""
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return None
    args = [a.decode(errors="replace") for a in raw.split(b"\0") if a]
    if not args:
        return None
    shown = [Path(args[0]).name]
    for arg in args[1:5]:
        if arg.startswith("-") and arg != "-m":
            break
        shown.append(Path(arg).name if "/" in arg else arg)
    return " ".join(shown)


def lock_holder(message: str) -> str:
    """Who holds the lock, from DuckDB's error ('... held in <program> (PID n)')."""
    found = HOLDER_RE.search(message)
    if found is None:
        return "another process"
    pid = int(found["pid"])
    return f"process {pid} ({_command(pid) or Path(found['program']).name})"


def _locked(path: Path, message: str, wait: float) -> WarehouseLocked:
    waited = f" after waiting {wait:g} s" if wait else ""
    return WarehouseLocked(
        f"warehouse {path} is held by {lock_holder(message)}{waited}: DuckDB lets one process "
        "write a file and nobody open it meanwhile. If that is another sync, let it finish and "
        "run again; anything else (a notebook, a SQL tool) should open the published "
        "WAREHOUSE_PATH read-only, never this file: close it there, or stop that process"
    )


def _connect(path: Path, read_only: bool, wait: float, limit: str) -> duckdb.DuckDBPyConnection:
    """Open the file, turning DuckDB's lock error into `WarehouseLocked` (after `wait` s).
    A writer spills to `<file>.tmp`, a private folder beside the file."""
    config: dict[str, str] = {}
    if not read_only:
        config["temp_directory"] = str(private_dir(path.with_name(path.name + ".tmp")))
    deadline = time.monotonic() + wait
    while True:
        try:
            con = duckdb.connect(str(path), read_only=read_only, config=config)
            con.execute("SET TimeZone = 'UTC'")
            con.execute(f"SET memory_limit = '{limit}'")
            con.execute("SET preserve_insertion_order = false")
            return con
        except duckdb.IOException as exc:
            if not any(word in str(exc).lower() for word in LOCK_WORDS):
                raise
            if time.monotonic() >= deadline:
                raise _locked(path, str(exc), wait) from None
            time.sleep(0.2)


class Warehouse:
    """The DuckDB warehouse file; a context manager holding DuckDB's write lock while open."""

    def __init__(
        self,
        path: str | Path,
        *,
        read_only: bool = False,
        wait: float = 0.0,
        entities: Sequence[EntitySet] = ALL_ENTITIES,
    ) -> None:
        self.path = Path(path)
        self.memory_limit = memory_limit()
        self.read_only = read_only
        self.wait = wait
        self.entities = {e.name: e for e in entities}
        self._con: duckdb.DuckDBPyConnection | None = None

    def __enter__(self) -> Warehouse:
        self.open()
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def open(self) -> None:
        if self._con is None:
            if not self.read_only:
                private_dir(self.path.parent)
            elif not self.path.exists():
                raise FileNotFoundError(f"no warehouse at {self.path} (WAREHOUSE_PATH)")
            self._con = _connect(self.path, self.read_only, self.wait, self.memory_limit)
            if not self.read_only:
                make_private(self.path)  # DuckDB created it with the umask's mode

    def close(self) -> None:
        if self._con is not None:
            self._con.close()
            self._con = None
            if not self.read_only:
                make_private(self.path.with_name(self.path.name + ".wal"))
                with contextlib.suppress(OSError):  # the spill folder, when nothing spilled
                    self.path.with_name(self.path.name + ".tmp").rmdir()

    @property
    def con(self) -> duckdb.DuckDBPyConnection:
        if self._con is None:
            raise RuntimeError("warehouse is not open; use `with Warehouse(path) as wh:`")
        return self._con

    def entity(self, entity: EntitySet | str) -> EntitySet:
        name = entity.name if isinstance(entity, EntitySet) else entity
        for ent in self.entities.values():
            if name in (ent.name, ent.table):
                return ent
        raise KeyError(f"unknown entity set {name!r}")

    # -- schema and models -------------------------------------------------------------

    def ensure_schema(self) -> None:
        """Create (or extend) every schema, table and comment; safe to run on every start.

        Skipped when the DDL's fingerprint is the one last applied: every load step calls
        this, and re-running a few hundred statements cost half a second each time."""
        statements = list(ddl.statements(self.entities.values()))
        fingerprint = hashlib.sha256("\n".join(statements).encode()).hexdigest()
        if self._applied_schema() == fingerprint:
            return
        with self._transaction():
            self._history_tables_to_views()
            for statement in statements:
                self.con.execute(statement)
            self._seed_snapshots()
            self.con.execute('DELETE FROM "ops"."schema_version"')
            self.con.execute('INSERT INTO "ops"."schema_version" VALUES (?, now())', [fingerprint])

    def _history_tables_to_views(self) -> None:
        """Warehouses made before `history.<table>` became a view kept every version in it:
        the versions that are not the current one in clinical move to the superseded table."""
        for ent in self.entities.values():
            (is_table,) = self.con.execute(
                "SELECT count(*) FROM duckdb_tables() WHERE schema_name = ? AND table_name = ?",
                [ddl.HISTORY, ent.table],
            ).fetchone()
            if not is_table:
                continue
            history = qualified(ddl.HISTORY, ent.table)
            key = quote(ent.key)
            self.con.execute(
                f"""CREATE TABLE {qualified(ddl.HISTORY, ddl.superseded_table(ent))} AS
                    SELECT h.* FROM {history} AS h WHERE NOT EXISTS (
                        SELECT 1 FROM {qualified(ddl.CLINICAL, ent.table)} AS c
                        WHERE c.{key} = h.{key} AND c."_extracted_at" = h."_valid_from"
                          AND c."_content_hash" = h."_content_hash")"""
            )
            self.con.execute(f"DROP TABLE {history}")

    def _seed_snapshots(self) -> None:
        """Warehouses made before `ops.snapshots` know their last snapshot only (from
        `sync_state`, its run from the batch ledger): it is the one recorded for them."""
        self.con.execute(
            """INSERT INTO "ops"."snapshots"
               SELECT s."entity",
                      (SELECT min(b."run_id") FROM "ops"."loaded_batches" AS b
                       WHERE b."entity" = s."entity" AND b."extracted_at" = s."last_snapshot_at"),
                      s."last_snapshot_at", now()
               FROM "ops"."sync_state" AS s
               WHERE s."last_snapshot_at" IS NOT NULL AND NOT EXISTS
                     (SELECT 1 FROM "ops"."snapshots" AS n WHERE n."entity" = s."entity")"""
        )

    def _applied_schema(self) -> str | None:
        try:
            row = self.con.execute('SELECT "fingerprint" FROM "ops"."schema_version"').fetchone()
        except duckdb.CatalogException:
            return None
        return row[0] if row else None

    def refresh_models(self) -> list[str]:
        """Create or replace the analytics views from `warehouse/sql/*.sql`, in name order."""
        folder = resources.files("warehouse") / "sql"
        scripts = sorted((p for p in folder.iterdir() if p.name.endswith(".sql")), key=str)
        with self._transaction():
            for script in scripts:
                self.con.execute(script.read_text(encoding="utf-8"))
        return [Path(str(s)).stem for s in scripts]

    # -- source, runs, watermarks ------------------------------------------------------

    def source(self) -> tuple[str, str] | None:
        """The (base_url, customer) the warehouse was built from; None before the first load."""
        row = self.con.execute('SELECT "base_url", "customer" FROM "ops"."source"').fetchone()
        return (row[0], row[1]) if row else None

    def check_source(self, base_url: str, customer: str, force: bool = False) -> None:
        """Record the source on first use; refuse another one unless `force`."""
        row = self.source()
        if row is not None and row != (base_url, customer) and not force:
            raise SourceMismatch(
                f"warehouse {self.path} was built from another source (customer "
                f"{row[1]!r} at {row[0]}), not customer {customer!r} at {base_url}; use another "
                "WAREHOUSE_PATH, or sync --force to adopt the new source"
            )
        if row != (base_url, customer):
            with self._transaction():
                self.con.execute('DELETE FROM "ops"."source"')
                self.con.execute(
                    'INSERT INTO "ops"."source" VALUES (?, ?, now())', [base_url, customer]
                )

    def record_run(
        self,
        run_id: str,
        entities: Iterable[str],
        *,
        full_snapshot: bool = False,
        started_at: datetime | None = None,
    ) -> None:
        """The run's row; `started_at` is when the run began (default: now)."""
        self.con.execute(
            'INSERT INTO "ops"."sync_runs" ("run_id", "started_at", "status", "entities", '
            '"full_snapshot") VALUES (?, coalesce(?, now()), ?, ?, ?)',
            [run_id, started_at, "running", list(entities), full_snapshot],
        )

    def finish_run(
        self,
        run_id: str,
        status: str,
        results: Mapping[str, LoadResult] | None = None,
        message: str | None = None,
    ) -> None:
        total = sum((results or {}).values(), LoadResult())
        figures = ", ".join(f"{quote(name)} = ?" for name in RUN_FIGURES)
        self.con.execute(
            f'UPDATE "ops"."sync_runs" SET "finished_at" = now(), "status" = ?, {figures}, '
            '"message" = ? WHERE "run_id" = ?',
            [status, *(getattr(total, name) for name in RUN_FIGURES), message, run_id],
        )

    def add_to_run(
        self,
        run_id: str,
        entities: Iterable[str],
        result: LoadResult,
        *,
        full_snapshot: bool = False,
        reconciled: Mapping[str, int] | None = None,
        started_at: datetime | None = None,
    ) -> None:
        """Add a committed load's figures (and its extraction's `reconciled` figures, named
        as RECONCILE_FIGURES) to its run's row, created by the run's first load
        (`started_at`: when the run began, not that load); a run of several loads (entity
        sets, documents) keeps one row that names them all."""
        self._ensure_run(run_id, list(entities), full_snapshot, started_at)
        names = (*RUN_FIGURES, *RECONCILE_FIGURES)
        figures = ", ".join(f"{quote(name)} = coalesce({quote(name)}, 0) + ?" for name in names)
        extra = reconciled or {}
        self.con.execute(
            f'UPDATE "ops"."sync_runs" SET "finished_at" = now(), "status" = ?, {figures}, '
            '"message" = NULL WHERE "run_id" = ?',
            [
                SUCCESS,
                *(getattr(result, name) for name in RUN_FIGURES),
                *(int(extra.get(name, 0)) for name in RECONCILE_FIGURES),
                run_id,
            ],
        )

    def fail_run(self, run_id: str, message: str, started_at: datetime | None = None) -> None:
        """Mark a run failed, keeping what its finished loads recorded; a run that failed
        before its first load gets a row of its own."""
        with self._transaction():
            self._ensure_run(run_id, [], started_at=started_at)
            self.con.execute(
                'UPDATE "ops"."sync_runs" SET "finished_at" = now(), "status" = ?, "message" = ? '
                'WHERE "run_id" = ?',
                [FAILED, message, run_id],
            )

    def _ensure_run(
        self,
        run_id: str,
        entities: list[str],
        full_snapshot: bool = False,
        started_at: datetime | None = None,
    ) -> None:
        """The run's row, made by the first write of the run; later writes add the sets it
        does not name yet."""
        row = self.con.execute(
            'SELECT "entities" FROM "ops"."sync_runs" WHERE "run_id" = ?', [run_id]
        ).fetchone()
        if row is None:
            self.record_run(run_id, entities, full_snapshot=full_snapshot, started_at=started_at)
        elif missing := [name for name in entities if name not in row[0]]:
            self.con.execute(
                'UPDATE "ops"."sync_runs" SET "entities" = ? WHERE "run_id" = ?',
                [[*row[0], *missing], run_id],
            )

    def watermark(self, entity: EntitySet | str) -> str | None:
        row = self.con.execute(
            'SELECT "watermark" FROM "ops"."sync_state" WHERE "entity" = ?',
            [self.entity(entity).name],
        ).fetchone()
        return row[0] if row else None

    def status(self) -> list[EntityStatus]:
        """Per entity set: rows, soft-deleted rows, rejects, watermark and last load."""
        out = []
        for ent in self.entities.values():
            rows, deleted = self.con.execute(
                f'SELECT count(*), count("_deleted_at") FROM {qualified(ddl.CLINICAL, ent.table)}'
            ).fetchone()
            (rejects,) = self.con.execute(
                'SELECT count(*) FROM "ops"."rejects" WHERE "entity" = ? AND "kind" = ?',
                [ent.name, REJECT],
            ).fetchone()
            state = self.con.execute(
                'SELECT "watermark", "last_run_id", "last_loaded_at" FROM "ops"."sync_state" '
                'WHERE "entity" = ?',
                [ent.name],
            ).fetchone() or (None, None, None)
            out.append(EntityStatus(ent.name, ent.table, rows, deleted, rejects, *state))
        return out

    # -- loading -----------------------------------------------------------------------

    def load(
        self,
        entity: EntitySet | str,
        batches: Iterable[str | Path],
        *,
        run_id: str,
        snapshot: bool = False,
        watermark: str | None = None,
    ) -> LoadResult:
        """Merge lake batch files into clinical/history/ops in one transaction.

        `snapshot` says the batches hold the whole entity set: records they lack are marked
        deleted. `watermark` is stored for the entity in the same transaction.
        """
        ent = self.entity(entity)
        paths = [Path(p).resolve() for p in batches]
        infos = [Lake.info(p) for p in paths]
        for info in infos:
            if info.table != ent.table:
                raise ValueError(f"batch of {info.entity} given to the load of {ent.name}")
        with self._transaction():
            result = _Merge(self.con, ent, paths, infos, run_id).run(snapshot) if paths else None
            self._write_state(ent, run_id, infos, snapshot, watermark)
            if result:
                appended = result.inserted + result.updated + result.resurrected
                vacuum.set_for_commit(self.con, ddl.CLINICAL, ent.table, appended)
        return result or LoadResult()

    def _write_state(
        self,
        ent: EntitySet,
        run_id: str,
        infos: Sequence[BatchInfo],
        snapshot: bool,
        watermark: str | None,
    ) -> None:
        """The watermark of the newest extraction wins: a run that commits after a run it
        started before (overlapping runs) leaves the later run's watermark."""
        newest = max((i.extracted for i in infos), default=None)
        self.con.execute(
            'INSERT INTO "ops"."sync_state" SELECT ?, NULL, NULL, NULL, NULL, NULL '
            'WHERE NOT EXISTS (SELECT 1 FROM "ops"."sync_state" WHERE "entity" = ?)',
            [ent.name, ent.name],
        )
        self.con.execute(
            'UPDATE "ops"."sync_state" SET "watermark" = CASE '
            'WHEN ?::TIMESTAMPTZ < "last_extracted_at" THEN "watermark" '
            'ELSE coalesce(?, "watermark") END, '
            '"last_run_id" = ?, "last_loaded_at" = now(), '
            '"last_extracted_at" = greatest("last_extracted_at", ?::TIMESTAMPTZ), '
            '"last_snapshot_at" = CASE WHEN ? THEN greatest("last_snapshot_at", ?::TIMESTAMPTZ) '
            'ELSE "last_snapshot_at" END WHERE "entity" = ?',
            [newest, watermark, run_id, newest, snapshot and newest is not None, newest, ent.name],
        )

    def _transaction(self) -> _Transaction:
        return _Transaction(self.con)


class _Transaction:
    def __init__(self, con: duckdb.DuckDBPyConnection) -> None:
        self.con = con

    def __enter__(self) -> None:
        self.con.execute("BEGIN TRANSACTION")

    def __exit__(self, kind: type[BaseException] | None, *_: object) -> None:
        self.con.execute("ROLLBACK" if kind else "COMMIT")


# The content hash: DuckDB's 64-bit hash of every field and the extras, as 16 hex digits.
# It only has to tell one key's versions apart, and it is many times cheaper than md5 over
# JSON text. (Changing this expression makes every row look changed once.)
CONTENT_HASH = "printf('%016x', hash({content}))"

# The plan's actions, as the classification query names them.
INSERT, UPDATE, RESURRECT, SAME, STALE = "insert", "update", "resurrect", "same", "stale"


class _Merge:
    """One load's SQL, built from the catalogue; identifiers quoted, values bound."""

    def __init__(
        self,
        con: duckdb.DuckDBPyConnection,
        ent: EntitySet,
        paths: Sequence[Path],
        infos: Sequence[BatchInfo],
        run_id: str,
    ) -> None:
        self.con, self.ent, self.paths, self.infos, self.run_id = con, ent, paths, infos, run_id
        self.files = [str(p) for p in paths]
        self.clinical = qualified(ddl.CLINICAL, ent.table)
        self.superseded = qualified(ddl.HISTORY, ddl.superseded_table(ent))
        self.key = quote(ent.key)
        self.fields = [f.name for f in ent.fields]
        self.version = [*self.fields, *ddl.CONTENT_META]  # the columns a version consists of
        self.snapshot_at = max(i.extracted for i in infos)
        self.present = _columns_in(paths)  # older batches may lack newer columns
        # Whether a snapshot loaded earlier was extracted after some of these batches.
        self.snapshot_since = self._snapshot_since(min(i.extracted for i in infos))

    def run(self, snapshot: bool) -> LoadResult:
        new = self._register_batches()
        actions: Counter[str] = Counter()
        duplicated = self._has_duplicate_keys()
        if not duplicated and not self.snapshot_since and self._is_empty():
            # A fresh load (an empty table, no key twice, no snapshot since) inserts
            # everything: one streaming statement, nothing to compare with.
            actions[INSERT] = self._insert_fresh()
            deleted = self._apply_deletes()
        else:
            actions.update(self._plan(duplicated))
            self._apply(actions)
            deleted = self._mark_deleted() if snapshot else 0
            deleted += self._apply_deletes()
            self.con.execute('DROP TABLE "_stage"')
            self.con.execute('DROP TABLE "_plan"')
        if snapshot:
            self._record_snapshot()
        rejected = self._rejects(new)
        self._ledger()
        self.con.unregister("_batches")
        return LoadResult(
            fetched=sum(i.rows for i in self.infos) + rejected,
            inserted=actions.get(INSERT, 0),
            updated=actions.get(UPDATE, 0),
            unchanged=actions.get(SAME, 0) + actions.get(STALE, 0),
            soft_deleted=deleted,
            resurrected=actions.get(RESURRECT, 0),
            rejected=rejected,
        )

    def _register_batches(self) -> list[bool]:
        """`_batches`: file, extraction time and order of each batch; which are new."""
        ids = [i.batch_id for i in self.infos]
        seen = {
            row[0]
            for row in self.con.execute(
                'SELECT "batch_id" FROM "ops"."loaded_batches" WHERE "batch_id" IN '
                "(SELECT unnest(?))",
                [ids],
            ).fetchall()
        }
        table = pa.table(
            {
                "file": self.files,
                "extracted_at": pa.array(
                    [i.extracted for i in self.infos], pa.timestamp("us", "UTC")
                ),
                "batch_run_id": [i.run_id for i in self.infos],
                "batch_id": ids,
                "batch_order": _ranks([i.order for i in self.infos]),
                "rejects_file": [
                    str(_rejects_path(p, i)) for p, i in zip(self.paths, self.infos, strict=True)
                ],
                "new": [i.batch_id not in seen for i in self.infos],
                "relative_file": [Lake.relative_name(p) for p in self.paths],
                "rows": [i.rows for i in self.infos],
                "rejects": [i.rejects for i in self.infos],
            }
        )
        self.con.register("_batches", table)
        return table.column("new").to_pylist()

    def _has_duplicate_keys(self) -> bool:
        """Whether a key occurs twice in the batches (reads the key column only)."""
        (duplicated,) = self.con.execute(
            f"""SELECT count(*) <> count(DISTINCT {self.key})
                FROM read_parquet(?, hive_partitioning = false)""",
            [self.files],
        ).fetchone()
        return bool(duplicated)

    def _is_empty(self) -> bool:
        return self.con.execute(f"SELECT count(*) FROM {self.clinical}").fetchone()[0] == 0

    def _snapshot_since(self, extracted: datetime) -> bool:
        """Whether a snapshot loaded earlier was extracted at or after `extracted`."""
        (count,) = self.con.execute(
            'SELECT count(*) FROM "ops"."snapshots" WHERE "entity" = ? AND "snapshot_at" >= ?',
            [self.ent.name, extracted],
        ).fetchone()
        return count > 0

    def _record_snapshot(self) -> None:
        """The snapshot, by the run that extracted it: its rejects carry that run's id."""
        run_id = max(self.infos, key=lambda i: i.extracted).run_id
        self.con.execute(
            'INSERT INTO "ops"."snapshots" SELECT ?, ?, ?, now() WHERE NOT EXISTS '
            '(SELECT 1 FROM "ops"."snapshots" WHERE "entity" = ? AND "snapshot_at" = ?)',
            [self.ent.name, run_id, self.snapshot_at, self.ent.name, self.snapshot_at],
        )

    def _missed_by_snapshot(self) -> tuple[str, list[object]]:
        """SQL of when the first snapshot extracted at or after a new record's version (`s`)
        missed it (NULL when none did), as a replay in extraction order would mark it, and
        its parameters. A snapshot that rejected the key did not miss it."""
        if not self.snapshot_since:
            return "NULL::TIMESTAMPTZ", []
        sql = f"""(SELECT min(n."snapshot_at") FROM "ops"."snapshots" AS n
                    WHERE n."entity" = ? AND n."snapshot_at" >= s."_extracted_at"
                      AND NOT EXISTS (
                        SELECT 1 FROM "ops"."rejects" AS r
                        WHERE r."entity" = n."entity" AND r."run_id" = n."run_id"
                          AND r."key" = CAST(s.{self.key} AS VARCHAR)))"""
        return sql, [self.ent.name]

    def _versions(self, ranked: bool) -> str:
        """SQL of the batches' rows with their content hash and cursor (`?`: the files);
        `ranked` adds batch order and row number, which break ties between versions."""
        select = ", ".join(
            f"s.{quote(name)}" if name in self.present else f"NULL::{kind} AS {quote(name)}"
            for name, (kind, _) in ddl.field_columns(self.ent).items()
        )
        extras = (
            f"s.{quote(EXTRAS)}" if EXTRAS in self.present else f"NULL::VARCHAR AS {quote(EXTRAS)}"
        )
        content = column_list([*self.fields, EXTRAS])
        cursor = quote(self.ent.cursor) if self.ent.cursor else "NULL"
        rank = ', b."batch_order" AS "_order", s."file_row_number" AS "_row"' if ranked else ""
        return f"""
            SELECT *, {CONTENT_HASH.format(content=content)} AS "_content_hash",
                   {cursor} AS "_cursor"
            FROM (
                SELECT {select}, {extras}, b."extracted_at" AS "_extracted_at",
                       b."batch_run_id" AS "_run_id" {rank}
                FROM read_parquet(?, filename = true, hive_partitioning = false,
                                  file_row_number = {ranked}, union_by_name = true) AS s
                JOIN "_batches" AS b ON s."filename" = b."file"
            )"""

    def _keep_newest(self) -> None:
        """Drop from `_stage` every version but the newest of its key (cursor, then
        extraction time, batch, row). The window sees narrow rows only: memory stays low."""
        self.con.execute(
            f"""DELETE FROM "_stage" WHERE rowid IN (
                    SELECT rowid FROM "_stage"
                    QUALIFY row_number() OVER (
                        PARTITION BY {self.key}
                        ORDER BY "_cursor" DESC NULLS LAST, "_extracted_at" DESC,
                                 "_order" DESC, "_row" DESC
                    ) > 1)"""
        )

    def _insert_fresh(self) -> int:
        """Every row of the batches straight into clinical; returns how many."""
        return self._insert_clinical(f"({self._versions(ranked=False)})", [self.files])

    def _insert_clinical(self, rows: str, params: Sequence[object] = ()) -> int:
        """Insert `rows` (a relation of versions) as current, live rows; returns how many."""
        columns = column_list(self.version)
        (inserted,) = self.con.execute(
            f"""INSERT INTO {self.clinical} ({columns}, "_extracted_at", "_synced_at", "_run_id",
                                             "_deleted_at")
                SELECT {columns}, "_extracted_at", now(), "_run_id", NULL FROM {rows}""",
            list(params),
        ).fetchone()
        return inserted

    def _plan(self, duplicated: bool) -> dict[str, int]:
        """`_stage`: the newest version per key across the batches with its content hash;
        `_plan`: what happens to each key (`_action`). Returns how many keys get each action.

        A version newer than the current one (by cursor, else by extraction time) replaces
        it. It brings a deleted record back only when it was extracted after the deletion
        was seen; an older one (a batch loaded again, or a run that commits after a later
        snapshot) updates the record's content, which stays deleted, as if the two loads
        had committed in extraction order. For the same reason a new record that a snapshot
        loaded earlier but extracted later missed is inserted deleted (`_deleted_at`).

        Every join sees narrow rows only (keys, cursors, times, hashes, row ids), so its hash
        table stays small; the wide staged rows stream, and spill under the memory cap.
        """
        self.con.execute(
            f'CREATE TEMP TABLE "_stage" AS {self._versions(duplicated)}', [self.files]
        )
        if duplicated:
            self._keep_newest()
        cursor = [self.ent.cursor] if self.ent.cursor else []
        current = f"c.{quote(self.ent.cursor)}" if self.ent.cursor else "NULL"
        narrow = column_list(
            [self.ent.key, *cursor, "_extracted_at", "_deleted_at", "_content_hash"]
        )
        missed, params = self._missed_by_snapshot()
        self.con.execute(
            f"""
            CREATE TEMP TABLE "_plan" AS
            SELECT s.rowid AS "_row_id", s.{self.key}, s."_extracted_at",
              CASE WHEN c.{self.key} IS NULL THEN {missed}
                   ELSE c."_deleted_at" END AS "_deleted_at",
              CASE
                WHEN c.{self.key} IS NULL THEN '{INSERT}'
                WHEN NOT (CASE WHEN s."_cursor" IS NOT NULL AND {current} IS NOT NULL
                                    AND s."_cursor" <> {current}
                               THEN s."_cursor" > {current}
                               ELSE s."_extracted_at" >= c."_extracted_at" END)
                     THEN '{STALE}'
                WHEN s."_extracted_at" > c."_deleted_at" THEN '{RESURRECT}'
                WHEN c."_content_hash" IS DISTINCT FROM s."_content_hash" THEN '{UPDATE}'
                ELSE '{SAME}'
              END AS "_action"
            FROM "_stage" AS s
            LEFT JOIN (SELECT {narrow} FROM {self.clinical}) AS c ON c.{self.key} = s.{self.key}
            """,
            params,
        )
        rows = self.con.execute('SELECT "_action", count(*) FROM "_plan" GROUP BY ALL').fetchall()
        return dict(rows)

    def _apply(self, planned: Mapping[str, int]) -> None:
        """Apply the planned actions; a statement with nothing to do is not run.

        A replaced version moves from clinical to the superseded history, closed when its
        successor was extracted (an update) or when a snapshot missed it (a resurrection)."""
        replaced = [a for a in (UPDATE, RESURRECT) if planned.get(a)]
        if not (planned.get(INSERT) or replaced):
            return
        if planned.get(SAME) or planned.get(STALE):  # `_stage` keeps only rows to write
            self.con.execute(
                'DELETE FROM "_stage" WHERE rowid IN '
                '(SELECT "_row_id" FROM "_plan" WHERE "_action" IN (?, ?))',
                [SAME, STALE],
            )
        planned_keys = """(SELECT * FROM "_plan" WHERE "_action" IN (SELECT unnest(?)))"""
        if replaced:
            self.con.execute(
                f"""INSERT INTO {self.superseded} ({column_list(self.version)}, "_valid_from",
                                                  "_valid_to", "_run_id")
                    SELECT {column_list(self.version, "c.")}, c."_extracted_at",
                           least(c."_deleted_at", s."_extracted_at"), c."_run_id"
                    FROM {self.clinical} AS c JOIN {planned_keys} AS s ON c.{self.key} = s.{self.key}""",
                [replaced],
            )
            self.con.execute(
                f"""DELETE FROM {self.clinical} WHERE {self.key} IN
                    (SELECT {self.key} FROM {planned_keys})""",
                [replaced],
            )
        self._insert_clinical('"_stage"')
        # Rows are inserted live; an update older than the record's deletion keeps it deleted,
        # and a new record a snapshot since missed is deleted from that snapshot on.
        if UPDATE in replaced or (self.snapshot_since and planned.get(INSERT)):
            self.con.execute(
                f"""UPDATE {self.clinical} AS c SET "_deleted_at" = p."_deleted_at"
                    FROM "_plan" AS p
                    WHERE p."_action" IN (?, ?) AND p."_deleted_at" IS NOT NULL
                      AND c.{self.key} = p.{self.key}""",
                [UPDATE, INSERT],
            )

    def _mark_deleted(self) -> int:
        """A snapshot marks what it did not see (nor reject) and was extracted before it."""
        files = self._reject_files()
        rejected_keys = (
            f"""AND CAST(c.{self.key} AS VARCHAR) NOT IN (
                    SELECT r."key" FROM read_parquet(?, union_by_name = true, hive_partitioning = false) AS r
                    WHERE r."key" IS NOT NULL)"""
            if files
            else ""
        )
        (marked,) = self.con.execute(
            f"""UPDATE {self.clinical} AS c SET "_deleted_at" = ?
                WHERE c."_deleted_at" IS NULL AND c."_extracted_at" <= ?
                  AND NOT EXISTS (SELECT 1 FROM "_plan" AS s WHERE s.{self.key} = c.{self.key})
                  {rejected_keys}""",
            [self.snapshot_at, self.snapshot_at, *([files] if files else [])],
        ).fetchone()
        return marked

    def _apply_deletes(self) -> int:
        """Mark deleted the keys an extraction found gone at the source, as of that batch's
        extraction, unless a newer version (a later extraction) is held."""
        found = [
            (str(side_path(Lake.root_of(p), DELETES, i.table, i.batch_id)), i.extracted)
            for p, i in zip(self.paths, self.infos, strict=True)
            if i.deletes
        ]
        if not found:
            return 0
        gone = pa.table(
            {
                "file": [f for f, _ in found],
                "at": pa.array([t for _, t in found], pa.timestamp("us", "UTC")),
            }
        )
        self.con.register("_gone_files", gone)
        (marked,) = self.con.execute(
            f"""UPDATE {self.clinical} AS c SET "_deleted_at" = g."at"
                FROM (SELECT d."key", max(f."at") AS "at"
                      FROM read_parquet(?, filename = true, hive_partitioning = false) AS d
                      JOIN "_gone_files" AS f ON d."filename" = f."file" GROUP BY ALL) AS g
                WHERE c."_deleted_at" IS NULL AND c."_extracted_at" <= g."at"
                  AND CAST(c.{self.key} AS VARCHAR) = g."key" """,
            [[f for f, _ in found]],
        ).fetchone()
        self.con.unregister("_gone_files")
        return marked

    def _reject_files(self) -> list[str]:
        return [
            str(_rejects_path(p, i))
            for p, i in zip(self.paths, self.infos, strict=True)
            if i.rejects
        ]

    def _rejects(self, new: list[bool]) -> int:
        """Copy the batches' rejects into ops.rejects once; return the rejected rows."""
        files = self._reject_files()
        if not files:
            return 0
        self.con.execute(
            """CREATE TEMP TABLE "_rejects" AS
                SELECT r.*, b."batch_run_id", b."batch_id", b."extracted_at", b."new"
                FROM read_parquet(?, union_by_name = true, filename = true, hive_partitioning = false) AS r
                JOIN "_batches" AS b ON r."filename" = b."rejects_file" """,
            [files],
        )
        self.con.execute(
            """INSERT INTO "ops"."rejects" SELECT "entity", "key", "kind", "fields", "reason",
                "raw_json", "batch_run_id", "batch_id", "extracted_at" FROM "_rejects"
                WHERE "new" """
        )
        (count,) = self.con.execute(
            'SELECT count(*) FROM "_rejects" WHERE "kind" = ?', [REJECT]
        ).fetchone()
        self.con.execute('DROP TABLE "_rejects"')
        return count

    def _ledger(self) -> None:
        self.con.execute(
            """INSERT INTO "ops"."loaded_batches"
               SELECT b."batch_id", ?, b."relative_file", b."batch_run_id", b."extracted_at",
                      b."rows", b."rejects", now()
               FROM "_batches" AS b WHERE b."new" """,
            [self.ent.name],
        )


def _ranks(orders: Sequence[tuple[str, str, int]]) -> list[int]:
    """Each batch's position when sorted oldest first (extraction time, run, sequence)."""
    ranking = {order: rank for rank, order in enumerate(sorted(set(orders)))}
    return [ranking[o] for o in orders]


def _rejects_path(path: Path, info: BatchInfo) -> Path:
    return side_path(Lake.root_of(path), REJECTS, info.table, info.batch_id)


def _columns_in(paths: Sequence[Path]) -> set[str]:
    names: set[str] = set()
    for path in paths:
        names.update(pq.read_schema(path).names)
    return names


def status(path: str | Path) -> list[EntityStatus]:
    """Status for `clinical-sync status`: opens read-only; `WarehouseLocked` while a sync writes."""
    with Warehouse(path, read_only=True) as wh:
        return wh.status()
