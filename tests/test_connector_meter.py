"""The client's one request meter: what a piece of work spent, on counters others share."""

from __future__ import annotations

import threading

import pytest

from connectors.clinical_records.meter import Counters


def test_measure_gives_the_difference_made_inside() -> None:
    counters = Counters()
    counters.add(requests=5, pages=2)
    with counters.measure() as spent:
        counters.add(requests=3, pages=1, records=250)
        assert spent == {}  # filled when the work ends
    assert spent["requests"] == 3 and spent["pages"] == 1 and spent["records"] == 250
    assert spent["throttled"] == 0 and counters.requests == 8


def test_measure_adds_into_a_set_of_several_phases() -> None:
    counters = Counters()
    per_set: dict[str, float] = {}
    for requests in (2, 4):
        with counters.measure(per_set):
            counters.add(requests=requests, wait_seconds=0.25)
    assert per_set["requests"] == 6
    assert per_set["wait_seconds"] == 0.5


def test_measure_counts_work_that_failed() -> None:
    counters = Counters()
    with pytest.raises(RuntimeError), counters.measure() as spent:
        counters.add(requests=1)
        raise RuntimeError("the service went away")
    assert spent["requests"] == 1


def test_measure_sees_the_parallel_requests_of_its_work() -> None:
    counters = Counters()
    with counters.measure() as spent:
        threads = [threading.Thread(target=counters.add, kwargs={"requests": 1}) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert spent["requests"] == 8
