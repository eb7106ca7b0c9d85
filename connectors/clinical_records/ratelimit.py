"""One request budget per API key, shared by every process and thread that uses the key: on one
machine through a SQLite file, across machines through PostgreSQL.

pyrate-limiter's `TokenBucket` (GCRA) policy keeps one number per key: the theoretical
arrival time. Its `StateStore` interface takes any store; pyrate-limiter ships in-memory,
multiprocessing and Redis stores, and its SQLite and Postgres buckets are sliding-window logs
that cannot honour a burst allowance (and read the clock before they hold the lock). So
`SharedStateStore` below runs each GCRA transition as one transaction that holds the key's
state and only then reads the clock: `SQLiteStateStore` inside `BEGIN IMMEDIATE` (SQLite's
file lock) with the host's clock, for one machine; `PostgresStateStore` on the key's row
(`SELECT ... FOR UPDATE`) with the database's `clock_timestamp()`, for every host of a
deployment whose instance is in PostgreSQL (DAGSTER_POSTGRES_URL): their clocks may differ,
the database's is one.

The bucket is named by a SHA-256 of the API key, never the key itself.

Safety margins: requests reach the server with a few milliseconds of jitter, so a client
using the server's exact burst could be refused. The local bucket keeps one token of the
burst in reserve (when the burst allows it) and runs at `SAFETY` of the configured rate.
Adaptive: a 429 pushes the shared bucket's state past the Retry-After, so every process
sharing the key pauses, and divides this process's rate by two (down to `FLOOR` of the
configured rate); each later success adds back `RECOVERY` of it.
"""

from __future__ import annotations

import hashlib
import os
import sqlite3
import threading
import time
from abc import abstractmethod
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from pyrate_limiter import Rate, StateStore, TokenBucket
from pyrate_limiter.abstracts.algorithm import Decision, StateAlgorithm

from connectors.clinical_records import postgres
from connectors.clinical_records.errors import ConfigError
from connectors.clinical_records.postgres import POSTGRES_VARIABLE, PostgresRefused

if TYPE_CHECKING:
    from connectors.clinical_records.settings import Settings

SAFETY = 0.99
FLOOR = 0.1
RECOVERY = 0.02
BUSY_TIMEOUT_MS = 10_000
POSTGRES_TABLE = "clinical_token_buckets"
POSTGRES_CONNECT_TIMEOUT = 10


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


class Held(Protocol):
    """One key's state while a transaction holds it, and the store's clock read after that."""

    now_ms: int

    def load(self) -> str: ...

    def save(self, state: str) -> None: ...


class SharedStateStore(StateStore):
    """GCRA state of one key outside the process. Every transition is one transaction that
    holds the state first and reads the clock then: a process that waited for the lock decides
    with the time it got it, never an earlier one. `check`'s `now` is therefore ignored."""

    is_async = False

    def __init__(self, key: str) -> None:
        self.key = key
        self._lock = threading.Lock()  # one transaction at a time on this process's connection

    @abstractmethod
    def _holding(self) -> AbstractContextManager[Held]:
        """A transaction holding this key's state; committed at the end, rolled back on error."""

    @staticmethod
    def _decode(algorithm: StateAlgorithm, rates: list[Rate], text: str) -> tuple:
        if not text:
            return algorithm.initial(rates)
        stored = algorithm.decode(text.split(","))
        return stored if len(stored) == len(rates) else algorithm.initial(rates)

    @staticmethod
    def _encode(state: tuple) -> str:
        return ",".join(str(int(v)) for v in state)

    def check(
        self, algorithm: StateAlgorithm, rates: list[Rate], now: int, weight: int
    ) -> Decision:
        with self._lock, self._holding() as held:
            state = self._decode(algorithm, rates, held.load())
            state, decision = algorithm.step(rates, state, held.now_ms, weight)
            if decision.allowed:
                held.save(self._encode(state))
            return decision

    def update(
        self,
        algorithm: StateAlgorithm,
        rates: list[Rate],
        change: Callable[[tuple, int], tuple],
    ) -> None:
        """Rewrite the stored state from it and the store's clock (ms), atomically: how a 429
        pushes every process sharing the key back."""
        with self._lock, self._holding() as held:
            state = self._decode(algorithm, rates, held.load())
            held.save(self._encode(change(state, held.now_ms)))

    def read(self, algorithm: StateAlgorithm, rates: list[Rate]) -> tuple:
        with self._lock, self._holding() as held:
            return self._decode(algorithm, rates, held.load())

    def reset(self) -> None:
        with self._lock, self._holding() as held:
            held.save("")


class _HeldRow:
    """`Held` over a cursor and a key, for both stores' SQL."""

    def __init__(
        self, cursor, key: str, now_ms: int, table: str, mark: str, state: str | None = None
    ) -> None:
        self.cursor, self.key, self.now_ms = cursor, key, now_ms
        self._table, self._mark = table, mark
        self._state = state  # read already, with the lock that holds the row

    def load(self) -> str:
        if self._state is not None:
            return self._state
        self.cursor.execute(
            f"SELECT state FROM {self._table} WHERE key = {self._mark}", (self.key,)
        )
        row = self.cursor.fetchone()
        return row[0] if row else ""

    def save(self, state: str) -> None:
        self.cursor.execute(
            f"UPDATE {self._table} SET state = {self._mark} WHERE key = {self._mark}",
            (state, self.key),
        )


class SQLiteStateStore(SharedStateStore):
    """One machine: the state in a SQLite file, each transition in `BEGIN IMMEDIATE`, the
    host's clock (wall time: a monotonic clock is per boot only)."""

    def __init__(self, path: Path, key: str) -> None:
        super().__init__(key)
        _private_file(path)
        self._conn = sqlite3.connect(
            path, isolation_level=None, check_same_thread=False, timeout=BUSY_TIMEOUT_MS / 1000
        )
        self._conn.execute(f"PRAGMA busy_timeout={BUSY_TIMEOUT_MS}")
        self._conn.execute(
            "CREATE TABLE IF NOT EXISTS token_buckets (key TEXT PRIMARY KEY, state TEXT NOT NULL)"
        )
        self._conn.execute(
            "INSERT INTO token_buckets (key, state) VALUES (?, '') ON CONFLICT (key) DO NOTHING",
            (key,),
        )

    @contextmanager
    def _holding(self) -> Iterator[Held]:
        self._conn.execute("BEGIN IMMEDIATE")
        try:
            now_ms = int(time.time() * 1000)
            yield _HeldRow(self._conn.cursor(), self.key, now_ms, "token_buckets", "?")
            self._conn.execute("COMMIT")
        except BaseException:
            self._conn.execute("ROLLBACK")
            raise

    def close(self) -> None:
        with self._lock:
            self._conn.close()


class PostgresStateStore(SharedStateStore):
    """Every host: the state in a row of `clinical_token_buckets` in the instance's PostgreSQL,
    each transition holding that row (`FOR UPDATE`), the database's clock read after it."""

    def __init__(self, url: str, key: str) -> None:
        super().__init__(key)
        self.url = url
        self._conn = self._connect()
        with self._conn.cursor() as cursor:
            # CREATE TABLE IF NOT EXISTS races between sessions: one creates at a time.
            cursor.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", (POSTGRES_TABLE,))
            cursor.execute(
                f"CREATE TABLE IF NOT EXISTS {POSTGRES_TABLE} "
                "(key TEXT PRIMARY KEY, state TEXT NOT NULL)"
            )
            cursor.execute(
                f"INSERT INTO {POSTGRES_TABLE} (key, state) VALUES (%s, '') "
                "ON CONFLICT (key) DO NOTHING",
                (key,),
            )
        self._conn.commit()

    def _connect(self):
        try:
            return postgres.connect(self.url, POSTGRES_CONNECT_TIMEOUT)
        except PostgresRefused as refused:
            raise ConfigError(
                POSTGRES_VARIABLE, f"a PostgreSQL server that answers ({refused.reason})"
            ) from None

    @contextmanager
    def _holding(self) -> Iterator[Held]:
        if self._conn.closed:
            self._conn = self._connect()  # the session ended (a server restart): a new one
        cursor = self._conn.cursor()
        try:
            # The row locked and read in one round trip, then the clock: read after the lock,
            # so no other host's later transition is older than this one's moment.
            cursor.execute(
                f"SELECT state FROM {POSTGRES_TABLE} WHERE key = %s FOR UPDATE", (self.key,)
            )
            row = cursor.fetchone()
            cursor.execute("SELECT (extract(epoch FROM clock_timestamp()) * 1000)::bigint")
            (now_ms,) = cursor.fetchone()
            state = row[0] if row else ""
            yield _HeldRow(cursor, self.key, int(now_ms), POSTGRES_TABLE, "%s", state)
            self._conn.commit()
        except BaseException:
            if not self._conn.closed:
                self._conn.rollback()
            raise
        finally:
            cursor.close()

    def close(self) -> None:
        with self._lock:
            self._conn.close()


def token_bucket_rate(rate: float, burst: int) -> Rate:
    """pyrate-limiter's integer Rate for `rate` per second: 1000 units per 1000/rate seconds."""
    return Rate(1000, max(1, round(1_000_000 / rate)), burst)


class AdaptiveLimiter:
    """A shared token bucket plus this process's adaptive share of the rate."""

    def __init__(self, store: SharedStateStore, rate: float, burst: int) -> None:
        self.configured = rate * SAFETY
        self.burst = max(1, burst - 1)
        self.current = self.configured
        self.store = store
        self.algorithm = TokenBucket()
        self._lock = threading.Lock()
        self._paused_until = 0.0
        self._rates = self._make_rates()

    def _make_rates(self) -> list[Rate]:
        return [token_bucket_rate(self.current, self.burst)]

    def acquire(self) -> float:
        started = time.monotonic()
        while True:
            pause = self._paused_until - time.monotonic()
            if pause > 0:
                time.sleep(pause)
                continue
            decision = self.store.check(self.algorithm, self._rates, 0, 1)
            if decision.allowed:
                return time.monotonic() - started
            wait_ms = decision.retry_after_ms or 10
            time.sleep(min(wait_ms, 1000) / 1000)

    def throttled(self, retry_after: float) -> None:
        """Pause for `retry_after` (every process sharing the store), then go slower."""
        with self._lock:
            self._paused_until = max(self._paused_until, time.monotonic() + retry_after)
            self._set_rate(max(self.configured * FLOOR, self.current / 2))
            rates, emission_us = self._rates, 1_000_000 / self.current

        def pushed(state: tuple, now_ms: int) -> tuple:
            # GCRA admits at `now` while TAT <= now + (burst - 1) * emission: a TAT this far
            # ahead admits nothing before the pause ends, and then one request at a time.
            resume_us = (now_ms + retry_after * 1000) * 1000
            tat = int(resume_us + (self.burst - 1) * emission_us)
            return tuple(max(int(v), tat) for v in state)

        self.store.update(self.algorithm, rates, pushed)

    def succeeded(self) -> None:
        if self.current >= self.configured:
            return
        with self._lock:
            self._set_rate(min(self.configured, self.current + self.configured * RECOVERY))

    def _set_rate(self, rate: float) -> None:
        if rate != self.current:
            self.current = rate
            self._rates = self._make_rates()

    def close(self) -> None:
        self.store.close()


def sqlite_limiter(path: Path, api_key: str, rate: float, burst: int) -> AdaptiveLimiter:
    """The machine-wide limiter for `api_key`, its state in the SQLite file at `path`."""
    try:
        store = SQLiteStateStore(path, key_digest(api_key))
    except (OSError, sqlite3.Error):
        raise ConfigError("CLINICAL_LIMITER_PATH", "a writable SQLite file path") from None
    return AdaptiveLimiter(store, rate, burst)


def postgres_limiter(url: str, api_key: str, rate: float, burst: int) -> AdaptiveLimiter:
    """The deployment-wide limiter for `api_key`, its state in the PostgreSQL at `url`."""
    return AdaptiveLimiter(PostgresStateStore(url, key_digest(api_key)), rate, burst)


def shared_limiter(settings: Settings) -> AdaptiveLimiter:
    """The limiter every process using this key shares: in the instance's PostgreSQL when the
    deployment has one (DAGSTER_POSTGRES_URL), else the machine's SQLite file."""
    if settings.limiter_url is not None:
        return postgres_limiter(
            settings.limiter_url, settings.api_key, settings.rate_limit, settings.burst
        )
    return sqlite_limiter(
        settings.limiter_path, settings.api_key, settings.rate_limit, settings.burst
    )
