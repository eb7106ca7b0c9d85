"""What a failed command shows: a few lines on the terminal, the whole story in a log file.

An operator reads what failed, why, the one thing to do and where the full trace went; the
trace itself (Dagster's events, the connector's log lines, a Python traceback) goes to
`<DAGSTER_HOME>/logs/<command>-<UTC time>.log`, or inline with `--verbose`.
"""

from __future__ import annotations

import logging
import os
import re
import sys
import traceback
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING

import duckdb

if TYPE_CHECKING:
    from dagster import DagsterInstance

from connectors.clinical_records.errors import (
    AuthenticationError,
    ConfigError,
    RetryExhausted,
    ServiceUnreachable,
    Unauthorized,
    UntrustedCertificate,
)
from pipelines import home
from pipelines.tenants import SETTING_VARIABLES, Tenant
from warehouse.errors import SourceMismatch, WarehouseLocked

# The error class a run failed with -> the one thing to do. The message says why.
ADVICE: dict[type[Exception], str] = {
    AuthenticationError: "correct the credentials in the environment or .env, then run again",
    Unauthorized: "check that CLINICAL_API_KEY belongs to CLINICAL_CLIENT_ID, then run again",
    ServiceUnreachable: (
        "check CLINICAL_AUTH_URL and CLINICAL_API_BASE_URL and that the service is up, "
        "then run again"
    ),
    UntrustedCertificate: "set CLINICAL_CA_BUNDLE to the CA's PEM file, then run again",
    RetryExhausted: "run again later: the next run resumes from the last committed load",
    SourceMismatch: "use another WAREHOUSE_PATH and LAKE_ROOT, or sync --force",
    WarehouseLocked: "wait for the other sync to finish, then run again",
    ConfigError: "correct the setting named above, then run again",
    duckdb.OutOfMemoryException: (
        "raise WAREHOUSE_MEMORY_LIMIT (docs/SIZING.md: what each scale needs), then run "
        "again: what committed stays"
    ),
}
# The same for a tenant's run, whose settings are its keys in the tenants file (the variables
# above are not read): `{tenant}` and `{file}` are filled in.
TENANT_ADVICE: dict[type[Exception], str] = {
    AuthenticationError: (
        "correct tenant {tenant}'s client_id and client_secret (or the variable or file each "
        "names) and its customer in {file}, then run again"
    ),
    Unauthorized: "check that tenant {tenant}'s api_key belongs to its client_id in {file}, then run again",
    ServiceUnreachable: (
        "check tenant {tenant}'s auth_url and base_url in {file} and that its service is up, "
        "then run again"
    ),
    SourceMismatch: (
        "give tenant {tenant} its own warehouse and lake in {file}, or sync --tenant {tenant} --force"
    ),
}
DEFAULT_ADVICE = "read the log file below, fix what it names, then run again"
LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def log_file(command: str) -> Path:
    """A new log file for this command under the Dagster home, readable by its owner only."""
    folder = home.dagster_home() / "logs"
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    path = folder / f"{command.replace(' ', '-')}-{stamp}-{os.getpid()}.log"
    os.close(os.open(path, os.O_CREAT | os.O_WRONLY | os.O_APPEND, 0o600))
    return path


def capture(path: Path, *, verbose: bool) -> None:
    """Python log records (the connector's request lines, warnings) go to the file; with
    `verbose` warnings also reach the terminal. Without this, Python prints them to stderr."""
    root = logging.getLogger()
    handler = logging.FileHandler(path, encoding="utf-8")
    handler.setFormatter(logging.Formatter(LOG_FORMAT))
    root.addHandler(handler)
    if verbose:
        shown = logging.StreamHandler(sys.stderr)
        shown.setLevel(logging.WARNING)
        root.addHandler(shown)
    root.setLevel(logging.INFO)
    logging.getLogger("alembic").setLevel(logging.WARNING)  # Dagster's storage migrations
    logging.captureWarnings(True)


def write_run(instance: DagsterInstance, run_id: str, path: Path, *, succeeded: bool) -> None:
    """Append a failed run's Dagster events, with every error's full trace, to the log file;
    a run that succeeded gets one line of figures. Its events stay in the instance (the UI's
    run page): reading them all back cost every run CPU for a file nobody reads then."""
    if succeeded:
        stats = instance.get_run_stats(run_id)
        with path.open("a", encoding="utf-8") as out:
            out.write(
                f"--- run {run_id} succeeded: {stats.steps_succeeded} steps, "
                f"{stats.materializations} materializations; its events are in Dagster\n"
            )
        return
    with path.open("a", encoding="utf-8") as out:
        out.write(f"--- Dagster events of run {run_id}\n")
        for record in instance.all_logs(run_id):
            when = datetime.fromtimestamp(record.timestamp, UTC).isoformat(timespec="seconds")
            level = logging.getLevelName(record.level)
            out.write(f"{when} {level} {record.step_key or '-'} {record.message}\n")
            event = record.dagster_event
            error = getattr(event.event_specific_data, "error", None) if event else None
            error = error or record.error_info
            if error is not None and hasattr(error, "to_string"):
                out.write(error.to_string() + "\n")


def write_traceback(error: BaseException, path: Path) -> None:
    with path.open("a", encoding="utf-8") as out:
        out.write("".join(traceback.format_exception(error)))


def advice(kind: str | None, tenant: Tenant | None = None) -> str:
    """The advice for the error class named `kind` (a run's error crosses Dagster's process
    boundary serialized, and keeps only its class's name, `cls_name`); for a tenant's run,
    naming the tenant and its keys in the tenants file."""
    if tenant is not None:
        found = [text for error, text in TENANT_ADVICE.items() if error.__name__ == kind]
        if found:
            return found[0].format(tenant=tenant.name, file=tenant.file)
    found = [text for error, text in ADVICE.items() if error.__name__ == kind]
    return found[0] if found else DEFAULT_ADVICE


def in_tenants_words(text: str, tenant: Tenant | None) -> str:
    """`text` (an error of the connector) with each CLINICAL_* variable a tenant's run does not
    read named as its key in the tenants file: `CLINICAL_CLIENT_ID` is `client_id`."""
    if tenant is None:
        return text
    for key, variable in SETTING_VARIABLES.items():
        text = re.sub(rf"\b{variable}\b", key, text)
    return text


def explain(
    what: str, why: str, kind: str | None, log: Path | None, tenant: Tenant | None = None
) -> list[str]:
    """The few lines a failure prints: what failed, why, what to do, where the trace is; for
    a tenant's run, in the words of its tenants file."""
    lines = [f"clinical-sync: {what}", f"  why:  {in_tenants_words(why, tenant)}"]
    lines.append(f"  do:   {advice(kind, tenant)}")
    if log is not None:
        lines.append(f"  log:  {log} (the full trace; --verbose prints it here)")
    return lines
