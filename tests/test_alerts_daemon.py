"""The deployment's side of the alerts: `dagster-daemon` ticks the nightly schedule against a
sandbox, and its sensors send one message for the run left not exact and one for the run that
failed, to a webhook receiver of our own on 127.0.0.1."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from dagster import DagsterInstance, DagsterRunStatus

from connectors.sandbox.config import SandboxConfig
from connectors.sandbox.server import SandboxServer
from pipelines.alerts import ALERT_TAG, EXACT_TAG, SENSOR_SECONDS
from pipelines.home import INSTANCE_YAML, REPO_ROOT
from pipelines.webhook import WEBHOOK_VARIABLE
from tests.connector_helpers import record_tokens
from tests.webhook_receiver import Receiver, webhook_receiver

pytestmark = pytest.mark.e2e

BIN = Path(sys.executable).parent
SCHEDULE = "nightly_sync_schedule"
TARGET = ["-m", "pipelines.definitions", "-d", str(REPO_ROOT)]
FINISHED = {DagsterRunStatus.SUCCESS, DagsterRunStatus.FAILURE, DagsterRunStatus.CANCELED}


def deployment_env(server: SandboxServer, hook: Receiver, tmp_path: Path) -> dict[str, str]:
    """What an operator gives the daemon: the service, a schedule that ticks every minute,
    the webhook, and the warehouse, lake and instance under tmp_path."""
    home = tmp_path / "dagster"
    home.mkdir(mode=0o700)
    shutil.copyfile(INSTANCE_YAML, home / "dagster.yaml")
    with DagsterInstance.from_config(str(home)) as instance:
        instance.get_runs(limit=1)  # its storage now: the daemon and `dagster schedule` race
    return {
        **{k: v for k, v in os.environ.items() if not k.startswith(("CLINICAL_", "DAGSTER"))},
        **server.env(),
        "CLINICAL_RATE_LIMIT": "1000",
        "CLINICAL_BURST": "200",
        "CLINICAL_MAX_ATTEMPTS": "2",
        "CLINICAL_RETRY_BUDGET": "5",
        "CLINICAL_LIMITER_PATH": str(tmp_path / "ratelimit.sqlite"),
        "CLINICAL_NIGHTLY_CRON": "* * * * *",
        WEBHOOK_VARIABLE: hook.url,
        "WAREHOUSE_PATH": str(tmp_path / "warehouse.duckdb"),
        "LAKE_ROOT": str(tmp_path / "lake"),
        "DAGSTER_HOME": str(home),
    }


def schedule(action: str, env: dict[str, str]) -> None:
    done = subprocess.run(
        [str(BIN / "dagster"), "schedule", action, SCHEDULE, *TARGET],
        env=env,
        cwd=env["DAGSTER_HOME"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr


@contextmanager
def daemon(env: dict[str, str], output: Path) -> Iterator[subprocess.Popen]:
    """`dagster-daemon run` (scheduler, sensors, run queue) in a process group of its own."""
    with output.open("w") as out:
        proc = subprocess.Popen(
            [str(BIN / "dagster-daemon"), "run", *TARGET],
            env=env,
            cwd=env["DAGSTER_HOME"],
            stdout=out,
            stderr=subprocess.STDOUT,
            process_group=0,
        )
    try:
        yield proc
    finally:
        for sig, wait in ((signal.SIGTERM, 30), (signal.SIGKILL, 10)):
            try:
                os.killpg(proc.pid, sig)
                proc.wait(timeout=wait)
                break
            except ProcessLookupError:
                break
            except subprocess.TimeoutExpired:
                continue


def wait_for(what: str, found: Callable[[], object], timeout: float, log: Path) -> object:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = found()
        if value:
            return value
        time.sleep(2)
    raise AssertionError(f"{what} within {timeout:.0f} s:\n{log.read_text()[-4000:]}")


def next_run(env: dict[str, str], known: set[str], log: Path) -> str:
    """Start the schedule, wait for the run its next tick launches, stop the schedule (no
    second tick), and wait for that run to finish."""
    schedule("start", env)

    def launched() -> str | None:
        with DagsterInstance.from_config(env["DAGSTER_HOME"]) as instance:
            fresh = [r.run_id for r in instance.get_runs() if r.run_id not in known]
        return fresh[0] if fresh else None

    run_id = str(wait_for("a run from the schedule", launched, 150, log))
    schedule("stop", env)

    def finished() -> bool:
        with DagsterInstance.from_config(env["DAGSTER_HOME"]) as instance:
            run = instance.get_run_by_id(run_id)
            return run is not None and run.status in FINISHED

    wait_for(
        f"run {run_id} to finish", finished, 1200, log
    )  # one process per step: slow under load
    return run_id


@pytest.mark.timeout(2700)
def test_schedule_runs_not_exact_or_failed_each_send_one_message(tmp_path):
    config = SandboxConfig(seed=5, scale=0.05, drift_every=1)
    with SandboxServer(config) as server, webhook_receiver() as hook:
        tokens = record_tokens(server)
        env = deployment_env(server, hook, tmp_path)
        log = tmp_path / "daemon.out"
        with daemon(env, log):
            # A source that changes before every answer: the run ends not exact.
            first = next_run(env, set(), log)
            wait_for("the message", hook.messages, 8 * SENSOR_SECONDS, log)
            (message,) = hook.messages()  # the sensors look again meanwhile: counted below
            assert message["clinical_sync"]["run_id"] == first
            assert message["clinical_sync"]["ending"] == "not_exact"
            assert message["clinical_sync"]["not_exact"]
            assert env["WAREHOUSE_PATH"] in message["text"]

            # The service then answers every request with a 5xx: the next run fails.
            server.configure(drift_every=0, error_rate=1.0)
            second = next_run(env, {first}, log)
            wait_for(
                "the second message", lambda: len(hook.messages()) == 2, 8 * SENSOR_SECONDS, log
            )
            time.sleep(2 * SENSOR_SECONDS)  # both sensors look again: nothing more
            assert len(hook.bodies) == 2  # one per run
            failed = hook.messages()[1]["clinical_sync"]
            assert failed["run_id"] == second and failed["ending"] == "failed"
            assert failed["failure"]["error"] == "RetryExhausted"

        secrets = [env["CLINICAL_CLIENT_SECRET"], env["CLINICAL_API_KEY"], *tokens]
        assert tokens and not [s for s in secrets if any(s.encode() in b for b in hook.bodies)]
        with DagsterInstance.from_config(env["DAGSTER_HOME"]) as instance:
            tags = {r.run_id: r.tags for r in instance.get_runs()}
        assert tags[first][EXACT_TAG] == "false" and tags[first][ALERT_TAG] == "sent"
        assert tags[second][ALERT_TAG] == "sent"
