"""Owner-only files and folders, whatever the umask (docs/ARCHITECTURE.md, Security).

The warehouse, its working copy, the lake and the Dagster home hold protected health
information. What this code writes itself is created private here (a mode set explicitly,
never left to the umask); what libraries write beside it (DuckDB's write-ahead log and spill
files, Dagster's SQLite files and logs) is covered by the entry points' `private_umask()` and
by the private folders it lands in. Data written before this rule existed is tightened once:
a tree whose top folder is open to others is walked and every entry made owner-only.
"""

from __future__ import annotations

import logging
import os
import stat
from pathlib import Path

log = logging.getLogger(__name__)

PRIVATE_FILE = 0o600
PRIVATE_DIR = 0o700
OPEN_BITS = 0o077  # group and others: read, write, execute
PRIVATE_UMASK = 0o077


def private_umask() -> int:
    """Make every file this process (and its children) creates owner-only; returns the old
    umask. Called by the entry points (`clinical-sync`, the Dagster code location)."""
    return os.umask(PRIVATE_UMASK)


def private_dir(path: str | os.PathLike[str]) -> Path:
    """`path` and any missing parents, each created 0700; an existing folder is left as is."""
    folder = Path(path)
    missing = []
    probe = folder
    while not probe.exists() and probe != probe.parent:
        missing.append(probe)
        probe = probe.parent
    for created in reversed(missing):
        try:
            created.mkdir(mode=PRIVATE_DIR)
        except FileExistsError:  # another process made it meanwhile
            continue
        os.chmod(created, PRIVATE_DIR)  # mkdir's mode passes through the umask
    return folder


def create_private(path: str | os.PathLike[str]) -> int:
    """A new file opened for writing, 0600 from its first byte; returns the descriptor."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, PRIVATE_FILE)
    os.fchmod(fd, PRIVATE_FILE)
    return fd


def make_private(path: str | os.PathLike[str]) -> bool:
    """Remove group and other bits from one file or folder; True when it had any."""
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return False
    if stat.S_ISLNK(mode) or not mode & OPEN_BITS:
        return False
    try:
        os.chmod(path, stat.S_IMODE(mode) & ~OPEN_BITS)
    except PermissionError:  # not ours: nothing this process may change
        return False
    return True


def is_open(path: str | os.PathLike[str]) -> bool:
    """Whether group or others have any access to `path` (False when it does not exist)."""
    try:
        return bool(os.lstat(path).st_mode & OPEN_BITS)
    except FileNotFoundError:
        return False


def tighten(paths: list[Path], what: str) -> int:
    """Make `paths` and everything under the folders among them owner-only, logging one line
    (a count and `what`, no file names) when any was open; returns how many changed."""
    changed = 0
    for path in paths:
        changed += make_private(path)
        if path.is_dir() and not path.is_symlink():
            for folder, dirs, files in os.walk(path):
                for name in (*dirs, *files):
                    changed += make_private(os.path.join(folder, name))
    if changed:
        entries = "1 file or folder was" if changed == 1 else f"{changed} files and folders were"
        log.warning("%s: %s open to other accounts; now owner-only (0600/0700)", what, entries)
    return changed


def tighten_tree(root: str | os.PathLike[str], what: str) -> int:
    """Tighten a whole tree once: only when its top folder is still open to others. A tree
    made by this code is private from its top down, so the walk runs once per old tree."""
    top = Path(root)
    return tighten([top], what) if is_open(top) else 0
