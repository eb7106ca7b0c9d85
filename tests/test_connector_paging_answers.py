"""Pages in flight are answered in any order: of two versions of a record, the page answered
later carries the newer, whatever the key order the pages are yielded in.

Found by seeds 7847 and 8314 of the simulation: a patient at the overlap of two windows, its
document deleted between their answers; the window answered first came last in key order, and
its older version (the document in it) stood.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Executor, Future
from pathlib import Path
from typing import Any

import pytest

from connectors.clinical_records import catalogue as cat
from connectors.clinical_records.client import ClinicalClient
from connectors.clinical_records.transport import Wire
from connectors.sandbox.config import SandboxConfig
from connectors.sandbox.server import SandboxServer
from tests.connector_helpers import settings_for

pytestmark = pytest.mark.integration


class LastSentAnsweredFirst(Executor):
    """Runs nothing until a result is waited for; then every task sent, the latest first,
    and `before_waited` just before the task waited for (so it is answered last)."""

    def __init__(self, before_waited: Callable[[], None]) -> None:
        self.pending: list[tuple[Future, Callable[[], Any]]] = []
        self.before_waited = before_waited

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future:
        future: Future = Future()
        self.pending.append((future, lambda: fn(*args, **kwargs)))
        original = future.result

        def result(timeout: float | None = None) -> Any:
            self._drain(future)
            return original(timeout)

        future.result = result  # type: ignore[method-assign]
        return future

    def _drain(self, waited: Future) -> None:
        tasks, self.pending = self.pending, []
        for future, call in sorted(tasks, key=lambda task: task[0] is waited):
            if future is waited:
                self.before_waited()
            if future.set_running_or_notify_cancel():
                future.set_result(call())

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        self.pending.clear()


@pytest.fixture
def server() -> SandboxServer:
    with SandboxServer(SandboxConfig(seed=5, scale=0.1)) as srv:
        yield srv


def test_a_record_at_an_overlap_keeps_the_later_answers_version(
    server: SandboxServer, tmp_path: Path
) -> None:
    table = server.store.table(cat.APPOINTMENTS.name)
    keys = sorted(r["id"] for r in server.control().truth()[cat.APPOINTMENTS.name])
    assert len(keys) > 300
    overlap = keys[198]  # window 1's last record and window 2's first
    changed = False

    def change_it() -> None:  # between window 2's answer and window 1's
        nonlocal changed
        if not changed:
            table.upsert({**table.get(overlap), "notes": "moved between the answers"})
            changed = True

    wire = Wire(pool=lambda _: LastSentAnsweredFirst(change_it))
    with ClinicalClient(settings_for(server, tmp_path), wire=wire) as client:
        pages = list(client.iter_pages(cat.APPOINTMENTS))
    versions = [
        (page.number, record["notes"])
        for page in pages
        for record in page.records
        if record["id"] == overlap
    ]
    assert changed
    assert versions == [(1, "moved between the answers")]  # window 2's older one not passed on
    assert pages[2].answered < pages[1].answered  # window 2 answered first
    read = [record["id"] for page in pages for record in page.records]
    assert sorted(set(read)) == keys and len(read) == len(keys)
