"""A dbt project, ready for builds in this process: which one (CLINICAL_DBT_PROJECT, else the
product's `transform/`), its parse cached by content, the profile that points dbt at one
warehouse file, and every dbt command run in process with nothing sent anywhere.

dbt parses a project into a manifest before it builds anything: seconds of CPU. Here the parse
runs once per project content (the fingerprint of its files, dbt's version and the warehouse's
catalog name) into a private cache folder, `manifest.json` for Dagster's asset graph and dbt's
`partial_parse.msgpack` for a new process; the parsed manifest is kept in the process, so a
build parses nothing (`dbtRunner(manifest=...)`) and `sync --all-tenants` parses once before it
forks. dbt runs in process (`dbtRunner`): a `dbt` subprocess per build would import dbt again
(seconds of CPU) in every tenant's every run.

A clinical deployment sends nothing anywhere it was not told to: every invocation turns dbt's
anonymous usage reporting off (and so does transform/dbt_project.yml); logs go to no file (an
error of DuckDB may quote a value); dbt writes its artifacts in the private cache only.
"""

from __future__ import annotations

import functools
import hashlib
import os
import pickle
import shutil
import sys
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from connectors.clinical_records.errors import ConfigError
from warehouse.connection import spill_dir
from warehouse.ddl import ANALYTICS
from warehouse.memory import memory_limit
from warehouse.private import create_private, private_dir

PROJECT_VARIABLE = "CLINICAL_DBT_PROJECT"
DEFAULT_PROJECT = Path(__file__).resolve().parents[1] / "transform"
PROFILE, TARGET = "clinical_records", "warehouse"  # the profile this module writes
SKIPPED_FOLDERS = {"target", "logs", ".git", "__pycache__", ".venv"}
QUIET = [
    "--log-level",
    "none",
    "--log-level-file",
    "none",
    "--no-send-anonymous-usage-stats",
    "--no-use-colors",
]
# dbt also reads this variable; set for anything that runs dbt from this process.
os.environ.setdefault("DBT_SEND_ANONYMOUS_USAGE_STATS", "false")


class DbtFailed(RuntimeError):
    """A dbt command that is not a build (a parse, deps) failed: the project is broken."""


def project_dir(env: Mapping[str, str]) -> Path:
    """CLINICAL_DBT_PROJECT (a dbt project's folder), else the product's own `transform/`."""
    value = (env.get(PROJECT_VARIABLE) or "").strip()
    if not value:
        return DEFAULT_PROJECT
    path = Path(value).expanduser().resolve()
    if not (path / "dbt_project.yml").is_file():
        raise ConfigError(
            PROJECT_VARIABLE, "the folder of a dbt project (it holds dbt_project.yml)"
        )
    return path


def cache_root() -> Path:
    """Where parses are kept: `$XDG_CACHE_HOME/clinical-sync/dbt` (`~/.cache` by default)."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return private_dir(Path(base) / "clinical-sync" / "dbt")


def fingerprint(folder: Path, *extra: str) -> str:
    """Every file of the project (installed packages included, a local one being a link to
    its folder), by path and content."""
    digest = hashlib.sha256("\0".join(extra).encode())
    for root, dirs, files in os.walk(folder, followlinks=True):  # a local package: a link
        dirs[:] = sorted(d for d in dirs if d not in SKIPPED_FOLDERS)
        for name in sorted(files):
            path = Path(root, name)
            digest.update(str(path.relative_to(folder)).encode() + b"\0")
            digest.update(path.read_bytes())
    return digest.hexdigest()[:24]


def catalog(warehouse: Path) -> str:
    """The name DuckDB (and dbt-duckdb) give a file's catalog: its name's first part."""
    return warehouse.name.lstrip(".").split(".")[0]


def write_profile(folder: Path, warehouse: Path) -> Path:
    """`profiles.yml` in `folder` for the warehouse file: one thread, the memory cap and the
    private spill folder of every writer of it (`warehouse/connection.py`), so dbt's
    connection joins an open one of this process instead of waiting for its lock."""
    profile = {
        PROFILE: {
            "target": TARGET,
            "outputs": {
                TARGET: {
                    "type": "duckdb",
                    "path": str(warehouse),
                    "schema": ANALYTICS,
                    "threads": 1,
                    "keep_open": True,  # closed after each command (`release`)
                    "config_options": {"temp_directory": str(spill_dir(warehouse))},
                    "settings": {
                        "memory_limit": memory_limit(),
                        "preserve_insertion_order": False,
                        "TimeZone": "UTC",
                    },
                }
            },
        }
    }
    private_dir(folder)
    path = folder / "profiles.yml"
    text = yaml.safe_dump(profile, sort_keys=False)
    if not path.exists() or path.read_text() != text:
        partial = folder / f".profiles.{uuid.uuid4().hex}.yml"
        with os.fdopen(create_private(partial), "w") as out:
            out.write(text)
        os.replace(partial, path)
    return folder


@dataclass(frozen=True)
class Project:
    """A dbt project and the cache of its parse for warehouses of one catalog name."""

    path: Path
    cache: Path  # <cache root>/<fingerprint>: target/ (manifest.json, dbt's partial parse)
    database: str  # the warehouse files' catalog name, which dbt writes into every relation

    @property
    def target(self) -> Path:
        return self.cache / "target"

    @property
    def manifest_path(self) -> Path:
        return self.target / "manifest.json"

    @property
    def pickled(self) -> Path:
        return self.cache / "manifest.pickle"

    def arguments(self, profiles: Path) -> list[str]:
        """What every dbt command of this project is given: its artifacts and its (empty)
        log folder in the private cache, never in the project's folder."""
        return [
            *("--project-dir", str(self.path), "--profiles-dir", str(profiles)),
            *("--profile", PROFILE, "--target", TARGET, "--target-path", str(self.target)),
            *("--log-path", str(self.cache / "logs")),
            *QUIET,
        ]

    def manifest(self) -> Any:
        """dbt's parsed manifest, kept in this process (a partial parse from the cache in a
        new process: no file changed since the cache was made)."""
        return _parsed(self)


def prepare(
    path: Path = DEFAULT_PROJECT, *, database: str = TARGET, cache: Path | None = None
) -> Project:
    """The project parsed (once per content) for warehouses whose catalog is `database`:
    its packages installed when it names some and they are missing, then `dbt parse` into a
    new folder of the cache, renamed into place (a process parsing the same project at the
    same moment keeps its own)."""
    from dbt.version import __version__ as dbt_version

    if (path / "packages.yml").exists() or (path / "dependencies.yml").exists():
        _install_packages(path)
    key = fingerprint(path, dbt_version, database)
    project = Project(path, private_dir(cache or cache_root()) / key, database)
    if project.manifest_path.exists():
        return project
    work = Project(path, project.cache.with_name(f".{key}.{uuid.uuid4().hex}"), database)
    manifest = _invoke(["parse", *work.arguments(_parse_profile(database))], what=f"parse {path}")
    _keep(work, manifest)
    try:
        os.rename(work.cache, project.cache)
    except OSError:  # another process made the same parse meanwhile: keep its folder
        shutil.rmtree(work.cache, ignore_errors=True)
    _PARSED[project] = manifest
    return project


def _parse_profile(database: str) -> Path:
    """The profile a parse sees: a file of the catalog's name that nobody opens, at a path
    that stays the same, so that dbt's partial parse in a later process holds."""
    folder = cache_root() / "parse" / database
    return write_profile(folder, folder / f"{database}.duckdb")


def _install_packages(path: Path) -> None:
    """`dbt deps` when the project names packages and has none installed (a local package,
    such as this product's own transform/, needs no network)."""
    installed = path / "dbt_packages"
    if installed.is_dir() and any(installed.iterdir()):
        return
    scratch = private_dir(cache_root() / "deps")
    write_profile(scratch, scratch / "deps.duckdb")
    folders = ["--project-dir", str(path), "--profiles-dir", str(scratch)]
    _invoke(["deps", *folders, "--log-path", str(scratch / "logs"), *QUIET], what=f"deps {path}")


_PARSED: dict[Project, Any] = {}


def _parsed(project: Project) -> Any:
    """The parse of a project, from this process, else from the cache: the manifest as this
    module pickled it (0.03 s, where dbt's partial parse of an unchanged project takes 1.9 s
    of CPU), else a partial parse."""
    if project not in _PARSED:
        try:
            with project.pickled.open("rb") as kept:
                _PARSED[project] = pickle.load(kept)
        except (OSError, pickle.UnpicklingError, EOFError, AttributeError, ImportError):
            profiles = _parse_profile(project.database)
            manifest = _invoke(
                ["parse", *project.arguments(profiles)], what=f"parse {project.path}"
            )
            _keep(project, manifest)
            _PARSED[project] = manifest
    return _PARSED[project]


def _keep(project: Project, manifest: Any) -> None:
    """The parsed manifest, pickled beside dbt's artifacts (written whole, then renamed). Its
    lookups are left out: dbt builds them again on first use, and its Manifest.__reduce_ex__
    (dbt-core 1.11) hands them back in the wrong places."""
    for name in vars(manifest):
        if name.startswith("_") and name.endswith("_lookup"):
            setattr(manifest, name, None)
    partial = project.pickled.with_name(f".{uuid.uuid4().hex}.pickle")
    with os.fdopen(create_private(partial), "wb") as out:
        pickle.dump(manifest, out, protocol=pickle.HIGHEST_PROTOCOL)
    os.replace(partial, project.pickled)


def _invoke(args: Sequence[str], *, what: str) -> Any:
    """One dbt command in process; its result, or DbtFailed naming what failed."""
    result = runner().invoke(list(args))
    if not result.success:
        raise DbtFailed(f"dbt {what} failed: {_first_line(result.exception)}")
    return result.result


def runner(manifest: Any = None, on_event: Callable[[Any], None] | None = None) -> Any:
    from dbt.cli.main import dbtRunner

    _name_flag_sources_quickly()
    _look_for_plugins_once()
    return dbtRunner(manifest=manifest, callbacks=[on_event] if on_event else [])


@functools.cache
def _name_flag_sources_quickly() -> None:
    """dbt-common names the module that declared each of an adapter's behaviour flags with
    `inspect.stack()`, evaluated even when the flag names its source: it reads the source
    lines of every frame and searches every loaded module for frames without a file (jinja's
    templates). Twice per build, 55 ms each under a few thousand modules (cProfile of
    benchmarks/year_of_nights.py --scale 2). The same answer, the first module outside
    dbt-common's flags on the stack, found from the frames' own globals."""
    from dbt_common import behavior_flags

    def first_caller() -> str:
        frame = sys._getframe(1)
        while frame is not None:
            name = frame.f_globals.get("__name__")
            if name and name != behavior_flags.__name__:
                return name
            frame = frame.f_back
        return "Unknown"

    behavior_flags.BehaviorFlagRendered._default_source = staticmethod(first_caller)


@functools.cache
def _look_for_plugins_once() -> None:
    """dbt looks for plugins before every command by importing each module on `sys.path`
    whose name starts with `dbt_` found by listing every folder of `sys.path` (pkgutil): 15 ms
    a build in benchmarks/year_of_nights.py (py-spy), for an answer that cannot change while
    the process runs. Listed once, then the same modules every command (dbt does the same
    under its own tests' caching)."""
    from dbt.plugins.manager import PluginManager

    found = PluginManager.get_prefixed_modules()
    PluginManager.get_prefixed_modules = classmethod(lambda cls: found)


def release() -> None:
    """Close dbt-duckdb's connection, which it keeps open (per process) between commands:
    the warehouse file is then free for the next writer, in this process or another."""
    from dbt.adapters.duckdb.connections import DuckDBConnectionManager

    with DuckDBConnectionManager._LOCK:
        if DuckDBConnectionManager._ENV is not None:
            DuckDBConnectionManager._ENV.close()
            DuckDBConnectionManager._ENV = None


def _first_line(error: object) -> str:
    text = str(error or "see the dbt project").strip()
    return text.splitlines()[0] if text else type(error).__name__


@functools.cache
def manifest_json(project: Project) -> dict[str, Any]:
    """The manifest as dbt wrote it (what Dagster's asset graph is built from)."""
    import json

    return json.loads(project.manifest_path.read_text())
