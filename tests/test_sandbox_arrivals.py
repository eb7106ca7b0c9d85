"""The sandbox's log of when each API key's requests arrived: the measure a client's shared
limit is judged by, so it must count refused requests too."""

from __future__ import annotations

import httpx

from connectors.sandbox.config import SandboxConfig
from connectors.sandbox.control import SandboxControl
from connectors.sandbox.ratelimit import RateLimiter, most_in_window
from connectors.sandbox.server import SandboxServer
from tests.conftest import api_client


def test_most_in_window_counts_the_busiest_stretch() -> None:
    assert most_in_window([], 1.0) == 0
    assert most_in_window([5.0, 0.0, 0.5, 1.0, 1.2, 3.0], 1.0) == 3  # 0.0, 0.5, 1.0
    assert most_in_window([0.0, 0.5, 1.0, 1.2, 3.0], 0.7) == 3  # 0.5, 1.0, 1.2
    assert most_in_window([2.0, 2.0, 2.0], 0.0) == 3


def test_every_request_of_a_key_is_logged_refused_ones_too() -> None:
    with SandboxServer(SandboxConfig(seed=3, scale=0.01, rate=5, burst=3)) as server:
        with api_client(server) as client:
            answers = [client.get("Branches").status_code for _ in range(12)]
        control = SandboxControl.from_env(server.env())
        arrivals = control.arrivals()
        other = httpx.get(
            f"{control.origin}/_sandbox/arrivals", headers={"x-api-key": "another-key"}
        )
    assert answers.count(429) > 0  # twelve at once exceed 5/s and a burst of 3
    assert len(arrivals) == 12 == answers.count(200) + answers.count(429)
    assert most_in_window(arrivals, 1.0) > 5 * 1.0 + 3  # the log shows what the limit refused
    assert other.status_code == 401  # another key sees nothing of this one's


def test_the_log_keeps_the_newest_arrivals_of_each_key_only() -> None:
    """A long-running sandbox's log stays bounded: past `kept`, the oldest go."""
    limiter = RateLimiter(rate=None, burst=1, kept=5)
    for _ in range(8):
        limiter.acquire("a")
    limiter.acquire("b")
    assert len(limiter.arrivals["a"]) == 5 and len(limiter.arrivals["b"]) == 1
    assert list(limiter.arrivals["a"]) == sorted(limiter.arrivals["a"])  # oldest first
