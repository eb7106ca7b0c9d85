"""Numbers and nulls as a person reads them: what `sql`, `demo` and `status` print."""

from __future__ import annotations

from decimal import Decimal

import duckdb
import pytest

from cli.cells import cell
from cli.sql import render


@pytest.mark.parametrize(
    ("value", "shown"),
    [
        (Decimal("2985150.460000000000"), "2985150.46"),
        (Decimal("100.000000000000"), "100"),
        (Decimal("0E-12"), "0"),
        (Decimal("-0.500000000000"), "-0.5"),
        (
            Decimal("12345678901234567890123456.000000000001"),
            "12345678901234567890123456.000000000001",
        ),
        (None, "NULL"),
        ("None", "None"),  # a text that says None is what it says
        (7, "7"),
    ],
)
def test_a_cell_is_the_value_without_the_scales_zeros_and_null_spelled_out(value, shown):
    assert cell(value) == shown


def test_a_query_over_decimal_columns_prints_as_a_person_reads_it():
    with duckdb.connect() as con:
        cursor = con.execute(
            "SELECT * FROM (VALUES ('Supplies', 2985150.46::DECIMAL(38,12)), "
            "(NULL, 1035615.53::DECIMAL(38,12))) AS t(category, billed) ORDER BY billed DESC"
        )
        text = render([d[0] for d in cursor.description], cursor.fetchall())
    assert "2985150.46" in text and "1035615.53" in text
    assert "None" not in text and "000000" not in text
    assert text.splitlines()[3].startswith("NULL")
