"""When a load's commit lets DuckDB vacuum the rows that merges deleted.

A merge replaces a changed row by deleting it and inserting the new version. At the
checkpoint that follows a large commit, DuckDB vacuums: it rewrites the row groups that hold
deleted rows. For a merge that changed 10% of 1M rows spread over the whole table, that was
2.1 of the 3.1 s its COMMIT took. Like PostgreSQL's autovacuum (scale factor 0.2), a load
leaves the dead rows until they are a fifth of the table; the load that crosses that line
lets the checkpoint vacuum. Dead rows cost disk and scan time, never correctness: DuckDB
never returns a deleted row.

The analytics models are the other source of dead space: dbt writes a model's new table
before it drops the old one (a model that fails keeps its last table, warehouse/models.py), so
after a build the file holds a generation of free blocks, which the next build reuses; an
incremental model deletes the rows it builds again, and is vacuumed by the same rule.

What is left is DuckDB's copy-on-write: a checkpoint writes the row groups a night changed
(the whole table, while it fits in one row group of 122,880 rows) and frees the old blocks,
which the next night reuses. When free blocks reach a fifth of the file all the same, the
publication writes the night compactly (`file_is_due`, warehouse/publish.py).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import duckdb

from warehouse.ident import qualified

SETTING = "max_vacuum_tasks"
_KNOWN: dict[str, bool] = {}  # whether this process's DuckDB has a setting, by name
DEAD_FRACTION = 0.2  # of the rows a table stores, live and dead


def is_due(stored: int, live: int) -> bool:
    """Whether the dead rows (stored but not live) reach a fifth of what a table stores."""
    return stored > 0 and stored - live >= DEAD_FRACTION * stored


def set_for_commit(con: duckdb.DuckDBPyConnection, schema: str, table: str, appended: int) -> None:
    """Inside a load's transaction: vacuum at its commit only when it is due. A DuckDB
    without the setting keeps its own behaviour (it always vacuums).

    DuckDB counts the rows a table stores (`estimated_size`, deleted rows included) as of
    the last commit, so the rows this transaction appended are added."""
    _vacuum_when(con, [(schema, table, appended)])


def set_for_close(con: duckdb.DuckDBPyConnection, tables: Iterable[tuple[str, str]]) -> None:
    """After the models' build, before the connection's last checkpoint: vacuum only when
    the dead rows of `tables` together are due. An incremental model deletes the rows of the records that
    changed all over its table every night; vacuumed each time, the close rewrote every row
    group of it (1 to 2 s a night at 840,000 clinical rows, growing with the table)."""
    _vacuum_when(con, [(schema, table, 0) for schema, table in tables])


def _vacuum_when(con: duckdb.DuckDBPyConnection, tables: Sequence[tuple[str, str, int]]) -> None:
    """Let the next checkpoint vacuum when the dead rows of `tables` (schema, name, rows
    appended since the last commit) are a fifth of the rows they store, else hold it back:
    the vacuum is the database's, not a table's, so they are weighed together."""
    if not _knows_setting(con):
        return
    stored = live = 0
    for schema, table, appended in tables:
        table_stored, table_live = con.execute(
            f"""SELECT (SELECT estimated_size FROM duckdb_tables()
                        WHERE schema_name = ? AND table_name = ?),
                       (SELECT count(*) FROM {qualified(schema, table)})""",
            [schema, table],
        ).fetchone()
        stored, live = stored + (table_stored or 0) + appended, live + table_live
    con.execute(f"RESET {SETTING}" if is_due(stored, live) else f"SET {SETTING} = 0")


def _knows_setting(con: duckdb.DuckDBPyConnection) -> bool:
    """Whether this DuckDB has the setting, asked once per process: `duckdb_settings()` lists
    every setting (3.9 ms), and each load and each models' build asks."""
    if SETTING not in _KNOWN:
        (count,) = con.execute(
            "SELECT count(*) FROM duckdb_settings() WHERE name = ?", [SETTING]
        ).fetchone()
        _KNOWN[SETTING] = bool(count)
    return _KNOWN[SETTING]


def free_share(con: duckdb.DuckDBPyConnection) -> float:
    """The file's free blocks over all its blocks, as of the last checkpoint."""
    total, free = con.execute(
        "SELECT total_blocks, free_blocks FROM pragma_database_size() "
        "WHERE database_name = current_database()"
    ).fetchone()
    return free / total if total else 0.0


def file_is_due(con: duckdb.DuckDBPyConnection) -> bool:
    """Whether free blocks reach a fifth of the file: time to write it compactly."""
    return free_share(con) >= DEAD_FRACTION
