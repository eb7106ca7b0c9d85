"""A parent or a record shown by two answers (a window's overlap, pages in flight answered
in any order): the later answer's count, documents and versions stand (sync/riders.py,
`Rider.take`), and a reconciled rider's children go to the batch page by page."""

from __future__ import annotations

from connectors.clinical_records.catalogue import ALL_BY_NAME, DOCUMENTS, RIDES_WITH
from sync.reconcile import Reconciler
from sync.riders import Rider, SetInput
from sync.strategy import Mode, Plan
from tests.simulation.model import RawWriter
from tests.sync.memory_source import MemorySource


def _rider(name: str) -> Rider:
    entity = ALL_BY_NAME[name]
    _, nav = RIDES_WITH[name]
    plan = Plan(entity, Mode.SNAPSHOT, "test")
    writer = RawWriter(plan, "run", None)
    reconciler = None
    if entity.contained_in is None:
        reconciler = Reconciler(entity, source=MemorySource(entity, []), to_batch=writer.add)
    return Rider(entity, nav, SetInput(plan), writer, reconciler)


def test_a_document_an_earlier_answer_showed_is_gone_when_a_later_one_shows_none() -> None:
    """Seeds 7847 and 8314: the earlier answer, taken last, kept a deleted document."""
    for earlier_taken_last in (False, True):
        rider = _rider(DOCUMENTS.name)
        shows = [(5.0, [{"id": "d1"}, {"id": "d2"}], 2), (6.0, [{"id": "d2"}], 1)]
        for answered, children, count in reversed(shows) if earlier_taken_last else shows:
            rider.take("P1", children, count, answered)
        rider.take("P2", [{"id": "d3"}], 1, 5.5)
        rider.end_page(5.5)
        assert [d["id"] for d in rider.arrived_documents()] == ["d2", "d3"]
        assert rider.reached == 2
        assert rider.writer.records == []  # held until their completion
        assert [d["id"] for d in rider.arrived_documents(listed=["P1"])] == ["d3"]


def test_a_reconciled_riders_children_go_to_the_batch_as_pages_come_the_later_version_last():
    rider = _rider("Claims")
    rider.take(7, [{"id": 1, "v": "new", "prescription_id": 7}], 1, 9.0)
    rider.end_page(9.0)
    assert rider.writer.records == [{"id": 1, "v": "new", "prescription_id": 7}]
    older = [{"id": 1, "v": "old", "prescription_id": 7}, {"id": 2, "prescription_id": 7}]
    rider.take(7, older, 2, 8.0)
    rider.end_page(8.0)
    assert [r.get("v") for r in rider.writer.records] == ["new", None]  # the old one not again
    assert rider.reached == 1  # the later answer's count
    assert rider.reconciler.held == {1, 2}
    rider.take(7, [{"id": 1, "v": "newest", "prescription_id": 7}], 1, 10.0)
    rider.end_page(10.0)
    assert [r.get("v") for r in rider.writer.records] == ["new", None, "newest"]
