"""Opening the published warehouse read-only while a publication may rename the next night
over it: DuckDB opens the file by its path more than once while it connects, so one open can
meet two files. Such an open is tried again; anything else is not."""

from __future__ import annotations

import duckdb
import pytest

from warehouse import connection
from warehouse.connection import OPEN_ATTEMPTS, open_read_only


@pytest.fixture
def published(tmp_path):
    path = tmp_path / "warehouse.duckdb"
    with duckdb.connect(str(path)) as con:
        con.execute("CREATE TABLE claims AS SELECT range AS id FROM range(7)")
    return path


def failing(times: int, error: Exception, calls: list[str]):
    """duckdb.connect that raises `error` on its first `times` calls, then opens for real."""
    real = duckdb.connect

    def connect(path, *args, **kwargs):
        calls.append(path)
        if len(calls) <= times:
            raise error
        return real(path, *args, **kwargs)

    return connect


def test_an_open_that_met_a_rename_is_tried_again_and_reads_the_file(published, monkeypatch):
    calls: list[str] = []
    met = duckdb.SerializationException("Failed to deserialize: expected end of object")
    monkeypatch.setattr(connection.duckdb, "connect", failing(2, met, calls))
    with open_read_only(published) as con:
        assert con.execute("SELECT count(*) FROM claims").fetchone() == (7,)
    assert len(calls) == 3
    with open_read_only(published) as again, pytest.raises(duckdb.InvalidInputException):
        again.execute("INSERT INTO claims VALUES (8)")  # and it is read-only


def test_a_file_that_never_opens_raises_after_the_attempts(published, monkeypatch):
    calls: list[str] = []
    met = duckdb.SerializationException("Failed to deserialize")
    monkeypatch.setattr(connection.duckdb, "connect", failing(99, met, calls))
    with pytest.raises(duckdb.SerializationException):
        open_read_only(published)
    assert len(calls) == OPEN_ATTEMPTS


def test_other_errors_are_not_tried_again(tmp_path, monkeypatch):
    calls: list[str] = []
    missing = duckdb.IOException("Cannot open database: No such file or directory")
    monkeypatch.setattr(connection.duckdb, "connect", failing(99, missing, calls))
    with pytest.raises(duckdb.IOException):
        open_read_only(tmp_path / "none.duckdb")
    assert len(calls) == 1
