"""The warehouse's memory cap: chosen from the machine and the runs that share it unless
WAREHOUSE_MEMORY_LIMIT names one, and a models build that runs out of it tried again on
one thread rather than failing the night."""

from __future__ import annotations

import duckdb
import pytest

from warehouse import memory, models
from warehouse.load import Warehouse
from warehouse.memory import CEILING, FLOOR, MIB, default_limit

GIB = 1024 * MIB


def test_a_run_gets_half_the_machine_shared_by_the_runs_between_floor_and_ceiling():
    assert default_limit(24 * GIB, 10) == int(24 * GIB * 0.5 / 10)  # ten tenants: 1.2 GiB
    assert default_limit(24 * GIB, 1) == CEILING  # alone on a big machine
    assert default_limit(1 * GIB, 1) == 512 * MIB  # a small container
    assert default_limit(1 * GIB, 10) == FLOOR  # never below what scale 300's models need


def test_the_cap_follows_the_machine_and_the_runs_at_once(tmp_path, monkeypatch):
    monkeypatch.delenv("WAREHOUSE_MEMORY_LIMIT", raising=False)
    monkeypatch.delenv("WAREHOUSE_RUNS_AT_ONCE", raising=False)
    monkeypatch.setattr(memory, "usable_memory", lambda: 8 * GIB)
    assert memory.memory_limit() == "2048MiB"
    monkeypatch.setenv("WAREHOUSE_RUNS_AT_ONCE", "10")
    assert memory.memory_limit() == "409MiB"
    with Warehouse(tmp_path / "wh.duckdb") as wh:
        (limit,) = wh.con.execute("SELECT current_setting('memory_limit')").fetchone()
    assert limit == "409.0 MiB"  # what DuckDB runs under
    monkeypatch.setenv("WAREHOUSE_MEMORY_LIMIT", "300MB")  # the operator's word stands
    assert memory.memory_limit() == "300MB"


@pytest.mark.parametrize("value", ["0", "ten", "-2", "1.5"])
def test_a_bad_runs_at_once_names_the_variable(tmp_path, monkeypatch, value):
    monkeypatch.delenv("WAREHOUSE_MEMORY_LIMIT", raising=False)
    monkeypatch.setenv("WAREHOUSE_RUNS_AT_ONCE", value)
    with pytest.raises(ValueError, match="WAREHOUSE_RUNS_AT_ONCE: expected a whole number"):
        Warehouse(tmp_path / "wh.duckdb")


def test_a_containers_limit_counts_when_it_is_lower(tmp_path, monkeypatch):
    v2, v1 = tmp_path / "memory.max", tmp_path / "memory.limit_in_bytes"
    monkeypatch.setattr(memory, "CGROUP_FILES", (v2, v1))
    assert memory.cgroup_limit() is None  # neither file: no container limit
    v2.write_text("max\n")
    v1.write_text(f"{2 * GIB}\n")
    assert memory.cgroup_limit() == 2 * GIB  # v2 unlimited, v1 set
    v2.write_text(f"{512 * MIB}\n")
    assert memory.cgroup_limit() == 512 * MIB
    assert memory.usable_memory() == 512 * MIB  # this machine has more than that


def test_models_out_of_memory_are_built_again_on_one_thread(tmp_path, monkeypatch, caplog):
    """DuckDB's out-of-core joins are best effort near the cap: the build that failed is
    run again, on one thread, in a new transaction; the connection keeps its threads."""
    built = models.refresh
    threads_seen: list[int] = []

    def refresh_failing_once(con, found):
        threads_seen.append(int(con.execute("SELECT current_setting('threads')").fetchone()[0]))
        if len(threads_seen) == 1:
            con.execute("CREATE TABLE analytics.half_built AS SELECT 1 AS x")
            raise duckdb.OutOfMemoryException("Out of Memory Error: could not allocate block")
        return built(con, found)

    monkeypatch.setattr(models, "refresh", refresh_failing_once)
    with Warehouse(tmp_path / "wh.duckdb") as wh:
        wh.ensure_schema()
        wh.con.execute("SET threads = 2")
        rows = wh.refresh_models()
        (threads,) = wh.con.execute("SELECT current_setting('threads')").fetchone()
        half = wh.con.execute(
            "SELECT count(*) FROM duckdb_tables() WHERE table_name = 'half_built'"
        ).fetchone()[0]
    assert threads_seen == [2, 1] and int(threads) == 2
    assert rows and all(n == 0 for n in rows.values())  # every model built, on empty tables
    assert half == 0  # the failed attempt's work was rolled back
    assert "built again on one thread" in caplog.text
