"""Where a run is: each phase it enters (reading a set, reconciling it, writing a lake file,
loading a table, publishing), for whatever supervises it.

When `CLINICAL_PHASE_FILE` names a file, each phase replaces its one line, `<phase>
<entity set>`, atomically and owner-only; otherwise nothing is written. The reliability
suite kills runs in each phase by it (tests/reliability/test_crashes.py); an operator's
watchdog can show where a long run is. It names sets, never records.
"""

from __future__ import annotations

import os
from enum import StrEnum
from uuid import uuid4

from warehouse.private import create_private

PHASE_FILE = "CLINICAL_PHASE_FILE"


class Phase(StrEnum):
    EXTRACT = "extract"  # reading a set (or its family) from the API
    RECONCILE = "reconcile"  # probes, catch-ups and key ranges after the read
    LAKE = "lake"  # writing a Parquet batch
    LOAD = "load"  # the DuckDB transaction of one set
    PUBLISH = "publish"  # copying the working copy to WAREHOUSE_PATH


def enter(phase: Phase, entity: str = "") -> None:
    """Note that the run has entered `phase` (for `entity`)."""
    path = os.environ.get(PHASE_FILE)
    if not path:
        return
    partial = f"{path}.{uuid4().hex}"
    fd = create_private(partial)
    try:
        os.write(fd, f"{phase} {entity}\n".encode())
    finally:
        os.close(fd)
    os.replace(partial, path)
