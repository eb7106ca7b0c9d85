"""The warehouse's errors: each says what is wrong and what to do, without PHI."""

from __future__ import annotations


class WarehouseLocked(RuntimeError):
    """Another process holds the DuckDB file (DuckDB allows one writing process)."""


class SourceMismatch(RuntimeError):
    """The warehouse or lake was built from another service or customer."""
