"""The deployment's PostgreSQL (DAGSTER_POSTGRES_URL), for the cluster-wide rate limit
(ratelimit.py), the connector's settings and the instance's checks (pipelines/postgres.py):
the variable's name, the rule of its URL and the reading of the driver's refusal, in one
place. The URL holds a password: what is said names the host, port and database, and the
reason is the driver's, past the `connection to server at ... failed:` that names the host."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

POSTGRES_VARIABLE = "DAGSTER_POSTGRES_URL"
URL_FORM = "postgresql://user:password@host:port/database"


class PostgresRefused(Exception):
    """The server could not be used: `reason` says why in one line, `advice` what to check."""

    def __init__(self, reason: str, advice: str) -> None:
        super().__init__(reason)
        self.reason = reason
        self.advice = advice


def place(url: str) -> str:
    """`host:port/database` of the URL, without its user or password; ValueError naming the
    variable when it is not a postgresql:// URL that names a host."""
    try:
        parts = urlsplit(url)
        host, port = parts.hostname, parts.port or 5432
        scheme = parts.scheme
    except ValueError:
        host, scheme = None, ""
    if scheme not in ("postgresql", "postgres") or not host:
        raise ValueError(f"{POSTGRES_VARIABLE}: expected {URL_FORM}")
    return f"{host}:{port}/{parts.path.lstrip('/') or parts.username or ''}"


def advice(reason: str) -> str:
    """What to check, from the driver's reason."""
    if "password authentication failed" in reason or "no password supplied" in reason:
        return "check the user and password in " + POSTGRES_VARIABLE
    if "does not exist" in reason:
        return "create the database (createdb) or correct its name in " + POSTGRES_VARIABLE
    return (
        "check that the server is running there and accepts connections from this host "
        f"(listen_addresses, pg_hba.conf, a firewall), and the host and port in {POSTGRES_VARIABLE}"
    )


def connect(url: str, timeout: float) -> Any:
    """A psycopg2 connection, or PostgresRefused with the driver's reason and what to check."""
    import psycopg2

    try:
        return psycopg2.connect(url, connect_timeout=timeout)
    except psycopg2.Error as error:
        first = (str(error).strip().splitlines() or ["no answer"])[0]
        reason = first.split(" failed: ", 1)[-1]
        raise PostgresRefused(reason, advice(reason)) from None
