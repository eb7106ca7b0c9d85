"""Where the operator's commands keep things: DAGSTER_HOME, the lake and the warehouse.

The defaults are DESIGN.md's (`data/...` under the working directory); the environment
overrides them. DAGSTER_HOME gets the repository's `dagster.yaml` on first use.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from pipelines.resources import DEFAULT_LAKE_ROOT, DEFAULT_WAREHOUSE_PATH

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
    home.mkdir(parents=True, exist_ok=True)
    target = home / "dagster.yaml"
    ours = INSTANCE_YAML.read_text(encoding="utf-8") if INSTANCE_YAML.exists() else None
    default_home = home == Path(DEFAULT_DAGSTER_HOME).resolve()
    current = target.read_text(encoding="utf-8") if target.exists() else None
    if ours is not None and current != ours and (current is None or default_home):
        shutil.copyfile(INSTANCE_YAML, target)
    os.environ["DAGSTER_HOME"] = str(home)
    return home
