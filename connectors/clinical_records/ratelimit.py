"""One request budget per API key for the whole machine, shared by every process and thread.

pyrate-limiter's `TokenBucket` (GCRA) policy keeps one number per key: the theoretical
arrival time. Its `StateBucket` takes any `StateStore`; pyrate-limiter ships in-memory,
multiprocessing and Redis stores but no SQLite one, and its `SQLiteBucket` is a sliding-window
log that cannot honour a burst allowance. So `SQLiteStateStore` below persists the GCRA state
in a SQLite file and runs each transition inside `BEGIN IMMEDIATE` (SQLite's own file lock):
every process on the machine sees one bucket. Several machines sharing a key swap in
pyrate-limiter's `RedisStateStore`, nothing else changes.

The bucket row is named by a SHA-256 of the API key, never the key itself.

Safety margins: requests reach the server with a few milliseconds of jitter, so a client
using the server's exact burst could be refused. The local bucket keeps one token of the
burst in reserve (when the burst allows it) and runs at `SAFETY` of the configured rate.
Adaptive: a 429 pushes the shared bucket's state past the Retry-After, so every process on
the machine pauses, and divides this process's rate by two (down to `FLOOR` of the
configured rate); each later success adds back `RECOVERY` of it.
"""

from __future__ import annotations

import hashlib
import os
import sqlite3
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

from pyrate_limiter import Rate, RateItem, StateBucket, StateStore, TokenBucket, WallClock
from pyrate_limiter.abstracts.algorithm import Decision, StateAlgorithm

from connectors.clinical_records.errors import ConfigError

SAFETY = 0.99
FLOOR = 0.1
RECOVERY = 0.02
BUSY_TIMEOUT_MS = 10_000


class RequestLimiter(Protocol):
    """What the transport needs from a limiter: wait for a slot, hear about 429s and successes."""

    def acquire(self) -> float:
        """Block until one request may be sent; return the seconds waited."""
        ...

    def throttled(self, retry_after: float) -> None: ...

    def succeeded(self) -> None: ...

    def close(self) -> None: ...


def key_digest(api_key: str) -> str:
    """The bucket's name: a hash of the API key, so the key never lands on disk."""
    return hashlib.sha256(api_key.encode()).hexdigest()[:32]


def _private_file(path: Path) -> None:
    """The bucket file (and a folder made for it) owner-only, whatever the umask: the machine's
    other accounts have no business with this user's request budget."""
    if not path.parent.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.parent.chmod(0o700)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        os.fchmod(fd, 0o600)
    finally:
        os.close(fd)


class SQLiteStateStore(StateStore):
    """GCRA state for one key in a SQLite file; each check is one `BEGIN IMMEDIATE` transaction."""

    is_async = False
    default_clock = WallClock()  # shared between processes: a monotonic clock is per boot only

    def __init__(self, path: Path, key: str) -> None:
        _private_file(path)
        self.key = key
        self._lock = threading.Lock()
        self._conn = sqlite3.connect(
            path, isolation_level=None, check_same_thread=False, timeout=BUSY_TIMEOUT_MS / 1000
        )
        self._conn.execute(f"PRAGMA busy_timeout={BUSY_TIMEOUT_MS}")
        self._conn.execute(
            "CREATE TABLE IF NOT EXISTS token_buckets (key TEXT PRIMARY KEY, state TEXT NOT NULL)"
        )

    def _write(self, state: tuple) -> None:
        self._conn.execute(
            "INSERT INTO token_buckets (key, state) VALUES (?, ?) "
            "ON CONFLICT (key) DO UPDATE SET state = excluded.state",
            (self.key, ",".join(str(int(v)) for v in state)),
        )

    def _load(self, algorithm: StateAlgorithm, rates: list[Rate]) -> tuple:
        row = self._conn.execute(
            "SELECT state FROM token_buckets WHERE key = ?", (self.key,)
        ).fetchone()
        if row is None:
            return algorithm.initial(rates)
        stored = algorithm.decode(row[0].split(","))
        return stored if len(stored) == len(rates) else algorithm.initial(rates)

    def check(
        self, algorithm: StateAlgorithm, rates: list[Rate], now: int, weight: int
    ) -> Decision:
        with self._lock:
            self._conn.execute("BEGIN IMMEDIATE")
            try:
                state, decision = algorithm.step(rates, self._load(algorithm, rates), now, weight)
                if decision.allowed:
                    self._write(state)
                self._conn.execute("COMMIT")
            except BaseException:
                self._conn.execute("ROLLBACK")
                raise
            return decision

    def update(
        self, algorithm: StateAlgorithm, rates: list[Rate], change: Callable[[tuple], tuple]
    ) -> None:
        """Rewrite the stored state atomically (used to push every process back after a 429)."""
        with self._lock:
            self._conn.execute("BEGIN IMMEDIATE")
            try:
                self._write(change(self._load(algorithm, rates)))
                self._conn.execute("COMMIT")
            except BaseException:
                self._conn.execute("ROLLBACK")
                raise

    def read(self, algorithm: StateAlgorithm, rates: list[Rate]) -> tuple:
        with self._lock:
            return self._load(algorithm, rates)

    def reset(self) -> None:
        with self._lock:
            self._conn.execute("DELETE FROM token_buckets WHERE key = ?", (self.key,))

    def close(self) -> None:
        with self._lock:
            self._conn.close()


def token_bucket_rate(rate: float, burst: int) -> Rate:
    """pyrate-limiter's integer Rate for `rate` per second: 1000 units per 1000/rate seconds."""
    return Rate(1000, max(1, round(1_000_000 / rate)), burst)


class AdaptiveLimiter:
    """A shared token bucket plus this process's adaptive share of the rate."""

    def __init__(self, store: StateStore, rate: float, burst: int) -> None:
        self.configured = rate * SAFETY
        self.burst = max(1, burst - 1)
        self.current = self.configured
        self.store = store
        self._lock = threading.Lock()
        self._paused_until = 0.0
        self._bucket = self._make_bucket()

    def _make_bucket(self) -> StateBucket:
        rate = token_bucket_rate(self.current, self.burst)
        return StateBucket([rate], algorithm=TokenBucket(), store=self.store)

    def acquire(self) -> float:
        started = time.monotonic()
        while True:
            pause = self._paused_until - time.monotonic()
            if pause > 0:
                time.sleep(pause)
                continue
            bucket = self._bucket
            item = RateItem("request", bucket.now())
            decision = self.store.check(bucket.algorithm, bucket.rates, item.timestamp, 1)
            if decision.allowed:
                return time.monotonic() - started
            wait_ms = decision.retry_after_ms or 10
            time.sleep(min(wait_ms, 1000) / 1000)

    def throttled(self, retry_after: float) -> None:
        """Pause for `retry_after` (every process, where the store allows), then go slower."""
        with self._lock:
            self._paused_until = max(self._paused_until, time.monotonic() + retry_after)
            self._set_rate(max(self.configured * FLOOR, self.current / 2))
            bucket = self._bucket
        update = getattr(self.store, "update", None)
        if update is not None:
            # GCRA admits at `now` while TAT <= now + (burst - 1) * emission: a TAT this far
            # ahead admits nothing before the pause ends, and then one request at a time.
            emission_us = 1_000_000 / self.current
            resume_us = (bucket.now() + retry_after * 1000) * 1000
            tat = int(resume_us + (self.burst - 1) * emission_us)
            update(
                bucket.algorithm, bucket.rates, lambda state: tuple(max(int(v), tat) for v in state)
            )

    def succeeded(self) -> None:
        if self.current >= self.configured:
            return
        with self._lock:
            self._set_rate(min(self.configured, self.current + self.configured * RECOVERY))

    def _set_rate(self, rate: float) -> None:
        if rate != self.current:
            self.current = rate
            self._bucket = self._make_bucket()

    def close(self) -> None:
        self.store.close()


def sqlite_limiter(path: Path, api_key: str, rate: float, burst: int) -> AdaptiveLimiter:
    """The machine-wide limiter for `api_key`, its state in the SQLite file at `path`."""
    try:
        store = SQLiteStateStore(path, key_digest(api_key))
    except (OSError, sqlite3.Error):
        raise ConfigError("CLINICAL_LIMITER_PATH", "a writable SQLite file path") from None
    return AdaptiveLimiter(store, rate, burst)
