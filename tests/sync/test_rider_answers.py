"""A parent shown by two answers (a window's overlap, pages in flight answered in any order):
its children as the later answer showed them stand (sync/riders.py, `Rider.take`)."""

from __future__ import annotations

from connectors.clinical_records.catalogue import ALL_BY_NAME, DOCUMENTS, RIDES_WITH
from sync.riders import Rider, SetInput
from sync.strategy import Mode, Plan


def _rider(name: str, reconciles: bool) -> Rider:
    entity = ALL_BY_NAME[name]
    _, nav = RIDES_WITH[name]
    plan = Plan(entity, Mode.SNAPSHOT, "test")
    # neither the batch nor the reconciliation is reached by `take` and `arrived`
    reconciler = object() if reconciles else None
    return Rider(entity, nav, SetInput(plan), writer=None, reconciler=reconciler)  # type: ignore[arg-type]


def test_a_document_an_earlier_answer_showed_is_gone_when_a_later_one_shows_none() -> None:
    """Seeds 7847 and 8314: the earlier answer, taken last, kept a deleted document."""
    for earlier_taken_last in (False, True):
        rider = _rider(DOCUMENTS.name, reconciles=False)
        shows = [(5.0, [{"id": "d1"}, {"id": "d2"}], 2), (6.0, [{"id": "d2"}], 1)]
        for answered, children, count in reversed(shows) if earlier_taken_last else shows:
            rider.take("P1", children, count, answered)
        rider.take("P2", [{"id": "d3"}], 1, 5.5)
        assert [d["id"] for d in rider.arrived()] == ["d2", "d3"]
        assert rider.reached == 2
        assert [d["id"] for d in rider.arrived(listed=["P1"])] == ["d3"]  # listed: the listing's


def test_a_set_that_reconciles_takes_every_version_the_later_last() -> None:
    rider = _rider("Claims", reconciles=True)
    rider.take(7, [{"id": 1, "v": "new"}], 1, 9.0)
    rider.take(7, [{"id": 1, "v": "old"}, {"id": 2}], 2, 8.0)
    assert rider.arrived() == [{"id": 1, "v": "old"}, {"id": 2}, {"id": 1, "v": "new"}]
    assert rider.counted == {7: 1}
