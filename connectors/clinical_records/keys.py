"""Ids from the warehouse back to the service, and ids compared across sets.

The service sends one logical id as a string in one set and a number in another (spec
section 2); the warehouse holds one type per key family (`Field.canonical`, docs/
ARCHITECTURE.md "Canonical types"): the string as sent, and a number sent for it as its
decimal text. "00123" and "123" are two ids. Into the warehouse, the normaliser converts
them a column at a time (warehouse/converters.py).

The engine speaks to the service in each set's own kind: a key read back from the warehouse
as text goes out as the number it spells where that set's field is a number
(`Prescriptions(123)`), and as the text itself where it is a string (`Patients(00123)`).
Keys are compared and ordered in that kind too, as the service orders them: numbers by
value, text by its characters.
"""

from __future__ import annotations

import re
from typing import Any

from connectors.clinical_records.catalogue import Edm, EntitySet, Field

_INTEGER = re.compile(r"-?[0-9]+")


def key_text(value: Any) -> str | None:
    """An id as text, whichever set sent it: a string as sent, an integer as its decimal
    text. Two ids are one exactly when their texts are equal. None: no id (null, a
    boolean, a fraction, an object)."""
    if type(value) is str:
        return value
    if type(value) is int:
        return str(value)
    return None


def to_api(field: Field, value: Any) -> str | int | None:
    """An id (as any set sent it, or as the warehouse holds it) in the kind `field`'s set
    sends and filters it: an integer where the spec types the field as a number, text
    otherwise. None where it cannot be one (text that is not an integer, for a number)."""
    if field.type is not Edm.INT32:
        return key_text(value)
    if type(value) is int:
        return value
    if type(value) is str and _INTEGER.fullmatch(value):
        return int(value)
    return None


def entity_key(entity: EntitySet, value: Any) -> str | int | None:
    """A record's key in the kind its set sends it (`to_api` of the key field)."""
    return to_api(entity.key_field, value)
