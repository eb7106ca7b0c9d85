"""Whole runs simulated from seeds: no set may end wrong while its run calls it exact.

CI plays `SEEDS` seeds against the model warehouse and a few against the real lake and DuckDB
(the model held to the real merge); `make soak` plays 20,000 (`python -m tests.simulation`).
A failure prints the one command that replays its seed.
"""

from __future__ import annotations

import logging
import os

import pytest

from sync import reconcile
from tests.simulation.explore import REPLAY, play
from tests.simulation.world import Scenario

SEEDS = int(os.environ.get("CLINICAL_SIM_SEEDS", "200"))
CHUNK = 50
DUCKDB_SEEDS = (3, 34, 12, 17, 61, 88)  # the real lake and warehouse; the Branches shape among them
# Seeds a sweep found failing, kept once mended: 1092 (a key deleted and given anew, the
# oracle), 1123 (tasks nested past the stack), 1173 (a parent's children counted twice at a
# window's overlap: two claims missed, called exact), 1298 (a 401 after a fresh token expired),
# 1914 (records a probe's answer carried into the batch but not into the keys counted: four
# inserts cancelled four deletes in the count, InsuranceVerifications called exact four over),
# 6281 (a verification the day added under a prescription deleted before its page: no page
# brought it, a delete cancelled it in the count; now asked for by its parent), 7384 (a
# change mark sent with RFC 3339's lower-case `t`, refused by the engine's own filter literal),
# 7847 and 8314 (a patient at two windows' overlap, a document deleted between their answers:
# the older answer's document stood, Documents called exact one over), 340 (a busy day's
# last look split in two requests, a delete and an insert between them: `DAY_PAIRS`)
FOUND = (340, 1092, 1123, 1173, 1298, 1914, 6281, 7384, 7847, 8314)


def _failures(seeds: range | tuple[int, ...], backend: str = "model") -> list[str]:
    return [str(outcome) for outcome in (play(s, backend)[0] for s in seeds) if outcome.failed]


@pytest.mark.parametrize("first", range(0, SEEDS, CHUNK))
def test_no_set_is_wrong_while_called_exact(first):
    failures = _failures(range(first, min(first + CHUNK, SEEDS)))
    assert not failures, "\n".join(failures)


def test_the_seeds_sweeps_found_stay_mended():
    failures = _failures(FOUND)
    assert not failures, "\n".join(failures)


def test_the_model_warehouse_agrees_with_the_real_one():
    failures = _failures(DUCKDB_SEEDS, backend="duckdb")
    assert not failures, "\n".join(failures)


def test_the_simulation_finds_a_set_touched_after_its_last_look_without_the_runs_end():
    """Seed 34 asks Branches for counts per parent (Appointments' reconciliation) after
    Branches was settled, while every request to Branches inserts one: without the run's end
    looking at Branches again, the run calls Branches exact and is six records off. The
    simulation would have caught issue 38's Branches shape before the independent service."""
    outcome, verdicts = play(34, settle_at_end=False)
    assert outcome.failed and "Branches called exact" in "\n".join(outcome.silent)
    assert REPLAY.format(seed=34) in str(outcome)
    branches = [v for v in verdicts if v.entity == "Branches" and v.silent]
    assert branches and all(v.reported == 0 and v.differences > 0 for v in branches)


def test_the_simulation_finds_a_busy_days_pairs_where_the_set_does_not_declare_them(monkeypatch):
    """Seed 340: a busy day (more Claims written that day than a page holds) and a change
    before every second request to Claims (a delete, an insert above every key). The
    nightly's last look is the probe, then the day's count; a change between them deletes one
    of the day's claims and inserts another, and both counts agree. Declared (`DAY_PAIRS`),
    the run is honest; withheld, as before 715d210, the simulation names Claims called exact
    and two records off: the shape CI met at 8c87e43, which no seed reached before the world
    had busy days."""
    declared = reconcile.blind_to
    monkeypatch.setattr(
        reconcile, "blind_to", lambda entity, whole=False, split=False: declared(entity, whole)
    )
    outcome, _ = play(340)
    assert outcome.failed and "Claims called exact" in "\n".join(outcome.silent)


def test_a_set_told_not_exact_may_differ_beyond_its_floor_but_is_never_called_exact():
    """Seed 8393: a change before every request to Claims, the budget spent with the window
    since the mark unread. The run tells Claims not exact by 10; it differs by 12 (two inserts
    and two deletes cancel in every count it holds). Not a failure: the figure is a floor
    (docs/reliability.md); calling the set exact would be. What lies beyond the floor is
    what the set declared it cannot see (`DAY_PAIRS`: the pairs)."""
    outcome, verdicts = play(8393)
    claims = [v for v in verdicts if v.entity == "Claims"]
    assert not outcome.failed
    assert all(v.reported > 0 for v in claims if v.differences)
    raw = [len(v.missing) + len(v.extra) + len(v.differ) for v in claims]
    assert any(r > v.reported for r, v in zip(raw, claims, strict=True))
    assert all(v.differences <= v.reported for v in claims)


def test_a_seed_leaves_the_process_logging_as_it_found_it():
    """A seed quiets the warnings its faults raise, then gives logging back: at 7c8ead5 it
    did not, and a later test in the same worker found no warning in caplog."""
    before = logging.root.manager.disable
    play(7)
    assert logging.root.manager.disable == before


def test_a_seed_chooses_the_same_world_every_time():
    assert Scenario.of(1234) == Scenario.of(1234)
    first, second = play(7)[1], play(7)[1]
    assert [str(v) for v in first] == [str(v) for v in second]
