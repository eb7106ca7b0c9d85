"""The service's request limit: a token bucket per API key, answered with 429 and Retry-After."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass


@dataclass
class _Bucket:
    tokens: float
    updated: float


class RateLimiter:
    """Per API key, `rate` requests per second sustained and `burst` at once; each key's own
    limit (a customer's) or the sandbox's; `rate=None` disables it."""

    def __init__(self, rate: float | None, burst: int) -> None:
        self.rate = rate
        self.burst = burst
        self._buckets: dict[str, _Bucket] = {}

    def reconfigure(self, rate: float | None, burst: int) -> None:
        self.rate, self.burst = rate, burst

    def acquire(self, key: str, rate: float | None = None, burst: int | None = None) -> float:
        """Take one token of `key`'s bucket (at `rate` and `burst` when given, else the
        sandbox's); return 0 when allowed, else the seconds until one is free."""
        rate = self.rate if rate is None else rate
        burst = self.burst if burst is None else burst
        if rate is None:
            return 0.0
        now = time.monotonic()
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
