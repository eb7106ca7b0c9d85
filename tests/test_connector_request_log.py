"""Where the connector's line per request goes: the Python logger (the CLI's log file, a code
server's stderr), never the logger a caller hands in (a Dagster run's, whose every line is an
event written to the instance), which gets a progress line now and then and the failed
attempts instead."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from connectors.clinical_records import catalogue as cat
from connectors.clinical_records import transport
from connectors.clinical_records.client import ClinicalClient
from connectors.clinical_records.transport import LOGGER_NAME
from connectors.sandbox.config import SandboxConfig
from connectors.sandbox.server import SandboxServer
from tests.connector_helpers import settings_for

pytestmark = pytest.mark.integration


class Lines(logging.Handler):
    """Every message a logger got, formatted."""

    def __init__(self) -> None:
        super().__init__()
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def run_logger() -> tuple[logging.Logger, Lines]:
    """A stand-in for a Dagster run's logger: a logger of its own, not under the connector's."""
    logger = logging.getLogger("test-run-log")
    logger.propagate = False
    logger.setLevel(logging.INFO)
    lines = Lines()
    logger.handlers = [lines]
    return logger, lines


def test_request_lines_reach_the_python_logger_and_the_run_log_only_progress(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    caplog.set_level(logging.INFO, logger=LOGGER_NAME)
    monkeypatch.setattr(transport, "PROGRESS_SECONDS", 0.0)  # a progress line every request
    run_log, run_lines = run_logger()
    with (
        SandboxServer(SandboxConfig(seed=3, scale=0.2)) as server,
        ClinicalClient(settings_for(server, tmp_path), logger=run_log) as client,
    ):
        pages = list(client.iter_pages(cat.PATIENTS))
        requests = client.stats.requests
    assert len(pages) > 1 and requests > 1
    per_request = [
        r for r in caplog.records if r.name == LOGGER_NAME and "status=200" in r.msg % r.args
    ]
    assert len(per_request) == requests  # every request's line, in the Python logger
    assert not any("status=" in line for line in run_lines.lines)  # none in the run's log
    assert run_lines.lines and all("requests so far" in line for line in run_lines.lines)
    assert f"{requests} requests so far in this extraction (now Patients)" in run_lines.lines[-1]


def test_a_failed_attempt_reaches_the_run_log_and_progress_waits_its_time(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger=LOGGER_NAME)
    run_log, run_lines = run_logger()
    with SandboxServer(SandboxConfig(seed=3, scale=0.2)) as server:
        server.configure(error_rate=0.3)
        settings = settings_for(server, tmp_path, CLINICAL_MAX_ATTEMPTS="10")
        with ClinicalClient(settings, logger=run_log) as client:
            list(client.iter_pages(cat.PATIENTS))
            retried = client.stats.retries
    assert retried > 0
    failed = [line for line in run_lines.lines if "status=50" in line]
    assert len(failed) == retried  # each failed attempt, for the operator
    assert not any("requests so far" in line for line in run_lines.lines)  # under 10 s
    assert not any("status=200" in line for line in run_lines.lines)
