"""One sync run through Dagster's Python API, for the CLI, the demo, tests and benchmarks.

The same assets and checks as `dagster dev` shows, materialized in this process with the
resources built from an environment mapping, and the figures read back from the run's
materialization events.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import date
from typing import Any

from dagster import AssetSelection, DagsterInstance, Definitions, define_asset_job

from connectors.clinical_records.catalogue import (
    ALL_ENTITIES,
    DOCUMENTS,
    EntitySet,
    entity,
)
from connectors.clinical_records.errors import ConfigError, ConfigErrors
from connectors.clinical_records.settings import Settings
from pipelines import home, keys
from pipelines.alerts import conclude
from pipelines.assets import build_reference_checks, build_sync_assets
from pipelines.dbt_assets import models_project
from pipelines.documents_asset import CONTENT_KEY, CONTENT_OP
from pipelines.keys import lake_key, table_key
from pipelines.liveness import run_tags
from pipelines.partitions import TENANT_DIMENSION, TENANTS
from pipelines.resources import (
    LakeResource,
    SettledApiResource,
    SyncOptionsResource,
    WarehouseResource,
)
from pipelines.run_record import Place, end_orphans, failed
from pipelines.tenants import Tenant
from pipelines.verdict import (
    CheckOutcome,
    Verdict,
    check_outcomes,
    first_failure,
    kind_and_reason,
    root_failures,
    set_figures,
    values,
    verdict,
)
from pipelines.webhook import Delivery, Webhook, webhook_from_env
from sync.budget import BUDGET_VARIABLE, parse_budget
from sync.state import LOCK_WAIT_SECONDS
from warehouse.dbt_project import Project, project_dir
from warehouse.figures import Figure
from warehouse.publish import working_path
from warehouse.source_guard import refuse_another_source
from warehouse.writer import writing

log = logging.getLogger(__name__)

SUMMARY_COLUMNS: tuple[tuple[str, str], ...] = (  # a load's metadata key, its heading
    ("entity", "entity set"),
    ("mode", "mode"),
    (Figure.ROWS_FETCHED, "fetched"),
    (Figure.ROWS_INSERTED, "inserted"),
    (Figure.ROWS_UPDATED, "updated"),
    (Figure.ROWS_SOFT_DELETED, "deleted"),
    (Figure.ROWS_REJECTED, "rejected"),
    (Figure.RECONCILED, "reconciled"),
    (Figure.LIVE_ROWS, "rows"),
    (Figure.REQUESTS, "requests"),
    (Figure.RECONCILE_REQUESTS, "of which reconciling"),
    (Figure.THROTTLED_429, "429s"),
    (Figure.RETRIES, "retries"),
    (Figure.WAIT_SECONDS, "wait s"),
)


@dataclass
class SyncReport:
    """Per entity set, the load's metadata; and the run as a whole."""

    run_id: str
    success: bool
    seconds: float
    entities: dict[str, dict[str, object]] = field(default_factory=dict)
    checks: list[CheckOutcome] = field(default_factory=list)
    failure: str | None = None
    failure_kind: str | None = None  # the error class underneath, e.g. AuthenticationError
    failure_reason: str | None = None  # its message, for the operator
    failed_steps: list[str] = field(default_factory=list)
    verdict: Verdict | None = None  # exact, not exact or failed: the exit status says which
    alert: Delivery | None = None  # the run's message, when one was sent or tried

    @property
    def exact(self) -> bool:
        return self.verdict is not None and self.verdict.exact

    def failed_checks(self) -> list[CheckOutcome]:
        return [c for c in self.checks if not c.passed]

    def check_lines(self) -> list[str]:
        """One line for the checks that passed, one per check that did not."""
        failed = self.failed_checks()
        lines = [f"checks: {len(self.checks) - len(failed)} of {len(self.checks)} passed"]
        for c in failed:
            figures = ", ".join(f"{k} {v}" for k, v in c.metadata.items())
            lines.append(f"  {c.severity:<5} {c.table}.{c.name}: {figures}")
        return lines

    @property
    def requests(self) -> int:
        return int(sum(float(e.get(Figure.REQUESTS, 0)) for e in self.entities.values()))

    def table(self) -> str:
        """The summary table printed at the end of a sync."""
        rows = [[label for _, label in SUMMARY_COLUMNS]]
        for name, figures in self.entities.items():
            values = {"entity": name, **figures}
            rows.append([_cell(values.get(key, "")) for key, _ in SUMMARY_COLUMNS])
        total = {"entity": "total", Figure.REQUESTS: self.requests}
        rows.append([_cell(total.get(key, "")) for key, _ in SUMMARY_COLUMNS])
        widths = [max(len(r[i]) for r in rows) for i in range(len(SUMMARY_COLUMNS))]
        lines = ["  ".join(_align(r, widths)) for r in rows]
        lines.insert(1, "  ".join("-" * w for w in widths))
        return "\n".join(lines)


def _align(row: list[str], widths: list[int]) -> list[str]:
    """Names left, figures right."""
    return [
        c.ljust(w) if i < 2 else c.rjust(w)
        for i, (c, w) in enumerate(zip(row, widths, strict=True))
    ]


def _cell(value: object) -> str:
    if isinstance(value, float):
        return f"{value:,.1f}" if not value.is_integer() else f"{int(value):,}"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)


@dataclass(frozen=True)
class Checked:
    """A run's configuration, validated and resolved once before it starts, then handed down
    to the run: its settings (a tenant's credentials read from their variables or files once),
    the variables it reads (a tenant's in place of CLINICAL_*) and where alerts go."""

    settings: Settings
    environment: Mapping[str, str] = field(repr=False)
    webhook: Webhook | None = None


def check_configuration(env: Mapping[str, str], tenant: Tenant | None = None) -> Checked:
    """Every setting a run reads, validated before it starts: one ConfigError naming each
    variable that is missing or wrong (the tenant's settings in place of the CLINICAL_*
    variables)."""
    problems: list[ConfigError] = []
    settings, webhook = None, None
    try:
        if tenant is not None:
            environment, settings = tenant.resolved(env)
        else:
            environment, settings = env, Settings.from_env(env)
        parse_budget(env.get(BUDGET_VARIABLE), settings.rate_limit)
    except ConfigError as error:
        problems.extend(error.problems if isinstance(error, ConfigErrors) else [error])
    try:
        webhook = webhook_from_env(env)
    except ConfigError as error:
        problems.append(error)
    try:
        project_dir(env)
    except ConfigError as error:
        problems.append(error)
    if problems or settings is None:
        raise ConfigError.combine(problems)
    return Checked(settings, environment, webhook)


def resources_from_env(
    env: Mapping[str, str],
    lake_root: str,
    warehouse_path: str,
    tenant: Tenant | None = None,
    checked: Checked | None = None,
    **options: object,
) -> dict[str, object]:
    """Resources for an in-process run of the configuration `check_configuration` accepted
    (checked now when not given): its settings handed to the run as resolved, a tenant's
    lake and warehouse those of its entry."""
    checked = checked or check_configuration(env, tenant)
    return {
        "clinical_api": SettledApiResource.holding(checked.settings),
        "lake": LakeResource(root=str(tenant.lake if tenant else lake_root)),
        "warehouse": WarehouseResource(path=str(tenant.warehouse if tenant else warehouse_path)),
        "sync_options": SyncOptionsResource(
            **{"nightly_budget": env.get(BUDGET_VARIABLE) or None, **options}  # type: ignore[arg-type]
        ),
    }


def resolve(names: Sequence[str]) -> list[EntitySet]:
    """Entity sets by the spec's name or table name; ConfigError for an unknown one."""
    chosen = []
    for name in names:
        try:
            found = entity(name)
        except KeyError:
            known = ", ".join(e.name for e in ALL_ENTITIES)
            raise ConfigError("--only", f"entity sets among: {known}") from None
        chosen.append(found)
    return chosen


def selection(only: Sequence[EntitySet]) -> AssetSelection:
    """The chosen sets' extraction and load, and the analytics models downstream of them."""
    if not only:
        return AssetSelection.all()
    wanted = [k for e in only for k in (lake_key(e), table_key(e))]
    chosen = AssetSelection.assets(*wanted)
    return chosen | AssetSelection.assets(*[table_key(e) for e in only]).downstream(
        include_self=False
    )


@functools.cache
def sync_definitions(
    *, partitioned: bool, read_rotation: int = 0, project: Project | None = None
) -> tuple[Any, ...]:
    """The assets and checks a sync materializes, built once per process (and by `sync
    --all-tenants` before it forks): every run of the process uses the same definitions, only
    its resources and partition differ. `read_rotation`: the family the reads start at
    (`assets.read_order`); `project`: the dbt project of the models (`dbt_assets.models_project`)."""
    assets = build_sync_assets(
        TENANTS if partitioned else None, read_rotation=read_rotation, project=project
    )
    return (*assets, *build_reference_checks())


def sync(
    env: Mapping[str, str],
    *,
    lake_root: str,
    warehouse_path: str,
    full: bool = False,
    only: Sequence[str] = (),
    backfill_from: date | None = None,
    backfill_to: date | None = None,
    force_source: bool = False,
    instance: DagsterInstance | None = None,
    tags: Mapping[str, str] | None = None,
    log_level: str = "INFO",
    tenant: Tenant | None = None,
    checked: Checked | None = None,
    read_rotation: int = 0,
    say: Callable[[str], object] = log.warning,
) -> SyncReport:
    """Materialize the selected assets (and their checks) once; return what each set did.
    With `tenant`, its partition of the tenant-partitioned assets (its lake and warehouse).
    A run that failed or ended not exact sends its one message to CLINICAL_ALERT_WEBHOOK
    (`pipelines/alerts.py`: this process concludes the runs it executes). `checked`: what
    `check_configuration` answered, when the caller checked the configuration first.
    `read_rotation`: the family its reads start at (`sync --all-tenants`: each tenant its
    place in the file). The run holds the warehouse's writer lock from before its first
    step to its row in ops.sync_runs (`say` hears that it waits for another writer), and is
    refused before any step and any request (SourceMismatch, WarehouseLocked) when the
    warehouse or lake holds another source's data or another writer keeps it past the wait."""
    options: dict[str, object] = {"full": full, "force_source": force_source}
    if backfill_from is not None:
        options["backfill_from"] = backfill_from.isoformat()
    if backfill_to is not None:
        options["backfill_to"] = backfill_to.isoformat()
    checked = checked or check_configuration(env, tenant)
    webhook = checked.webhook
    resources = resources_from_env(env, lake_root, warehouse_path, tenant, checked, **options)
    job = keys.FULL_JOB if full else keys.NIGHTLY_JOB
    job = keys.BACKFILL_JOB if backfill_from is not None else job
    place = _place(checked, lake_root, warehouse_path, tenant)
    project = models_project(env, tenant.warehouse if tenant else warehouse_path)
    what = f"clinical-sync {job}"
    with (
        home.own_instance(instance) as instance,
        writing(working_path(warehouse_path), wait=LOCK_WAIT_SECONDS, what=what, say=say),
    ):
        if tenant and tenant.name not in instance.get_dynamic_partitions(TENANT_DIMENSION):
            instance.add_dynamic_partitions(TENANT_DIMENSION, [tenant.name])
        if not force_source and place.source is not None:
            refuse_another_source(warehouse_path, lake_root, *place.source)
        end_orphans(instance, place, tenant.file if tenant else None, webhook, say=say)
        started = time.monotonic()
        result = _materialize(
            job,
            sync_definitions(
                partitioned=tenant is not None, read_rotation=read_rotation, project=project
            ),
            resources,
            log_level=log_level,
            instance=instance,
            tags=tags or {},
            selection=selection(resolve(only)),
            partition_key=tenant.name if tenant else None,
        )
        report = SyncReport(result.run_id, result.success, round(time.monotonic() - started, 2))
        loaded = set_figures(result.all_events)
        report.entities = {e.name: loaded[e.table] for e in ALL_ENTITIES if e.table in loaded}
        report.checks = check_outcomes(result.all_events)
        report.failure = _failure(result, place, instance)
        failures = root_failures(result.all_events)
        report.failed_steps = [step for step, _ in failures]
        if failures:
            report.failure_kind, report.failure_reason = kind_and_reason(failures[0][1])
        report.verdict, report.alert = _conclude(
            result, job, warehouse_path, webhook, instance, tenant.name if tenant else None
        )
    return report


def _place(checked: Checked, lake_root: str, warehouse_path: str, tenant: Tenant | None) -> Place:
    """Where this run writes, and the source it reads, as checked (a tenant's credentials
    are not read again)."""
    source = (checked.settings.base_url, checked.settings.customer)
    return Place(warehouse_path, lake_root, source, tenant.name if tenant else None)


def _conclude(
    result: Any,
    job: str,
    warehouse_path: str,
    webhook: Webhook | None,
    instance: DagsterInstance | None,
    tenant: str | None,
) -> tuple[Verdict, Delivery | None]:
    """How the run ended, and its message when it failed or is not exact: this process
    executed it, so this process tells (the daemon's sensors leave it alone)."""
    ending = verdict(result.run_id, job, result.success, result.all_events)
    delivery = conclude(
        ending, warehouse=warehouse_path, webhook=webhook, instance=instance, tenant=tenant
    )
    return ending, delivery


@dataclass
class DocumentsRun:
    run_id: str
    success: bool
    figures: dict[str, object]
    failure: str | None = None
    verdict: Verdict | None = None
    alert: Delivery | None = None


def sync_documents(
    env: Mapping[str, str],
    *,
    lake_root: str,
    warehouse_path: str,
    full: bool = False,
    content: bool = False,
    instance: DagsterInstance | None = None,
    log_level: str = "INFO",
    say: Callable[[str], object] = log.warning,
) -> DocumentsRun:
    """The `documents_sync` job once: the documents read in the patients' pages, loaded, their
    files fetched when `content`, published; the warehouse's writer lock held throughout
    and another source refused before any step, as `sync` does."""
    checked = check_configuration(env)
    webhook = checked.webhook
    place = _place(checked, lake_root, warehouse_path, None)
    what = "clinical-sync documents sync"
    with (
        home.own_instance(instance) as instance,
        writing(working_path(warehouse_path), wait=LOCK_WAIT_SECONDS, what=what, say=say),
    ):
        if place.source is not None:
            refuse_another_source(warehouse_path, lake_root, *place.source)
        end_orphans(instance, place, None, webhook, say=say)
        result = _materialize(
            keys.DOCUMENTS_JOB,
            build_sync_assets(project=models_project(env, warehouse_path)),
            resources_from_env(env, lake_root, warehouse_path, checked=checked, full=full),
            log_level=log_level,
            instance=instance,
            tags={"clinical-sync/command": "documents sync"},
            selection=AssetSelection.assets(
                lake_key(DOCUMENTS), table_key(DOCUMENTS), CONTENT_KEY, keys.PUBLISHED_KEY
            ),
            ops={CONTENT_OP: {"config": {"download_content": content}}},
        )
        figures: dict[str, object] = {}
        for event in result.get_asset_materialization_events():
            figures.update(values(event.materialization.metadata))
        failure = _failure(result, place, instance)
        ending, delivery = _conclude(
            result, keys.DOCUMENTS_JOB, warehouse_path, webhook, instance, None
        )
    return DocumentsRun(result.run_id, result.success, figures, failure, ending, delivery)


def _materialize(
    job: str,
    assets: Sequence[Any],
    resources: Mapping[str, object],
    *,
    log_level: str,
    instance: DagsterInstance | None,
    tags: Mapping[str, str],
    selection: AssetSelection | None = None,
    ops: Mapping[str, object] | None = None,
    partition_key: str | None = None,
):
    """One in-process run under the name of the job it stands for (so the UI lists it on that
    job's page), as the CLI makes them: its log level, liveness tags, no raising."""
    run_config: dict[str, object] = {"loggers": {"console": {"config": {"log_level": log_level}}}}
    if ops:
        run_config["ops"] = dict(ops)
    defs = Definitions(
        assets=assets,
        jobs=[define_asset_job(job, selection=selection or AssetSelection.all())],
        resources=resources,
    )
    return defs.resolve_job_def(job).execute_in_process(
        run_config=run_config,
        instance=instance,
        tags={**run_tags(), **tags},
        raise_on_error=False,
        partition_key=partition_key,
    )


def _failure(result: Any, place: Place, instance: DagsterInstance) -> str | None:
    """A failed run's first error, recorded in ops.sync_runs as the sensor records UI runs."""
    if result.success:
        return None
    failure = first_failure(result.all_events)
    failed(instance, result.run_id, place, failure)
    return failure
