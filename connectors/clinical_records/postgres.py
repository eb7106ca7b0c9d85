"""A connection to the deployment's PostgreSQL (DAGSTER_POSTGRES_URL), for the cluster-wide
rate limit (ratelimit.py) and the instance's checks (pipelines/postgres.py): the variable's
name and the driver's refusal as one line, in one place. The URL holds a password: the reason
is the driver's, past the `connection to server at ... failed:` that names the host."""

from __future__ import annotations

from typing import Any

POSTGRES_VARIABLE = "DAGSTER_POSTGRES_URL"


class PostgresRefused(Exception):
    """The server could not be used; `reason` says why in one line."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def connect(url: str, timeout: float) -> Any:
    """A psycopg2 connection, or PostgresRefused with the driver's reason."""
    import psycopg2

    try:
        return psycopg2.connect(url, connect_timeout=timeout)
    except psycopg2.Error as error:
        first = (str(error).strip().splitlines() or ["no answer"])[0]
        raise PostgresRefused(first.split(" failed: ", 1)[-1]) from None
