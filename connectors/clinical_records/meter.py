"""The one meter of a run's requests: its figures (`Counters`) and every answered request as
a look at the sets it showed (`Look`), which the run's end checks (sync/exactness.py)."""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field, fields


@dataclass(frozen=True)
class Look:
    """One answered request, as a look at every entity set its answer showed (the set asked
    and those expanded into it): when it was sent and when its answer had been read, by the
    wall clock that every step of a run on one host shares. The end of a run checks each
    set's last look against every other look at it (sync/exactness.py)."""

    id: str  # unique in a run: the process and the request's number in it
    shows: frozenset[str]
    sent: float
    answered: float


@dataclass
class Counters:
    """Per-run figures the Dagster assets publish as metadata; `measure` attributes them to
    a piece of work. The one meter of requests: it also keeps every answered request's
    `Look` (`looks`), and each thread's latest (`latest_look`)."""

    requests: int = 0
    pages: int = 0
    records: int = 0
    bytes: int = 0
    throttled: int = 0
    retries: int = 0
    token_refreshes: int = 0
    # Wall-clock seconds in which a request waited (for the limiter or a backoff): waits of
    # parallel requests that overlap count once, so this never exceeds the run's duration.
    wait_seconds: float = 0.0
    gap_repairs: int = 0  # paging windows that did not join up (the source changed)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)
    _waiters: int = field(default=0, repr=False, compare=False)
    _wait_began: float = field(default=0.0, repr=False, compare=False)
    _looks: list[Look] = field(default_factory=list, repr=False, compare=False)
    _latest: threading.local = field(default_factory=threading.local, repr=False, compare=False)

    def look(self, shows: frozenset[str], sent: float, answered: float) -> Look:
        """An answered request that showed `shows`."""
        with self._lock:
            seen = Look(f"{os.getpid()}.{len(self._looks)}", shows, sent, answered)
            self._looks.append(seen)
        self._latest.look = seen
        return seen

    @property
    def looks(self) -> list[Look]:
        with self._lock:
            return list(self._looks)

    def latest_look(self) -> Look | None:
        """The last answered request this thread sent (a reconciler's own requests are sent
        from its thread: its last look at a set is the latest after its final probe)."""
        return getattr(self._latest, "look", None)

    @contextlib.contextmanager
    def waiting(self) -> Iterator[None]:
        """Time spent inside, counted once however many requests wait at the same time."""
        with self._lock:
            if self._waiters == 0:
                self._wait_began = time.monotonic()
            self._waiters += 1
        try:
            yield
        finally:
            with self._lock:
                self._waiters -= 1
                if self._waiters == 0:
                    self.wait_seconds += time.monotonic() - self._wait_began

    def add(self, **amounts: float) -> None:
        with self._lock:
            for name, amount in amounts.items():
                setattr(self, name, getattr(self, name) + amount)

    @contextlib.contextmanager
    def measure(self, into: dict[str, float] | None = None) -> Iterator[dict[str, float]]:
        """What the work inside spent, every counter's difference added into `into` (a new
        dict by default), filled when the work ends, failed or not: the one way a step
        learns its own cost on a client other steps share."""
        spent = {} if into is None else into
        before = self.as_dict()
        try:
            yield spent
        finally:
            for name, value in self.as_dict().items():
                spent[name] = round(spent.get(name, 0) + value - before[name], 3)

    def as_dict(self) -> dict[str, float]:
        with self._lock:
            values = {f.name: getattr(self, f.name) for f in fields(self) if f.name[0] != "_"}
        values["wait_seconds"] = round(values["wait_seconds"], 3)
        return values
