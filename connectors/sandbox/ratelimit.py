"""The service's request limit: a token bucket per API key, answered with 429 and Retry-After;
and the log of when each key's requests arrived, the measure a shared client limit is judged by.
"""

from __future__ import annotations

import math
import time
from collections import defaultdict, deque
from collections.abc import Sequence
from dataclasses import dataclass

ARRIVALS_KEPT = 100_000
"""Arrivals kept per API key: the newest, so a long-running sandbox's memory stays bounded
(a benchmark's run, thousands of requests, fits many times over)."""


@dataclass
class _Bucket:
    tokens: float
    updated: float


class RateLimiter:
    """Per API key, `rate` requests per second sustained and `burst` at once; each key's own
    limit (a customer's) or the sandbox's; `rate=None` disables it."""

    def __init__(self, rate: float | None, burst: int, kept: int = ARRIVALS_KEPT) -> None:
        self.rate = rate
        self.burst = burst
        self._buckets: dict[str, _Bucket] = {}
        # Per API key, the monotonic time every request reached the limit, admitted or not:
        # the newest `kept`.
        self.arrivals: defaultdict[str, deque[float]] = defaultdict(lambda: deque(maxlen=kept))

    def reconfigure(self, rate: float | None, burst: int) -> None:
        self.rate, self.burst = rate, burst

    def acquire(self, key: str, rate: float | None = None, burst: int | None = None) -> float:
        """Take one token of `key`'s bucket (at `rate` and `burst` when given, a customer's
        own, else the sandbox's); return 0 when allowed, else the seconds until one is free."""
        now = time.monotonic()
        self.arrivals[key].append(now)
        rate = self.rate if rate is None else rate
        burst = self.burst if burst is None else burst
        if rate is None:
            return 0.0
        bucket = self._buckets.setdefault(key, _Bucket(float(burst), now))
        bucket.tokens = min(burst, bucket.tokens + (now - bucket.updated) * rate)
        bucket.updated = now
        if bucket.tokens >= 1:
            bucket.tokens -= 1
            return 0.0
        return (1 - bucket.tokens) / rate


def retry_after_header(wait: float) -> str:
    """Whole seconds, rounded up and at least 1, as HTTP's delta-seconds form requires."""
    return str(max(1, math.ceil(wait)))


def most_in_window(times: Sequence[float], seconds: float) -> int:
    """The most arrivals within any `seconds` of each other (a window that starts at one of
    them): a key honours `rate` and `burst` when this is at most rate * seconds + burst."""
    ordered = sorted(times)
    most, first = 0, 0
    for last, at in enumerate(ordered):
        while at - ordered[first] > seconds:
            first += 1
        most = max(most, last - first + 1)
    return most
