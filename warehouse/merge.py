"""The merge of one load: lake batches into clinical and history, by key, in SQL over Parquet.

A load stages the batches' rows with `read_parquet` and merges every version, each key's oldest
first (`NEWER`'s order): one newer than the current row is compared by content hash and applied
(insert, update, resurrection, type-2 history), an older one placed among those held
(`warehouse/history.py`); then the soft deletes (`warehouse/soft_deletes.py`), rejects and the
batch ledger. The caller (`Warehouse.load`) holds the transaction.

A fresh load (an empty table, no key twice) skips all that and streams the rows into
`clinical`. DuckDB keeps no insertion order (`preserve_insertion_order`): no table here
promises one, and keeping it doubled the time of a large insert under the memory cap.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq

from connectors.clinical_records.catalogue import Canonical, EntitySet
from warehouse import changes, ddl, history, ledger, soft_deletes
from warehouse.ident import column_list, qualified, quote
from warehouse.lake import REJECTS, BatchInfo, Lake, side_path
from warehouse.ledger import LoadResult
from warehouse.normalise import REJECT
from warehouse.schema import EXTRAS

# The content hash: DuckDB's 64-bit hash of every field and the extras, as 16 hex digits.
# It only has to tell one key's versions apart, and it is many times cheaper than md5 over
# JSON text. (Changing this expression makes every row look changed once.)
CONTENT_HASH = "printf('%016x', hash({content}))"

# The plan's actions, as the classification query names them.
INSERT, UPDATE, RESURRECT, SAME = "insert", "update", "resurrect", "same"
STALE = history.STALE  # older than the current version: placed among those held
# How analytics.changes names each action that changes a record (a record back is inserted).
CHANGES = {INSERT: changes.INSERTED, RESURRECT: changes.INSERTED, UPDATE: changes.UPDATED}

# The plan's rows of some actions (`?`: the actions' names).
PLANNED = """(SELECT * FROM "_plan" WHERE "_action" IN (SELECT unnest(?)))"""

# Whether a staged version (`s`) is newer than the current one (`c`, its cursor `{current}`):
# by cursor, a missing one oldest, then by extraction time (a tie: the version being loaded).
NEWER = """(CASE WHEN s."_cursor" IS DISTINCT FROM {current}
                 THEN coalesce(s."_cursor" > {current}, {current} IS NULL)
                 ELSE s."_extracted_at" >= c."_extracted_at" END)"""


class Merge:
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
        self.cursor = _ordering_cursor(ent)
        self.fields = [f.name for f in ent.fields]
        self.version = [*self.fields, *ddl.CONTENT_META]  # the columns a version consists of
        self.snapshot_at = max(i.extracted for i in infos)
        self.present = _columns_in(paths)  # older batches may lack newer columns
        # Whether a snapshot loaded earlier was extracted after some of these batches.
        self.snapshot_since = ledger.snapshot_since(con, ent.name, min(i.extracted for i in infos))

    def run(self, snapshot: bool) -> LoadResult:
        new = self._register_batches()
        actions: Counter[str] = Counter()
        duplicated = self._has_duplicate_keys()
        if not duplicated and not self.snapshot_since and self._is_empty():
            # A fresh load (an empty table, no key twice, no snapshot since) inserts
            # everything: one streaming statement, nothing to compare with.
            actions[INSERT] = self._insert_fresh()
            changes.record_fresh(self.con, self.ent, self.run_id, self.files)
            deleted = soft_deletes.found_gone(self)
        else:
            actions.update(self._merge_versions(duplicated))
            deleted = soft_deletes.missed_by_snapshot(self) if snapshot else 0
            deleted += soft_deletes.found_gone(self)
            self.con.execute('DROP TABLE "_keys"')
        if snapshot:
            self._record_snapshot()
        rejected = self._rejects(new)
        self._resolve_notes()
        ledger.record_new_batches(self.con, self.ent.name)
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
        seen = ledger.loaded_batch_ids(self.con, ids)
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
                FROM read_parquet(?, hive_partitioning = false, union_by_name = true)""",
            [self.files],
        ).fetchone()
        return bool(duplicated)

    def _is_empty(self) -> bool:
        return self.con.execute(f"SELECT count(*) FROM {self.clinical}").fetchone()[0] == 0

    def _record_snapshot(self) -> None:
        """The snapshot, by the run that extracted it: its rejects carry that run's id."""
        run_id = max(self.infos, key=lambda i: i.extracted).run_id
        ledger.record_snapshot(self.con, self.ent.name, run_id, self.snapshot_at)

    def _missed_by_snapshot(self) -> tuple[str, list[object]]:
        """SQL of when the first snapshot extracted at or after a new record's version (`s`)
        missed it (NULL when none did), as a replay in extraction order would mark it, and
        its parameters. A snapshot that rejected the key did not miss it."""
        if not self.snapshot_since:
            return "NULL::TIMESTAMPTZ", []
        sql = ledger.first_snapshot_missing(f"s.{self.key}", 's."_extracted_at"')
        return sql, [self.ent.name]

    def _versions(self, ranked: bool) -> str:
        """SQL of the batches' rows with their content hash and cursor (`?`: the files);
        `ranked` adds batch order and row number, which break ties between versions."""
        # Each column cast to its type: a batch written under an older typing rule (an id
        # as BIGINT, DECIMAL(18,4)) loads as the warehouse now types it.
        select = ", ".join(
            f"CAST(s.{quote(name)} AS {kind}) AS {quote(name)}"
            if name in self.present
            else f"NULL::{kind} AS {quote(name)}"
            for name, (kind, _) in ddl.field_columns(self.ent).items()
        )
        extras = (
            f"s.{quote(EXTRAS)}" if EXTRAS in self.present else f"NULL::VARCHAR AS {quote(EXTRAS)}"
        )
        content = column_list([*self.fields, EXTRAS])
        cursor = quote(self.cursor) if self.cursor else "NULL"
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

    def _merge_versions(self, duplicated: bool) -> Counter[str]:
        """Every staged version, each key's oldest first: one round per version of a key (a
        load holds one for most keys), each planned and applied against what the rounds
        before left, as loads of one version each in that order would. Returns how many
        versions got each action."""
        self.con.execute(
            f'CREATE TEMP TABLE "_stage" AS {self._versions(duplicated)}', [self.files]
        )
        self.con.execute(f'CREATE TEMP TABLE "_keys" AS SELECT DISTINCT {self.key} FROM "_stage"')
        rounds = history.set_later_versions_aside(self.con, self.key) if duplicated else 1
        actions: Counter[str] = Counter()
        for number in range(1, rounds + 1):
            if number > 1:
                self.con.execute(
                    'CREATE TEMP TABLE "_stage" AS SELECT * EXCLUDE ("_round") FROM "_later" '
                    'WHERE "_round" = ?',
                    [number],
                )
            planned = self._plan()
            if planned.get(STALE):
                history.place_older_versions(
                    self.con,
                    self.ent.name,
                    self.key,
                    quote(self.cursor) if self.cursor else None,
                    self.clinical,
                    self.superseded,
                    self.version,
                )
            self._apply(planned)
            actions.update(planned)
            self.con.execute('DROP TABLE "_stage"')
            self.con.execute('DROP TABLE "_plan"')
        if duplicated:
            self.con.execute('DROP TABLE "_later"')
        if rounds > 1:
            changes.one_per_record(self.con, self.ent, self.run_id)
        return actions

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

    def _plan(self) -> dict[str, int]:
        """`_plan`: what happens to each key's version in `_stage` (one per key, with its
        content hash): `_action`. Returns how many keys get each action.

        A version newer than the current one (`NEWER`) replaces it; an older one is placed
        among the versions held (STALE: `history.place_older_versions`). A newer version
        brings a deleted record back only when it was extracted after the deletion was seen;
        one extracted before it (a run that commits after a later snapshot) updates the
        record's content, which stays deleted, as if the two loads had committed in
        extraction order. For the same reason a new record that a snapshot
        loaded earlier but extracted later missed is inserted deleted (`_deleted_at`).

        Every join sees narrow rows only (keys, cursors, times, hashes, row ids), so its hash
        table stays small; the wide staged rows stream, and spill under the memory cap. The
        current version's row id (`_clinical_row`) lets `_apply` read and delete the versions
        it replaces without matching keys against clinical again.
        """
        cursor = [self.cursor] if self.cursor else []
        current = f"c.{quote(self.cursor)}" if self.cursor else "NULL"
        narrow = column_list(
            [self.ent.key, *cursor, "_extracted_at", "_deleted_at", "_content_hash"]
        )
        missed, params = self._missed_by_snapshot()
        self.con.execute(
            f"""
            CREATE TEMP TABLE "_plan" AS
            SELECT s.rowid AS "_row_id", c."_clinical_row", s.{self.key}, s."_extracted_at",
              CASE WHEN c.{self.key} IS NULL THEN {missed}
                   ELSE c."_deleted_at" END AS "_deleted_at",
              CASE
                WHEN c.{self.key} IS NULL THEN '{INSERT}'
                WHEN NOT {NEWER.format(current=current)} THEN '{STALE}'
                WHEN s."_extracted_at" > c."_deleted_at" THEN '{RESURRECT}'
                WHEN c."_content_hash" IS DISTINCT FROM s."_content_hash" THEN '{UPDATE}'
                ELSE '{SAME}'
              END AS "_action"
            FROM "_stage" AS s
            LEFT JOIN (SELECT rowid AS "_clinical_row", {narrow} FROM {self.clinical}) AS c
                ON c.{self.key} = s.{self.key}
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
        if replaced:  # the versions replaced, read from clinical once (its wide columns)
            self.con.execute(
                f"""CREATE TEMP TABLE "_replaced" AS
                    SELECT {column_list(self.version, "c.")}, c."_extracted_at",
                           least(c."_deleted_at", s."_extracted_at") AS "_valid_to", c."_run_id"
                    FROM {self.clinical} AS c JOIN {PLANNED} AS s
                    ON c.rowid = s."_clinical_row" """,
                [replaced],
            )
            self._check_replaced(replaced, sum(planned[a] for a in replaced))
        changes.record_plan(
            self.con, self.ent, self.run_id, '"_replaced"' if replaced else None, CHANGES
        )
        if planned.get(SAME) or planned.get(STALE):  # `_stage` keeps only rows to write
            self.con.execute(
                'DELETE FROM "_stage" WHERE rowid IN '
                '(SELECT "_row_id" FROM "_plan" WHERE "_action" IN (?, ?))',
                [SAME, STALE],
            )
        if replaced:
            self.con.execute(
                f"""INSERT INTO {self.superseded} ({column_list(self.version)}, "_valid_from",
                                                  "_valid_to", "_run_id")
                    SELECT {column_list(self.version)}, "_extracted_at", "_valid_to", "_run_id"
                    FROM "_replaced" """
            )
            self.con.execute('DROP TABLE "_replaced"')
            self.con.execute(
                f"""DELETE FROM {self.clinical} WHERE rowid IN
                    (SELECT "_clinical_row" FROM {PLANNED})""",
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

    def _check_replaced(self, replaced: list[str], planned: int) -> None:
        """The versions read by row id are the planned keys' current rows, each once. Row ids
        hold within the load's transaction (DuckDB renumbers rows only when a checkpoint
        rewrites a table); were that ever to change, history would take other records'
        versions, so the load stops here and rolls back instead."""
        read, of_planned = self.con.execute(
            f"""SELECT count(*), count(*) FILTER (WHERE r.{self.key} IN
                    (SELECT p.{self.key} FROM {PLANNED} AS p))
                FROM "_replaced" AS r""",
            [replaced],
        ).fetchone()
        if not read == of_planned == planned:
            raise RuntimeError(
                f"{self.ent.name}: the merge read {read} current versions by row id for "
                f"{planned} planned replacements ({of_planned} of the planned keys); the load "
                "is rolled back and nothing is written. This is a fault of the merge: report "
                "it with the run's log"
            )

    def reject_files(self) -> list[str]:
        return [
            str(_rejects_path(p, i))
            for p, i in zip(self.paths, self.infos, strict=True)
            if i.rejects
        ]

    def _rejects(self, new: list[bool]) -> int:
        """Copy the batches' rejects into ops.rejects once; return the rejected rows."""
        files = self.reject_files()
        if not files:
            return 0
        self.con.execute(
            """CREATE TEMP TABLE "_rejects" AS
                SELECT r.*, b."batch_run_id", b."batch_id", b."extracted_at", b."new"
                FROM read_parquet(?, union_by_name = true, filename = true, hive_partitioning = false) AS r
                JOIN "_batches" AS b ON r."filename" = b."rejects_file" """,
            [files],
        )
        ledger.copy_new_rejects(self.con)
        (count,) = self.con.execute(
            'SELECT count(*) FROM "_rejects" WHERE "kind" = ?', [REJECT]
        ).fetchone()
        self.con.execute('DROP TABLE "_rejects"')
        return count

    def _resolve_notes(self) -> None:
        """Notes on keys these batches loaded again, from a later extraction, become history
        (ledger.resolve_notes); reads the key column alone, and only while notes are open."""
        ledger.resolve_notes(
            self.con,
            self.ent.name,
            f"""SELECT CAST(s.{self.key} AS VARCHAR) AS "key", b."extracted_at",
                       b."batch_run_id" AS "run_id"
                FROM read_parquet(?, filename = true, hive_partitioning = false) AS s
                JOIN "_batches" AS b ON s."filename" = b."file" WHERE b."new" """,
            [self.files],
        )


def _ordering_cursor(entity: EntitySet) -> str | None:
    """The cursor that orders a key's versions; a text cursor (Prescriptions.created_at, no
    format stated) has no order to trust, so extraction time decides there."""
    cursor = entity.cursor
    if cursor is None or entity.field(cursor).canonical is Canonical.VARCHAR:
        return None
    return cursor


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
