"""The warehouse's errors: each says what is wrong and what to do, without PHI."""

from __future__ import annotations


class WarehouseLocked(RuntimeError):
    """Another process holds the DuckDB file (DuckDB allows one writing process)."""


class SourceMismatch(RuntimeError):
    """The warehouse or lake was built from another service or customer."""


class ModelsFailed(RuntimeError):
    """dbt models failed to build, or a test of severity error failed on them: each keeps its
    last table. The message names the models and the kind of failure, never a value."""

    def __init__(self, failed: dict[str, str]) -> None:
        self.failed = dict(failed)
        named = "; ".join(f"{model}: {what}" for model, what in failed.items())
        super().__init__(
            f"dbt models failed ({named}); the clinical tables publish, and each failed model "
            "keeps its last table (analytics.model_health says which are stale)"
        )
