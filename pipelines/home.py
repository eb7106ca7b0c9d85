"""Where the operator's commands keep things: DAGSTER_HOME, the lake and the warehouse.

The defaults are DESIGN.md's (`data/...` under the working directory); the environment
overrides them. DAGSTER_HOME gets the repository's `dagster.yaml` on first use.
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
DEFAULT_DAGSTER_HOME = "data/dagster"


def lake_root() -> str:
    return os.environ.get("LAKE_ROOT") or DEFAULT_LAKE_ROOT


def warehouse_path() -> str:
    return os.environ.get("WAREHOUSE_PATH") or DEFAULT_WAREHOUSE_PATH


def dagster_home() -> Path:
    """DAGSTER_HOME (default data/dagster), made absolute, created, with our dagster.yaml.

    The default home always gets the repository's current file; a home the operator chose
    gets it only when it has none (their own settings win).
    """
    home = Path(os.environ.get("DAGSTER_HOME") or DEFAULT_DAGSTER_HOME).resolve()
    private_dir(home)  # Dagster's storage keeps step outputs and logs of PHI-bearing runs
    tighten_tree(home, f"Dagster home {home}")
    target = home / "dagster.yaml"
    ours = INSTANCE_YAML.read_text(encoding="utf-8") if INSTANCE_YAML.exists() else None
    default_home = home == Path(DEFAULT_DAGSTER_HOME).resolve()
    current = target.read_text(encoding="utf-8") if target.exists() else None
    if ours is not None and current != ours and (current is None or default_home):
        partial = home / f".dagster.yaml.{os.getpid()}"
        shutil.copyfile(INSTANCE_YAML, partial)
        partial.chmod(PRIVATE_FILE)
        os.replace(partial, target)  # a concurrent command never reads half a file
    os.environ["DAGSTER_HOME"] = str(home)
    return home


@contextmanager
def instance() -> Iterator[DagsterInstance]:
    """The Dagster instance of DAGSTER_HOME, its storage created under a file lock: two
    commands started at once on a new home would otherwise both create the SQLite schema."""
    from dagster import DagsterInstance

    home = dagster_home()
    with (home / ".instance.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            opened = DagsterInstance.get()
            opened.get_runs(limit=1)  # creates (or migrates) the run and event storage now
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
    with opened:
        yield opened
