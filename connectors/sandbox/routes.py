"""Which resource a request path below {base_url} names, its key and its query options."""

from __future__ import annotations

import re
from dataclasses import dataclass

from starlette.requests import Request

from connectors.clinical_records import catalogue as cat
from connectors.sandbox.errors import ODataError, invalid_query, not_found

API_PREFIX = "/api"
AUTH_PREFIX = "/auth"

# /X, /X(key), /Patients(key)/Documents, .../Documents(doc), .../Documents(doc)/$value
RESOURCE_PATH = re.compile(
    r"^(?P<set>[A-Za-z]+)(?:\((?P<key>[^()/]*)\))?"
    r"(?:/(?P<docs>Documents)(?:\((?P<doc>[^()/]*)\))?(?P<value>/\$value)?)?$"
)
DIRECT_DOCUMENT_PATH = re.compile(r"^document/(?P<doc>[^/]+)$")
INT_KEY = re.compile(r"-?\d+")


@dataclass(frozen=True)
class Resource:
    """What a request path names, and the methods allowed on it."""

    kind: str
    allowed: tuple[str, ...]
    entity: cat.EntitySet | None = None
    key: str | None = None
    doc: str | None = None


def resolve(path: str) -> Resource:
    """Map a path below {base_url} to a resource, or 404 in the spec's error body."""
    if path in ("", "/"):
        return Resource("service", ("GET", "HEAD"))
    if path == "$metadata":
        return Resource("metadata", ("GET", "HEAD"))
    if path == "openapi.json":
        return Resource("openapi", ("GET", "HEAD"))
    if direct := DIRECT_DOCUMENT_PATH.match(path):
        return Resource("direct", ("GET", "HEAD"), doc=direct["doc"])
    match = RESOURCE_PATH.match(path)
    entity = cat.BY_NAME.get(match["set"]) if match else None
    if match is None or entity is None:
        raise not_found("Resource not found.", f"No resource at path '{path.split('(')[0]}'.")
    if match["docs"] is None:
        if match["key"] is None:
            return Resource("collection", ("GET", "HEAD"), entity)
        return Resource("entity", ("GET", "HEAD"), entity, match["key"])
    if entity is not cat.PATIENTS or match["key"] is None:
        raise not_found("Resource not found.", "Documents belong to a single patient.")
    if match["doc"] is None:
        return Resource("documents", ("GET", "HEAD", "POST"), entity, match["key"])
    kind, allowed = (
        ("document_value", ("GET", "HEAD"))
        if match["value"]
        else ("document", ("GET", "HEAD", "DELETE"))
    )
    return Resource(kind, allowed, entity, match["key"], match["doc"])


def parse_key(entity: cat.EntitySet, text: str) -> str | int:
    """Keys are bare (spec 4.2); a quoted string key is accepted as OData writes it."""
    if entity.key_field.type is cat.Edm.INT32:
        if not INT_KEY.fullmatch(text):
            raise ODataError(
                400, "InvalidKey", f"The key of {entity.name} is a number.", f"Got '{text}'."
            )
        return int(text)
    if len(text) >= 2 and text[0] == text[-1] == "'":
        return text[1:-1].replace("''", "'")
    return text


def query_options(request: Request) -> dict[str, str]:
    """The query string as a dict; a system option given twice is refused."""
    options: dict[str, str] = {}
    for name, value in request.query_params.multi_items():
        if name in options and name.startswith("$"):
            raise invalid_query(f"The query option {name} is given more than once.")
        options[name] = value
    return options
