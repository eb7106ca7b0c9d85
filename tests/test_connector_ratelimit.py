"""The SQLite token bucket: shared through the file, keyed by a hash, adaptive after 429s."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from connectors.clinical_records.errors import ConfigError
from connectors.clinical_records.ratelimit import FLOOR, SAFETY, key_digest, sqlite_limiter
from tests.connector_helpers import acquire_together

API_KEY = "key-do-not-store-4411"


def test_two_limiters_on_one_file_share_the_budget(tmp_path: Path) -> None:
    path = tmp_path / "bucket.sqlite"
    rate, burst = 20.0, 3
    limiters = [sqlite_limiter(path, API_KEY, rate, burst) for _ in range(2)]
    elapsed = acquire_together(limiters, 10)
    # 20 requests, burst - 1 at once, the rest at SAFETY * rate for the pair of them
    assert elapsed >= (20 - (burst - 1)) / (rate * SAFETY) * 0.95
    assert elapsed < 2.0
    for limiter in limiters:
        limiter.close()
    assert API_KEY.encode() not in path.read_bytes()
    assert key_digest(API_KEY).encode() in path.read_bytes()


def test_other_keys_have_their_own_bucket(tmp_path: Path) -> None:
    path = tmp_path / "bucket.sqlite"
    busy = sqlite_limiter(path, API_KEY, 2.0, 2)
    busy.acquire()
    other = sqlite_limiter(path, "another-key", 2.0, 2)
    assert other.acquire() < 0.2
    assert busy.acquire() > 0.3  # the first key's bucket is empty: wait for a refill
    busy.close()
    other.close()


def test_429_lowers_the_rate_and_successes_recover_it(tmp_path: Path) -> None:
    limiter = sqlite_limiter(tmp_path / "b.sqlite", API_KEY, 10.0, 4)
    full = limiter.current
    limiter.throttled(0.2)
    assert limiter.current == full / 2
    started = time.monotonic()
    limiter.acquire()
    assert time.monotonic() - started >= 0.18  # Retry-After pauses this process
    for _ in range(10):
        limiter.throttled(0.0)
    assert limiter.current == full * FLOOR
    for _ in range(200):
        limiter.succeeded()
    assert limiter.current == full
    limiter.close()


def test_a_429_pauses_every_limiter_sharing_the_file(tmp_path: Path) -> None:
    path = tmp_path / "bucket.sqlite"
    hit, other = (sqlite_limiter(path, API_KEY, 50.0, 5) for _ in range(2))
    started = time.monotonic()
    hit.throttled(0.5)
    for _ in range(3):
        other.acquire()
    # the other "process" waits out the Retry-After too, then resumes without a burst:
    # three requests need at least two emission intervals (1/49.5 s) after the pause
    assert time.monotonic() - started >= 0.5 + 2 / 49.5
    hit.close()
    other.close()


def test_an_unwritable_limiter_path_is_a_config_error(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    with pytest.raises(ConfigError, match="CLINICAL_LIMITER_PATH"):
        sqlite_limiter(blocker / "bucket.sqlite", API_KEY, 2.0, 4)
