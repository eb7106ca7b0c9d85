"""Loading lake batches into DuckDB: one writer, one transaction per load, SQL over Parquet.

A load stages the batches' rows with `read_parquet`, keeps the newest version per key
(cursor, then extraction time), compares content hashes with `clinical`, and applies the
plan: inserts, updates, resurrections, type-2 history, soft deletes of a snapshot, rejects,
the batch ledger and the watermark, all committed together or not at all.
"""

from __future__ import annotations

import hashlib
import os
import re
import time
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping, Sequence
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
from warehouse import ddl
from warehouse.errors import SourceMismatch, WarehouseLocked
from warehouse.ident import column_list, qualified, quote
from warehouse.lake import BatchInfo, Lake
from warehouse.normalise import REJECT
from warehouse.schema import EXTRAS

__all__ = ["EntityStatus", "LoadResult", "SourceMismatch", "Warehouse", "WarehouseLocked", "status"]

LOCK_WORDS = ("could not set lock", "conflicting lock")
FAILED = "failed"


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
# data; under this cap it spills to `<warehouse>.tmp` instead and memory stays flat.
MEMORY_LIMIT_VARIABLE = "WAREHOUSE_MEMORY_LIMIT"
DEFAULT_MEMORY_LIMIT = "128MB"
_MEMORY_LIMIT_RE = re.compile(
    r"^\s*([0-9]+(?:\.[0-9]+)?)\s*(KB|MB|GB|KiB|MiB|GiB)\s*$", re.IGNORECASE
)
_UNIT_BYTES = {"kb": 10**3, "mb": 10**6, "gb": 10**9, "kib": 2**10, "mib": 2**20, "gib": 2**30}

# Rows staged at once; larger loads run as several merges inside the same transaction. The
# staged rows, every field of them, are the build side of the merge's hash join, which does
# not spill: about 2.5 KB a row for the widest set, so the chunk follows the memory cap
# (a merge of 1M appointments ran out of memory at 128MB with 200,000-row chunks).
STAGED_ROW_BYTES = 2_500
CHUNK_ROWS_RANGE = (20_000, 200_000)


def _size_bytes(value: str) -> float:
    """A WAREHOUSE_MEMORY_LIMIT value in bytes; ConfigError names the variable otherwise."""
    match = _MEMORY_LIMIT_RE.match(value)
    if match is None:
        raise ConfigError(MEMORY_LIMIT_VARIABLE, "a size such as 256MB or 2GB")
    return float(match.group(1)) * _UNIT_BYTES[match.group(2).lower()]


def memory_limit() -> str:
    """WAREHOUSE_MEMORY_LIMIT, checked before DuckDB sees it."""
    value = (os.environ.get(MEMORY_LIMIT_VARIABLE) or DEFAULT_MEMORY_LIMIT).strip()
    _size_bytes(value)
    return value


def chunk_rows_for(limit: str) -> int:
    """Rows to stage at once under the memory cap `limit` (a WAREHOUSE_MEMORY_LIMIT value)."""
    low, high = CHUNK_ROWS_RANGE
    return max(low, min(high, int(_size_bytes(limit) / 2 / STAGED_ROW_BYTES)))


def _connect(path: Path, read_only: bool, wait: float, limit: str) -> duckdb.DuckDBPyConnection:
    """Open the file, turning DuckDB's lock error into `WarehouseLocked` (after `wait` s)."""
    deadline = time.monotonic() + wait
    while True:
        try:
            con = duckdb.connect(str(path), read_only=read_only)
            con.execute("SET TimeZone = 'UTC'")
            con.execute(f"SET memory_limit = '{limit}'")
            return con
        except duckdb.IOException as exc:
            if not any(word in str(exc).lower() for word in LOCK_WORDS):
                raise
            if time.monotonic() >= deadline:
                raise WarehouseLocked(
                    f"warehouse {path} is locked by another process (one writer at a time); "
                    "wait for the running sync to finish or set WAREHOUSE_PATH to another file"
                ) from None
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
        chunk_rows: int | None = None,
    ) -> None:
        self.path = Path(path)
        self.memory_limit = memory_limit()
        self.chunk_rows = chunk_rows or chunk_rows_for(self.memory_limit)
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
                self.path.parent.mkdir(parents=True, exist_ok=True)
            elif not self.path.exists():
                raise FileNotFoundError(f"no warehouse at {self.path} (WAREHOUSE_PATH)")
            self._con = _connect(self.path, self.read_only, self.wait, self.memory_limit)

    def close(self) -> None:
        if self._con is not None:
            self._con.close()
            self._con = None

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
            for statement in statements:
                self.con.execute(statement)
            self.con.execute('DELETE FROM "ops"."schema_version"')
            self.con.execute('INSERT INTO "ops"."schema_version" VALUES (?, now())', [fingerprint])

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
        self, run_id: str, entities: Iterable[str], *, full_snapshot: bool = False
    ) -> None:
        self.con.execute(
            'INSERT INTO "ops"."sync_runs" ("run_id", "started_at", "status", "entities", '
            '"full_snapshot") VALUES (?, now(), ?, ?, ?)',
            [run_id, "running", list(entities), full_snapshot],
        )

    def finish_run(
        self,
        run_id: str,
        status: str,
        results: Mapping[str, LoadResult] | None = None,
        message: str | None = None,
    ) -> None:
        total = sum((results or {}).values(), LoadResult())
        self.con.execute(
            'UPDATE "ops"."sync_runs" SET "finished_at" = now(), "status" = ?, "fetched" = ?, '
            '"inserted" = ?, "updated" = ?, "soft_deleted" = ?, "rejected" = ?, "message" = ? '
            'WHERE "run_id" = ?',
            [
                status,
                total.fetched,
                total.inserted,
                total.updated,
                total.soft_deleted,
                total.rejected,
                message,
                run_id,
            ],
        )

    def fail_run(self, run_id: str, message: str, entities: Iterable[str] = ()) -> None:
        """Mark a run failed, keeping what its finished loads recorded; a run that failed
        before its first load gets a row of its own."""
        with self._transaction():
            exists = self.con.execute(
                'SELECT count(*) FROM "ops"."sync_runs" WHERE "run_id" = ?', [run_id]
            ).fetchone()[0]
            if not exists:
                self.record_run(run_id, entities)
            self.con.execute(
                'UPDATE "ops"."sync_runs" SET "finished_at" = now(), "status" = ?, "message" = ? '
                'WHERE "run_id" = ?',
                [FAILED, message, run_id],
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
            result = (
                _Merge(self.con, ent, paths, infos, run_id).run(snapshot, self.chunk_rows)
                if paths
                else None
            )
            self._write_state(ent, run_id, infos, snapshot, watermark)
        return result or LoadResult()

    def _write_state(
        self,
        ent: EntitySet,
        run_id: str,
        infos: Sequence[BatchInfo],
        snapshot: bool,
        watermark: str | None,
    ) -> None:
        newest = max((i.extracted for i in infos), default=None)
        self.con.execute(
            'INSERT INTO "ops"."sync_state" SELECT ?, NULL, NULL, NULL, NULL, NULL '
            'WHERE NOT EXISTS (SELECT 1 FROM "ops"."sync_state" WHERE "entity" = ?)',
            [ent.name, ent.name],
        )
        self.con.execute(
            'UPDATE "ops"."sync_state" SET "watermark" = coalesce(?, "watermark"), '
            '"last_run_id" = ?, "last_loaded_at" = now(), '
            '"last_extracted_at" = greatest("last_extracted_at", ?::TIMESTAMPTZ), '
            '"last_snapshot_at" = CASE WHEN ? THEN greatest("last_snapshot_at", ?::TIMESTAMPTZ) '
            'ELSE "last_snapshot_at" END WHERE "entity" = ?',
            [watermark, run_id, newest, snapshot and newest is not None, newest, ent.name],
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
        self.clinical = qualified(ddl.CLINICAL, ent.table)
        self.history = qualified(ddl.HISTORY, ent.table)
        self.key = quote(ent.key)
        self.fields = [f.name for f in ent.fields]
        self.snapshot_at = max(i.extracted for i in infos)

    def run(self, snapshot: bool, chunk_rows: int) -> LoadResult:
        new = self._register_batches()
        self.con.execute(
            f'CREATE TEMP TABLE "_seen" AS SELECT {self.key} AS "k" FROM {self.clinical} LIMIT 0'
        )
        actions: Counter[str] = Counter()
        fresh = self._is_empty() and not self._has_duplicate_keys([str(p) for p in self.paths])
        if fresh:  # no join to build: the staged rows spill like any temp table
            chunk_rows = max(chunk_rows, CHUNK_ROWS_RANGE[1])
        for chunk in _chunks(self.paths, self.infos, chunk_rows):
            planned = self._stage(chunk, fresh)
            actions.update(planned)
            self._apply(planned)
            self.con.execute(f'INSERT INTO "_seen" SELECT {self.key} FROM "_stage"')
            self.con.execute('DROP TABLE "_stage"')
        deleted = self._mark_deleted() if snapshot else 0
        rejected = self._rejects(new)
        self._ledger()
        self.con.execute('DROP TABLE "_seen"')
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
                "file": [str(p) for p in self.paths],
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

    def _has_duplicate_keys(self, files: list[str]) -> bool:
        """Whether a key occurs twice in these batches (reads the key column only)."""
        (duplicated,) = self.con.execute(
            f"""SELECT count(*) <> count(DISTINCT {self.key})
                FROM read_parquet(?, hive_partitioning = false)""",
            [files],
        ).fetchone()
        return bool(duplicated)

    def _is_empty(self) -> bool:
        return self.con.execute(f"SELECT count(*) FROM {self.clinical}").fetchone()[0] == 0

    def _stage(self, paths: Sequence[Path], fresh: bool) -> dict[str, int]:
        """`_stage`: the newest version per key across the batches, its content hash and
        what happens to it (`_action`); returns how many keys get each action.

        One statement reads the Parquet files, hashes and classifies; the newest-per-key
        window runs only when some key occurs twice. A `fresh` load (an empty table, no key
        twice in the whole load) inserts everything, so it skips the comparison with the
        table, which each chunk would otherwise probe as the table grows.
        """
        files = [str(p) for p in paths]
        present = _columns_in(paths)
        select = ", ".join(
            f"s.{quote(name)}" if name in present else f"NULL::{kind} AS {quote(name)}"
            for name, (kind, _) in ddl.field_columns(self.ent).items()
        )
        extras = f"s.{quote(EXTRAS)}" if EXTRAS in present else f"NULL::VARCHAR AS {quote(EXTRAS)}"
        content = column_list([*self.fields, EXTRAS])
        cursor = quote(self.ent.cursor) if self.ent.cursor else "NULL"
        newest = (
            f"""QUALIFY row_number() OVER (
                    PARTITION BY {self.key}
                    ORDER BY {cursor} DESC NULLS LAST, "_extracted_at" DESC, "_order" DESC,
                             "_row" DESC
                ) = 1"""
            if not fresh and self._has_duplicate_keys(files)
            else ""
        )
        current = f"c.{quote(self.ent.cursor)}" if self.ent.cursor else "NULL"
        classify = (
            f"""SELECT s.*, '{INSERT}' AS "_action" FROM "newest" AS s"""
            if fresh
            else f"""SELECT s.*,
              CASE
                WHEN c.{self.key} IS NULL THEN '{INSERT}'
                WHEN NOT (CASE WHEN s."_cursor" IS NOT NULL AND {current} IS NOT NULL
                                    AND s."_cursor" <> {current}
                               THEN s."_cursor" > {current}
                               ELSE s."_extracted_at" >= c."_extracted_at" END)
                     THEN '{STALE}'
                WHEN c."_deleted_at" IS NOT NULL THEN '{RESURRECT}'
                WHEN c."_content_hash" IS DISTINCT FROM s."_content_hash" THEN '{UPDATE}'
                ELSE '{SAME}'
              END AS "_action"
            FROM "newest" AS s LEFT JOIN {self.clinical} AS c ON c.{self.key} = s.{self.key}"""
        )
        self.con.execute(
            f"""
            CREATE TEMP TABLE "_stage" AS
            WITH "rows" AS (
                SELECT {select}, {extras}, b."extracted_at" AS "_extracted_at",
                       b."batch_run_id" AS "_run_id", b."batch_order" AS "_order",
                       s."file_row_number" AS "_row"
                FROM read_parquet(?, filename = true, hive_partitioning = false,
                                  file_row_number = true, union_by_name = true) AS s
                JOIN "_batches" AS b ON s."filename" = b."file"
            ), "newest" AS (
                SELECT * EXCLUDE ("_order", "_row"),
                       {CONTENT_HASH.format(content=content)} AS "_content_hash",
                       {cursor} AS "_cursor"
                FROM "rows" {newest}
            )
            {classify}
            """,
            [files],
        )
        rows = self.con.execute('SELECT "_action", count(*) FROM "_stage" GROUP BY ALL').fetchall()
        return dict(rows)

    def _apply(self, planned: Mapping[str, int]) -> None:
        """Apply the staged actions; a statement with nothing to do is not run."""
        cols = [*self.fields, EXTRAS, "_content_hash"]
        changed = [a for a in (INSERT, UPDATE, RESURRECT) if planned.get(a)]
        replaced = [a for a in (UPDATE, RESURRECT) if planned.get(a)]
        if planned.get(UPDATE):
            self.con.execute(
                f"""UPDATE {self.history} AS h SET "_valid_to" = s."_extracted_at"
                    FROM "_stage" AS s
                    WHERE h.{self.key} = s.{self.key} AND h."_valid_to" IS NULL
                      AND s."_action" = ?""",
                [UPDATE],
            )
        if not changed:
            return
        self.con.execute(
            f"""INSERT INTO {self.history} ({column_list(cols)}, "_valid_from", "_valid_to",
                                            "_run_id")
                SELECT {column_list(cols)}, "_extracted_at", NULL, "_run_id" FROM "_stage"
                WHERE "_action" IN (SELECT unnest(?))""",
            [changed],
        )
        if replaced:
            self.con.execute(
                f"""DELETE FROM {self.clinical} WHERE {self.key} IN
                    (SELECT {self.key} FROM "_stage" WHERE "_action" IN (SELECT unnest(?)))""",
                [replaced],
            )
        self.con.execute(
            f"""INSERT INTO {self.clinical} ({column_list(cols)}, "_extracted_at", "_synced_at",
                                             "_run_id", "_deleted_at")
                SELECT {column_list(cols)}, "_extracted_at", now(), "_run_id", NULL
                FROM "_stage" WHERE "_action" IN (SELECT unnest(?))""",
            [changed],
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
        self.con.execute(
            f"""CREATE TEMP TABLE "_gone" AS SELECT c.{self.key} AS "k" FROM {self.clinical} AS c
                WHERE c."_deleted_at" IS NULL AND c."_extracted_at" <= ?
                  AND NOT EXISTS (SELECT 1 FROM "_seen" AS s WHERE s."k" = c.{self.key})
                  {rejected_keys}""",
            [self.snapshot_at, files] if files else [self.snapshot_at],
        )
        for target, column in ((self.clinical, "_deleted_at"), (self.history, "_valid_to")):
            self.con.execute(
                f"""UPDATE {target} SET {quote(column)} = ? WHERE {quote(column)} IS NULL
                    AND {self.key} IN (SELECT "k" FROM "_gone")""",
                [self.snapshot_at],
            )
        (count,) = self.con.execute('SELECT count(*) FROM "_gone"').fetchone()
        self.con.execute('DROP TABLE "_gone"')
        return count

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


def _chunks(paths: Sequence[Path], infos: Sequence[BatchInfo], limit: int) -> Iterator[list[Path]]:
    """Batches oldest first, in groups of about `limit` rows: memory stays bounded and a
    later group, being newer, wins over an earlier one by the same rule as within a group."""
    chunk: list[Path] = []
    rows = 0
    for info, path in sorted(zip(infos, paths, strict=True), key=lambda pair: pair[0].order):
        if chunk and rows + info.rows > limit:
            yield chunk
            chunk, rows = [], 0
        chunk.append(path)
        rows += info.rows
    if chunk:
        yield chunk


def _ranks(orders: Sequence[tuple[str, str, int]]) -> list[int]:
    """Each batch's position when sorted oldest first (extraction time, run, sequence)."""
    ranking = {order: rank for rank, order in enumerate(sorted(set(orders)))}
    return [ranking[o] for o in orders]


def _rejects_path(path: Path, info: BatchInfo) -> Path:
    return Lake.root_of(path) / "_rejects" / f"entity={info.table}" / f"{info.batch_id}.parquet"


def _columns_in(paths: Sequence[Path]) -> set[str]:
    names: set[str] = set()
    for path in paths:
        names.update(pq.read_schema(path).names)
    return names


def status(path: str | Path) -> list[EntityStatus]:
    """Status for `clinical-sync status`: opens read-only; `WarehouseLocked` while a sync writes."""
    with Warehouse(path, read_only=True) as wh:
        return wh.status()
