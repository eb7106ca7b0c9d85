"""Page bodies decode exactly as sent; what is not JSON is a ValueError (the transport retries)."""

from __future__ import annotations

import json

import pytest

from connectors.clinical_records.decode import decode_json


def test_an_integer_wider_than_64_bits_arrives_exactly():
    body = b'{"id": 123456789012345678901234567890, "amount": -98765432109876543210}'
    assert decode_json(body) == {
        "id": 123456789012345678901234567890,
        "amount": -98765432109876543210,
    }


DEEP = b'{"value": [{"id": 1, "x": ' + b"[" * 5000 + b"]" * 5000 + b"}]}"  # valid, too deep


@pytest.mark.parametrize("body", [b'{"value": [', b"<html>502</html>", b"", DEEP])
def test_a_body_that_is_not_json_raises_value_error(body):
    with pytest.raises(ValueError):
        decode_json(body)


@pytest.mark.parametrize(
    "body",
    [
        b'{"a": NaN, "b": -Infinity}',
        b'{"note": "\\ud800 alone"}',
        b'{"big": 1e400, "tiny": 5e-400}',
        b'{"a": 1, "a": 2}',
        b'{"text": "Zo\\u00eb \\ud83d\\ude00", "x": 0.1, "y": -0.0, "z": 1.7976931348623157e308}',
    ],
)
def test_every_body_decodes_as_the_standard_library_decodes_it(body):
    decoded = decode_json(body)
    assert json.dumps(decoded, sort_keys=True) == json.dumps(json.loads(body), sort_keys=True)
