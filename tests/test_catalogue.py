"""The catalogue holds exactly the spec's fields, types and max lengths, and the design's rules."""

import pytest

from connectors.clinical_records import catalogue as cat
from tests.spec_tables import spec_fields

SPEC = spec_fields()
BY_SPEC_TITLE = {**{e.name: e for e in cat.ENTITY_SETS}, "Document": cat.DOCUMENTS}


def test_spec_has_every_entity_the_catalogue_has():
    assert set(SPEC) == set(BY_SPEC_TITLE)


@pytest.mark.parametrize("title", sorted(BY_SPEC_TITLE))
def test_fields_types_and_max_lengths_match_the_spec(title):
    ent = BY_SPEC_TITLE[title]
    ours = {f.name: (f.type, f.max_length) for f in ent.fields}
    assert ours == SPEC[title], f"{title}: catalogue and spec differ"
    assert len(ent.fields) == len(ours), f"{title}: a field is listed twice"


def test_every_field_has_a_meaning_and_every_entity_a_key():
    for ent in cat.ALL_ENTITIES:
        assert ent.key_field.required
        assert all(f.meaning for f in ent.fields)


# The typing rule's result, family by family: a change to the catalogue (or the rule) that
# retypes a family shows here as a diff. BIGINT only where every member is a number.
FAMILY_TYPES = {
    "appointment": "VARCHAR",
    "appointment_type": "VARCHAR",
    "appointment_type_status": "VARCHAR",
    "branch": "VARCHAR",  # Patients.primary_branch_id, Appointments.branch_id are strings
    "caregiver": "VARCHAR",
    "claim": "BIGINT",
    "delivery_location": "VARCHAR",
    "document": "VARCHAR",
    "guarantor": "VARCHAR",
    "patient": "VARCHAR",  # Patients.id is a string, Prescriptions.patient_id a number
    "patient_insurance": "BIGINT",
    "physician": "VARCHAR",  # Physicians.id is a string
    "prescription": "VARCHAR",  # Appointments.prescription_id is a string
    "recurring_series": "VARCHAR",
    "user": "VARCHAR",  # InsuranceVerifications.verified_by_id is the only number
    "user_type": "VARCHAR",
    "verification": "BIGINT",
}


def test_a_key_family_is_bigint_only_where_every_member_is_a_number():
    members: dict[str, list[cat.Field]] = {}
    for ent in cat.ALL_ENTITIES:
        for fld in ent.fields:
            if fld.key:
                members.setdefault(fld.key, []).append(fld)
    assert {k: fields[0].canonical.value for k, fields in members.items()} == FAMILY_TYPES
    for family, fields in members.items():
        assert len({f.canonical for f in fields}) == 1, f"{family}: one type per family"
        numbers_only = all(f.type is cat.Edm.INT32 for f in fields)
        assert (fields[0].canonical is cat.Canonical.BIGINT) == numbers_only, family


def test_a_string_without_a_stated_format_is_text():
    """Prescriptions.created_at ("Date/time created") and Patients.dob state no format."""
    for fld in (cat.PRESCRIPTIONS.field("created_at"), cat.PATIENTS.field("dob")):
        assert fld.parse_as is None and fld.canonical is cat.Canonical.VARCHAR
    stated = {
        (e.name, f.name): f.canonical.value
        for e in cat.ALL_ENTITIES
        for f in e.fields
        if f.parse_as is not None
    }
    assert stated == {
        ("Appointments", "appointment_date"): "DATE",
        ("Appointments", "start_time"): "TIME",
        ("Appointments", "end_time"): "TIME",
    }


def test_navigation_properties_point_at_real_fields():
    for ent in cat.ENTITY_SETS:
        for nav in ent.navigations:
            target = nav.target_set
            assert nav.local in ent.by_name, (ent.name, nav.name)
            assert nav.remote in target.by_name, (ent.name, nav.name)
            local_key = ent.field(nav.local).key
            assert local_key is not None and local_key == target.field(nav.remote).key


def test_contained_navigations_are_the_contained_entities():
    """`Navigation.contained` and `EntitySet.contained_in` say the same thing twice."""
    declared = {(e.name, n.target) for e in cat.ENTITY_SETS for n in e.navigations if n.contained}
    assert declared == {(e.contained_in, e.name) for e in cat.ALL_ENTITIES if e.contained_in}
    assert all(target not in cat.BY_NAME for _, target in declared)


def test_cursor_fields_exist_and_strategies_need_them():
    for ent in cat.ALL_ENTITIES:
        if ent.strategy in (cat.Strategy.CURSOR, cat.Strategy.CREATED, cat.Strategy.PER_PATIENT):
            assert ent.cursor in ent.by_name, ent.name
        else:
            assert ent.cursor is None, ent.name


def test_entity_lookup_by_spec_name_or_table():
    assert cat.entity("InsuranceVerifications") is cat.INSURANCE_VERIFICATIONS
    assert cat.entity("insurance_verifications") is cat.INSURANCE_VERIFICATIONS
    with pytest.raises(KeyError, match="unknown entity set"):
        cat.entity("Invoices")
