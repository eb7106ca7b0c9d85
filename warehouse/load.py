"""The warehouse file as one object: open it, apply the schema, load lake batches, keep books.

`Warehouse` is the façade the pipelines use; each of its jobs lives in its own module:
`connection` (opening DuckDB, lock waits, the memory cap), `writer` (one writer across
processes and hosts), `migrations` (schema fingerprint and shims), `ops`, `runs` and `ledger`
(the statements over ops.*) and `merge` (one load's SQL). A load is one
DuckDB transaction: the merged rows, the rejects, the batch ledger and the watermark commit
together or not at all.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from types import TracebackType
from typing import Concatenate, ParamSpec, TypeVar

import duckdb

from connectors.clinical_records.catalogue import ALL_ENTITIES, EntitySet
from warehouse import kept, migrations, ops, runs, writer
from warehouse.connection import Transaction, connect, spill_dir
from warehouse.errors import SourceMismatch, WarehouseLocked
from warehouse.lake import Lake
from warehouse.ledger import LoadResult
from warehouse.memory import memory_limit
from warehouse.merge import Merge
from warehouse.ops import EntityStatus
from warehouse.private import make_private, private_dir
from warehouse.runs import SetResult

__all__ = [
    "EntityStatus",
    "LoadResult",
    "SetResult",
    "SourceMismatch",
    "Warehouse",
    "WarehouseLocked",
    "status",
]


P = ParamSpec("P")
R = TypeVar("R")


def _on_con(
    statement: Callable[Concatenate[duckdb.DuckDBPyConnection, P], R],
) -> Callable[Concatenate[Warehouse, P], R]:
    """A function of `warehouse.ops` as a method of the open warehouse (same signature)."""

    @functools.wraps(statement)
    def method(self: Warehouse, *args: P.args, **kwargs: P.kwargs) -> R:
        return statement(self.con, *args, **kwargs)

    return method


class Warehouse:
    """The DuckDB warehouse file; a context manager that, open to write, holds the writer lock
    (`warehouse/writer.py`) and DuckDB's write lock. `lock`: the warehouse whose writer lock
    it holds (a rebuild's new file: the working copy it replaces), by default its own. Opened
    while this process already holds the file's writer lock (a command's steps), it is a
    cursor of the instance the command keeps (`warehouse/kept.py`)."""

    def __init__(
        self,
        path: str | Path,
        *,
        read_only: bool = False,
        wait: float = 0.0,
        entities: Sequence[EntitySet] = ALL_ENTITIES,
        lock: str | Path | None = None,
    ) -> None:
        self.path = Path(path)
        self.memory_limit = memory_limit()
        self.read_only = read_only
        self.wait = wait
        self.entities = {e.name: e for e in entities}
        self.lock = Path(lock) if lock is not None else self.path
        self._con: duckdb.DuckDBPyConnection | None = None
        self._kept: kept.Instance | None = None  # the command's instance this is a cursor of
        self._writing = contextlib.ExitStack()

    def __enter__(self) -> Warehouse:
        self.open()
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close(failed=kind is not None)

    def open(self) -> None:
        if self._con is None:
            keep = self.lock == self.path and writer.held_here(self.path)
            if not self.read_only:
                private_dir(self.path.parent)
                self._writing.enter_context(writer.writing(self.lock, wait=self.wait))
            elif not self.path.exists():
                raise FileNotFoundError(f"no warehouse at {self.path} (WAREHOUSE_PATH)")
            try:
                if keep:
                    self._con, self._kept = kept.cursor(self.path, self._connect_to_write)
                else:
                    self._con = connect(self.path, self.read_only, self.wait, self.memory_limit)
            except BaseException:
                self._writing.close()
                raise
            if not self.read_only:
                make_private(self.path)  # DuckDB created it with the umask's mode

    def _connect_to_write(self) -> duckdb.DuckDBPyConnection:
        """The instance a command keeps is a writer's, whatever its first user wanted: DuckDB
        gives a process one instance per file."""
        return connect(self.path, False, self.wait, self.memory_limit)

    def close(self, *, failed: bool = False) -> None:
        """Close; `failed`: the block that used it raised (a kept instance is let go)."""
        if self._con is not None:
            if self._kept is not None:
                kept.done(self._con, self._kept, checkpoint=not self.read_only, failed=failed)
            else:
                self._con.close()
            self._con, self._kept = None, None
            if not self.read_only:
                make_private(self.path.with_name(self.path.name + ".wal"))
                with contextlib.suppress(OSError):  # the spill folder, when nothing spilled
                    spill_dir(self.path).rmdir()
                self._writing.close()

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

    # -- schema ------------------------------------------------------------------

    def ensure_schema(self) -> None:
        """Create (or extend) every schema, table and comment; safe to run on every start
        (skipped while the DDL is the one last applied)."""
        migrations.ensure_schema(self.con, self.entities.values())

    # -- source, runs, watermarks ------------------------------------------------------

    source = _on_con(ops.source)

    def check_source(self, base_url: str, customer: str, force: bool = False) -> None:
        """Record the source on first use (open to write); refuse another one unless
        `force`."""
        row = self.source()
        if row is not None and row != (base_url, customer) and not force:
            raise SourceMismatch(
                f"warehouse {self.path} was built from another source (customer "
                f"{row[1]!r} at {row[0]}), not customer {customer!r} at {base_url}; use another "
                "WAREHOUSE_PATH, or sync --force to adopt the new source"
            )
        if row != (base_url, customer) and not self.read_only:
            with self.transaction():
                ops.record_source(self.con, base_url, customer)

    end_run = _on_con(runs.end_run)
    record_set_result = _on_con(runs.record_set_result)
    record_checks = _on_con(runs.record_checks)

    def watermark(self, entity: EntitySet | str) -> str | None:
        return ops.watermark(self.con, self.entity(entity).name)

    def status(self) -> list[EntityStatus]:
        """Per entity set: rows, soft-deleted rows, rejects, watermark and last load."""
        return ops.status(self.con, self.entities.values())

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
        with self.transaction():
            result = Merge(self.con, ent, paths, infos, run_id).run(snapshot) if paths else None
            ops.write_state(self.con, ent.name, run_id, infos, snapshot, watermark)
        return result or LoadResult()

    def transaction(self) -> Transaction:
        """`with wh.transaction():` the block's statements commit together, or none."""
        return Transaction(self.con)


def status(path: str | Path) -> list[EntityStatus]:
    """Status for `clinical-sync status`: opens read-only; `WarehouseLocked` while a sync writes."""
    with Warehouse(path, read_only=True) as wh:
        return wh.status()
