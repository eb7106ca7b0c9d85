"""`clinical-sync tenants list|add|check`, and the tenants' side of `sync` and `status`.

With a tenants file (CLINICAL_TENANTS_FILE) `sync --tenant NAME` runs one tenant's partition in
this process, as `sync` runs the one customer; `sync --all-tenants` runs every tenant's, each
`sync --tenant` in its own process forked from this one (which has imported Dagster and the
pipelines once), up to the instance's global maximum at once, so a tenant that fails or hangs
never stops the others. Its exit status is the worst of the tenants' (docs/operators/running.md,
with a tenants file).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
import traceback
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING

from cli.exit_codes import CONFIG, EXACT, FAILED, NOT_EXACT
from cli.output import format_table, status_json, status_text
from connectors.clinical_records.catalogue import FAMILIES
from connectors.clinical_records.errors import ClinicalApiError, ConfigError
from pipelines import home, tenants
from pipelines.tenants import TENANTS_VARIABLE, Secret, Tenant, Tenants, TenantsFileError
from warehouse.memory import RUNS_VARIABLE
from warehouse.private import create_private, private_dir

if TYPE_CHECKING:
    from connectors.sandbox.server import SandboxServer

# A tenant's `sync` exit status, the worst first: what `--all-tenants` exits with.
WORST_FIRST = (CONFIG, FAILED, NOT_EXACT, EXACT)
OUTCOME = {EXACT: "ok", NOT_EXACT: "not exact", FAILED: "failed", CONFIG: "configuration"}
DEFAULT_PARALLEL = 10  # when the instance sets no max_concurrent_runs


def configured() -> Tenants:
    """The tenants file CLINICAL_TENANTS_FILE names, loaded and checked; ConfigError without."""
    path = home.tenants_file()
    if path is None:
        raise ConfigError(
            TENANTS_VARIABLE, "the path of a tenants file (docs/operators/tenants.md)"
        )
    return tenants.load(path)


def chosen(name: str | None) -> Tenant | None:
    """`--tenant NAME`'s tenant; None for the one customer of the environment. With a tenants
    file a command must say whose run it is."""
    if home.tenants_file() is None:
        if name is not None:
            raise ConfigError(TENANTS_VARIABLE, f"a tenants file holding tenant {name!r}")
        return None
    if name is None:
        raise ConfigError(
            "--tenant", f"a tenant's name, or --all-tenants ({TENANTS_VARIABLE} is set)"
        )
    return configured().get(name)


# -- tenants list | add | check --------------------------------------------------------------


def list_tenants(args: argparse.Namespace) -> int:
    """One line per tenant: its customer, service, limit, warehouse and last run."""
    from dagster import RunsFilter

    from pipelines.partitions import PARTITION_TAG, TENANT_DIMENSION

    found = configured()
    rows = [("tenant", "customer", "service", "rate/burst", "warehouse", "last run")]
    with home.instance() as instance:
        held = set(instance.get_dynamic_partitions(TENANT_DIMENSION))
        for t in found:
            runs = instance.get_runs(RunsFilter(tags={PARTITION_TAG: t.name}), limit=1)
            last = "-" if t.name in held else "no partition yet"
            if runs:
                record = instance.get_run_record_by_id(runs[0].run_id)
                when = record.create_timestamp.strftime("%Y-%m-%d %H:%M") if record else ""
                last = f"{runs[0].status.value.lower()} {when} ({runs[0].run_id[:8]})"
            rows.append(
                (t.name, t.customer, t.base_url, f"{t.rate:g}/{t.burst}", str(t.warehouse), last)
            )
    print(f"{found.path}: {len(found)} tenants")
    print(format_table(rows))
    return 0


def add_tenant(args: argparse.Namespace) -> int:
    """Append a tenant to the file (private; created when missing), then its partition."""
    from pipelines.partitions import keep_in_step

    path = Path(args.file) if args.file else home.tenants_file()
    if path is None:
        raise ConfigError(TENANTS_VARIABLE, "the tenants file to add to (or --file PATH)")
    entry: dict[str, object] = {
        "name": args.name,
        "customer": args.customer,
        "base_url": args.base_url,
        "auth_url": args.auth_url,
        "client_id": Secret(env=args.client_id_env) if args.client_id_env else args.client_id,
        "client_secret": _reference(args.client_secret_env, args.client_secret_file),
        "api_key": _reference(args.api_key_env, args.api_key_file),
        "rate": args.rate,
        "burst": args.burst,
        # paths given here are the operator's, from the working directory
        "warehouse": str(Path(args.warehouse).resolve()) if args.warehouse else None,
        "lake": str(Path(args.lake).resolve()) if args.lake else None,
    }
    found = tenants.add(path, entry)
    os.environ[TENANTS_VARIABLE] = str(found.path)  # the instance beside this file
    with home.instance() as instance:
        keep_in_step(instance, found.names)
    tenant = found.get(args.name)
    print(f"added tenant {tenant.name!r} to {found.path} ({len(found)} tenants)")
    print(f"  warehouse {tenant.warehouse}, lake {tenant.lake}")
    print("  check it with: clinical-sync tenants check")
    return 0


def _reference(env: str | None, file: str | None) -> Secret | None:
    return Secret(env=env) if env else Secret(file=Path(file).resolve()) if file else None


@dataclass
class Checked:
    tenant: str
    ok: bool
    text: str


def check_tenants(args: argparse.Namespace) -> int:
    """The file, each tenant's credentials, and one request per tenant (a token, then one
    small read with the API key), all tenants at once: one line each; exit 2 on any problem."""
    found = configured()
    with ThreadPoolExecutor(max_workers=min(16, max(1, len(found)))) as pool:
        results = list(pool.map(_check, found))
    width = max([len(t.name) for t in found] or [6])
    for r in results:
        print(f"{r.tenant:<{width}}  {'ok' if r.ok else 'FAILED':<6}  {r.text}")
    bad = [r for r in results if not r.ok]
    print(f"{len(found) - len(bad)} of {len(found)} tenants ready ({found.path})")
    return CONFIG if bad else EXACT


def _check(tenant: Tenant) -> Checked:
    from connectors.clinical_records.catalogue import BRANCHES
    from connectors.clinical_records.client import ClinicalClient

    started = time.monotonic()
    try:
        settings = tenant.settings()
        with ClinicalClient(settings) as client:
            client.count(BRANCHES)
    except TenantsFileError as error:
        problems = [p.removeprefix(f"tenant {tenant.name!r}: ") for p in error.problems]
        return Checked(tenant.name, False, "; ".join(problems))
    except ClinicalApiError as error:
        return Checked(tenant.name, False, f"{type(error).__name__}: {error}")
    seconds = time.monotonic() - started
    return Checked(
        tenant.name,
        True,
        f"token and API key accepted ({settings.scope}) at {settings.base_url} in {seconds:.2f} s",
    )


def sandbox_tenants(server: SandboxServer, path: Path) -> Tenants:
    """A tenants file for every customer of a running sandbox (the demo's, the tests'), their
    secrets in owner-only files in `<file stem>.secrets/` beside it, never in the file."""
    folder = private_dir(path.resolve().parent / f"{path.stem}.secrets")
    entries = []
    for customer in server.customers:
        env = server.env(customer.name)
        entry: dict[str, object] = {
            "name": customer.name,
            "base_url": env["CLINICAL_API_BASE_URL"],
            "auth_url": env["CLINICAL_AUTH_URL"],
            "client_id": env["CLINICAL_CLIENT_ID"],
        }
        for key in ("client_secret", "api_key"):
            secret = folder / f"{customer.name}.{key}"
            secret.unlink(missing_ok=True)
            with os.fdopen(create_private(secret), "w", encoding="utf-8") as out:
                out.write(env[f"CLINICAL_{key.upper()}"])
            entry[key] = Secret(file=secret)
        if "CLINICAL_RATE_LIMIT" in env:
            entry["rate"] = float(env["CLINICAL_RATE_LIMIT"])
            entry["burst"] = int(env["CLINICAL_BURST"])
        entries.append(entry)
    return tenants.write(path, entries)


# -- sync --all-tenants ----------------------------------------------------------------------


@dataclass
class TenantRun:
    tenant: str
    status: int
    seconds: float
    output: Path
    summary: str


def sync_all(args: argparse.Namespace, command: Callable[[Sequence[str]], int]) -> int:
    """Every tenant's sync, each its own process, `--parallel` at a time; the worst status.
    `command`: the command line's entry (`cli.main.main`), which each child runs as
    `sync --tenant NAME`."""
    # Imported once here, inherited by every tenant's forked process: our pipelines, and
    # pandas, which pyarrow imports in each run to build its first table from Python values.
    import pandas  # noqa: F401

    from pipelines.dbt_assets import models_project
    from pipelines.partitions import keep_in_step
    from pipelines.runner import sync_definitions
    from warehouse.models import warm_up

    found = configured()
    projects = {models_project(os.environ, t.warehouse) for t in found}  # parsed once
    for project in projects if len(found) > 1 else ():
        warm_up(project)  # dbt's first build in a process, paid here once
    for rotation in range(min(len(found), len(FAMILIES))):  # built here, not in every child
        for project in projects:
            sync_definitions(partitioned=True, read_rotation=rotation, project=project)
    with home.instance() as instance, home.inherited(instance):
        keep_in_step(instance, found.names)  # every tenant's partition, before its run
        limit = args.parallel or _global_maximum(instance)
        # The tenants' warehouses share this machine's memory (warehouse/memory.py).
        os.environ.setdefault(RUNS_VARIABLE, str(max(1, min(limit, len(found)))))
        stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
        folder = private_dir(home.dagster_home() / "logs" / f"sync-all-tenants-{stamp}")
        flags = _passed_on(args)
        print(f"{len(found)} tenants, {min(limit, len(found))} at a time; output in {folder}")
        runs = _run_all(list(found), flags, folder, max(1, limit), command)
    print(_runs_table(runs))
    for run in runs:
        if run.status != EXACT:
            tail = run.output.read_text(encoding="utf-8", errors="replace").strip().splitlines()
            print(f"{run.tenant}:", *(f"  {line}" for line in tail[-4:]), sep="\n")
    worst = min(WORST_FIRST.index(r.status) if r.status in WORST_FIRST else 0 for r in runs)
    status = WORST_FIRST[worst] if runs else EXACT
    print(f"exit status {status}: {OUTCOME[status]} (the worst of {len(runs)} tenants)")
    return status


def _global_maximum(instance) -> int:
    """The run queue's max_concurrent_runs (dagster.yaml): as many runs as the daemon allows."""
    queue = instance.get_concurrency_config().run_queue_config
    found = getattr(queue, "max_concurrent_runs", None)
    return found if isinstance(found, int) and found > 0 else DEFAULT_PARALLEL


def _passed_on(args: argparse.Namespace) -> list[str]:
    """The flags of `sync --all-tenants` each tenant's `sync --tenant` gets too."""
    flags = ["--full"] if args.full else []
    flags += ["--only", *args.only] if args.only else []
    flags += ["--backfill-from", args.backfill_from.isoformat()] if args.backfill_from else []
    flags += ["--backfill-to", args.backfill_to.isoformat()] if args.backfill_to else []
    flags += ["--force"] if args.force else []
    return flags


def _run_all(
    found: Sequence[Tenant],
    flags: Sequence[str],
    folder: Path,
    limit: int,
    command: Callable[[Sequence[str]], int],
) -> list[TenantRun]:
    """Each tenant's `sync --tenant` in a process forked from this one, `limit` at a time,
    its reads starting at the family of its place in the file (`assets.read_order`).
    This process has imported Dagster and our pipelines (a fresh interpreter pays about 1.4
    CPU s for that), built the definitions and opened the instance the children use
    (`home.inherited`), and holds no thread and no open connection for a child to inherit."""
    waiting = list(enumerate(found))  # a tenant's place: its reads' rotation
    running: dict[int, tuple[Tenant, Path, float]] = {}
    done: dict[str, TenantRun] = {}
    sys.stdout.flush()  # or each child would print what this process has not yet
    while waiting or running:
        while waiting and len(running) < limit:
            place, tenant = waiting.pop(0)
            output = folder / f"{tenant.name}.out"
            mine = [*flags, "--read-rotation", str(place % len(FAMILIES))]
            running[_fork_sync(tenant, mine, output, command)] = (tenant, output, time.monotonic())
        pid, status = os.wait()
        if pid not in running:
            continue
        tenant, output, started = running.pop(pid)
        lines = output.read_text(encoding="utf-8", errors="replace").splitlines()
        summary = next((line for line in reversed(lines) if line.startswith("run ")), "")
        seconds = time.monotonic() - started
        code = os.waitstatus_to_exitcode(status)
        done[tenant.name] = TenantRun(tenant.name, code, seconds, output, summary)
    return [done[t.name] for t in found]


def _fork_sync(
    tenant: Tenant, flags: Sequence[str], output: Path, command: Callable[[Sequence[str]], int]
) -> int:
    """A child running `clinical-sync sync --tenant NAME` as its own command would
    (`command`), its output (stdout and stderr) in `output`; its pid."""
    pid = os.fork()
    if pid:
        return pid
    status = FAILED
    try:
        out = os.open(output, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.dup2(out, 1)
        os.dup2(out, 2)
        os.close(out)
        # prepared by sync_all a moment ago: no lock to wait on
        status = command(["sync", "--tenant", tenant.name, *flags, "--instance-prepared"])
    except SystemExit as stop:
        status = stop.code if isinstance(stop.code, int) else FAILED
    except BaseException:
        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        logging.shutdown()
        os._exit(status)


def _runs_table(runs: Sequence[TenantRun]) -> str:
    rows = [("tenant", "exit", "result", "seconds", "run")]
    for r in runs:
        outcome = OUTCOME.get(r.status, f"exit {r.status}")
        rows.append((r.tenant, str(r.status), outcome, f"{r.seconds:.1f}", r.summary or "-"))
    return format_table(rows)


# -- status ----------------------------------------------------------------------------------


def status_tenants(names: Sequence[str], as_json: bool = False) -> int:
    """Each named tenant's warehouse, as `status` shows one customer's; `--json`: a list of
    the one-customer objects, each naming its tenant."""
    from cli.orphans import end_orphans_of
    from warehouse.load import status as warehouse_status

    found = configured()
    end_orphans_of(None, found.path)
    worst = EXACT
    shown: list[dict[str, object]] = []
    for name in names or found.names:
        tenant = found.get(name)
        try:
            states = warehouse_status(tenant.warehouse)
        except FileNotFoundError:
            print(
                f"tenant {tenant.name}: no warehouse yet; run "
                f"`clinical-sync sync --tenant {tenant.name}`",
                file=sys.stderr if as_json else sys.stdout,
            )
            worst = FAILED
            continue
        if as_json:
            shown.append(status_json(states, tenant.warehouse, tenant.name))
        else:
            print(f"tenant {tenant.name} ({tenant.warehouse}):")
            print(status_text(states))
    if as_json:
        print(json.dumps(shown, indent=2))
    return worst


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "tenants",
        help="the customers of the tenants file (CLINICAL_TENANTS_FILE): list, add, check",
    )
    actions = p.add_subparsers(dest="action", required=True)
    listing = actions.add_parser("list", help="each tenant: customer, service, limit, last run")
    listing.set_defaults(func=list_tenants)
    check = actions.add_parser(
        "check", help="the file, each tenant's credentials and one request each: one line each"
    )
    check.set_defaults(func=check_tenants)
    add = actions.add_parser("add", help="append a tenant to the file (never a secret itself)")
    add.add_argument("name", help="the tenant's name: its partition and data/<name>/")
    add.add_argument("--file", help=f"the tenants file (default: ${TENANTS_VARIABLE})")
    add.add_argument("--base-url", required=True, help="{base_url} of its service")
    add.add_argument("--auth-url", required=True, help="{auth_url} of its token service")
    add.add_argument("--customer", help="its customer (scope); default: the name")
    who = add.add_mutually_exclusive_group(required=True)
    who.add_argument("--client-id", help="its client id")
    who.add_argument("--client-id-env", metavar="VAR", help="... or the variable holding it")
    for name in ("client-secret", "api-key"):
        kept = add.add_mutually_exclusive_group(required=True)
        kept.add_argument(f"--{name}-env", metavar="VAR", help=f"the variable holding its {name}")
        kept.add_argument(f"--{name}-file", metavar="PATH", help="... or a file holding it")
    add.add_argument("--rate", type=float, help="its plan's requests per second (default 2)")
    add.add_argument("--burst", type=int, help="its burst (default 4)")
    add.add_argument("--warehouse", help="its DuckDB file (default data/<name>/warehouse.duckdb)")
    add.add_argument("--lake", help="its lake (default data/<name>/lake)")
    add.set_defaults(func=add_tenant)
