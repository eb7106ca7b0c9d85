"""A hostile little server: garbage and truncated bodies are retried, nextLinks followed."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from connectors.clinical_records import catalogue as cat
from connectors.clinical_records.client import ClinicalClient
from connectors.clinical_records.errors import MalformedResponse, RetryExhausted
from connectors.clinical_records.settings import Settings

pytestmark = [pytest.mark.integration, pytest.mark.reliability]


class Hostile:
    """Answers Patients with a scripted list of bodies, then a next-linked collection."""

    def __init__(self) -> None:
        self.script: list[bytes] = []
        self.link = ""
        self.seen: list[str] = []
        self.app = Starlette(
            routes=[
                Route("/auth/oauth2/token", self.token, methods=["POST"]),
                Route("/api/Patients", self.patients),
            ]
        )

    async def token(self, request: Request) -> Response:
        return JSONResponse({"access_token": "t0k", "expires_in": 300, "token_type": "Bearer"})

    async def patients(self, request: Request) -> Response:
        self.seen.append(request.url.query)
        if self.script:
            return Response(self.script.pop(0), media_type="application/json")
        if "skiptoken" in request.url.query:
            return JSONResponse({"value": [{"id": "3"}]})
        return JSONResponse(
            {"@odata.count": 3, "value": [{"id": "1"}, {"id": "2"}], "@odata.nextLink": self.link}
        )


@pytest.fixture
def hostile() -> Iterator[tuple[Hostile, str]]:
    server = Hostile()
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    origin = f"http://127.0.0.1:{sock.getsockname()[1]}"
    runner = uvicorn.Server(uvicorn.Config(server.app, log_level="warning", lifespan="off"))
    thread = threading.Thread(target=lambda: asyncio.run(runner.serve(sockets=[sock])), daemon=True)
    thread.start()
    while not runner.started:
        time.sleep(0.01)
    yield server, origin
    runner.should_exit = True
    thread.join(5)


def settings(origin: str, tmp_path: Path, attempts: int = 5) -> Settings:
    return Settings.from_env(
        {
            "CLINICAL_API_BASE_URL": f"{origin}/api",
            "CLINICAL_AUTH_URL": f"{origin}/auth",
            "CLINICAL_CLIENT_ID": "c",
            "CLINICAL_CLIENT_SECRET": "s",
            "CLINICAL_API_KEY": "k",
            "CLINICAL_CUSTOMER": "x",
            "CLINICAL_RATE_LIMIT": "100",
            "CLINICAL_LIMITER_PATH": str(tmp_path / "rl.sqlite"),
            "CLINICAL_MAX_ATTEMPTS": str(attempts),
        },
        dotenv_path=None,
    )


def test_malformed_bodies_are_retried_and_next_links_followed(hostile, tmp_path: Path) -> None:
    server, origin = hostile
    server.script = [b"<html>oops</html>", b'{"value": [{"id": "1"', b'{"value": "nope"}']
    server.link = f"{origin}/api/Patients?$skiptoken=2"
    with ClinicalClient(settings(origin, tmp_path)) as client:
        pages = list(client.iter_pages(cat.PATIENTS))
        stats = client.stats.as_dict()
    assert [[r["id"] for r in p.records] for p in pages] == [["1", "2"], ["3"]]
    assert stats["retries"] == 3 and stats["requests"] == 5
    assert server.seen[-1] == "$skiptoken=2"


def test_persistently_malformed_is_reported_with_entity_and_page(hostile, tmp_path) -> None:
    server, origin = hostile
    server.script = [b"not json"] * 3
    with (
        ClinicalClient(settings(origin, tmp_path, attempts=3)) as client,
        pytest.raises(RetryExhausted) as caught,
    ):
        list(client.iter_pages(cat.PATIENTS))
    assert caught.value.entity == "Patients" and caught.value.page == 0
    assert "not JSON" in str(caught.value)


def test_a_next_link_to_another_host_is_not_followed(hostile, tmp_path: Path) -> None:
    server, origin = hostile
    server.link = "https://elsewhere.example/api/Patients?$skiptoken=2"
    with (
        ClinicalClient(settings(origin, tmp_path)) as client,
        pytest.raises(MalformedResponse, match="outside the service"),
    ):
        list(client.iter_pages(cat.PATIENTS))
    assert len(server.seen) == 1


def test_records_whose_key_is_no_key_are_passed_on_not_fatal(hostile, tmp_path: Path) -> None:
    """An object, array, boolean or fraction where the id belongs cannot be paged by (nor
    hashed, for the first two): such records reach the caller for normalise to reject."""
    server, origin = hostile
    odd = [{"id": {"a": 1}}, {"id": [2]}, {"id": True}, {"id": 1.5}, {"id": "3"}]
    server.script = [json.dumps({"@odata.count": 1, "value": odd}).encode()]
    with ClinicalClient(settings(origin, tmp_path)) as client:
        pages = list(client.iter_pages(cat.PATIENTS))
    assert [p.records for p in pages] == [odd]
    assert len(server.seen) == 1


def test_a_key_sent_in_the_other_kind_bounds_keyset_paging_in_the_fields_kind(
    hostile, tmp_path: Path
) -> None:
    """Patients' ids are strings; a page ending with the number 2 must continue with
    `id gt '2'`, a query the service accepts (an unquoted 2 is a type error for it)."""
    server, origin = hostile
    first = {"@odata.count": 3, "value": [{"id": "1"}, {"id": 2}]}
    server.script = [json.dumps(first).encode(), b'{"value": []}', b'{"value": []}']
    with ClinicalClient(settings(origin, tmp_path)) as client:
        pages = list(client.iter_pages(cat.PATIENTS))
    assert [p.records for p in pages] == [first["value"]]
    assert server.seen[-1].startswith("$filter=id%20gt%20%272%27")  # id gt '2'
