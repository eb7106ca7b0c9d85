"""One message per run that failed or ended not exact, to CLINICAL_ALERT_WEBHOOK.

Who sends: the process that ran the run. The sensors below, which the daemon evaluates, for
the runs the deployment launched (the schedule, the UI); `clinical-sync sync` for the run it
executes in process. The sensors leave alone the runs `clinical-sync` executes itself (they
carry its process id, `liveness.PID_TAG`; Dagster's run-status sensors do not even see them,
as such a run belongs to no code location). A tag on the run, `clinical-sync/alert`, is
written before the message is sent, so a second look at the same run (a sensor evaluated
again after a restart) sends nothing: at most one message per run.

A message names the warehouse (and the tenant, when given), the run, each set that is not
exact with the checks that failed and its figures, or the step that failed and why: never a
secret, a token, a record or a URL. Every finished run is also tagged `clinical-sync/exact`,
so the Dagster UI's run list shows it at a glance.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from typing import Any

from dagster import (
    DagsterInstance,
    DagsterRunStatus,
    DefaultSensorStatus,
    RunStatusSensorContext,
    run_failure_sensor,
    run_status_sensor,
)

from connectors.clinical_records.errors import ConfigError
from pipelines import home
from pipelines.liveness import PID_TAG
from pipelines.partitions import PARTITION_TAG, run_place
from pipelines.verdict import Verdict, verdict_of_run
from pipelines.webhook import Delivery, Webhook, webhook_from_env
from warehouse.figures import Figure

ALERT_TAG = "clinical-sync/alert"  # sending, then sent or not delivered
EXACT_TAG = "clinical-sync/exact"  # true or false, on every run that finished
SENSOR_SECONDS = 15  # how often the daemon looks for finished runs

log = logging.getLogger(__name__)


def message(verdict: Verdict, warehouse: str, tenant: str | None = None) -> dict[str, Any]:
    """The webhook's body: `text` for Slack, Mattermost and Teams workflows, and the same facts
    as fields under `clinical_sync` for a program."""
    where = f"tenant {tenant}, warehouse {warehouse}" if tenant else f"warehouse {warehouse}"
    head = f"clinical-sync: {verdict.job} run {verdict.run_id[:8]} ({where})"
    lines: list[str] = []
    if verdict.failure is not None:
        lines.append(f"{head} {verdict.failure}")
        lines.append(
            "The clinical tables published; the failed models keep their last tables."
            if verdict.published
            else "Loads that committed before the failure stay; nothing was published."
        )
    else:
        lines.append(
            f"{head} is NOT EXACT: {len(verdict.not_exact)} of {len(verdict.sets)} entity "
            "sets may differ from the source"
        )
    for ending in verdict.not_exact:
        rows = f"{ending.live_rows:,} rows, " if ending.live_rows is not None else ""
        names = ", ".join(c.name for c in ending.failed)
        lines.append(f"- {ending.entity}: {rows}{ending.differs_by}; failed: {names}")
    if verdict.failure is None:
        lines.append("The run published; `clinical-sync status` and analytics.sync_health say so.")
    fields = {
        "ending": verdict.ending.value,
        "run_id": verdict.run_id,
        "job": verdict.job,
        "warehouse": warehouse,
        "tenant": tenant,
        "entity_sets": list(verdict.sets),
        "published": verdict.published,
        "not_exact": [
            {
                "entity": e.entity,
                Figure.UNRECONCILED: e.unreconciled,
                Figure.LIVE_ROWS: e.live_rows,
                "failed_checks": [
                    {"name": c.name, "figures": _numbers(c.metadata)} for c in e.failed
                ],
            }
            for e in verdict.not_exact
        ],
        "failure": None
        if verdict.failure is None
        else {
            "steps": list(verdict.failure.steps),
            "error": verdict.failure.kind,
            "message": verdict.failure.message,
        },
    }
    return {"text": "\n".join(lines), "clinical_sync": fields}


def _numbers(metadata: Mapping[str, object]) -> dict[str, float | int]:
    """A check's figures: counts and hours only, so no value of a record can slip in."""
    return {
        k: v for k, v in metadata.items() if isinstance(v, int | float) and not isinstance(v, bool)
    }


def conclude(
    verdict: Verdict,
    *,
    warehouse: str,
    webhook: Webhook | None,
    instance: DagsterInstance | None = None,
    tenant: str | None = None,
    say: Any = log,
) -> Delivery | None:
    """Tag the run with how it ended and, when it is not exact, send its one message.
    None when nothing was sent (an exact run, no webhook, or a message sent before)."""
    if instance is not None and verdict.failure is None:
        instance.add_run_tags(verdict.run_id, {EXACT_TAG: str(verdict.exact).lower()})
    if verdict.exact or webhook is None:
        return None
    if instance is not None:
        run = instance.get_run_by_id(verdict.run_id)
        if run is not None and ALERT_TAG in run.tags:
            return None  # this run's message went out before
        instance.add_run_tags(verdict.run_id, {ALERT_TAG: "sending"})
    delivery = webhook.post(message(verdict, warehouse, tenant), log=say)
    if instance is not None:
        instance.add_run_tags(verdict.run_id, {ALERT_TAG: "sent" if delivery.sent else "failed"})
    return delivery


def _from_sensor(context: RunStatusSensorContext) -> None:
    """A run the deployment launched has finished: conclude it here, in the daemon."""
    run = context.dagster_run
    if PID_TAG in run.tags:
        return  # `clinical-sync` ran it in its own process and concludes it there
    try:
        tenant, warehouse = run_place(run.tags)
    except ConfigError as error:  # the message still goes out, naming what is known
        context.log.warning(f"run {run.run_id}: its tenant is unknown: {error}")
        tenant, warehouse = None, home.warehouse_path()
    conclude(
        verdict_of_run(context.instance, run),
        warehouse=warehouse,
        webhook=webhook_from_env(os.environ),
        instance=context.instance,
        say=context.log,
        tenant=tenant.name if tenant else run.tags.get(PARTITION_TAG),
    )


@run_failure_sensor(
    name="alert_failed_runs",
    default_status=DefaultSensorStatus.RUNNING,
    minimum_interval_seconds=SENSOR_SECONDS,
    description="A failed run: one message to CLINICAL_ALERT_WEBHOOK (when set)",
)
def alert_failed_runs(context: RunStatusSensorContext) -> None:
    _from_sensor(context)


@run_status_sensor(
    run_status=DagsterRunStatus.SUCCESS,
    name="alert_inexact_runs",
    default_status=DefaultSensorStatus.RUNNING,
    minimum_interval_seconds=SENSOR_SECONDS,
    description=(
        "A run whose checks of severity ERROR failed (a set not equal to the source): one "
        "message to CLINICAL_ALERT_WEBHOOK (when set); every run tagged clinical-sync/exact"
    ),
)
def alert_inexact_runs(context: RunStatusSensorContext) -> None:
    _from_sensor(context)
