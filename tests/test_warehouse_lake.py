"""The lake is plain hive-partitioned Parquet: any DuckDB or pyarrow user reads it as it is."""

from __future__ import annotations

import hashlib
from datetime import timedelta

import duckdb
import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq

from connectors.clinical_records.catalogue import APPOINTMENTS
from tests.warehouse_records import T0, record
from warehouse.lake import Lake
from warehouse.normalise import normalise


def write(lake: Lake, records: list, *, day: int, run_id: str):
    batch = normalise(APPOINTMENTS, records)
    return lake.write(
        APPOINTMENTS,
        batch.table,
        run_id=run_id,
        extracted_at=T0 + timedelta(days=day),
        rejects=batch.rejects,
    )


def digest(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_duckdb_and_pyarrow_read_the_lake_with_hive_partitions(tmp_path):
    lake = Lake(tmp_path / "lake")
    write(lake, [record(APPOINTMENTS, i, patient_id=str(i)) for i in (1, 2)], day=0, run_id="r1")
    # A value kept raw and an unknown field on the second day: rows and extras stay readable.
    write(
        lake,
        [record(APPOINTMENTS, 3, loyalty="gold"), record(APPOINTMENTS, 4, start_time="25:00:00")],
        day=1,
        run_id="r2",
    )
    glob = str(lake.entity_dir(APPOINTMENTS) / "**" / "*.parquet")

    con = duckdb.connect()
    con.execute("SET TimeZone = 'UTC'")
    rows = con.execute(
        """SELECT entity, extracted_date, id, patient_id, start_datetime, _extras
           FROM read_parquet(?, hive_partitioning = true) ORDER BY id""",
        [glob],
    ).fetchall()
    first, second = T0.date(), T0.date() + timedelta(days=1)
    assert [(r[0], r[1], r[2], r[3]) for r in rows] == [
        ("appointments", first, "app-1", "1"),
        ("appointments", first, "app-2", "2"),
        ("appointments", second, "app-3", "3patient_id"),
        ("appointments", second, "app-4", "4patient_id"),
    ]
    assert rows[0][4].isoformat() == "2026-02-01T09:00:00+00:00"  # +01:00 sent, UTC stored
    assert rows[2][5] == '{"loyalty": "gold"}'
    assert rows[3][5] == '{"start_time": "25:00:00"}'
    types = dict(
        con.execute(
            """SELECT column_name, column_type FROM (DESCRIBE SELECT * FROM
               read_parquet(?, hive_partitioning = true))""",
            [glob],
        ).fetchall()
    )
    assert types["extracted_date"] == "DATE" and types["patient_id"] == "VARCHAR"
    assert types["start_datetime"] == "TIMESTAMP WITH TIME ZONE"
    assert types["start_time"] == "TIME" and types["recurring"] == "BOOLEAN"

    # pyarrow skips `_`-prefixed folders (`_tmp`, `_rejects`), so the root reads as a dataset.
    table = ds.dataset(lake.root, format="parquet", partitioning="hive").to_table()
    assert table.num_rows == 4
    assert sorted(set(table.column("entity").to_pylist())) == ["appointments"]
    assert table.schema.field("extracted_date").type in (pa.date32(), pa.string())
    days = {str(d) for d in table.column("extracted_date").to_pylist()}
    assert days == {first.isoformat(), second.isoformat()}


def test_a_batch_is_written_once_zstd_compressed_and_never_rewritten(tmp_path):
    lake = Lake(tmp_path / "lake")
    first = write(lake, [record(APPOINTMENTS, 1)], day=0, run_id="r1")
    before = digest(first)
    second = write(lake, [record(APPOINTMENTS, 1, notes="changed")], day=0, run_id="r1")

    assert (first.name, second.name) == ("r1-000001.parquet", "r1-000002.parquet")
    assert digest(first) == before  # the same run's next batch is a new file
    assert list((lake.root / "_tmp").iterdir()) == []  # temporary names are gone
    meta = pq.ParquetFile(second).metadata
    codecs = {meta.row_group(0).column(i).compression for i in range(meta.num_columns)}
    assert codecs == {"ZSTD"}
    assert [Lake.info(p).seq for p in lake.files(APPOINTMENTS)] == [1, 2]


def test_short_bounded_text_is_dictionary_encoded_and_distinct_values_are_not(tmp_path):
    lake = Lake(tmp_path / "lake")
    path = write(lake, [record(APPOINTMENTS, i) for i in range(50)], day=0, run_id="r1")
    meta = pq.ParquetFile(path).metadata.row_group(0)
    encodings = {
        meta.column(i).path_in_schema: meta.column(i).encodings for i in range(meta.num_columns)
    }
    # status: max 30 in the spec; id and notes: no max; start_time: a TIME, not text.
    assert "RLE_DICTIONARY" in encodings["status"]
    for name in ("id", "notes", "start_time", "start_datetime", "_extras"):
        assert "RLE_DICTIONARY" not in encodings[name], name
