"""When a load's commit lets DuckDB vacuum the rows that merges deleted.

A merge replaces a changed row by deleting it and inserting the new version. At the
checkpoint that follows a large commit, DuckDB vacuums: it rewrites the row groups that hold
deleted rows. For a merge that changed 10% of 1M rows spread over the whole table, that was
2.1 of the 3.1 s its COMMIT took. Like PostgreSQL's autovacuum (scale factor 0.2), a load
leaves the dead rows until they are a fifth of the table; the load that crosses that line
lets the checkpoint vacuum. Dead rows cost disk and scan time, never correctness: DuckDB
never returns a deleted row.
"""

from __future__ import annotations

import duckdb

from warehouse.ident import qualified

SETTING = "max_vacuum_tasks"
DEAD_FRACTION = 0.2  # of the rows a table stores, live and dead


def supported(con: duckdb.DuckDBPyConnection) -> bool:
    """Whether this DuckDB has the setting (one without it always vacuums)."""
    query = "SELECT count(*) FROM duckdb_settings() WHERE name = ?"
    return con.execute(query, [SETTING]).fetchone()[0] > 0


def is_due(stored: int, live: int) -> bool:
    """Whether the dead rows (stored but not live) reach a fifth of what a table stores."""
    return stored > 0 and stored - live >= DEAD_FRACTION * stored


def set_for_commit(con: duckdb.DuckDBPyConnection, schema: str, table: str, appended: int) -> bool:
    """Inside a load's transaction: vacuum at its commit only when it is due.

    DuckDB counts the rows a table stores (`estimated_size`, deleted rows included) as of
    the last commit, so the rows this transaction appended are added. Returns whether the
    commit vacuums."""
    stored, live = con.execute(
        f"""SELECT (SELECT estimated_size FROM duckdb_tables()
                    WHERE schema_name = ? AND table_name = ?),
                   (SELECT count(*) FROM {qualified(schema, table)})""",
        [schema, table],
    ).fetchone()
    due = is_due(stored + appended, live)
    con.execute(f"RESET {SETTING}" if due else f"SET {SETTING} = 0")
    return due
