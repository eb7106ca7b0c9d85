"""A run that is not exact is loud: `clinical-sync sync`'s exit status, `status`, and one
message to a webhook (a receiver of our own on 127.0.0.1), never a secret in it."""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from pathlib import Path

import duckdb
import pytest
from dagster import DagsterInstance, build_run_status_sensor_context

from cli import exit_codes
from connectors.clinical_records.catalogue import ALL_ENTITIES
from connectors.sandbox.config import SandboxConfig
from connectors.sandbox.server import SandboxServer
from pipelines.alerts import ALERT_TAG, EXACT_TAG, alert_failed_runs
from pipelines.runner import sync
from pipelines.webhook import WEBHOOK_VARIABLE
from tests.connector_helpers import record_tokens
from tests.test_pipelines_cli import env_for, run
from tests.warehouse_records import PER_BRANCH, project_copy
from tests.webhook_receiver import Receiver, webhook_receiver
from warehouse.dbt_project import PROJECT_VARIABLE

pytestmark = pytest.mark.integration

STATUS_KEYS = {
    "entity",
    "table",
    "rows",
    "deleted",
    "rejects",
    "kept_raw",
    "watermark",
    "last_run_id",
    "last_loaded_at",
    "exact",
    "unreconciled",
    "failed_checks",
    "warned_checks",
    "staleness_hours",
}


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    with webhook_receiver() as hook:
        yield hook


@pytest.fixture
def drifting() -> Iterator[SandboxServer]:
    """A source that changes before every answer: no reconciliation can settle it."""
    with SandboxServer(SandboxConfig(seed=5, scale=0.05, drift_every=1)) as server:
        yield server


def secrets_of(env: dict[str, str], tokens: list[str]) -> dict[str, str]:
    return {
        "client secret": env["CLINICAL_CLIENT_SECRET"],
        "API key": env["CLINICAL_API_KEY"],
        **{f"token {t[:6]}...": t for t in tokens},
    }


def assert_holds_none(body: bytes, secrets: dict[str, str]) -> None:
    found = [name for name, value in secrets.items() if value.encode() in body]
    assert not found, f"the message holds the {', '.join(found)}"


def test_a_clean_sync_exits_0_and_sends_nothing(fresh_sandbox, receiver, tmp_path):
    env = {**env_for(fresh_sandbox, tmp_path), WEBHOOK_VARIABLE: receiver.url}
    done = run(["sync"], env, tmp_path)
    assert done.returncode == exit_codes.EXACT, done.stderr[-3000:]
    assert receiver.bodies == []
    assert "NOT EXACT" not in done.stdout + done.stderr

    shown = run(["status", "--json"], env, tmp_path)
    status = json.loads(shown.stdout)
    assert status["exact"] is True and status["not_exact"] == []
    assert all(s["exact"] is True and s["unreconciled"] == 0 for s in status["entity_sets"])
    assert "NOT EXACT" not in run(["status"], env, tmp_path).stdout


def test_a_sync_left_with_a_residual_exits_3_says_where_and_alerts_once(
    drifting, receiver, tmp_path
):
    tokens = record_tokens(drifting)
    env = {**env_for(drifting, tmp_path), WEBHOOK_VARIABLE: receiver.url}
    done = run(["sync"], env, tmp_path)
    assert done.returncode == exit_codes.NOT_EXACT, done.stderr[-3000:]
    assert "NOT EXACT" in done.stderr and "alert: sent to 127.0.0.1" in done.stderr

    (message,) = receiver.messages()  # exactly one
    assert len(receiver.bodies) == 1
    assert tokens
    assert_holds_none(receiver.bodies[0], secrets_of(env, tokens))
    assert "/hooks/" not in receiver.bodies[0].decode()  # nor the webhook's own URL
    fields = message["clinical_sync"]
    assert fields["ending"] == "not_exact" and fields["failure"] is None
    assert fields["warehouse"] == env["WAREHOUSE_PATH"]
    wrong = {s["entity"]: s for s in fields["not_exact"]}
    assert wrong and sum(s["unreconciled"] for s in wrong.values()) > 0
    for name, figures in wrong.items():
        line = next(x for x in message["text"].splitlines() if x.startswith(f"- {name}:"))
        unreconciled = figures["unreconciled"]  # a count's difference: a floor
        assert (f"by at least {unreconciled:,}" if unreconciled else "an unknown number") in line
        checks = {c["name"]: c["figures"] for c in figures["failed_checks"]}
        assert checks and all(
            isinstance(v, int | float) for f in checks.values() for v in f.values()
        )
        assert all(c in line for c in checks)
    assert "NOT EXACT" in message["text"] and env["WAREHOUSE_PATH"] in message["text"]

    # `status` tells the same story, from the published warehouse alone.
    shown = run(["status"], env, tmp_path)
    assert shown.returncode == 0, shown.stderr
    head = shown.stdout.splitlines()[0]
    assert head.startswith(f"NOT EXACT: {len(wrong)} entity sets")
    for name, figures in wrong.items():
        assert f"{name} (by {figures['unreconciled']:,}; " in head
        row = next(x for x in shown.stdout.splitlines() if x.startswith(name + " "))
        assert " NO " in row and "reconciled_with_source" in row
    status = json.loads(run(["status", "--json"], env, tmp_path).stdout)
    assert status["exact"] is False and set(status["not_exact"]) == set(wrong)
    assert [s["entity"] for s in status["entity_sets"]] == [e.name for e in ALL_ENTITIES]
    for entry in status["entity_sets"]:
        assert set(entry) == STATUS_KEYS
        if entry["entity"] in wrong:
            assert entry["exact"] is False
            assert entry["unreconciled"] == wrong[entry["entity"]]["unreconciled"]
            assert "reconciled_with_source" in entry["failed_checks"]
        else:
            assert entry["exact"] is True and entry["failed_checks"] == []

    # Analysts see it too: the run's flag and the view, in the published warehouse.
    with duckdb.connect(env["WAREHOUSE_PATH"], read_only=True) as con:
        (exact,) = con.execute('SELECT "exact" FROM "ops"."sync_runs"').fetchone()
        health = dict(con.execute("SELECT entity, exact FROM analytics.sync_health").fetchall())
    assert exact is False
    assert {name for name, ok in health.items() if not ok} == set(wrong)

    # In the UI: the run carries how it ended and that its message went out.
    with DagsterInstance.from_config(env["DAGSTER_HOME"]) as instance:
        (record,) = instance.get_run_records()
    assert record.dagster_run.tags[EXACT_TAG] == "false"
    assert record.dagster_run.tags[ALERT_TAG] == "sent"


def test_a_failed_run_sends_one_message_and_keeps_its_exit_status(
    fresh_sandbox, receiver, tmp_path
):
    tokens = record_tokens(fresh_sandbox)
    env = {
        **env_for(fresh_sandbox, tmp_path),
        WEBHOOK_VARIABLE: receiver.url,
        "CLINICAL_CLIENT_SECRET": "wrong-secret-81d2",
    }
    done = run(["sync"], env, tmp_path)
    assert done.returncode == exit_codes.FAILED, done.stderr[-3000:]
    (message,) = receiver.messages()
    assert_holds_none(
        receiver.bodies[0],
        {**secrets_of(env, tokens), "real secret": fresh_sandbox.config.client_secret},
    )
    fields = message["clinical_sync"]
    assert fields["ending"] == "failed"
    assert fields["failure"]["error"] == "AuthenticationError"
    assert "invalid_client" in fields["failure"]["message"]
    assert "failed in extract_" in message["text"] and "invalid_client" in message["text"]


def test_a_failed_model_alerts_naming_it_and_says_the_tables_published(
    fresh_sandbox, receiver, tmp_path
):
    broken = PER_BRANCH.replace("count(*)", "count(nope)")
    env = {
        **env_for(fresh_sandbox, tmp_path),
        WEBHOOK_VARIABLE: receiver.url,
        PROJECT_VARIABLE: str(project_copy(tmp_path, claims_per_branch=broken)),
    }
    done = run(["sync"], env, tmp_path)
    assert done.returncode == exit_codes.FAILED, done.stderr[-3000:]
    (message,) = receiver.messages()
    fields = message["clinical_sync"]
    assert fields["ending"] == "failed" and fields["published"] is True
    assert fields["failure"]["error"] == "ModelsFailed"
    assert fields["failure"]["steps"] == ["analytics_models"]
    assert "claims_per_branch: build failed: Binder Error" in fields["failure"]["message"]
    assert "The clinical tables published" in message["text"]


def closed_port_url() -> str:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{probe.getsockname()[1]}/hooks/nothing-listens"


@pytest.mark.parametrize("refusal", ["http 500", "unreachable"])
def test_an_alert_that_cannot_be_delivered_is_one_log_line(
    fresh_sandbox, receiver, tmp_path, refusal
):
    receiver.status = 500
    url = receiver.url if refusal == "http 500" else closed_port_url()
    env = {
        **env_for(fresh_sandbox, tmp_path),
        WEBHOOK_VARIABLE: url,
        "CLINICAL_CLIENT_SECRET": "wrong-secret-81d2",
    }
    done = run(["sync"], env, tmp_path)
    assert done.returncode == exit_codes.FAILED, done.stderr[-3000:]  # as without alerts
    expected = "HTTP 500" if refusal == "http 500" else "ConnectError"
    assert f"alert: not delivered to 127.0.0.1: {expected} after 3 attempts" in done.stderr
    if refusal == "http 500":
        assert len(receiver.bodies) == 3  # the message, retried twice
    log = Path(done.stderr.split("log:")[1].split()[0])
    lines = [x for x in log.read_text().splitlines() if "alert not delivered" in x]
    assert len(lines) == 1, lines
    assert "/hooks/" not in log.read_text()  # the URL (a token, for Slack) is never logged


@pytest.mark.parametrize(
    "url",
    [
        "ftp://hooks.example.com/T0/B0/x",
        "http://hooks.example.com/T0/B0/x",  # plain http off loopback
        "hooks.example.com/T0/B0/x",
    ],
)
def test_a_webhook_that_is_not_https_is_refused_before_the_run(sandbox, tmp_path, url):
    env = {**env_for(sandbox, tmp_path), WEBHOOK_VARIABLE: url}
    env.pop("CLINICAL_API_KEY")  # and every other problem is named with it
    done = run(["sync"], env, tmp_path)
    assert done.returncode == exit_codes.CONFIG
    assert f"{WEBHOOK_VARIABLE}: expected an https:// URL" in done.stderr
    assert "CLINICAL_API_KEY" in done.stderr
    assert "T0/B0" not in done.stdout + done.stderr  # the value is never echoed
    assert not (tmp_path / "dagster").exists() or not list((tmp_path / "dagster").glob("logs/*"))


def test_the_sensors_leave_a_run_the_cli_concluded_alone(fresh_sandbox, receiver, tmp_path):
    """One message per run: `clinical-sync` sends for the run it executed; a sensor that
    sees the same run (an instance shared with a daemon) sends nothing more."""
    env = {
        **env_for(fresh_sandbox, tmp_path),
        WEBHOOK_VARIABLE: receiver.url,
        "CLINICAL_CLIENT_SECRET": "wrong-secret-81d2",
    }
    with DagsterInstance.ephemeral() as instance:
        report = sync(
            env,
            lake_root=str(tmp_path / "lake"),
            warehouse_path=env["WAREHOUSE_PATH"],
            only=["Branches"],
            instance=instance,
            log_level="ERROR",
        )
        assert not report.success and report.alert is not None and report.alert.sent
        assert len(receiver.messages()) == 1
        failure = next(
            e.dagster_event
            for e in instance.all_logs(report.run_id)
            if e.dagster_event is not None and e.dagster_event.is_run_failure
        )
        context = build_run_status_sensor_context(
            sensor_name="alert_failed_runs",
            dagster_instance=instance,
            dagster_run=instance.get_run_by_id(report.run_id),
            dagster_event=failure,
        ).for_run_failure()
        alert_failed_runs(context)
        assert len(receiver.bodies) == 1
