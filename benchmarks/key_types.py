"""What issue 29's typing rule costs the analytics joins, at scale 50.

The same records, made in SQL at the sandbox's scale-50 sizes (ids are the numbers the
default profile sends), go into two warehouse files with the DDL of each rule, and the
`analytics.*` views of warehouse/sql are queried on both in turns in this one run:
- before (main until issue 29): an id family that is a number anywhere is BIGINT, decimals
  DECIMAL(18,4);
- after: such families VARCHAR (the decimal text of the same numbers), DECIMAL(38,12);
- and between them, to tell the two apart: VARCHAR ids with DECIMAL(18,4).

Each query is a full aggregate over one view (every join of it runs); the figure is the
median of `--repeats` runs, the ratio after / before.

Run: nice .venv/bin/python benchmarks/key_types.py [--scale 50] [--repeats 7]
Target: the rule costs the joins little (ratio near 1; under 1.5).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from importlib import resources
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import duckdb

from benchmarks.common import record
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
from warehouse.ident import literal, qualified, quote

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


def before(fld: Field) -> str:
    """The type main gave a field before issue 29."""
    if fld.key is not None and fld.key in NUMERIC_KEYS:
        return "BIGINT"
    if fld.type is Edm.DECIMAL:
        return "DECIMAL(18,4)"
    return fld.canonical.value


def keys_only(fld: Field) -> str:
    """Today's ids, yesterday's decimals: what the ids alone cost."""
    return "DECIMAL(18,4)" if fld.type is Edm.DECIMAL else fld.canonical.value


def after(fld: Field) -> str:
    return fld.canonical.value


RULES: dict[str, Callable[[Field], str]] = {
    "before": before,
    "ids_only": keys_only,
    "after": after,
}


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
    """A warehouse file with the views: the sets the views read, typed by `rule`."""
    sizes = {e.name: size_of(e, scale) for e in ENTITY_SETS}
    with duckdb.connect(str(path)) as con:
        for schema in (ddl.CLINICAL, ddl.ANALYTICS):
            con.execute(f"CREATE SCHEMA {quote(schema)}")
        for entity in ENTITY_SETS:
            if entity.name in ("Appointments", "AppointmentTypes"):
                continue  # the views never read them
            columns = ", ".join(
                f"CAST({value(entity, f, sizes)} AS {rule(f)}) AS {quote(f.name)}"
                for f in entity.fields
            )
            con.execute(
                f"CREATE TABLE {qualified(ddl.CLINICAL, entity.table)} AS SELECT {columns}, "
                'CAST(NULL AS TIMESTAMPTZ) AS "_deleted_at" '
                f"FROM range(1, {sizes[entity.name] + 1}) AS r(i)"
            )
        for name in ("Appointments", "AppointmentTypes"):  # broken_references names them
            entity = next(e for e in ENTITY_SETS if e.name == name)
            columns = ", ".join(
                f"CAST(NULL AS {rule(f)}) AS {quote(f.name)}" for f in entity.fields
            )
            con.execute(
                f"CREATE TABLE {qualified(ddl.CLINICAL, entity.table)} AS SELECT {columns}, "
                'CAST(NULL AS TIMESTAMPTZ) AS "_deleted_at" WHERE false'
            )
        folder = resources.files("warehouse") / "sql"
        for script in sorted(p for p in folder.iterdir() if p.name.endswith(".sql")):
            con.execute(script.read_text(encoding="utf-8"))
        con.execute("CHECKPOINT")


def timed(con: duckdb.DuckDBPyConnection, sql: str) -> tuple[float, list[tuple]]:
    started = time.perf_counter()
    rows = con.execute(sql).fetchall()
    return time.perf_counter() - started, rows


def measure(
    root: Path, scale: float, repeats: int
) -> tuple[dict[str, dict[str, list[float]]], dict[str, dict[str, list[tuple]]]]:
    """Per rule and view, the seconds of each run and the answer."""
    paths = {name: root / f"{name}.duckdb" for name in RULES}
    for name, rule in RULES.items():
        build(paths[name], rule, scale)
    cons = {name: duckdb.connect(str(p), read_only=True) for name, p in paths.items()}
    seconds: dict[str, dict[str, list[float]]] = {n: {q: [] for q in QUERIES} for n in RULES}
    answers: dict[str, dict[str, list[tuple]]] = {n: {} for n in RULES}
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scale", type=float, default=50)
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        seconds, answers = measure(Path(tmp), args.scale, args.repeats)
    same = all(answers[n] == answers["before"] for n in RULES)  # the same records, linked alike
    medians = {n: {q: statistics.median(s) for q, s in qs.items()} for n, qs in seconds.items()}
    totals = {n: sum(m.values()) for n, m in medians.items()}
    print(f"scale {args.scale:g}, median of {args.repeats} runs per query, seconds")
    print(f"{'view':28} {'before':>8} {'ids only':>9} {'after':>8} {'after/before':>13}")
    for query in QUERIES:
        b, k, a = (medians[n][query] for n in RULES)
        print(f"{query:28} {b:8.3f} {k:9.3f} {a:8.3f} {a / b:13.2f}")
    b, k, a = (totals[n] for n in RULES)
    print(f"{'all four':28} {b:8.3f} {k:9.3f} {a:8.3f} {a / b:13.2f}")
    print(f"ids only / before: {k / b:.2f}; the three give the same answers: {same}")
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    print(f"load average while measured (1, 5, 15 min): {load} on {os.cpu_count()} cores")
    record(
        "key_types",
        {
            "scale": args.scale,
            "repeats": args.repeats,
            "seconds": {n: {q: round(v, 4) for q, v in m.items()} for n, m in medians.items()},
            "total_seconds": {n: round(v, 4) for n, v in totals.items()},
            "ratio_after_before": round(a / b, 3),
            "ratio_ids_only_before": round(k / b, 3),
            "same_answers": same,
            "load_average": [round(x, 1) for x in os.getloadavg()],
        },
    )


if __name__ == "__main__":
    main()
