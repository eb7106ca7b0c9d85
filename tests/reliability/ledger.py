"""The soak ledger: figures the reliability suite collects across its cases (faults injected,
crashes survived, records compared, differences found), printed as one table at the end of
the session. Under `pytest -n` each worker keeps its own and sends it to the controller at
its end (`as_dict`, xdist's `workeroutput`), which adds them (`add`) and prints the sum. The
size factor is the environment's (`CLINICAL_SOAK`), which workers and controller share."""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

WORKER_OUTPUT = "reliability_ledger"  # the key of a worker's ledger in its workeroutput


def soak_factor() -> int:
    """10 under `make soak` (CLINICAL_SOAK set to anything but 0/empty), else 1."""
    flag = os.environ.get("CLINICAL_SOAK", "").strip()
    return 10 if flag and flag != "0" else 1


SIZE = soak_factor()


@dataclass
class Ledger:
    """Figures the suite collects across cases; printed as one table at the end."""

    faults: Counter[str] = field(default_factory=Counter)
    crashes_survived: int = 0
    kills: Counter[str] = field(default_factory=Counter)  # by the phase the run was in
    bad_rows_rejected: int = 0
    records_compared: int = 0
    mismatches: int = 0
    reported: int = 0  # runs that ended not exact and said so (an ERROR check failed)
    differences: Counter[str] = field(default_factory=Counter)  # records missing, stale, ...
    secrets_found: int = 0
    changes_during_runs: int = 0  # what drift changed at the source while runs read it
    reconciled: int = 0  # records the runs' reconciliation re-read or found deleted
    cases: int = 0

    def add_faults(self, stats: Mapping[str, int]) -> None:
        """The sandbox's `injected_*` counters and the 429s it sent."""
        for name, value in stats.items():
            if name.startswith("injected_") and name != "injected_error":  # = http_5xx
                self.faults[name.removeprefix("injected_")] += int(value)
        self.faults["429_rate_limit"] += int(stats.get("throttled", 0))

    def rows(self) -> list[tuple[str, str]]:
        kinds = ", ".join(f"{k} {v:,}" for k, v in sorted(self.faults.items()) if v) or "none"
        return [
            ("size factor", f"{SIZE}x"),
            ("cases run", f"{self.cases}"),
            ("faults injected", f"{sum(self.faults.values()):,} ({kinds})"),
            ("crashes survived (SIGKILL)", f"{self.crashes_survived}{self._by_phase()}"),
            ("bad rows rejected", f"{self.bad_rows_rejected}"),
            ("records compared", f"{self.records_compared:,}"),
            (
                "changed during runs, reconciled",
                f"{self.changes_during_runs:,}, {self.reconciled:,}",
            ),
            (
                "missing, extra, stale, duplicated (must be 0)",
                ", ".join(str(self.differences[k]) for k in DIFFERENCES),
            ),
            ("mismatches (must be 0)", f"{self.mismatches}"),
            ("runs not exact, reported by a failed check", f"{self.reported}"),
            ("secrets found (must be 0)", f"{self.secrets_found}"),
        ]

    def _by_phase(self) -> str:
        phases = ", ".join(f"{k} {v}" for k, v in sorted(self.kills.items()))
        return f" (killed while: {phases})" if phases else ""

    def as_dict(self) -> dict[str, Any]:
        """Plain values (a worker's ledger crosses to the controller through execnet)."""
        return {
            f.name: dict(value) if isinstance(value := getattr(self, f.name), Counter) else value
            for f in fields(self)
        }

    def add(self, other: Mapping[str, Any]) -> None:
        """Another process's ledger (`as_dict`) added to this one."""
        for f in fields(self):
            if f.name not in other:
                continue
            mine = getattr(self, f.name)
            if isinstance(mine, Counter):
                mine.update(other[f.name])
            else:
                setattr(self, f.name, mine + other[f.name])

    def print_to(self, terminalreporter: Any) -> None:
        """The table, as the session's last section (nothing when no case ran)."""
        if not self.cases:
            return
        rows = self.rows()
        width = max(len(name) for name, _ in rows)
        terminalreporter.section("reliability summary")
        for name, value in rows:
            terminalreporter.write_line(f"{name.ljust(width)}  {value}")


DIFFERENCES = ("missing", "extra", "stale", "duplicated")  # against the truth, per record
LEDGER = Ledger()  # this process's: a worker's, or the whole session's without -n
