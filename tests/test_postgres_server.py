"""The throwaway PostgreSQL the instance and limiter tests stand on: reachable on loopback
only with its password, one fresh database per test, gone after the session."""

from __future__ import annotations

import psycopg2
import pytest

from tests.postgres import PostgresServer


def test_each_test_gets_an_empty_database_of_its_own(postgres: PostgresServer) -> None:
    first, second = postgres.database(), postgres.database()
    assert first != second
    with psycopg2.connect(first) as connection, connection.cursor() as cursor:
        cursor.execute("CREATE TABLE marker (x int)")
    with psycopg2.connect(second) as connection, connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM pg_tables WHERE tablename = 'marker'")
        assert cursor.fetchone() == (0,)


def test_it_listens_on_loopback_and_wants_the_password(postgres: PostgresServer) -> None:
    assert postgres.host == "127.0.0.1"
    with psycopg2.connect(postgres.url) as connection, connection.cursor() as cursor:
        cursor.execute("SHOW listen_addresses")
        assert cursor.fetchone() == ("127.0.0.1",)
    wrong = postgres.url.replace(postgres.password, "not-the-password")
    with pytest.raises(psycopg2.OperationalError, match="password authentication failed"):
        psycopg2.connect(wrong)
