"""One DuckDB instance per warehouse file for as long as this process holds its writer lock.

Opening a file reads its catalog (20 to 35 ms at a nightly's sizes); a tenant's run opened its
working copy 21 times, a night of benchmarks/year_of_nights.py four. While a command holds
the writer lock (`warehouse/writer.py`: `sync` for its whole run, a publication for its own),
every `Warehouse` of that file in this process is a cursor of one instance, opened at the
first and closed when the hold ends (`release`, called by the writer lock). A writer's
cursor checkpoints when it closes, as closing its own instance did, so what reaches the file,
and when, is what it was; two cursors of one instance are what two connections of one
process always were (DuckDB gives a process one instance per file).

An instance must never outlive its file: one left open on a file renamed over (a compaction,
a rebuild) would write to the old inode. Whoever replaces a working copy calls `replaced`
first; every cursor asks whether the file is still the one the instance opened (inode and
device) and refuses, rather than guess, while an instance of a replaced file is in use. A
cursor closed by an error lets the instance go: the next step starts on a fresh one, as it
did when every step opened its own.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import duckdb

from warehouse.connection import set_session


@dataclass(eq=False)
class Instance:
    """A kept instance: its own connection, the file it opened, the cursors in use."""

    key: Path
    root: duckdb.DuckDBPyConnection
    file: tuple[int, int] | None  # (device, inode) of the file it opened
    users: int = 0
    gone: bool = False  # replaced, or a cursor failed: closed when its last cursor closes


_instances: dict[Path, Instance] = {}  # the instance kept of each file
_guard = threading.Lock()


def _key(path: Path) -> Path:
    return Path(path).absolute()


def _identity(path: Path) -> tuple[int, int] | None:
    try:
        found = os.stat(path)
    except FileNotFoundError:
        return None
    return found.st_dev, found.st_ino


def cursor(
    path: Path, connect: Callable[[], duckdb.DuckDBPyConnection]
) -> tuple[duckdb.DuckDBPyConnection, Instance]:
    """A cursor of this process's instance of `path` and that instance (`done` is given
    both), opened with `connect` when there is none (or the file is no longer the one it
    opened and nothing uses it)."""
    key = _key(path)
    with _guard:
        held = _instances.get(key)
        if held is not None and (held.gone or held.file != _identity(key)):
            if held.users:
                raise RuntimeError(
                    f"warehouse {path} was replaced while this process still reads it; "
                    "run the command again"
                )
            _close(held)
            held = None
        if held is None:
            root = connect()  # DuckDB writes a new file's header as it opens it
            held = _instances[key] = Instance(key, root, _identity(key))
        con = held.root.cursor()
        held.users += 1
    try:
        set_session(con)
    except BaseException:
        done(con, held, checkpoint=False, failed=True)
        raise
    return con, held


def done(con: duckdb.DuckDBPyConnection, held: Instance, *, checkpoint: bool, failed: bool) -> None:
    """A cursor of `held` is finished with: a writer's checkpoints when it is the only one of
    its instance in use (as its own instance's close would have); a failed one lets the
    instance go."""
    with _guard:
        try:
            if checkpoint and not failed and held.users == 1 and not held.gone:
                with contextlib.suppress(duckdb.TransactionException):  # another still writes
                    con.execute("CHECKPOINT")
        finally:
            con.close()
            held.users -= 1
            held.gone = held.gone or failed
            if held.gone and not held.users:
                _close(held)


def replaced(path: Path) -> None:
    """`path` is about to be (or was just) renamed over: its instance closes with its last
    cursor, and the next opens the new file."""
    key = _key(path)
    with _guard:
        held = _instances.get(key)
        if held is not None:
            held.gone = True
            if not held.users:
                _close(held)


def release(path: Path) -> None:
    """The writer lock's hold has ended: close the instance (its cursors, if any are left,
    keep it alive until they close)."""
    with _guard:
        held = _instances.get(_key(path))
        if held is not None:
            held.gone = True  # a cursor left open closes nothing more when it is done
            _close(held)


def _close(held: Instance) -> None:
    """Close the instance's own connection and forget it (once)."""
    if _instances.get(held.key) is held:
        del _instances[held.key]
    held.root.close()


def _forget_in_child() -> None:
    """A forked process does not own its parent's instances (nor may it close them)."""
    _instances.clear()


os.register_at_fork(after_in_child=_forget_in_child)
