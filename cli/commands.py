"""The operator's commands behind `clinical-sync sync | status | rebuild | dev`."""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

from cli import exit_codes
from cli import log as cli_log
from cli.orphans import end_orphans_of
from cli.output import (
    alert_lines,
    format_table,
    models_json,
    models_table,
    status_json,
    status_text,
    tell,
)
from connectors.clinical_records.errors import ConfigError
from pipelines import home, tenants
from sync.progress import TerminalProgress, install

if TYPE_CHECKING:
    pass


@contextmanager
def terminal_progress() -> Iterator[None]:
    previous = install(TerminalProgress(sys.stderr))
    try:
        yield
    finally:
        install(previous)


def sync(args: argparse.Namespace) -> int:
    """One run in this process: the one customer's, or with `--tenant` a tenant's (main.py
    forks one such process per tenant for `--all-tenants`)."""
    from cli.tenants import chosen
    from pipelines.runner import check_configuration
    from pipelines.runner import sync as run_sync

    tenant = chosen(args.tenant)  # None: the one customer of the environment
    # every configuration problem first, before a log file or a run
    checked = check_configuration(os.environ, tenant)
    log = cli_log.log_file(f"sync {tenant.name}" if tenant else "sync")
    cli_log.capture(log, verbose=args.verbose)
    with (
        terminal_progress(),
        home.instance(prepared=args.instance_prepared, runs_here=True) as instance,
    ):
        report = run_sync(
            os.environ,
            lake_root=str(tenant.lake) if tenant else home.lake_root(),
            warehouse_path=str(tenant.warehouse) if tenant else home.warehouse_path(),
            tenant=tenant,
            full=args.full,
            only=args.only or (),
            backfill_from=args.backfill_from,
            backfill_to=args.backfill_to,
            force_source=args.force,
            instance=instance,
            # Dagster's own lines (a trace per failed step) go to the log file, not here.
            log_level="WARNING" if args.verbose else "CRITICAL",
            tags={"clinical-sync/command": "sync"},
            checked=checked,
            read_rotation=args.read_rotation,
            say=tell,
        )
        cli_log.write_run(instance, report.run_id, log, succeeded=report.success)
    if not report.success:
        if report.entities:
            print("loaded before the failure:")
            print(report.table())
        steps = report.failed_steps
        shown = ", ".join(steps[:2]) + (f" and {len(steps) - 2} more" if len(steps) > 2 else "")
        what = f"sync run {report.run_id[:8]} failed in {shown or 'its setup'}"
        why = report.failure_reason or report.failure or "the run failed"
        lines = cli_log.explain(what, why, report.failure_kind, log, tenant)
        print("\n".join([*lines, *alert_lines(report.alert)]), file=sys.stderr)
        return exit_codes.FAILED
    print(report.table())
    print("\n".join(report.check_lines()))
    print(f"run {report.run_id}: {report.requests} requests in {report.seconds:.1f} s")
    verdict = report.verdict
    if verdict is None or verdict.exact:
        return exit_codes.EXACT
    lines = [
        f"clinical-sync: run {report.run_id[:8]} is NOT EXACT (exit status {exit_codes.NOT_EXACT})"
    ]
    for ending in verdict.not_exact:
        names = ", ".join(c.name for c in ending.failed)
        lines.append(f"  {ending.entity}: {ending.differs_by}; failed {names}")
    print("\n".join([*lines, *alert_lines(report.alert)]), file=sys.stderr)
    return exit_codes.NOT_EXACT


def status(args: argparse.Namespace) -> int:
    """The published warehouse, per entity set: what it holds and how its last run ended;
    with a tenants file, each tenant's."""
    from cli.tenants import status_tenants
    from warehouse import models
    from warehouse.load import status as warehouse_status

    if args.tenant or home.tenants_file() is not None:
        return status_tenants(args.tenant or [], as_json=args.json)

    path = home.warehouse_path()
    demo = home.demo_warehouse_path()
    if not home.warehouse_path_chosen() and not Path(path).exists() and Path(demo).exists():
        if not args.json:
            print(f"no sync has written {path} yet; the demo's warehouse, {demo}:")
        path = demo  # what a user who just ran `make demo` wants to see
    end_orphans_of(path)
    try:
        states = warehouse_status(path)
    except FileNotFoundError:
        print(f"no warehouse at {path} yet (WAREHOUSE_PATH); run `clinical-sync sync`")
        return 1
    found = models.health(path)
    if args.json:
        print(json.dumps({**status_json(states, path), "models": models_json(found)}, indent=2))
        return 0
    print(status_text(states))
    if found:
        print(f"\n{models_table(found)}")
    return 0


def rebuild(args: argparse.Namespace) -> int:
    """Rebuild the working copy from the lake, its models, then publish it."""
    from sync.state import LOCK_WAIT_SECONDS
    from warehouse import dbt_project
    from warehouse.publish import publish, working_copy
    from warehouse.rebuild import rebuild as rebuild_warehouse
    from warehouse.writer import writing

    lake, path = home.lake_root(), home.warehouse_path()
    project = dbt_project.project_dir(os.environ)
    print(f"rebuilding {path} from the lake at {lake} ...", file=sys.stderr)
    work = working_copy(path, adopt=False)
    with writing(work, wait=LOCK_WAIT_SECONDS, what="clinical-sync rebuild", say=tell):
        prepared = dbt_project.prepare(project, database=dbt_project.catalog(work))
        results = rebuild_warehouse(lake, work, project=prepared, say=tell)
        publish(work, path, wait=LOCK_WAIT_SECONDS)
    rows = [("entity set", "fetched", "inserted", "updated", "deleted", "rejected")]
    for name, r in results.items():
        figures = (r.fetched, r.inserted, r.updated, r.soft_deleted, r.rejected)
        rows.append((name, *(f"{n:,}" for n in figures)))
    print(format_table(rows))
    return 0


SANDBOX_VARIABLE = "CLINICAL_API_BASE_URL"


@contextmanager
def sandbox_process(args: argparse.Namespace) -> Iterator[dict[str, str]]:
    """`clinical-sync sandbox` in a child process; yields its CLINICAL_* settings."""
    cmd = [
        sys.executable,
        "-m",
        "cli.main",
        "sandbox",
        "--port",
        str(args.port),
        "--scale",
        f"{args.scale:g}",
        "--rate",
        f"{args.rate:g}",
    ]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        env: dict[str, str] = {}
        assert proc.stdout is not None
        while "CLINICAL_CUSTOMER" not in env:
            line = proc.stdout.readline()
            if not line:
                raise ConfigError("--port", f"a free port for the sandbox ({args.port} is taken?)")
            name, _, value = line.strip().partition("=")
            env[name] = value
        yield env
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        if proc.stdout is not None:
            proc.stdout.close()


UI_HOST = "127.0.0.1"
STOP_GRACE_SECONDS = 20.0


def _stop(signum: int, frame: object) -> None:
    raise KeyboardInterrupt  # SIGTERM ends `dev` the way Ctrl-C does: children first


def dev_environment(extra: dict[str, str]) -> dict[str, str]:
    """The environment of the webserver and daemon, which run in the Dagster home: the
    project's .env under the environment, and the warehouse, lake and tenants file as absolute
    paths."""
    from connectors.clinical_records.settings import read_dotenv

    env = {**read_dotenv(Path(".env")), **os.environ, **extra}
    env["WAREHOUSE_PATH"] = str(Path(home.warehouse_path()).resolve())
    env["LAKE_ROOT"] = str(Path(home.lake_root()).resolve())
    tenants_file = home.tenants_file()
    if tenants_file is not None:
        env[tenants.TENANTS_VARIABLE] = str(tenants_file)  # absolute, as the other paths
    return env


def run_group(cmds: list[list[str]], env: dict[str, str], cwd: Path) -> int:
    """Run `cmds` side by side in a process group of their own until one ends or this
    process is asked to stop (Ctrl-C, SIGTERM); then stop the whole group, so no webserver,
    daemon or code server is left behind."""
    first = subprocess.Popen(cmds[0], env=env, cwd=cwd, process_group=0)
    procs = [first]
    previous = signal.signal(signal.SIGTERM, _stop)
    try:
        for cmd in cmds[1:]:
            procs.append(subprocess.Popen(cmd, env=env, cwd=cwd, process_group=first.pid))
        while all(p.poll() is None for p in procs):
            time.sleep(0.5)
        return next(p.returncode for p in procs if p.returncode is not None)
    except KeyboardInterrupt:
        return 0
    finally:
        signal.signal(signal.SIGTERM, previous)
        _stop_group(procs)


def _stop_group(procs: list[subprocess.Popen]) -> None:
    """SIGTERM the group of `procs`, SIGKILL what is left after a grace period; our own
    children are reaped as they end (a zombie would keep the group alive)."""
    group = procs[0].pid
    for sig, wait in ((signal.SIGTERM, STOP_GRACE_SECONDS), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(group, sig)
        except ProcessLookupError:
            return  # the group is gone: nothing left to stop
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            for proc in procs:
                proc.poll()
            try:
                os.killpg(group, 0)
            except ProcessLookupError:
                return
            time.sleep(0.2)


def dev(args: argparse.Namespace) -> int:
    """Open the Dagster UI and its daemon (schedules, sensors, run queue, freshness); against
    a sandbox unless CLINICAL_API_BASE_URL or a tenants file is set. What `dagster dev` did,
    with Dagster's current commands, run from the Dagster home with the project as working
    directory."""
    from pipelines.partitions import keep_in_step

    tenants_file = home.tenants_file()
    with home.instance() as instance:  # storage created or migrated before its processes start
        if tenants_file is not None:  # the UI shows every tenant's partition from the start
            keep_in_step(instance, tenants.load(tenants_file).names)
    dagster_home = home.dagster_home()
    target = ["-m", "pipelines.definitions", "-d", str(Path.cwd())]
    bin_dir = Path(sys.executable).parent
    webserver = [
        str(bin_dir / "dagster-webserver"),
        *target,
        "-h",
        UI_HOST,
        "-p",
        str(args.ui_port),
    ]
    daemon = [str(bin_dir / "dagster-daemon"), "run", *target]
    url = f"http://{UI_HOST}:{args.ui_port}"
    previous = signal.signal(signal.SIGTERM, _stop)
    try:
        if (os.environ.get(SANDBOX_VARIABLE) or tenants_file) and not args.sandbox:
            print(f"Dagster UI: {url} (instance {dagster_home}; Ctrl-C stops it)", flush=True)
            return run_group([webserver, daemon], dev_environment({}), dagster_home)
        with sandbox_process(args) as env:
            print(f"sandbox at {env[SANDBOX_VARIABLE]}", flush=True)
            print(f"Dagster UI: {url} (instance {dagster_home}; Ctrl-C stops it)", flush=True)
            return run_group([webserver, daemon], dev_environment(env), dagster_home)
    except KeyboardInterrupt:
        return 0
    finally:
        signal.signal(signal.SIGTERM, previous)
