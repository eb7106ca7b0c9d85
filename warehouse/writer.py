"""One writer per warehouse, proven: an fcntl lock on `<file>.lock` beside the DuckDB file,
held by whoever writes it for the whole of its write (docs/ARCHITECTURE.md, "One writer").

DuckDB's own lock is taken and let go with each connection, so a command that writes in
several connections (a rebuild builds a new file, then renames it over the working copy) is
not one write to DuckDB: a sync's load could commit between two of them and be deleted with
the old file. This lock spans the whole write. `Warehouse` takes it for every connection that
may write; a command holds it across its connections (`clinical-sync sync` for its whole run,
`rebuild` from its first read to its rename). Within one process the lock is re-entrant (a
run's in-process steps write under their command's hold); another process waits, then is
refused with the holder named, as the holder wrote itself into the file.

The lock is a POSIX record lock (`fcntl.lockf`): the kernel releases it when its process
dies, however it dies, so a killed writer never leaves it held; and a filesystem that
forwards POSIX locks to its server (a local disk, NFSv4, NFSv3 with lockd) holds it across the
hosts that share the volume. A filesystem that does not (some FUSE and SMB mounts) makes it
a lock per host: keep the working copy on one that does (docs/operators/running.md, "One
writer").
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import socket
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from warehouse import kept
from warehouse.connection import process_name
from warehouse.errors import WarehouseLocked
from warehouse.private import PRIVATE_FILE, private_dir

LOCK_SUFFIX = ".lock"
POLL_SECONDS = 0.2


@dataclass
class _Hold:
    fd: int
    depth: int


_holds: dict[Path, _Hold] = {}  # this process's holds, by lock file
_guard = threading.Lock()


def lock_path(warehouse: str | os.PathLike[str]) -> Path:
    path = Path(warehouse).absolute()
    return path.with_name(path.name + LOCK_SUFFIX)


def held_here(warehouse: str | os.PathLike[str]) -> bool:
    """Whether this process holds the warehouse's writer lock."""
    return lock_path(warehouse) in _holds


@contextlib.contextmanager
def writing(
    warehouse: str | os.PathLike[str],
    *,
    wait: float = 0.0,
    what: str = "",
    say: Callable[[str], object] | None = None,
) -> Iterator[None]:
    """Hold the writer lock of `warehouse` for the block: at once when this process holds
    it, else after waiting up to `wait` seconds for another holder (`say` is told once that
    it waits, and whom for); WarehouseLocked names the holder when the wait runs out. `what`
    says what this process writes, for whoever waits on it."""
    path = lock_path(warehouse)
    with _guard:
        hold = _holds.get(path)
        if hold is not None:
            hold.depth += 1
    if hold is None:
        hold = _acquire(path, Path(warehouse), wait, what, say)
    try:
        yield
    finally:
        with _guard:
            hold.depth -= 1
            if hold.depth == 0:
                del _holds[path]
                kept.release(Path(warehouse))  # before the lock goes: nobody may open it first
                _release(hold.fd)


def _acquire(
    path: Path, warehouse: Path, wait: float, what: str, say: Callable[[str], object] | None
) -> _Hold:
    private_dir(path.parent)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, PRIVATE_FILE)
    os.fchmod(fd, PRIVATE_FILE)  # created under the umask
    deadline = time.monotonic() + wait
    told = False
    try:
        while True:
            try:
                fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except OSError:  # EAGAIN or EACCES: another process holds it
                holder = _holder(fd)
                if time.monotonic() >= deadline:
                    raise _refused(warehouse, holder, wait) from None
                if say is not None and not told:
                    say(
                        f"warehouse {warehouse} is being written by {holder}; waiting up to {wait:g} s"
                    )
                    told = True
                time.sleep(POLL_SECONDS)
        text = (
            f"{_me()}{': ' + what if what else ''}, since {datetime.now(UTC):%Y-%m-%d %H:%M:%S} UTC"
        )
        os.ftruncate(fd, 0)
        os.pwrite(fd, text.encode(), 0)
    except BaseException:
        os.close(fd)
        raise
    hold = _Hold(fd, 1)
    with _guard:
        _holds[path] = hold
    return hold


def _release(fd: int) -> None:
    """Forget the holder and let go (closing the file alone would let go too)."""
    with contextlib.suppress(OSError):
        os.ftruncate(fd, 0)
    os.close(fd)


def _holder(fd: int) -> str:
    """Who holds the lock, as the holder wrote it (it writes right after taking it)."""
    with contextlib.suppress(OSError):
        text = os.pread(fd, 1024, 0).decode(errors="replace").strip()
        if text:
            return text
    return "another process"


def _me() -> str:
    """This process as a holder: its id, host and command (no option: one may hold a secret)."""
    name = process_name(os.getpid())
    return f"process {os.getpid()} on {socket.gethostname()}" + (f" ({name})" if name else "")


def _refused(warehouse: Path, holder: str, wait: float) -> WarehouseLocked:
    waited = f" (waited {wait:g} s)" if wait else ""
    return WarehouseLocked(
        f"warehouse {warehouse} is being written by {holder}{waited}: one writer at a time. "
        "Let it finish and run again"
    )
