"""The analytics models, built by dbt on a warehouse file: which models a load has made stale,
their build (in this process, `warehouse/dbt_project.py`), and what was built and what failed
(`ops.models`), so that a model older than the tables it reads says so
(`analytics.model_health`, `status`).

`build` is the one entry point: the Dagster step calls it after a run's loads, `rebuild` and
the benchmarks call it without Dagster. A model is stale when its table is missing, was built
from other SQL, or is older than the schema or than the last change (`analytics.changes`) of
a set it reads, directly or through the models it refs; a model downstream of a stale one is
stale too. A model that fails keeps its last table, marked failed; the others are built.

Tables, not views: most id families are text as sent (docs/ARCHITECTURE.md, Canonical types),
and DuckDB joins text keys at several times the cost of dense integers. Built once a run, the
joins cost the nightly a fraction of a second and an analyst's query reads one table
(BENCHMARKS.md, key_types).
"""

from __future__ import annotations

import logging
import re
import tempfile
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import duckdb

from connectors.clinical_records.catalogue import BY_TABLE
from warehouse import dbt_project, ops
from warehouse.connection import Transaction
from warehouse.dbt_project import DEFAULT_PROJECT, Project
from warehouse.ddl import ANALYTICS, CHANGES_TABLE, CLINICAL, MODEL_HEALTH_VIEW
from warehouse.ident import qualified
from warehouse.load import Warehouse

log = logging.getLogger(__name__)

MODELS = qualified("ops", "models")
ERROR_KIND = re.compile(r"\b([A-Z][a-z]*(?: of| [A-Z][a-z]*)* Error):")  # "Binder Error: ..."
DBT_KIND = re.compile(r"\b([A-Z][A-Za-z]* Error) in ")  # dbt's own: "Compilation Error in ..."
FAILED_STATUSES = {"error", "fail", "runtime error", "skipped"}
OUT_OF_MEMORY = "build failed: Out of Memory Error"
NOT_BUILT = "not built: a model it reads failed"


@dataclass(frozen=True)
class Model:
    """A dbt model whose table the warehouse holds."""

    unique_id: str
    name: str  # its table's name
    relation: str  # its table, as dbt names it ("catalog"."schema"."name")
    selector: str  # its fully qualified name, for dbt's --select
    checksum: str  # dbt's checksum of its SQL
    reads: tuple[str, ...]  # the entity sets whose clinical tables it reads, through refs too
    upstream: tuple[str, ...]  # the models it refs (unique ids)
    description: str


def models(manifest: Mapping[str, Any]) -> list[Model]:
    """Every model of a manifest (as `manifest.json` holds it) that builds a table or view."""
    nodes = manifest["nodes"]
    sets = {
        uid: BY_TABLE[s["identifier"]].name
        for uid, s in manifest["sources"].items()
        if s["schema"] == CLINICAL and s["identifier"] in BY_TABLE
    }

    def reads(uid: str, seen: frozenset[str] = frozenset()) -> set[str]:
        found: set[str] = set()
        for parent in nodes[uid]["depends_on"]["nodes"]:
            if parent in sets:
                found.add(sets[parent])
            elif parent in nodes and parent not in seen:
                found |= reads(parent, seen | {uid})
        return found

    out = []
    for uid, node in nodes.items():
        if node["resource_type"] != "model" or node["config"]["materialized"] == "ephemeral":
            continue
        out.append(
            Model(
                unique_id=uid,
                name=node["alias"] or node["name"],
                relation=node["relation_name"],
                selector=".".join(node["fqn"]),
                checksum=node["checksum"]["checksum"],
                reads=tuple(sorted(reads(uid))),
                upstream=tuple(p for p in node["depends_on"]["nodes"] if p.startswith("model.")),
                description=node.get("description") or "",
            )
        )
    return out


SOURCE_CALL = re.compile(r"\{\{\s*source\('(\w+)',\s*'(\w+)'\)\s*\}\}")
REF_CALL = re.compile(r"\{\{\s*ref\('(\w+)'\)\s*\}\}")
INCREMENTAL_ONLY = re.compile(
    r"\{%-?\s*if is_incremental\(\)\s*-?%\}.*?\{%-?\s*endif\s*-?%\}", re.S
)


def select_sql(manifest: Mapping[str, Any], model: Model) -> str:
    """A model's SELECT with its source() and ref() calls resolved to the warehouse's tables:
    transform/'s models call nothing else. For a test or a benchmark that runs a model's
    query beside its table, or builds it as a view; dbt builds the tables. An incremental
    model's SELECT is its whole build's (its `is_incremental()` blocks left out)."""
    raw = INCREMENTAL_ONLY.sub("", manifest["nodes"][model.unique_id]["raw_code"])
    raw = SOURCE_CALL.sub(lambda m: f'"{m[1]}"."{m[2]}"', raw)
    return REF_CALL.sub(lambda m: f'"{ANALYTICS}"."{m[1]}"', raw)


def stale(
    con: duckdb.DuckDBPyConnection, found: Sequence[Model], record: BuildRecord | None = None
) -> list[Model]:
    """The models a build must make: missing, other SQL, older than the schema or than a
    change to a set they read, or downstream of such a model."""
    record = record or BuildRecord(con)
    oldest = min((at for _, at in record.built.values() if at is not None), default=None)
    changed: dict[str, datetime] = dict(
        con.execute(
            f"SELECT entity, max(synced_at) FROM {qualified(ANALYTICS, CHANGES_TABLE)} "
            "WHERE synced_at > ? GROUP BY entity",
            [oldest],
        ).fetchall()
        if oldest is not None
        else []
    )
    by_id = {m.unique_id: m for m in found}
    verdicts: dict[str, bool] = {}

    def is_stale(model: Model) -> bool:
        if model.unique_id not in verdicts:
            at = record.built.get(model.name, (None, None))[1]
            verdicts[model.unique_id] = (
                record.altered(model)
                or any(changed.get(e, at) > at for e in model.reads)
                or any(is_stale(by_id[u]) for u in model.upstream if u in by_id)
            )
        return verdicts[model.unique_id]

    return [m for m in found if is_stale(m)]


class BuildRecord:
    """What ops.models and the analytics schema say of the models' last builds."""

    def __init__(self, con: duckdb.DuckDBPyConnection) -> None:
        self.built: dict[str, tuple[str | None, datetime | None]] = {
            name: (checksum, at)
            for name, checksum, at in con.execute(
                f'SELECT "name", "fingerprint", "built_at" FROM {MODELS}'
            ).fetchall()
        }
        self.tables = {
            row[0]
            for row in con.execute(
                "SELECT table_name FROM duckdb_tables() WHERE schema_name = ?", [ANALYTICS]
            ).fetchall()
        }
        self.schema = ops.schema_applied_at(con)

    def altered(self, model: Model) -> bool:
        """Never built, built from other SQL, its table gone, or older than the schema."""
        checksum, at = self.built.get(model.name, (None, None))
        return (
            at is None
            or checksum != model.checksum
            or model.name not in self.tables
            or (self.schema is not None and self.schema > at)
        )

    def built_whole(self, todo: Sequence[Model]) -> bool:
        """Whether a build of `todo` must make every model whole (dbt's --full-refresh): one
        of them is altered, so an incremental model's rows cannot be made from the changes
        since its last build alone."""
        return any(self.altered(m) for m in todo)


@dataclass
class Built:
    """What a build did: per model its rows (built) or what failed; the tests' results."""

    built: dict[str, int] = field(default_factory=dict)
    failed: dict[str, str] = field(default_factory=dict)  # model -> what failed (no values)
    warned: dict[str, str] = field(default_factory=dict)  # test -> what it found (severity warn)
    reused: list[str] = field(default_factory=list)  # fresh, left as they were
    seconds: float = 0.0
    cpu_seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return not self.failed

    def summary(self) -> str:
        parts = [f"{len(self.built)} built", f"{len(self.reused)} fresh"]
        if self.failed:
            parts.append("failed: " + "; ".join(f"{m} ({w})" for m, w in self.failed.items()))
        return ", ".join(parts)


def build(
    warehouse: str | Path,
    project: Project | None = None,
    *,
    only: Iterable[str] | None = None,
    run_id: str | None = None,
    on_event: Callable[[Any], None] | None = None,
    wait: float = 0.0,
    lock: str | Path | None = None,
) -> Built:
    """Build the stale models of `project` (default: transform/) on the warehouse file, in
    this process: its lock held throughout (dbt's connection joins this one; `lock`: as
    `Warehouse` takes it), each model's outcome recorded in ops.models. `only`: the names of
    the models to consider."""
    path = Path(warehouse)
    database = dbt_project.catalog(path)
    if project is None or project.database != database:  # dbt names relations by catalog
        project = dbt_project.prepare(
            project.path if project else DEFAULT_PROJECT, database=database
        )
    found = models(dbt_project.manifest_json(project))
    if only is not None:
        wanted = set(only)
        found = [m for m in found if m.name in wanted]
    started, cpu = time.monotonic(), time.process_time()
    with Warehouse(path, wait=wait, lock=lock) as wh:
        wh.ensure_schema()
        record = BuildRecord(wh.con)
        todo = stale(wh.con, found, record)
        done = Built(reused=[m.name for m in found if m not in todo])
        if todo:
            whole = record.built_whole(todo)
            _outcomes(done, todo, _run(project, path, todo, on_event, whole))
            if OUT_OF_MEMORY in done.failed.values():
                _again_on_one_thread(wh, project, todo, done, on_event, whole)
            _record(wh.con, todo, done, run_id)
    done.seconds = round(time.monotonic() - started, 3)
    done.cpu_seconds = round(time.process_time() - cpu, 3)
    return done


def _again_on_one_thread(
    wh: Warehouse,
    project: Project,
    todo: Sequence[Model],
    done: Built,
    on_event: Callable[[Any], None] | None,
    whole: bool,
) -> None:
    """The models that ran out of memory (and those that read them) built again on one
    thread: DuckDB's hash joins and aggregates hold state per thread, so one thread needs
    less under the same cap and spills what does not fit. A slower build, not a failed
    night. dbt's connection joins this one, whose DuckDB settings it shares."""
    again = [m for m in todo if done.failed.get(m.name) in (OUT_OF_MEMORY, NOT_BUILT)]
    log.warning(
        "models out of memory under %s: %s built again on one thread",
        wh.memory_limit,
        ", ".join(m.name for m in again),
    )
    for model in again:
        del done.failed[model.name]
    (threads,) = wh.con.execute("SELECT current_setting('threads')").fetchone()
    wh.con.execute("SET threads = 1")
    try:
        _outcomes(done, again, _run(project, wh.path, again, on_event, whole))
    finally:
        wh.con.execute(f"SET threads = {int(threads)}")


def _run(
    project: Project,
    path: Path,
    todo: Sequence[Model],
    on_event: Callable[[Any], None] | None,
    whole: bool,
) -> list[Any]:
    """`dbt build` of these models and their tests (`whole`: incremental ones rebuilt whole);
    dbt's result per node."""
    profiles = dbt_project.write_profile(path.parent / "dbt", path)
    args = [
        "build",
        *project.arguments(profiles),
        "--no-write-json",  # run_results.json and the manifest again: a second per build
        *(["--full-refresh"] if whole else []),
        "--select",
        *(m.selector for m in todo),
    ]
    try:
        result = dbt_project.runner(project.manifest(), on_event).invoke(args)
    finally:
        dbt_project.release()
    if result.result is None:  # dbt failed before it ran a node (a broken profile, say)
        raise dbt_project.DbtFailed(f"dbt build failed: {result.exception}")
    return list(result.result.results)


def _outcomes(done: Built, todo: Sequence[Model], results: Sequence[Any]) -> None:
    """Each model built or failed (its build, or a test of severity error on it), without
    any value a DuckDB message may quote: that message goes to the log."""
    by_id = {m.unique_id: m for m in todo}
    for r in results:
        node, status = r.node, str(r.status)
        if node.unique_id in by_id:
            model = by_id[node.unique_id]
            if status in FAILED_STATUSES:
                done.failed[model.name] = _failure(status, r.message)
                log.error("dbt model %s: %s", model.name, r.message)
            else:
                done.built[model.name] = 0
        elif node.resource_type == "test":
            tested = [by_id[u].name for u in node.depends_on.nodes if u in by_id]
            what = f"test {node.name}: {r.failures} rows" if r.failures else f"test {node.name}"
            if status in ("fail", "error"):
                log.error("dbt %s on %s: %s", what, ", ".join(tested), r.message)
                for name in tested:
                    done.failed[name] = "; ".join(filter(None, [done.failed.get(name), what]))
            elif status == "warn":
                done.warned[node.name] = what


def _failure(status: str, message: str | None) -> str:
    if status == "skipped":
        return NOT_BUILT
    kind = ERROR_KIND.search(message or "") or DBT_KIND.search(message or "")
    return f"build failed: {kind.group(1) if kind else 'dbt error'}"


def _record(
    con: duckdb.DuckDBPyConnection, todo: Sequence[Model], done: Built, run_id: str | None
) -> None:
    """ops.models: each model built (its rows counted) and each failure, in one transaction."""
    for model in todo:
        if model.name in done.built:
            (done.built[model.name],) = con.execute(
                f"SELECT count(*) FROM {model.relation}"
            ).fetchone()
    with Transaction(con):
        for model in todo:
            con.execute(
                f"""INSERT INTO {MODELS} ("name", "reads") SELECT ?, ?
                    WHERE NOT EXISTS (SELECT 1 FROM {MODELS} WHERE "name" = ?)""",
                [model.name, list(model.reads), model.name],
            )
            if model.name in done.built:
                con.execute(
                    f"""UPDATE {MODELS} SET "fingerprint" = ?, "built_at" = now(), "rows" = ?,
                            "reads" = ?, "built_run_id" = ? WHERE "name" = ?""",
                    [model.checksum, done.built[model.name], list(model.reads), run_id, model.name],
                )
            if model.name in done.failed:
                con.execute(
                    f"""UPDATE {MODELS} SET "failed_at" = now(), "failed_run_id" = ?,
                            "failure" = ? WHERE "name" = ?""",
                    [run_id, done.failed[model.name], model.name],
                )


def failed_in(con: duckdb.DuckDBPyConnection, run_id: str) -> dict[str, str]:
    """The models whose build in run `run_id` failed and were not built since: what failed."""
    rows = con.execute(
        f"""SELECT "name", "failure" FROM {MODELS} WHERE "failed_run_id" = ?
            AND ("built_at" IS NULL OR "failed_at" > "built_at") ORDER BY "name" """,
        [run_id],
    ).fetchall()
    return dict(rows)


@dataclass(frozen=True)
class Health:
    """A model's table as `analytics.model_health` tells it (what `status` shows)."""

    name: str
    built_at: datetime | None
    rows: int | None
    stale: bool
    changed_since_built: tuple[str, ...]
    failed_at: datetime | None
    failure: str | None

    @property
    def failing(self) -> bool:
        """Its last build (or a test of severity error) failed after its last good build."""
        return self.failed_at is not None and (
            self.built_at is None or self.failed_at > self.built_at
        )


def health(path: str | Path) -> list[Health]:
    """Every model's health in a warehouse file (read-only); none in a file without the view."""
    with Warehouse(path, read_only=True) as wh:
        if not wh.con.execute(
            "SELECT count(*) FROM duckdb_views() WHERE schema_name = ? AND view_name = ?",
            [ANALYTICS, MODEL_HEALTH_VIEW],
        ).fetchone()[0]:
            return []
        rows = wh.con.execute(
            "SELECT name, built_at, rows, stale, changed_since_built, failed_at, failure "
            f"FROM {qualified(ANALYTICS, MODEL_HEALTH_VIEW)} ORDER BY name"
        ).fetchall()
    return [Health(n, b, r, s, tuple(c), fa, f) for n, b, r, s, c, fa, f in rows]


def warm_up(project: Project) -> None:
    """The models built once on an empty scratch warehouse of the project's catalog name. A
    process's first build costs dbt about three times a later one (its macros compiled, its
    serializers generated: 3.1 against 1.1 CPU s, measured on two loaded cores), so a process
    about to fork its tenants' runs pays it once for all of them."""
    with tempfile.TemporaryDirectory(prefix="clinical-models-") as folder:  # 0700
        build(Path(folder) / f"{project.database}.duckdb", project)
