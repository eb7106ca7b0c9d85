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


def is_due(stored: int, live: int) -> bool:
    """Whether the dead rows (stored but not live) reach a fifth of what a table stores."""
    return stored > 0 and stored - live >= DEAD_FRACTION * stored


def set_for_commit(con: duckdb.DuckDBPyConnection, schema: str, table: str, appended: int) -> None:
    """Inside a load's transaction: vacuum at its commit only when it is due. A DuckDB
    without the setting keeps its own behaviour (it always vacuums).

    DuckDB counts the rows a table stores (`estimated_size`, deleted rows included) as of
    the last commit, so the rows this transaction appended are added."""
    known, stored, live = con.execute(
        f"""SELECT (SELECT count(*) FROM duckdb_settings() WHERE name = ?),
                   (SELECT estimated_size FROM duckdb_tables()
                    WHERE schema_name = ? AND table_name = ?),
                   (SELECT count(*) FROM {qualified(schema, table)})""",
        [SETTING, schema, table],
    ).fetchone()
    if known:
        due = is_due(stored + appended, live)
        con.execute(f"RESET {SETTING}" if due else f"SET {SETTING} = 0")
