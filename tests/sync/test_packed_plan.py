"""What a family's extraction reads (sync/family_plan.py), decided from the sets' plans
before any request: who rides in the parents' pages, who is read alone, who pays."""

from __future__ import annotations

from connectors.clinical_records.catalogue import BY_NAME, DOCUMENTS, FAMILIES, EntitySet
from sync.family_plan import PackedRead, plan_family
from sync.strategy import Mode, Plan

PATIENTS, APPOINTMENTS = BY_NAME["Patients"], BY_NAME["Appointments"]
PRESCRIPTIONS, CLAIMS = BY_NAME["Prescriptions"], BY_NAME["Claims"]
VERIFICATIONS = BY_NAME["InsuranceVerifications"]
PATIENT_FAMILY = next(f for f in FAMILIES if f[0] is PATIENTS)
PRESCRIPTION_FAMILY = next(f for f in FAMILIES if f[0] is PRESCRIPTIONS)


def plans(*modes: tuple[EntitySet, Mode]) -> dict[str, Plan]:
    return {entity.name: Plan(entity, mode, "test") for entity, mode in modes}


def test_children_ride_in_the_pages_of_a_root_read_whole() -> None:
    chosen = plans(
        (PATIENTS, Mode.SNAPSHOT),
        (APPOINTMENTS, Mode.INCREMENTAL),
        (DOCUMENTS, Mode.SNAPSHOT),
    )
    family = plan_family(PATIENT_FAMILY, chosen, documents_refused=False)
    assert family.read_separately == () and family.skipped == ()
    packed = family.packed
    assert packed is not None and packed.carried == (APPOINTMENTS, DOCUMENTS)
    assert packed.expanded == (APPOINTMENTS, DOCUMENTS) and packed.payer is PATIENTS
    query = packed.query().params()
    assert "$select" not in query and "$count=true" in query["$expand"]
    assert query["$expand"].count("$count=true") == 2


def test_an_increment_of_the_root_carries_only_the_children_without_a_set() -> None:
    """A root read past its watermark does not pass every parent: a child with a set of its
    own is read alone; the documents ride on the patients' keys, which pay for the read."""
    chosen = plans(
        (PATIENTS, Mode.INCREMENTAL),
        (APPOINTMENTS, Mode.SNAPSHOT),
        (DOCUMENTS, Mode.SNAPSHOT),
    )
    family = plan_family(PATIENT_FAMILY, chosen, documents_refused=False)
    assert family.read_separately == (PATIENTS, APPOINTMENTS)
    packed = family.packed
    assert packed is not None and packed.root_plan is None and packed.carried == (DOCUMENTS,)
    assert packed.payer is DOCUMENTS
    assert packed.query().params()["$select"] == PATIENTS.key
    assert "$filter" not in packed.query().params()  # every patient, to reach every document


def test_a_range_or_backfill_child_is_read_alone_and_a_skipped_one_not_at_all() -> None:
    chosen = plans(
        (PRESCRIPTIONS, Mode.SNAPSHOT),
        (CLAIMS, Mode.BACKFILL),
        (VERIFICATIONS, Mode.SKIP),
    )
    family = plan_family(PRESCRIPTION_FAMILY, chosen, documents_refused=False)
    assert family.read_separately == (CLAIMS,) and family.skipped == (VERIFICATIONS,)
    assert family.packed is not None and family.packed.carried == ()
    assert family.packed.payer is PRESCRIPTIONS  # read whole, carrying nothing


def test_nothing_rides_when_nothing_is_carried() -> None:
    family = plan_family(PRESCRIPTION_FAMILY, plans((CLAIMS, Mode.INCREMENTAL)), False)
    assert family.packed is None and family.read_separately == (CLAIMS,)
    assert plan_family(PRESCRIPTION_FAMILY, {}, False) == plan_family(PRESCRIPTION_FAMILY, {}, True)


def test_documents_the_service_refused_to_expand_are_listed_per_patient() -> None:
    chosen = plans((PATIENTS, Mode.SNAPSHOT), (DOCUMENTS, Mode.SNAPSHOT))
    packed = plan_family(PATIENT_FAMILY, chosen, documents_refused=True).packed
    assert packed is not None and packed.listed == (DOCUMENTS,) and packed.expanded == ()
    assert "$expand" not in packed.query().params()


def test_a_refusal_met_during_the_read_lists_the_documents_and_keeps_the_rest() -> None:
    read = PackedRead(PATIENTS, None, (APPOINTMENTS, DOCUMENTS))
    refused = read.listing_documents()
    assert refused.carried == read.carried and refused.payer is APPOINTMENTS
    assert refused.expanded == (APPOINTMENTS,) and refused.listed == (DOCUMENTS,)
    assert refused.listing_documents() == refused
