"""The analytics models: each `warehouse/sql/NN_name.sql` is one SELECT over `clinical`,
built as the table `analytics.<name>` after a run's loads, so analysts read joined rows.

Tables, not views: most id families are text as sent (docs/ARCHITECTURE.md, Canonical
types), and DuckDB joins text keys at several times the cost of dense integers. Built once
a run, the joins cost the nightly a few seconds and an analyst's query reads one table
(BENCHMARKS.md, key_types). A table is as fresh as its last build: `refresh` builds every
model in the caller's transaction and records it in `ops.models`; `stale` names the models
a load, a schema change or new SQL has overtaken, so that a publication never copies
models older than the clinical tables beside them (warehouse/publish.py).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence
from dataclasses import dataclass
from importlib import resources

import duckdb

from connectors.clinical_records.catalogue import BY_TABLE, EntitySet
from warehouse import ops
from warehouse.ddl import ANALYTICS, DDL_OWNED
from warehouse.ident import literal, qualified

FILE_RE = re.compile(r"^[0-9]+_(\w+)\.sql$")
TABLE_RE = re.compile(r'"?clinical"?\."?(\w+)"?', re.IGNORECASE)
COMMENT_RE = re.compile(r"^\s*--\s?(.*)$")


@dataclass(frozen=True)
class Model:
    name: str  # the table analytics.<name>
    description: str  # the SQL's first comment sentence: the table's COMMENT and the UI's text
    sql: str  # one SELECT over clinical.*
    sources: tuple[EntitySet, ...]  # the sets it reads

    @property
    def fingerprint(self) -> str:
        return hashlib.sha256(self.sql.encode()).hexdigest()


def parse(file_name: str, sql: str) -> Model:
    named = FILE_RE.match(file_name)
    if named is None:
        raise ValueError(f"an analytics model's file is named NN_<name>.sql, not {file_name!r}")
    body = sql.strip().rstrip(";").strip()
    if not body:
        raise ValueError(f"{file_name}: an analytics model is one SELECT, and this is empty")
    tables = dict.fromkeys(m.group(1) for m in TABLE_RE.finditer(body))
    comments = [m.group(1) for line in body.splitlines() if (m := COMMENT_RE.match(line))]
    name = named.group(1)
    return Model(
        name,
        _first_sentence(comments) or f"analytics.{name}",
        body,
        tuple(BY_TABLE[t] for t in tables if t in BY_TABLE),
    )


def _first_sentence(comments: list[str]) -> str:
    """The comment's first sentence, however many lines it wraps over (the UI shows it)."""
    taken: list[str] = []
    for line in comments:
        taken.append(line.strip())
        if line.rstrip().endswith("."):
            break
    return " ".join(taken)


def models() -> list[Model]:
    """Every model in `warehouse/sql`, in the order the warehouse builds them."""
    folder = resources.files("warehouse") / "sql"
    scripts = sorted((p for p in folder.iterdir() if p.name.endswith(".sql")), key=str)
    return [parse(p.name, p.read_text(encoding="utf-8")) for p in scripts]


def refresh(con: duckdb.DuckDBPyConnection, found: Sequence[Model]) -> dict[str, int]:
    """Build every model as its table, in the caller's transaction, and record the builds;
    the analytics schema then holds exactly these tables and the DDL's own views (a view of
    an older version, or a model since removed, is dropped). Returns the rows of each."""
    names = {m.name for m in found}
    held = con.execute(
        "SELECT view_name, 'VIEW' FROM duckdb_views() WHERE schema_name = ? "
        "UNION ALL SELECT table_name, 'TABLE' FROM duckdb_tables() WHERE schema_name = ?",
        [ANALYTICS, ANALYTICS],
    ).fetchall()
    for name, kind in held:
        if name in DDL_OWNED:
            continue
        if kind == "VIEW" or name not in names:
            con.execute(f"DROP {kind} {qualified(ANALYTICS, name)}")
    rows: dict[str, int] = {}
    for model in found:
        target = qualified(ANALYTICS, model.name)
        built = con.execute(f"CREATE OR REPLACE TABLE {target} AS\n{model.sql}").fetchone()
        (rows[model.name],) = built  # CREATE TABLE AS answers with the rows it wrote
        con.execute(f"COMMENT ON TABLE {target} IS {literal(model.description)}")
    ops.record_models(con, [(m.name, m.fingerprint, rows[m.name]) for m in found])
    return rows


def stale(con: duckdb.DuckDBPyConnection, found: Sequence[Model]) -> list[str]:
    """The models whose table is missing, was built from other SQL, or is older than the
    last load of a set it reads or the last change of the schema. None in a file without
    the ops tables this reads (not a warehouse a sync set up, or one whose analytics are an
    older version's views, which are never stale)."""
    if not ops.holds(con, "models", "sync_state", "schema_version"):
        return []
    built, loaded, schema = ops.models_built(con), ops.last_loads(con), ops.schema_applied_at(con)
    out = []
    for model in found:
        fingerprint, at = built.get(model.name, (None, None))
        changes = [loaded.get(e.name) for e in model.sources] + [schema]
        if fingerprint != model.fingerprint or any(t is not None and t > at for t in changes):
            out.append(model.name)
    return out
