"""How a rider read whole is completed once its parents are read (sync/rider_plan.py): the
held children split by their parent's fate, and the cost decision, ride on or read alone."""

from __future__ import annotations

from connectors.clinical_records.catalogue import BY_NAME
from sync.rider_plan import Completion, HeldChildren, held_children, orphan_cost

CLAIMS = BY_NAME["Claims"]  # a numeric key (BIGINT family), its reference text


def test_held_children_are_split_by_what_became_of_their_parent() -> None:
    parents = {"1": "P1", "2": "P2", "3": None, "4": "P1", None: "P1"}
    held = held_children(CLAIMS, parents, parents_read_whole={"P1"})
    assert held == HeldChildren(
        under_parent_not_read=(2,),
        under_parent_read=(1, 4),
        without_parent=(3,),
        parents_not_read=("P2",),
    )
    assert held_children(CLAIMS, {}, {"P1"}) == HeldChildren()


def test_a_parent_is_matched_by_its_text_as_the_service_and_warehouse_spell_it() -> None:
    held = held_children(CLAIMS, {7: 123}, parents_read_whole={"123"})
    assert held.under_parent_read == (7,)


def test_every_child_brought_by_its_parents_rides_for_free() -> None:
    done = Completion(2_000, 2_000, 0, 0, 0, 0)
    assert done.new == 0 and done.find == 0 and not done.read_alone
    assert done.pages == 20
    assert done.reason().startswith("with its parents; 0 with no parent read by filter")


def test_a_few_orphans_are_found_cheaper_than_reading_the_set() -> None:
    """5,000 claims, 40 with a null reference, 10 held under a deleted parent asked for in
    one request, 3 new with a missing parent, 2 parents cut short."""
    ride = Completion(5_000, 4_947, 40, 10, 1, 2)
    assert ride.new == 3 and ride.pages == 50
    assert ride.find == orphan_cost(50, 40, 3) + 1 + 2 < ride.pages
    assert not ride.read_alone
    assert "3 new with a missing parent" in ride.reason() and "against 50" in ride.reason()


def test_orphans_spread_through_the_keys_make_reading_alone_cheaper() -> None:
    """Dangling references through the keys cost about a halving each: past the set's
    pages, the set is read alone and the reason gives both figures."""
    spread = Completion(5_000, 4_900, 0, 100, 100, 0)  # `or` refused: a request per key
    assert spread.new == 0 and spread.find == 100 >= spread.pages
    assert spread.read_alone
    assert spread.reason() == (
        "read alone: 0 with no parent, 100 under a parent not read and about 0 new with a "
        "missing parent would cost about 100 requests to find, reading it costs 50"
    )


def test_the_unreached_are_nulls_known_orphans_or_new_never_fewer_than_none() -> None:
    assert Completion(100, 150, 0, 0, 0, 0).new == 0  # deletes after the count: none new
    assert Completion(1_000, 900, 60, 30, 1, 0).new == 10
    assert Completion(0, 0, 0, 0, 0, 0).pages == 1  # an empty set still costs its request


def test_orphan_cost_is_bounded_by_reading_the_set() -> None:
    assert orphan_cost(50, 0, 0) == 0
    assert orphan_cost(50, 250, 0) == 3 + 1  # three pages of nulls and their count
    assert orphan_cost(50, 0, 1_000) == 50
