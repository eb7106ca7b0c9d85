"""The order of a key's versions in a load (`set_later_versions_aside`), and where a version
older than the record's current one goes: into its place among the versions held, so that
history keeps every version a load was handed, in the source's order, whatever order the
loads commit in (docs/ARCHITECTURE.md, "History in the source's order").

Two runs whose loads commit out of extraction order (a command-line run beside a scheduled
one) hand the later-committing load versions older than those held; a rebuild replays the lake
in extraction order and meets them in order. Placing each such version where an in-order load
would have put it gives both the same history. A key's versions are ordered by its cursor
(nulls first), then extraction time: `merge.NEWER`'s order. A version is placed between the
held version before it (P) and the one after it (S):

- the same content as P, with no deletion of P before it: P seen again, nothing to write;
- the same content as S, with no deletion between them: S was first seen earlier, its
  `_valid_from` and run move back to this version's;
- else a new superseded version, valid until S, or until P's deletion when P was deleted
  after it was extracted (the deletion then ends this version, as in extraction order), or,
  before every held version, until a snapshot loaded earlier that missed the key (one that
  held it would have left a version before S); P then ends where this version begins.

What cannot be placed: a sighting that changed nothing is not stored, so a record whose
content went back to an earlier one (A, B, A) between two runs that commit out of order, in a
set without a cursor, keeps A's version once; and a snapshot that commits after a later
version was loaded marks only the current version deleted.
"""

from __future__ import annotations

import duckdb

from warehouse import ledger
from warehouse.ident import column_list

STALE = "stale"  # the plan's action for a version older than the current one


def place_older_versions(
    con: duckdb.DuckDBPyConnection,
    entity: str,
    key: str,
    cursor: str | None,
    clinical: str,
    superseded: str,
    version: list[str],
) -> None:
    """Place the staged versions the plan marked STALE (`_stage`, `_plan`: one per key) among
    the versions held in `clinical` and `superseded`. `key`, `cursor`: quoted columns;
    `version`: the columns a version consists of."""
    ordering = f"c.{cursor}" if cursor else "NULL"
    con.execute(
        f"""CREATE TEMP TABLE "_older" AS
            SELECT s.rowid AS "vid", s.{key} AS "k", s."_cursor" AS "cur",
                   s."_extracted_at" AS "f", s."_content_hash" AS "h", s."_run_id" AS "run"
            FROM "_stage" AS s JOIN "_plan" AS p ON p."_row_id" = s.rowid
            WHERE p."_action" = ?""",
        [STALE],
    )
    # Held versions and the older ones in one order per key; each older version's neighbours.
    # Held versions that tie (a batch that carried a key twice at one cursor leaves one that
    # began and ended at the same instant) keep the order they were written in, the current
    # one last: without it the window breaks the tie differently from run to run.
    window = 'PARTITION BY "k" ORDER BY "cur" NULLS FIRST, "f", "is_v", "is_current", "rid"'
    held = 'CASE WHEN NOT "is_v" THEN {"rid": "rid", "cur_row": "is_current", "f": "f", "t": "t", "h": "h"} END'
    missed = ledger.first_snapshot_missing('v."k"', 'v."f"')
    con.execute(
        f"""CREATE TEMP TABLE "_places" AS
            WITH "chain" AS (
                SELECT c.{key} AS "k", {ordering} AS "cur", c."_valid_from" AS "f",
                       c."_valid_to" AS "t", c."_content_hash" AS "h", c.rowid AS "rid",
                       false AS "is_current", false AS "is_v", NULL::BIGINT AS "vid"
                FROM {superseded} AS c WHERE c.{key} IN (SELECT "k" FROM "_older")
                UNION ALL
                SELECT c.{key}, {ordering}, c."_extracted_at", NULL, c."_content_hash", c.rowid,
                       true, false, NULL
                FROM {clinical} AS c WHERE c.{key} IN (SELECT "k" FROM "_older")
                UNION ALL
                SELECT "k", "cur", "f", NULL, "h", NULL, false, true, "vid" FROM "_older"
            ), "around" AS (
                SELECT "vid",
                       last_value({held} IGNORE NULLS) OVER ({window}
                           ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS "p",
                       first_value({held} IGNORE NULLS) OVER ({window}
                           ROWS BETWEEN 1 FOLLOWING AND UNBOUNDED FOLLOWING) AS "s"
                FROM "chain"
            )
            SELECT v.*, a."p", a."s",
                   -- before every held version: a snapshot since that missed the key
                   CASE WHEN a."p" IS NULL THEN {missed} END AS "missed",
                   -- P's deletion: it ended after it began, before S began
                   CASE WHEN a."p"."f" < a."p"."t" AND a."p"."t" < a."s"."f"
                        THEN a."p"."t" END AS "p_gone"
            FROM "_older" AS v JOIN "around" AS a ON a."vid" = v."vid" """,
        [entity],
    )
    con.execute(
        """CREATE TEMP TABLE "_placed" AS
            SELECT *,
              CASE
                WHEN "p" IS NOT NULL AND "p"."h" = "h"
                     AND NOT coalesce("p_gone" <= "f", false) THEN 'seen'
                WHEN "s"."h" = "h" AND NOT coalesce("p_gone" > "f", false)
                     AND NOT coalesce("missed" < "s"."f", false) THEN 'earlier'
                ELSE 'new'
              END AS "how",
              least("s"."f", CASE WHEN "p_gone" > "f" THEN "p_gone" END, "missed") AS "until"
            FROM "_places" """
    )
    columns = column_list(version)
    con.execute(
        f"""INSERT INTO {superseded} ({columns}, "_valid_from", "_valid_to", "_run_id")
            SELECT {column_list(version, "s.")}, p."f", p."until", p."run"
            FROM "_placed" AS p JOIN "_stage" AS s ON s.rowid = p."vid"
            WHERE p."how" = 'new'"""
    )
    # The version before ends where the placed one begins (a deletion before it stays).
    con.execute(
        f"""UPDATE {superseded} AS c SET "_valid_to" = least(c."_valid_to", p."f")
            FROM "_placed" AS p
            WHERE p."how" <> 'seen' AND NOT p."p"."cur_row" AND c.rowid = p."p"."rid" """
    )
    # A version the placed one repeats was first seen at the placed one's extraction.
    for table, begins, current in (
        (superseded, "_valid_from", False),
        (clinical, "_extracted_at", True),
    ):
        con.execute(
            f"""UPDATE {table} AS c SET "{begins}" = p."f", "_run_id" = p."run"
                FROM "_placed" AS p
                WHERE p."how" = 'earlier' AND p."s"."cur_row" = ? AND c.rowid = p."s"."rid" """,
            [current],
        )
    for name in ("_older", "_places", "_placed"):
        con.execute(f'DROP TABLE "{name}"')


def set_later_versions_aside(con: duckdb.DuckDBPyConnection, key: str) -> int:
    """Keep each key's oldest version in `_stage` and move the others to `_later`, numbered
    by their place in the key's order (`_round` 2, 3, ...): a load merges them one round at
    a time, as loads of one version each would. The number of rounds. The window sees
    narrow rows only: memory stays low. `key`: the quoted key column."""
    con.execute(
        f"""CREATE TEMP TABLE "_ranks" AS
            SELECT rowid AS "rid", row_number() OVER (
                PARTITION BY {key}
                ORDER BY "_cursor" NULLS FIRST, "_extracted_at", "_order", "_row"
            ) AS "_round"
            FROM "_stage" """
    )
    later = 'SELECT "rid", "_round" FROM "_ranks" WHERE "_round" > 1'
    con.execute(
        f"""CREATE TEMP TABLE "_later" AS SELECT s.*, r."_round"
            FROM "_stage" AS s JOIN ({later}) AS r ON s.rowid = r."rid" """
    )
    con.execute(f'DELETE FROM "_stage" WHERE rowid IN (SELECT "rid" FROM ({later}))')
    (rounds,) = con.execute('SELECT max("_round") FROM "_ranks"').fetchone()
    con.execute('DROP TABLE "_ranks"')
    return int(rounds or 1)
