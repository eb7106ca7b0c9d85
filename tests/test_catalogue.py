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


def test_logical_key_sent_as_number_anywhere_is_bigint_everywhere():
    patient_ids = [
        cat.PATIENTS.field("id"),
        cat.APPOINTMENTS.field("patient_id"),
        cat.PRESCRIPTIONS.field("patient_id"),
        cat.DOCUMENTS.field("patient_id"),
    ]
    assert {f.type for f in patient_ids} == {cat.Edm.STRING, cat.Edm.INT32}
    assert {f.canonical for f in patient_ids} == {cat.Canonical.BIGINT}
    assert cat.PHYSICIANS.field("id").canonical is cat.Canonical.BIGINT
    for string_only in (cat.APPOINTMENTS, cat.APPOINTMENT_TYPES, cat.DOCUMENTS):
        assert string_only.key_field.canonical is cat.Canonical.VARCHAR


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
