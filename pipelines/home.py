"""Where things are kept: DAGSTER_HOME, the lake and the warehouse. The one module that reads
WAREHOUSE_PATH, LAKE_ROOT and DAGSTER_HOME from the environment; everyone else asks it.

The defaults are `data/...` under the working directory (docs/ARCHITECTURE.md,
Configuration); the environment overrides them. Each warehouse has its own Dagster home (run
history, schedules, logs) beside it, `<warehouse without .duckdb>.dagster/`, unless
DAGSTER_HOME says otherwise: the runs of one warehouse never mix into another's plots. A home
gets the repository's `dagster.yaml`.
"""

from __future__ import annotations

import fcntl
import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from dagster import DagsterInstance

from pipelines.resources import DEFAULT_LAKE_ROOT, DEFAULT_WAREHOUSE_PATH
from warehouse.private import PRIVATE_FILE, private_dir, tighten_tree

REPO_ROOT = Path(__file__).resolve().parents[1]
INSTANCE_YAML = REPO_ROOT / "dagster.yaml"
DEMO_DIR = "data/demo"  # `clinical-sync demo`'s own lake and warehouse


def lake_root() -> str:
    return os.environ.get("LAKE_ROOT") or DEFAULT_LAKE_ROOT


def warehouse_path() -> str:
    return os.environ.get("WAREHOUSE_PATH") or DEFAULT_WAREHOUSE_PATH


def warehouse_path_chosen() -> bool:
    """Whether WAREHOUSE_PATH is set (else the default, or the demo's, is shown)."""
    return bool(os.environ.get("WAREHOUSE_PATH"))


def demo_warehouse_path() -> str:
    return str(Path(DEMO_DIR) / "warehouse.duckdb")


def default_dagster_home(warehouse: str | Path) -> Path:
    """The Dagster home of a warehouse: `data/warehouse.duckdb` -> `data/warehouse.dagster`."""
    return Path(warehouse).resolve().with_suffix(".dagster")


def dagster_home(warehouse: str | Path | None = None) -> Path:
    """DAGSTER_HOME, else the warehouse's own home; made absolute, created, with our
    dagster.yaml, and exported so that Dagster (and `dagster dev`'s children) use it.

    The default home always gets the repository's current file; a home the operator chose
    gets it only when it has none (their own settings win).
    """
    chosen = os.environ.get("DAGSTER_HOME")
    home = Path(chosen).resolve() if chosen else default_dagster_home(warehouse or warehouse_path())
    private_dir(home)  # Dagster's storage keeps step outputs and logs of PHI-bearing runs
    tighten_tree(home, f"Dagster home {home}")
    target = home / "dagster.yaml"
    ours = INSTANCE_YAML.read_text(encoding="utf-8") if INSTANCE_YAML.exists() else None
    default_home = not chosen
    current = target.read_text(encoding="utf-8") if target.exists() else None
    if ours is not None and current != ours and (current is None or default_home):
        partial = home / f".dagster.yaml.{os.getpid()}"
        shutil.copyfile(INSTANCE_YAML, partial)
        partial.chmod(PRIVATE_FILE)
        os.replace(partial, target)  # a concurrent command never reads half a file
    os.environ["DAGSTER_HOME"] = str(home)
    return home


@contextmanager
def instance(warehouse: str | Path | None = None) -> Iterator[DagsterInstance]:
    """The Dagster instance of DAGSTER_HOME (or of the warehouse), its storage created under a
    file lock: two commands started at once on a new home would otherwise both create the
    SQLite schema."""
    from dagster import DagsterInstance

    home = dagster_home(warehouse)
    with (home / ".instance.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            opened = DagsterInstance.get()
            opened.get_runs(limit=1)  # creates (or migrates) the run and event storage now
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
    with opened:
        yield opened
