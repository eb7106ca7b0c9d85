"""What issue 29's typing rule costs analysts, at scale 50: main's BIGINT ids against today's.

The same records, made in SQL at the sandbox's scale-50 sizes (ids are the numbers the
default profile sends), go into three warehouse files, and each model of transform/ is
queried on all three in turns in this one run:
- before: main until issue 29; an id family that is a number anywhere is BIGINT, decimals
  DECIMAL(18,4), the models views;
- views: today's types (such families VARCHAR, the decimal text of the same numbers;
  DECIMAL(38,12)) under the same views: what the rule alone costs a join;
- after: today's types, the models tables that every run builds after its loads
  (warehouse/models.py): what analysts pay now.
Each query is a full aggregate over one model (every join of a view runs); the figure is the
median of `--repeats` runs. What the tables cost instead: building them (the real
`warehouse.models.build`, dbt in a child process under WAREHOUSE_MEMORY_LIMIT, twice, as two
nights would), the file's size and its publication (warehouse/publish.py), against the views.

Run: nice .venv/bin/python benchmarks/key_types.py [--scale 50] [--repeats 7]
Target: analysts pay nothing for the rule: the models' queries on their tables together take
at most as long as on main's BIGINT views (after / before <= 1); the build takes seconds, not
minutes. A table removes a model's joins, not what text ids cost a query that groups or
counts them (prescription_claims counts distinct patients), so one model may stay dearer.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import duckdb

from benchmarks.common import ROOT, add_record_option, record
from benchmarks.measure import MIB, child_env, failure, run_measured
from connectors.clinical_records.catalogue import (
    ENTITY_SETS,
    NUMERIC_KEYS,
    Canonical,
    Edm,
    EntitySet,
    Field,
)
from connectors.sandbox.columns import HOME
from connectors.sandbox.generator import size_of
from warehouse import ddl
from warehouse.connection import Transaction
from warehouse.dbt_project import manifest_json, prepare
from warehouse.ident import literal, qualified, quote
from warehouse.load import Warehouse
from warehouse.memory import memory_limit
from warehouse.models import build as build_models
from warehouse.models import models, select_sql
from warehouse.publish import publish

QUERIES = {
    "prescription_claims": "SELECT count(*), sum(total_claim_amount), count(DISTINCT patient_id) "
    "FROM analytics.prescription_claims",
    "prescription_verifications": "SELECT count(*), sum(deductible_amount) "
    "FROM analytics.prescription_verifications",
    "prescription_summary": "SELECT count(*), sum(total_claim_amount), count(patient_first_name), "
    "count(branch_name), count(referring_physician), count(latest_verification_id) "
    "FROM analytics.prescription_summary",
    "broken_references": "SELECT entity, count(*) FROM analytics.broken_references GROUP BY ALL",
}
LAYOUTS = ("before", "views", "after")
PUBLISHES = 3


def before(fld: Field) -> str:
    """The type main gave a field before issue 29."""
    if fld.key is not None and fld.key in NUMERIC_KEYS:
        return "BIGINT"
    if fld.type is Edm.DECIMAL:
        return "DECIMAL(18,4)"
    return fld.canonical.value


def after(fld: Field) -> str:
    return fld.canonical.value


def value(entity: EntitySet, fld: Field, sizes: dict[str, int]) -> str:
    """SQL of the field's value in row `i` (its records' numbers), deterministic."""
    noise = f"hash(i, {literal(entity.name + fld.name)})"
    if fld.name == entity.key:
        return "i"
    if fld.key is not None:
        home = HOME.get(fld.key)
        parents = sizes[home.name] if home is not None else 400
        if (entity.name, fld.name) == ("Claims", "prescription_id"):
            parents = round(parents * 1.01)  # 1% dangling, as the sandbox sends
        return f"1 + {noise} % {parents}"
    kind = fld.canonical
    if kind is Canonical.DECIMAL:
        return f"CAST({noise} % 10000000 AS DECIMAL(18, 0)) * 0.01"  # cents, exact
    if kind is Canonical.DATE:
        return f"DATE '2024-01-01' + CAST({noise} % 700 AS INTEGER)"
    if kind is Canonical.BOOLEAN:
        return f"{noise} % 2 = 0"
    if kind is Canonical.TIMESTAMPTZ:
        return (
            f"TIMESTAMPTZ '2024-01-01 00:00:00+00' + to_seconds(CAST({noise} % 63072000 AS BIGINT))"
        )
    if kind is Canonical.TIME:
        return "TIME '09:30:00'"
    if kind is Canonical.BIGINT:
        return f"{noise} % 100000"
    return f"'t' || ({noise} % 5000)"


def build(path: Path, rule: Callable[[Field], str], scale: float) -> None:
    """A warehouse file of every entity set (broken_references reads appointments too),
    typed by `rule`."""
    sizes = {e.name: size_of(e, scale) for e in ENTITY_SETS}
    with duckdb.connect(str(path)) as con:
        for schema in (ddl.CLINICAL, ddl.ANALYTICS):
            con.execute(f"CREATE SCHEMA {quote(schema)}")
        for entity in ENTITY_SETS:
            columns = ", ".join(
                f"CAST({value(entity, f, sizes)} AS {rule(f)}) AS {quote(f.name)}"
                for f in entity.fields
            )
            con.execute(
                f"CREATE TABLE {qualified(ddl.CLINICAL, entity.table)} AS SELECT {columns}, "
                'CAST(NULL AS TIMESTAMPTZ) AS "_deleted_at" '
                f"FROM range(1, {sizes[entity.name] + 1}) AS r(i)"
            )
        con.execute("CHECKPOINT")


def create_views(path: Path) -> float:
    """The models as views, as main made them before this design; seconds taken."""
    with Warehouse(path) as wh:
        started = time.perf_counter()
        manifest = manifest_json(prepare())
        with Transaction(wh.con):
            for model in models(manifest):
                wh.con.execute(
                    f"CREATE OR REPLACE VIEW {qualified(ddl.ANALYTICS, model.name)} AS\n"
                    + select_sql(manifest, model)
                )
        return time.perf_counter() - started


def build_tables(path: Path) -> float:
    """The models as tables, the way a run's models step builds them (dbt, in process), every
    one of them: earlier builds are forgotten, as after a night that changed every table they
    read (a build skips the models nothing changed for); seconds taken."""
    with Warehouse(path) as wh:
        wh.ensure_schema()
        wh.con.execute(f"DELETE FROM {qualified(ddl.OPS, 'models')}")
    started = time.perf_counter()
    build_models(path)
    seconds = time.perf_counter() - started
    with Warehouse(path) as wh:
        wh.con.execute("CHECKPOINT")
    return seconds


def measured_build(path: Path, kind: str) -> dict[str, float]:
    """`kind` ("views" or "tables") built in a child process: its seconds and largest RSS,
    and the file's size once checkpointed."""
    cmd = [sys.executable, __file__, "--build", kind, str(path)]
    run = run_measured(cmd, child_env({}), ROOT)
    if run.returncode != 0:
        raise failure(f"building the {kind}", run)
    return {
        "seconds": round(json.loads(run.stdout.strip().splitlines()[-1])["seconds"], 3),
        "largest_rss_mib": run.largest_rss_mib,
        "file_mib": round(path.stat().st_size / MIB, 1),
    }


def files(root: Path, scale: float) -> tuple[dict[str, Path], dict[str, list[dict[str, float]]]]:
    """The three files, and what building the models cost twice (views, tables)."""
    paths = {name: root / f"{name}.duckdb" for name in LAYOUTS}
    build(paths["before"], before, scale)
    build(paths["after"], after, scale)
    shutil.copy(paths["after"], paths["views"])
    with duckdb.connect(str(paths["after"])) as con:  # where builds are recorded
        for statement in ddl.ops_table("models"):
            con.execute(statement)
    create_views(paths["before"])
    builds = {
        kind: [measured_build(paths[layout], kind) for _ in range(2)]
        for layout, kind in (("views", "views"), ("after", "tables"))
    }
    return paths, builds


def timed(con: duckdb.DuckDBPyConnection, sql: str) -> tuple[float, list[tuple]]:
    started = time.perf_counter()
    rows = con.execute(sql).fetchall()
    return time.perf_counter() - started, rows


def measure(
    paths: dict[str, Path], repeats: int
) -> tuple[dict[str, dict[str, list[float]]], dict[str, dict[str, list[tuple]]]]:
    """Per layout and model, the seconds of each query and its answer."""
    cons = {name: duckdb.connect(str(p), read_only=True) for name, p in paths.items()}
    seconds: dict[str, dict[str, list[float]]] = {n: {q: [] for q in QUERIES} for n in cons}
    answers: dict[str, dict[str, list[tuple]]] = {n: {} for n in cons}
    for name, con in cons.items():  # warm: every file read once
        for query, sql in QUERIES.items():
            answers[name][query] = sorted(timed(con, sql)[1], key=str)
    for _ in range(repeats):  # in turns, so the machine's load falls on all alike
        for query, sql in QUERIES.items():
            for name, con in cons.items():
                seconds[name][query].append(timed(con, sql)[0])
    for con in cons.values():
        con.close()
    return seconds, answers


def publish_seconds(path: Path, root: Path) -> float:
    """Median seconds of publishing `path` (checkpoint, copy, fsync, rename)."""
    target = root / f"published-{path.stem}.duckdb"
    runs = [publish(path, target).seconds for _ in range(PUBLISHES)]
    target.unlink()
    return statistics.median(runs)


def report(
    scale: float,
    repeats: int,
    seconds: dict[str, dict[str, list[float]]],
    same: bool,
    builds: dict[str, list[dict[str, float]]],
    published: dict[str, float],
) -> dict[str, object]:
    """Print the tables and the target's verdict; the figures to record."""
    medians = {n: {q: statistics.median(s) for q, s in qs.items()} for n, qs in seconds.items()}
    totals = {n: sum(m.values()) for n, m in medians.items()}
    print(f"scale {scale:g}, median of {repeats} runs per query, seconds")
    print(
        f"{'model':27} {'before':>7} {'views':>7} {'after':>7} {'views/before':>13} "
        f"{'after/before':>13}"
    )
    ratios = {}
    for query in [*QUERIES, "all four"]:
        b, v, a = (medians[n][query] if query in QUERIES else totals[n] for n in LAYOUTS)
        ratios[query] = a / b
        print(f"{query:27} {b:7.3f} {v:7.3f} {a:7.3f} {v / b:13.2f} {a / b:13.2f}")
    print(f"the three answer alike: {same}")
    views, tables = builds["views"], builds["tables"]
    print(
        f"building the models, every run (child process, WAREHOUSE_MEMORY_LIMIT={memory_limit()}):"
    )
    print(f"{'':27} {'views':>7} {'tables':>7}")
    for label, pick in (
        ("first build (s)", lambda b: b[0]["seconds"]),
        ("second build (s)", lambda b: b[1]["seconds"]),
        ("largest process (MiB)", lambda b: max(x["largest_rss_mib"] for x in b)),
        ("file after one (MiB)", lambda b: b[0]["file_mib"]),
        ("file after two (MiB)", lambda b: b[1]["file_mib"]),
    ):
        print(f"  {label:25} {pick(views):7.3f} {pick(tables):7.3f}")
    print(f"  {'publish (s, median of 3)':25} {published['views']:7.3f} {published['after']:7.3f}")
    worst = max(QUERIES, key=lambda q: ratios[q])
    met = ratios["all four"] <= 1.0
    print(
        "target: the models' queries on their tables together at most as long as on main's "
        f"BIGINT views: {'met' if met else 'NOT met'} (after/before {ratios['all four']:.2f}; "
        f"the dearest model {worst}, {ratios[worst]:.2f})"
    )
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    print(f"load average while measured (1, 5, 15 min): {load} on {os.cpu_count()} cores")
    return {
        "scale": scale,
        "repeats": repeats,
        "seconds": {n: {q: round(v, 4) for q, v in m.items()} for n, m in medians.items()},
        "total_seconds": {n: round(v, 4) for n, v in totals.items()},
        "ratio_after_before": {q: round(r, 3) for q, r in ratios.items()},
        "ratio_views_before": round(totals["views"] / totals["before"], 3),
        "same_answers": same,
        "builds": builds,
        "publish_seconds": {"views": published["views"], "tables": published["after"]},
        "memory_limit": memory_limit(),
        "target_met": met,
        "load_average": [round(x, 1) for x in os.getloadavg()],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scale", type=float, default=50)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--build", nargs=2, metavar=("KIND", "PATH"), help=argparse.SUPPRESS)
    add_record_option(parser)
    args = parser.parse_args()
    if args.build:  # the child process of `measured_build`
        kind, path = args.build
        seconds = (create_views if kind == "views" else build_tables)(Path(path))
        print(json.dumps({"seconds": seconds}))
        return
    with tempfile.TemporaryDirectory() as tmp:
        paths, builds = files(Path(tmp), args.scale)
        seconds, answers = measure(paths, args.repeats)
        published = {n: publish_seconds(paths[n], Path(tmp)) for n in ("views", "after")}
    same = all(answers[n] == answers["before"] for n in LAYOUTS)  # the same records, linked alike
    if args.record:
        record("key_types", report(args.scale, args.repeats, seconds, same, builds, published))


if __name__ == "__main__":
    main()
