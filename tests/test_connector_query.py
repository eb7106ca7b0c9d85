"""The query builder renders spec 4.2 literals and refuses names the catalogue does not know."""

from __future__ import annotations

from datetime import UTC, date, datetime, timedelta, timezone
from decimal import Decimal

import pytest

from connectors.clinical_records import catalogue as cat
from connectors.clinical_records.errors import QueryError
from connectors.clinical_records.query import Expand, F, Query, all_of, quote


def rendered(entity: cat.EntitySet, expr) -> str:
    return Query(entity, filter=expr).params()["$filter"]


@pytest.mark.parametrize(
    ("entity", "expr", "expected"),
    [
        (cat.PATIENTS, F("first_name") == "Ann", "first_name eq 'Ann'"),
        (cat.PATIENTS, F("last_name") == "O'Neil", "last_name eq 'O''Neil'"),
        (cat.PATIENTS, F("last_name") == "''", "last_name eq ''''''"),
        (cat.PATIENTS, F("middle_name") == None, "middle_name eq null"),  # noqa: E711
        (cat.PATIENTS, F("active") == True, "active eq true"),  # noqa: E712
        (cat.PATIENTS, F("deceased").ne(False), "deceased ne false"),
        (cat.BRANCHES, F("id") > 5, "id gt 5"),
        (cat.BRANCHES, F("id") <= 7, "id le 7"),
        (cat.CLAIMS, F("updated_at") >= date(2024, 2, 29), "updated_at ge 2024-02-29"),
        (cat.CLAIMS, F("updated_at") < "2024-03-01", "updated_at lt 2024-03-01"),
        (cat.CLAIMS, F("total_claim_amount") > Decimal("10.50"), "total_claim_amount gt 10.50"),
        (
            cat.APPOINTMENTS,
            F("updated_at") >= datetime(2024, 1, 2, 3, 4, 5, tzinfo=UTC),
            "updated_at ge 2024-01-02T03:04:05Z",
        ),
        (
            cat.APPOINTMENTS,
            F("updated_at") >= datetime(2024, 1, 2, 5, 4, 5, tzinfo=timezone(timedelta(hours=2))),
            "updated_at ge 2024-01-02T03:04:05Z",
        ),
        (  # RFC 3339's lower-case `t` (seed 7384: a change mark as the service sent it)
            cat.APPOINTMENTS,
            F("updated_at") >= "2026-11-01t19:00:43.459-05:00",
            "updated_at ge 2026-11-01T19:00:43.459-05:00",
        ),
        (
            cat.APPOINTMENTS,
            F("updated_at") < "2026-11-01t19:00:43z",
            "updated_at lt 2026-11-01T19:00:43Z",
        ),
        (cat.APPOINTMENTS, F("id") > "A00", "id gt 'A00'"),
        (cat.PATIENTS, F("last_name").startswith("Mc'"), "startswith(last_name,'Mc''')"),
    ],
)
def test_literals_follow_spec_4_2(entity, expr, expected) -> None:
    assert rendered(entity, expr) == expected


def test_combinators_parenthesise() -> None:
    expr = (F("status") == "Completed") & ~(F("recurring") == True) | F("notes").startswith("x")  # noqa: E712
    assert rendered(cat.APPOINTMENTS, expr) == (
        "((status eq 'Completed' and not (recurring eq true)) or startswith(notes,'x'))"
    )
    assert all_of(None, None) is None
    single = F("id") > 1
    assert all_of(None, single) is single


def test_full_query_params_in_order() -> None:
    query = Query(
        cat.PATIENTS,
        filter=F("state") == "CA",
        select=["id", "first_name", "id"],
        orderby=["last_name desc", ("id", False)],
        top=50,
        skip=100,
        count=True,
        expand=[
            Expand(
                "Appointments",
                filter=F("status") == "a;b",
                orderby=["start_datetime desc"],
                top=5,
                select=["id", "status"],
                expand=["AppointmentTypes", Expand("Patients", select=["id"])],
            )
        ],
    )
    assert query.params() == {
        "$filter": "state eq 'CA'",
        "$select": "id,first_name",
        "$orderby": "last_name desc,id asc",
        "$top": "50",
        "$skip": "100",
        "$count": "true",
        "$expand": "Appointments($filter=status eq 'a;b';$select=id,status;"
        "$orderby=start_datetime desc;$top=5;$expand=AppointmentTypes,Patients($select=id))",
    }


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: Query(cat.PATIENTS, filter=F("shoe_size") == 3), "no field 'shoe_size'"),
        (lambda: Query(cat.PATIENTS, select=["id", "nope"]), "no field 'nope'"),
        (lambda: Query(cat.PATIENTS, orderby=["nope"]), "no field 'nope'"),
        (lambda: Query(cat.PATIENTS, orderby=["id sideways"]), "asc or desc"),
        (lambda: Query(cat.PATIENTS, top=101), "$top"),
        (lambda: Query(cat.PATIENTS, skip=-1), "$skip"),
        (lambda: Query(cat.PATIENTS, expand=["Claims"]), "no navigation 'Claims'"),
        (lambda: Query(cat.BRANCHES, filter=F("id") == "5"), "expected an int"),
        (lambda: Query(cat.BRANCHES, filter=F("active") == 1), "expected a bool"),
        (lambda: Query(cat.PATIENTS, filter=F("first_name") == 5), "expected a str"),
        (lambda: Query(cat.CLAIMS, filter=F("updated_at") == "yesterday"), "YYYY-MM-DD"),
        (
            lambda: Query(cat.APPOINTMENTS, filter=F("updated_at") > datetime(2024, 1, 1)),
            "timezone-aware",
        ),
        (lambda: Query(cat.BRANCHES, filter=F("id").startswith("1")), "string field"),
        (
            lambda: Query(cat.PRESCRIPTIONS, expand=[Expand("Patient", top=3)]),
            "single-valued",
        ),
    ],
)
def test_refused_before_any_request(make, message) -> None:
    with pytest.raises(QueryError, match=message.replace("$", r"\$")):
        make()


def test_documents_expand_on_patients_is_checked_against_the_document_type() -> None:
    """The contained navigation renders like any other, validated on Document's fields."""
    query = Query(
        cat.PATIENTS,
        top=100,
        orderby=["id"],
        count=True,
        expand=[
            Expand("Documents", count=True, select=["id", "uploaded_at"]),
            Expand("Appointments", count=True, top=5),
        ],
    )
    assert query.params()["$expand"] == (
        "Documents($select=id,uploaded_at;$count=true),Appointments($top=5;$count=true)"
    )
    filtered = Expand("Documents", filter=F("document_type") == "Referral", orderby=["uploaded_at"])
    assert Query(cat.PATIENTS, expand=[filtered]).params()["$expand"] == (
        "Documents($filter=document_type eq 'Referral';$orderby=uploaded_at asc)"
    )
    with pytest.raises(QueryError, match="Documents has no field 'first_name'"):
        Query(cat.PATIENTS, expand=[Expand("Documents", select=["first_name"])])
    with pytest.raises(QueryError, match="no navigation 'Documents'"):
        Query(cat.APPOINTMENTS, expand=["Documents"])


def test_expand_depth_limit_is_three() -> None:
    three = Expand("Branch", expand=[Expand("Children", expand=["Parent"])])
    Query(cat.PRESCRIPTIONS, expand=[three])  # depth 3: allowed
    four = Expand(
        "Branch", expand=[Expand("Children", expand=[Expand("Parent", expand=["Parent"])])]
    )
    with pytest.raises(QueryError, match="at most 3"):
        Query(cat.PRESCRIPTIONS, expand=[four])


def test_quote_doubles_every_quote() -> None:
    assert quote("it's 'x'") == "'it''s ''x'''"
