"""Page bodies decode fast and exactly as the standard library would decode them."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from connectors.clinical_records.decode import decode_json

JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=20,
)


@given(JSON_VALUES)
def test_any_json_value_decodes_as_the_standard_library_does(value):
    body = json.dumps(value).encode()
    assert decode_json(body) == json.loads(body)


@pytest.mark.parametrize(
    "body",
    [
        b'{"id": 123456789012345678901234567890}',  # orjson would give a lossy float
        b'{"name": "\\ud800"}',  # a lone surrogate escape orjson refuses
        b'{"amount": NaN}',  # not JSON, but what json accepts is kept, not retried
        '{"name": "Zoë"}'.encode("utf-16"),  # json detects the encoding
    ],
)
def test_what_orjson_would_change_or_refuse_goes_through_json(body):
    decoded = decode_json(body)
    assert decoded.keys() == json.loads(body).keys()
    assert repr(decoded) == repr(json.loads(body))


@pytest.mark.parametrize("body", [b'{"value": [', b"<html>502</html>", b""])
def test_a_body_that_is_not_json_raises_value_error(body):
    with pytest.raises(ValueError):
        decode_json(body)
