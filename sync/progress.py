"""Progress of an extraction: pages done of the total that `@odata.count` promises, rate, ETA.

The extraction asset reports to whatever `Progress` is installed; the CLI installs a terminal
bar, and under `dagster dev` the default one writes a log line every few pages instead.
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TextIO

from connectors.clinical_records.catalogue import PAGE_SIZE


@dataclass
class Tally:
    """Pages and records done for one entity set, and since when."""

    entity: str
    started: float = field(default_factory=time.monotonic)
    pages: int = 0
    records: int = 0
    total_records: int | None = None

    @property
    def total_pages(self) -> int | None:
        if self.total_records is None:
            return None
        # The connector's windows overlap by a record, so a page or two more may be needed.
        return max(1, math.ceil(self.total_records / PAGE_SIZE), self.pages)

    @property
    def rate(self) -> float:
        """Pages per second so far."""
        elapsed = time.monotonic() - self.started
        return self.pages / elapsed if elapsed > 0 else 0.0

    @property
    def eta_seconds(self) -> float | None:
        total = self.total_pages
        if total is None or self.rate <= 0:
            return None
        return max(0.0, (total - self.pages) / self.rate)

    def line(self) -> str:
        total = self.total_pages
        of = f"/{total}" if total is not None else ""
        eta = self.eta_seconds
        eta_text = f"ETA {eta:4.0f}s" if eta is not None else "ETA    ?"
        bar = ""
        if total:
            done = min(20, round(20 * self.pages / total))
            bar = "[" + "#" * done + "." * (20 - done) + "] "
        return (
            f"{self.entity:<24} {bar}{self.pages:>5}{of} pages "
            f"{self.records:>8,} rows {self.rate:5.1f} pages/s {eta_text}"
        )


class Progress:
    """Receives page events; this base class forwards a line every `every` pages to `emit`."""

    def __init__(self, emit: Callable[[str], None] | None = None, every: int = 25) -> None:
        self.emit = emit
        self.every = every
        self.tallies: dict[str, Tally] = {}

    def start(self, entity: str, total_records: int | None = None) -> Tally:
        tally = self.tallies[entity] = Tally(entity, total_records=total_records)
        return tally

    def page(self, entity: str, records: int, total_records: int | None) -> None:
        tally = self.tallies.get(entity) or self.start(entity, total_records)
        tally.pages += 1
        tally.records += records
        if total_records is not None:
            tally.total_records = total_records
        self.show(tally, final=False)

    def finish(self, entity: str) -> None:
        tally = self.tallies.get(entity)
        if tally is not None:
            self.show(tally, final=True)

    def show(self, tally: Tally, *, final: bool) -> None:
        if self.emit is not None and (final or tally.pages % self.every == 0):
            self.emit(tally.line())


class TerminalProgress(Progress):
    """One line per entity set, redrawn in place on a terminal, appended otherwise."""

    def __init__(self, stream: TextIO | None = None, min_interval: float = 0.2) -> None:
        super().__init__()
        self.stream = stream or sys.stderr
        self.tty = self.stream.isatty()
        self.min_interval = min_interval
        self._last_draw = 0.0

    def show(self, tally: Tally, *, final: bool) -> None:
        now = time.monotonic()
        if not final and now - self._last_draw < self.min_interval:
            return
        self._last_draw = now
        if self.tty:
            end = "\n" if final else ""
            self.stream.write("\r\x1b[2K" + tally.line() + end)
        elif final:
            self.stream.write(tally.line() + "\n")
        self.stream.flush()


_current: Progress | None = None


def install(progress: Progress | None) -> Progress | None:
    """Make `progress` receive the page events of extractions in this process (None: logs)."""
    global _current
    previous, _current = _current, progress
    return previous


def current(emit: Callable[[str], None]) -> Progress:
    """The installed progress, or one that emits a line every few pages to `emit`."""
    return _current if _current is not None else Progress(emit)
