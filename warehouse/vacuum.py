"""Dead space has one place to go: the publication's compact copy of the file. The night's
checkpoints never vacuum.

A merge replaces a changed row by deleting it and inserting the new version; an incremental
model deletes the rows it builds again; every commit appends a small row group to each table
it wrote. DuckDB's vacuum, at a checkpoint, rewrites row groups to drop deleted rows and join
small ones. Let run at every checkpoint it rewrote most of a table after a large merge (2.1 of
the 3.1 s a commit took for 10% of 1M rows) and the models' tables every night. Held back until
a table's dead rows were a fifth of it, the checkpoint that crossed the line vacuumed every
table it could (2 to 3 s in the models' close at scale 10 late in the year), which freed a
fifth of the file or more, and the publication then wrote the whole file anew (4.6 to 8.4 s):
the same rows rewritten twice in a night. One task a table per checkpoint (tried over a
scale-10 year) moved those seconds into the loads (a task rewrites up to three row groups:
loads of 1.3 to 2.5 s on ten nights late in the year; docs/SIZING.md).

So every writer holds the vacuum (`hold`), and the publication writes the file compactly
(DuckDB's `COPY FROM DATABASE`: live rows only, in full row groups, warehouse/publish.py) when
it is due (`file_is_due`): a clinical table's dead rows reach a fifth of what it stores, or the
models' tables' together do (each night deletes and inserts again the rows of the records that
changed), or free blocks reach a fifth of the file. Dead rows cost disk and scan time until
then, never correctness: DuckDB never returns a deleted row.
"""

from __future__ import annotations

import duckdb

from warehouse.ddl import ANALYTICS, CLINICAL, DDL_OWNED
from warehouse.ident import literal, qualified

SETTING = "max_vacuum_tasks"
DEAD_FRACTION = 0.2  # of a table's stored rows, or of the file's blocks
_KNOWN: dict[str, bool] = {}  # whether this process's DuckDB has a setting, by name


def hold(con: duckdb.DuckDBPyConnection) -> None:
    """A writer's checkpoints never vacuum. A DuckDB without the setting keeps its own
    behaviour (it vacuums at every checkpoint)."""
    if _knows_setting(con):
        con.execute(f"SET {SETTING} = 0")


def is_due(stored: int, live: int) -> bool:
    """Whether the dead rows (stored but not live) reach a fifth of what is stored."""
    return stored > 0 and stored - live >= DEAD_FRACTION * stored


def _knows_setting(con: duckdb.DuckDBPyConnection) -> bool:
    """Whether this DuckDB has the setting, asked once per process: `duckdb_settings()` lists
    every setting (3.9 ms), and every writer's connection asks."""
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


def stored_and_live(con: duckdb.DuckDBPyConnection, schema: str) -> dict[str, tuple[int, int]]:
    """Each table of `schema`: the rows it stores, deleted ones included (`estimated_size`, as
    of the last checkpoint), and the rows it holds; the counts in one statement."""
    stored = dict(
        con.execute(
            "SELECT table_name, estimated_size FROM duckdb_tables() "
            "WHERE database_name = current_database() AND schema_name = ? AND NOT temporary",
            [schema],
        ).fetchall()
    )
    if not stored:
        return {}
    counts = " UNION ALL ".join(
        f"SELECT {literal(table)}, count(*) FROM {qualified(schema, table)}" for table in stored
    )
    return {table: (stored[table] or 0, live) for table, live in con.execute(counts).fetchall()}


def dead_rows_due(con: duckdb.DuckDBPyConnection) -> bool:
    """Whether a clinical table's dead rows, or the models' tables' together, reach a fifth
    of what they store."""
    if any(is_due(*rows) for rows in stored_and_live(con, CLINICAL).values()):
        return True
    models = [
        rows for table, rows in stored_and_live(con, ANALYTICS).items() if table not in DDL_OWNED
    ]
    return is_due(sum(s for s, _ in models), sum(live for _, live in models))


def file_is_due(con: duckdb.DuckDBPyConnection) -> bool:
    """Whether the publication writes the file compactly tonight (module docstring)."""
    return free_share(con) >= DEAD_FRACTION or dead_rows_due(con)
