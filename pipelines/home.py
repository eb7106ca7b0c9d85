"""Where things are kept: DAGSTER_HOME, the lake and the warehouse, the instance's storage and
the tenants file. The one module that reads WAREHOUSE_PATH, LAKE_ROOT, DAGSTER_HOME,
DAGSTER_POSTGRES_URL, CLINICAL_TENANTS_FILE and CLINICAL_WORKER_TENANTS from the environment;
everyone else asks it.

The defaults are `data/...` under the working directory (docs/ARCHITECTURE.md,
Configuration); the environment overrides them. Each warehouse has its own Dagster home (run
history, schedules, logs) beside it, `<warehouse without .duckdb>.dagster/`, unless
DAGSTER_HOME says otherwise: the runs of one warehouse never mix into another's plots. A home
gets the repository's `dagster.yaml`; with DAGSTER_POSTGRES_URL set, with the blocks of
`deploy/dagster-postgres.yaml` laid over it (storage in PostgreSQL, shared by every host).

With a tenants file (CLINICAL_TENANTS_FILE) one instance serves every tenant: its home is
beside the file (`tenants.toml` -> `tenants.dagster/`) unless DAGSTER_HOME is set, and
`deploy/dagster-tenants.yaml` is laid over its settings (pools as wide as the runs).
"""

from __future__ import annotations

import fcntl
import os
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from dagster import DagsterInstance

from pipelines import postgres, tenants
from pipelines.resources import DEFAULT_LAKE_ROOT, DEFAULT_WAREHOUSE_PATH
from warehouse.private import PRIVATE_FILE, private_dir, tighten_tree

REPO_ROOT = Path(__file__).resolve().parents[1]
INSTANCE_YAML = REPO_ROOT / "dagster.yaml"
POSTGRES_YAML = REPO_ROOT / "deploy" / "dagster-postgres.yaml"
TENANTS_YAML = REPO_ROOT / "deploy" / "dagster-tenants.yaml"
WORKER_TENANTS_VARIABLE = "CLINICAL_WORKER_TENANTS"
SQLITE_STORAGE_MODULE = "pipelines.sqlite_storage"
DEMO_DIR = "data/demo"  # `clinical-sync demo`'s own lake and warehouse


def lake_root() -> str:
    return os.environ.get("LAKE_ROOT") or DEFAULT_LAKE_ROOT


def warehouse_path() -> str:
    return os.environ.get("WAREHOUSE_PATH") or DEFAULT_WAREHOUSE_PATH


def warehouse_path_chosen() -> bool:
    """Whether WAREHOUSE_PATH is set (else the default, or the demo's, is shown)."""
    return bool(os.environ.get("WAREHOUSE_PATH"))


def tenants_file() -> Path | None:
    """CLINICAL_TENANTS_FILE (absolute), or None: one customer from the environment."""
    return tenants.configured()


def worker_tenants() -> list[str] | None:
    """CLINICAL_WORKER_TENANTS: the tenants whose nightly runs this code location starts, when
    several workers (code locations) share one tenants file; None: every tenant."""
    text = os.environ.get(WORKER_TENANTS_VARIABLE) or ""
    names = [name.strip() for name in text.split(",") if name.strip()]
    return names or None


def postgres_url() -> str | None:
    """DAGSTER_POSTGRES_URL: the instance (and the shared rate limit) in PostgreSQL; unset,
    SQLite files in the Dagster home, as on one machine."""
    return os.environ.get(postgres.POSTGRES_VARIABLE) or None


def _laid_over(base: Mapping[str, object], top: Mapping[str, object]) -> dict[str, object]:
    """`top`'s keys over `base`'s, mappings merged key by key."""
    merged = dict(base)
    for key, value in top.items():
        below = merged.get(key)
        both = isinstance(below, Mapping) and isinstance(value, Mapping)
        merged[key] = _laid_over(below, value) if both else value  # type: ignore[arg-type]
    return merged


def sqlite_storage(home: Path) -> dict[str, object]:
    """The `storage` block of a home on one machine: Dagster's SQLite files in it, through
    one engine per file (pipelines/sqlite_storage.py: a third less CPU per run)."""
    config = {"base_dir": str(home)}
    return {"custom": {"module": SQLITE_STORAGE_MODULE, "class": "SqliteStorage", "config": config}}


def instance_settings(home: Path | None = None) -> str | None:
    """The text of a home's dagster.yaml: the repository's file, with deploy/dagster-postgres.yaml
    laid over it when DAGSTER_POSTGRES_URL is set and deploy/dagster-tenants.yaml when a
    tenants file is; else, for `home`, its SQLite storage (`sqlite_storage`)."""
    if not INSTANCE_YAML.exists():
        return None
    import yaml

    ours = INSTANCE_YAML.read_text(encoding="utf-8")
    url = postgres_url()
    overlays = [
        path
        for path, chosen in ((POSTGRES_YAML, url), (TENANTS_YAML, tenants_file()))
        if chosen is not None
    ]
    storage = {"storage": sqlite_storage(home)} if home and url is None else {}
    if not overlays:
        if not storage:
            return ours
        block = yaml.safe_dump(storage, sort_keys=False)
        return f"{ours}\n# Written by pipelines/home.py for this home.\n{block}"
    merged = yaml.safe_load(ours)
    for path in overlays:
        merged = _laid_over(merged, yaml.safe_load(path.read_text(encoding="utf-8")))
    sources = " and ".join(f"deploy/{p.name}" for p in overlays)
    header = f"# Written by pipelines/home.py from dagster.yaml and {sources}.\n"
    return header + yaml.safe_dump({**merged, **storage}, sort_keys=False)


def demo_warehouse_path() -> str:
    return str(Path(DEMO_DIR) / "warehouse.duckdb")


def default_dagster_home(warehouse: str | Path) -> Path:
    """The Dagster home of a warehouse, `data/warehouse.duckdb` -> `data/warehouse.dagster`, or
    of a tenants file, `tenants.toml` -> `tenants.dagster`."""
    return Path(warehouse).resolve().with_suffix(".dagster")


def made_dagster_home(warehouse: str | Path | None = None) -> Path | None:
    """The Dagster home `dagster_home` would give, when a command has made it; creates
    nothing (`status` looks for runs there only where a sync ran)."""
    chosen = os.environ.get("DAGSTER_HOME")
    found = (
        Path(chosen)
        if chosen
        else default_dagster_home(warehouse or tenants_file() or warehouse_path())
    )
    return found if (found / "dagster.yaml").exists() else None


def dagster_home(warehouse: str | Path | None = None, *, refresh: bool = False) -> Path:
    """DAGSTER_HOME, else the warehouse's own home; made absolute, created, with our
    dagster.yaml (`instance_settings`), and exported so that Dagster (and `dagster dev`'s
    children) use it. On PostgreSQL, only once the server answers (else PostgresUnreachable).

    The default home always gets the current settings; a home the operator chose gets them
    only when it has none (their own settings win), or with `refresh` (a deployment's own
    preparation, `python -m pipelines.home`, after an upgrade).
    """
    url = postgres_url()
    if url is not None:  # PostgresUnreachable before anything is written
        postgres.connect(url).close()
    chosen = os.environ.get("DAGSTER_HOME")
    home = (
        Path(chosen).resolve()
        if chosen
        else default_dagster_home(warehouse or tenants_file() or warehouse_path())
    )
    private_dir(home)  # Dagster's storage keeps step outputs and logs of PHI-bearing runs
    tighten_tree(home, f"Dagster home {home}")
    target = home / "dagster.yaml"
    ours = instance_settings(home)
    default_home = not chosen
    current = target.read_text(encoding="utf-8") if target.exists() else None
    if ours is not None and current != ours and (current is None or default_home or refresh):
        partial = home / f".dagster.yaml.{os.getpid()}"
        fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, PRIVATE_FILE)
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            out.write(ours)
        os.replace(partial, target)  # a concurrent command never reads half a file
    os.environ["DAGSTER_HOME"] = str(home)
    return home


@contextmanager
def _storage_lock(home: Path) -> Iterator[None]:
    """One process at a time creates or migrates the instance's storage: a file lock in the
    home for SQLite, a PostgreSQL advisory lock (every host) for PostgreSQL."""
    url = postgres_url()
    if url is not None:
        with postgres.migration_lock(url):
            yield
        return
    with (home / ".instance.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def prepare_instance(
    warehouse: str | Path | None = None, *, refresh: bool = False
) -> DagsterInstance:
    """The Dagster instance of DAGSTER_HOME (or of the warehouse), its storage created or
    migrated now under `_storage_lock`: two commands started at once on a new instance would
    otherwise both create the schema."""
    from dagster import DagsterInstance

    url = postgres_url()
    home = dagster_home(warehouse, refresh=refresh)
    with _storage_lock(home):
        opened = DagsterInstance.get()
        if url is not None:
            opened.upgrade()  # Dagster's schema migrations; nothing to do when current
            _set_pool_limits(opened)
        opened.get_runs(limit=1)  # creates (or migrates) the run and event storage now
    return opened


def _set_pool_limits(opened: DagsterInstance) -> None:
    """Our pools' rows at the instance's default limit, written here, one process at a time.
    Left to Dagster (1.13.27), the first step of each pool writes its row, and on PostgreSQL
    two runs starting together fail there: the loser's INSERT aborts the transaction its
    UPDATE then runs in (InFailedSqlTransaction)."""
    from pipelines.keys import API_POOL, WAREHOUSE_POOL

    default = opened.global_op_concurrency_default_limit
    storage = opened.event_log_storage
    current = {pool.name: pool.limit for pool in storage.get_pool_limits()}
    for pool in (API_POOL, WAREHOUSE_POOL):
        if default is not None and current.get(pool) != default:
            storage.set_concurrency_slots(pool, default)


# The instance `sync --all-tenants` opened before forking each tenant's process (`inherited`).
_inherited: DagsterInstance | None = None


@contextmanager
def inherited(opened: DagsterInstance) -> Iterator[None]:
    """While this process forks children that run on `opened`, each child uses it as it is
    (storage checked, schema revisions read, engines made) instead of opening the home
    again (ten tenants starting at once each spent that CPU). Safe to inherit: opening the
    instance starts no thread; on SQLite a process closes the connections it keeps before it
    forks (pipelines/sqlite_storage.py), and on PostgreSQL this process holds none (NullPool:
    only a process that runs and never forks holds them, `postgres.hold_connections`)."""
    global _inherited
    _inherited = opened
    try:
        yield
    finally:
        _inherited = None


@contextmanager
def own_instance(given: DagsterInstance | None) -> Iterator[DagsterInstance]:
    """The caller's instance, or an ephemeral one for one in-process run, closed with the run:
    its temporary folder removed then, not left to the garbage collector (a ResourceWarning in
    whatever ran next)."""
    from dagster import DagsterInstance

    if given is not None:
        yield given
        return
    with DagsterInstance.ephemeral() as own:
        yield own


@contextmanager
def instance(
    warehouse: str | Path | None = None, *, prepared: bool = False, runs_here: bool = False
) -> Iterator[DagsterInstance]:
    """`prepare_instance`, closed at the end. `prepared`: the process that started this one
    prepared it a moment ago (`sync --all-tenants`), so it is only opened, or taken as its
    parent opened it (`inherited`): ten tenants' runs do not wait on each other for the lock
    of a migration there is nothing to do for. `runs_here`: this process executes runs and
    forks nothing, so on PostgreSQL it keeps its connections (`postgres.hold_connections`)."""
    with _opened(warehouse, prepared) as opened:
        if runs_here:
            postgres.hold_connections(opened)  # nothing on SQLite
        yield opened


@contextmanager
def _opened(warehouse: str | Path | None, prepared: bool) -> Iterator[DagsterInstance]:
    if not prepared:
        with prepare_instance(warehouse) as opened:
            yield opened
        return
    from dagster import DagsterInstance

    dagster_home(warehouse)
    if _inherited is not None:
        yield _inherited
        return
    with DagsterInstance.get() as opened:
        yield opened


if __name__ == "__main__":
    # `python -m pipelines.home`: the instance of DAGSTER_HOME ready before its processes
    # start, with the settings of this version (deploy/compose.yaml's `instance` service).
    prepare_instance(refresh=True).dispose()
    print(f"Dagster instance ready in {dagster_home()}")
