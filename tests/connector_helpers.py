"""Shared by the connector tests: settings for a sandbox, ids read, ground truth, tokens issued."""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from pathlib import Path

from connectors.clinical_records.catalogue import EntitySet
from connectors.clinical_records.client import ClinicalClient
from connectors.clinical_records.query import Query
from connectors.clinical_records.ratelimit import AdaptiveLimiter
from connectors.clinical_records.settings import Settings
from connectors.sandbox.server import SandboxServer


def settings_for(server: SandboxServer, tmp_path: Path, **env: str) -> Settings:
    """Settings for `server`; unlimited sandboxes get a generous client limit."""
    values = {
        "CLINICAL_RATE_LIMIT": "200",
        "CLINICAL_BURST": "50",
        **server.env(),
        "CLINICAL_LIMITER_PATH": str(tmp_path / "ratelimit.sqlite"),
        "CLINICAL_READ_TIMEOUT": "10",
        **env,
    }
    return Settings.from_env(values, dotenv_path=None)


def read_ids(client: ClinicalClient, entity: EntitySet, query: Query | None = None) -> list:
    return [r[entity.key] for page in client.iter_pages(entity, query) for r in page.records]


def truth_ids(server: SandboxServer, entity: EntitySet) -> set:
    return {record[entity.key] for record in server.control().truth()[entity.name]}


def acquire_together(limiters: Sequence[AdaptiveLimiter], each: int) -> float:
    """`each` slots from every limiter at once, a thread per limiter; the seconds it took."""
    started = time.monotonic()
    threads = [
        threading.Thread(target=lambda lim=lim: [lim.acquire() for _ in range(each)])
        for lim in limiters
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return time.monotonic() - started


def record_tokens(server: SandboxServer) -> list[str]:
    """Every access token the sandbox issues from now on (the test reads its own sandbox)."""
    issued: list[str] = []
    service = server.sandbox.tokens
    issue = service.issue

    def issue_and_note(form):
        body = issue(form)
        issued.append(str(body["access_token"]))
        return body

    service.issue = issue_and_note  # type: ignore[method-assign]
    return issued
