"""How much memory DuckDB may take: a share of the machine, split between the runs at once.

A fixed 128MB cap ran the analytics models out of memory at scale 300 about one build in
five (DuckDB's out-of-core joins are best effort near the cap), on a machine where 128MB was
half a percent of memory. DuckDB's own default (80% of RAM, per process) is the other
extreme: ten tenants syncing at once would each claim most of the machine. So unless
WAREHOUSE_MEMORY_LIMIT names a cap, each warehouse gets half of the memory this process may
use (the physical memory, or its container's cgroup limit when lower) divided by the runs
that share it (WAREHOUSE_RUNS_AT_ONCE; `sync --all-tenants` sets it for its tenants), between
a floor and a ceiling. The other half is for Python (about 350 MiB a run), the operating
system and its page cache. Past the cap a load, a model or a publication spills to the
working copy's private `<file>.tmp` folder and runs slower; docs/SIZING.md says what each
scale needs.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from connectors.clinical_records.errors import ConfigError

MEMORY_LIMIT_VARIABLE = "WAREHOUSE_MEMORY_LIMIT"
RUNS_VARIABLE = "WAREHOUSE_RUNS_AT_ONCE"
MIB = 1024 * 1024
SHARE = 0.5  # of the memory this process may use, for every run's DuckDB together
FLOOR = 256 * MIB  # every scale-300 build of the models passed at 256MB, one in five failed at 128
CEILING = 2048 * MIB  # the biggest customer's night runs within it (docs/SIZING.md)
CGROUP_FILES = (
    Path("/sys/fs/cgroup/memory.max"),  # cgroup v2: a number, or "max"
    Path("/sys/fs/cgroup/memory/memory.limit_in_bytes"),  # cgroup v1: a huge number if unset
)
_SIZE_RE = re.compile(r"^[0-9]+(\.[0-9]+)?\s*(KB|MB|GB|KiB|MiB|GiB)$", re.IGNORECASE)


def memory_limit() -> str:
    """WAREHOUSE_MEMORY_LIMIT, checked before DuckDB sees it (ConfigError names it otherwise),
    or the share of this machine a run gets (`default_limit`)."""
    value = (os.environ.get(MEMORY_LIMIT_VARIABLE) or "").strip()
    if not value:
        return f"{default_limit(usable_memory(), runs_at_once()) // MIB}MiB"
    if not _SIZE_RE.match(value):
        raise ConfigError(MEMORY_LIMIT_VARIABLE, "a size such as 256MB or 2GB")
    return value


def default_limit(usable: int, runs: int) -> int:
    """Bytes for one run's DuckDB: SHARE of `usable` over `runs`, within [FLOOR, CEILING]."""
    return max(FLOOR, min(CEILING, int(usable * SHARE / max(1, runs))))


def runs_at_once() -> int:
    """WAREHOUSE_RUNS_AT_ONCE: how many runs share this machine's memory (1 when unset)."""
    value = (os.environ.get(RUNS_VARIABLE) or "").strip()
    if not value:
        return 1
    if not value.isdigit() or int(value) < 1:
        raise ConfigError(RUNS_VARIABLE, "a whole number of runs, 1 or more")
    return int(value)


def usable_memory() -> int:
    """The physical memory, or the cgroup's limit on this process when it is lower."""
    physical = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return min(physical, cgroup_limit() or physical)


def cgroup_limit() -> int | None:
    """The container's memory limit in bytes, if one is set (v2 or v1)."""
    for path in CGROUP_FILES:
        try:
            text = path.read_text(encoding="ascii").strip()
        except OSError:
            continue
        if text.isdigit():
            return int(text)
    return None
