"""Page bodies decode exactly as sent; what is not JSON is a ValueError (the transport retries)."""

from __future__ import annotations

import pytest

from connectors.clinical_records.decode import decode_json


def test_an_integer_wider_than_64_bits_arrives_exactly():
    body = b'{"id": 123456789012345678901234567890, "amount": -98765432109876543210}'
    assert decode_json(body) == {
        "id": 123456789012345678901234567890,
        "amount": -98765432109876543210,
    }


@pytest.mark.parametrize("body", [b'{"value": [', b"<html>502</html>", b""])
def test_a_body_that_is_not_json_raises_value_error(body):
    with pytest.raises(ValueError):
        decode_json(body)
