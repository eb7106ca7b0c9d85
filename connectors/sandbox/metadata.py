"""The sandbox's self-description: the service document, `$metadata` (EDMX) and, from
`openapi.py`, `openapi.json`.

All three are derived from the entity catalogue, so a field added there shows up in every
description at once. The EDMX never changes and is built once.
"""

from __future__ import annotations

from functools import cache
from typing import Any
from xml.sax.saxutils import quoteattr

from connectors.clinical_records import catalogue as cat
from connectors.sandbox.openapi import openapi as openapi  # served beside $metadata

EDMX_NS = "http://docs.oasis-open.org/odata/ns/edmx"
EDM_NS = "http://docs.oasis-open.org/odata/ns/edm"
CORE_VOCABULARY = (
    "https://oasis-tcs.github.io/odata-vocabularies/vocabularies/Org.OData.Core.V1.xml"
)
CORE_NAMESPACE = "Org.OData.Core.V1"
CONTAINER = "Container"


# -- service document --------------------------------------------------------------------------


def service_document(base_url: str) -> dict[str, Any]:
    """OData JSON service document: the eight entity sets, URLs relative to the service root."""
    return {
        "@odata.context": f"{base_url}/$metadata",
        "value": [
            {"name": entity.name, "kind": "EntitySet", "url": entity.name}
            for entity in cat.ENTITY_SETS
        ],
    }


# -- $metadata (EDMX 4.0) ----------------------------------------------------------------------


Attrs = dict[str, str]


def element(tag: str, attrs: Attrs, children: list[str] | None = None, depth: int = 0) -> str:
    """One XML element as indented text; attribute values are escaped here, once."""
    pad = "  " * depth
    opening = tag + "".join(f" {name}={quoteattr(value)}" for name, value in attrs.items())
    if not children:
        return f"{pad}<{opening}/>"
    return "\n".join([f"{pad}<{opening}>", *children, f"{pad}</{tag}>"])


def description(text: str, depth: int) -> str:
    return element("Annotation", {"Term": "Core.Description", "String": text}, depth=depth)


def target_type(navigation: cat.Navigation) -> str:
    qualified = navigation.target_set.qualified_type
    return f"Collection({qualified})" if navigation.many else qualified


def referential_constraint(
    entity: cat.EntitySet, navigation: cat.Navigation, depth: int
) -> list[str]:
    """A constraint for a single-valued navigation, where both ends share an Edm type.

    Some navigations join fields of different types (Prescription.patient_id is a number,
    Patient.id a string); EDM forbids a constraint there, so none is written.
    """
    target = navigation.target_set
    if (
        navigation.many
        or entity.field(navigation.local).type is not target.field(navigation.remote).type
    ):
        return []
    attrs = {"Property": navigation.local, "ReferencedProperty": navigation.remote}
    return [element("ReferentialConstraint", attrs, depth=depth)]


def property_attrs(field: cat.Field) -> Attrs:
    attrs = {"Name": field.name, "Type": field.type.value}
    if field.max_length is not None:
        attrs["MaxLength"] = str(field.max_length)
    if field.required:
        attrs["Nullable"] = "false"
    return attrs


def entity_type(entity: cat.EntitySet, depth: int) -> str:
    inner = depth + 1
    children = [
        element("Key", {}, [element("PropertyRef", {"Name": entity.key}, depth=inner + 1)], inner)
    ]
    children += [
        element("Property", property_attrs(f), [description(f.meaning, inner + 1)], inner)
        for f in entity.fields
    ]
    for navigation in entity.navigations:
        attrs = {"Name": navigation.name, "Type": target_type(navigation)}
        if not navigation.many:
            attrs["Nullable"] = "true"
        if navigation.contained:
            attrs["ContainsTarget"] = "true"
        constraint = referential_constraint(entity, navigation, inner + 1)
        children.append(element("NavigationProperty", attrs, constraint, inner))
    return element("EntityType", {"Name": entity.type_name}, children, depth)


def entity_container(depth: int) -> str:
    sets = []
    for entity in cat.ENTITY_SETS:
        bindings = [
            element(
                "NavigationPropertyBinding", {"Path": n.name, "Target": n.target}, [], depth + 2
            )
            for n in entity.navigations
            if not n.contained  # a contained target has no entity set to bind to
        ]
        attrs = {"Name": entity.name, "EntityType": entity.qualified_type}
        sets.append(element("EntitySet", attrs, bindings, depth + 1))
    return element("EntityContainer", {"Name": CONTAINER}, sets, depth)


@cache
def edmx() -> str:
    """The EDMX 4.0 `$metadata` document; built once, it never changes."""
    reference = element(
        "edmx:Reference",
        {"Uri": CORE_VOCABULARY},
        [element("edmx:Include", {"Namespace": CORE_NAMESPACE, "Alias": "Core"}, depth=2)],
        depth=1,
    )
    schema = element(
        "Schema",
        {"xmlns": EDM_NS, "Namespace": cat.NAMESPACE},
        [*(entity_type(e, 3) for e in cat.ALL_ENTITIES), entity_container(3)],
        depth=2,
    )
    root = element(
        "edmx:Edmx",
        {"xmlns:edmx": EDMX_NS, "Version": "4.0"},
        [reference, element("edmx:DataServices", {}, [schema], depth=1)],
    )
    return f'<?xml version="1.0" encoding="utf-8"?>\n{root}\n'
