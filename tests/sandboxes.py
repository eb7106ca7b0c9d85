"""One sandbox serving several customers, for the tenants' tests."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager

from connectors.sandbox.config import SandboxConfig, customers
from connectors.sandbox.server import SandboxServer


@contextmanager
def serving(
    names: Sequence[str],
    scale: float,
    rate: float = 1000,
    burst: int = 200,
    values: str = "spec",
) -> Iterator[SandboxServer]:
    """A sandbox serving `names` (data from seeds 1, 2, ...: each customer's its own), every API
    key limited to `rate` and `burst` (by default too fast to wait on), its values drawn from
    the profile `values`."""
    config = SandboxConfig(
        scale=scale, rate=rate, burst=burst, values=values, customers=customers(names, 1)
    )
    with SandboxServer(config) as server:
        yield server
