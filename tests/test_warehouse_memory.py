"""The warehouse's memory cap: chosen from the machine and the runs that share it unless
WAREHOUSE_MEMORY_LIMIT names one, and a models build that runs out of it tried again on
one thread rather than failing the night."""

from __future__ import annotations

import logging
from dataclasses import replace

import pytest
from dbt.artifacts.schemas.results import RunStatus

from tests.warehouse_records import project_copy
from warehouse import dbt_project, memory, models
from warehouse.load import Warehouse
from warehouse.memory import CEILING, FLOOR, MIB, default_limit

GIB = 1024 * MIB
OUT_OF_MEMORY_MESSAGE = (
    "Runtime Error in model threads_seen (models/threads_seen.sql)\n"
    "  Out of Memory Error: failed to allocate data of size 16.0 MiB (256.0 MiB/256.0 MiB used)"
)


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
    """DuckDB's out-of-core joins are best effort near the cap: a model that ran out of
    memory is built again by dbt on one thread (its table then says what it saw), with the
    models that read it; the others are not built twice. What cannot run on demand is the
    cap's failure itself: dbt's result for one model says it, as DuckDB words it."""
    project = dbt_project.prepare(
        project_copy(tmp_path, threads_seen="select current_setting('threads') as threads\n")
    )
    real = models._run
    asked: list[list[str]] = []

    def out_of_memory_once(project, path, todo, on_event, whole):
        asked.append(sorted(m.name for m in todo))
        results = real(project, path, todo, on_event, whole)
        if len(asked) == 1:
            results = [
                replace(r, status=RunStatus.Error, message=OUT_OF_MEMORY_MESSAGE)
                if r.node.name == "threads_seen"
                else r
                for r in results
            ]
        return results

    monkeypatch.setattr(models, "_run", out_of_memory_once)
    # the warning asserted below, whatever level an earlier test in this process left the
    # logger at (dbt's runs set levels of their own)
    caplog.set_level(logging.WARNING, logger=models.log.name)
    path = tmp_path / "wh.duckdb"
    with Warehouse(path) as wh:
        wh.ensure_schema()
        wh.con.execute("SET threads = 2")
        done = models.build(path, project)
        (threads,) = wh.con.execute("SELECT current_setting('threads')").fetchone()
        (seen,) = wh.con.execute('SELECT "threads" FROM "analytics"."threads_seen"').fetchone()
        failures = wh.con.execute('SELECT count(*) FROM "ops"."models" WHERE "failure" IS NOT NULL')
        failed = failures.fetchone()[0]
    assert done.ok and "threads_seen" in done.built and len(done.built) == len(asked[0])
    assert asked[1] == ["threads_seen"]  # only the model that ran out of memory, again
    assert int(seen) == 1 and int(threads) == 2  # built on one thread; the setting restored
    assert failed == 0  # a slower build, not a failed one
    assert "threads_seen built again on one thread" in caplog.text
