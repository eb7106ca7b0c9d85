"""Opening the DuckDB file: the memory cap (`warehouse.memory`), the lock wait, owner-only files, transactions.

DuckDB lets one process write a file and nobody open it meanwhile; a second opener gets an
IOException naming the holder. Here it waits up to `wait` seconds, then says who holds it.
"""

from __future__ import annotations

import re
import time
from pathlib import Path

import duckdb

from warehouse import vacuum
from warehouse.errors import WarehouseLocked
from warehouse.private import private_dir

LOCK_WORDS = ("could not set lock", "conflicting lock")
OPEN_ATTEMPTS = 5  # read-only opens that met a publication's rename, before the error stands

HOLDER_RE = re.compile(r"Conflicting lock is held in (?P<program>.*?) \(PID (?P<pid>\d+)\)")


def process_name(pid: int) -> str | None:
    """A short name for process `pid` from /proc: the program and the words that say what it
    runs (`python3.11 -m cli.main sync`), stopping at the first option: options may carry
    secrets, and `-c` code anything."""
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return None
    args = [a.decode(errors="replace") for a in raw.split(b"\0") if a]
    if not args:
        return None
    shown = [Path(args[0]).name]
    for arg in args[1:5]:
        if arg.startswith("-") and arg != "-m":
            break
        shown.append(Path(arg).name if "/" in arg else arg)
    return " ".join(shown)


def lock_holder(message: str) -> str:
    """Who holds the lock, from DuckDB's error ('... held in <program> (PID n)')."""
    found = HOLDER_RE.search(message)
    if found is None:
        return "another process"
    pid = int(found["pid"])
    return f"process {pid} ({process_name(pid) or Path(found['program']).name})"


def _locked(path: Path, message: str, wait: float) -> WarehouseLocked:
    waited = f" after waiting {wait:g} s" if wait else ""
    return WarehouseLocked(
        f"warehouse {path} is held by {lock_holder(message)}{waited}: DuckDB lets one process "
        "write a file and nobody open it meanwhile. If that is another sync, let it finish and "
        "run again; anything else (a notebook, a SQL tool) should open the published "
        "WAREHOUSE_PATH read-only, never this file: close it there, or stop that process"
    )


def spill_dir(path: Path) -> Path:
    """Where a writer of `path` spills under the memory cap: `<file>.tmp` beside it."""
    return path.with_name(path.name + ".tmp")


def connect(path: Path, read_only: bool, wait: float, limit: str) -> duckdb.DuckDBPyConnection:
    """Open the file, turning DuckDB's lock error into `WarehouseLocked` (after `wait` s).
    A writer spills to `<file>.tmp`, a private folder beside the file."""
    config: dict[str, str] = {}
    if not read_only:
        config["temp_directory"] = str(private_dir(spill_dir(path)))
    deadline = time.monotonic() + wait
    while True:
        try:
            con = (
                open_read_only(path)
                if read_only
                else duckdb.connect(str(path), read_only=False, config=config)
            )
            set_session(con)
            con.execute(f"SET memory_limit = '{limit}'")
            con.execute("SET preserve_insertion_order = false")
            if not read_only:
                vacuum.hold(con)
            return con
        except duckdb.IOException as exc:
            if not any(word in str(exc).lower() for word in LOCK_WORDS):
                raise
            if time.monotonic() >= deadline:
                raise _locked(path, str(exc), wait) from None
            time.sleep(0.2)


def set_session(con: duckdb.DuckDBPyConnection) -> None:
    """What each connection (or cursor) sets for itself: TimeZone is a session's setting in
    DuckDB; the memory cap and insertion order are the instance's."""
    con.execute("SET TimeZone = 'UTC'")


def open_read_only(path: str | Path) -> duckdb.DuckDBPyConnection:
    """A read-only connection on a published warehouse. DuckDB opens the file by its path
    more than once while it connects (three times in 1.x, seen with strace), so a publication
    renaming the next night over it between two of those opens can make it read one file's
    header and the other's blocks: a SerializationException (seen once in a loaded test run).
    Either file is whole, so opening again a moment later succeeds."""
    for attempt in range(1, OPEN_ATTEMPTS):
        try:
            return duckdb.connect(str(path), read_only=True)
        except duckdb.SerializationException:
            time.sleep(0.05 * attempt)
    return duckdb.connect(str(path), read_only=True)  # the last attempt's error stands


class Transaction:
    """`with Transaction(con):` commits the block's statements together, or none of them."""

    def __init__(self, con: duckdb.DuckDBPyConnection) -> None:
        self.con = con

    def __enter__(self) -> None:
        self.con.execute("BEGIN TRANSACTION")

    def __exit__(self, kind: type[BaseException] | None, *_: object) -> None:
        self.con.execute("ROLLBACK" if kind else "COMMIT")
