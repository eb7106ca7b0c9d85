"""The sandbox's `openapi.json` (OpenAPI 3.0.3), derived from the entity catalogue.

It names the server and token addresses of the request, so it is built per call (it is cheap).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from connectors.clinical_records import catalogue as cat

API_TITLE = "Clinical Records Customer Service Interface (sandbox)"
API_VERSION = "1.0.0"

DECIMAL_PATTERN = r"^[+-]?([0-9]+(\.[0-9]*)?|\.[0-9]+)$"
# Spec 2: "ISO 8601 date-time with offset or Z", as OData's Edm.DateTimeOffset writes it:
# seconds are optional (`T10:00Z`), which RFC 3339's `date-time` format refuses, so a pattern
# says it instead. No space for T and no `-0800`: ISO 8601 allows neither.
DATETIME_PATTERN = (
    r"^[0-9]{4}-[0-9]{2}-[0-9]{2}[Tt][0-9]{2}:[0-9]{2}(:[0-9]{2}(\.[0-9]{1,12})?)?"
    r"([Zz]|[+-][0-9]{2}:[0-9]{2})$"
)

# JSON Schema of each Edm type, as the service writes it in JSON (spec 2, type notes).
JSON_TYPES: dict[cat.Edm, dict[str, Any]] = {
    cat.Edm.STRING: {"type": "string"},
    cat.Edm.INT32: {"type": "integer", "format": "int32"},
    cat.Edm.DECIMAL: {"type": "string", "format": "decimal", "pattern": DECIMAL_PATTERN},
    cat.Edm.BOOLEAN: {"type": "boolean"},
    cat.Edm.DATE: {"type": "string", "format": "date"},
    cat.Edm.DATETIME: {"type": "string", "pattern": DATETIME_PATTERN},
}

ERROR_SCHEMA = "Error"
ERROR_STATUSES: dict[str, str] = {
    "400": "Invalid request: a bad query option, key or upload form.",
    "401": "Missing, invalid or expired access token, or a missing or wrong x-api-key.",
    "404": "Resource not found; patient or document not found.",
    "413": "The uploaded file exceeds the 25 MB limit.",
    "429": "Request rate limit exceeded; Retry-After (seconds) says when to try again.",
    "500": "Unexpected server error.",
    "502": "The upstream service did not answer properly.",
    "503": "The service is temporarily unavailable.",
}
# Statuses every API request can get, whatever the path.
ALWAYS = ("401", "429", "500", "502", "503")
QUERY_OPTIONS: dict[str, dict[str, Any]] = {
    "$filter": {"description": "OData filter expression", "schema": {"type": "string"}},
    "$select": {
        "description": "Comma-separated properties to return",
        "schema": {"type": "string"},
    },
    "$orderby": {
        "description": "Comma-separated `property [asc|desc]` items",
        "schema": {"type": "string"},
    },
    "$top": {
        "description": f"Page size, at most {cat.PAGE_SIZE} (also the default)",
        "schema": {"type": "integer", "minimum": 0, "maximum": cat.PAGE_SIZE},
    },
    "$skip": {"description": "Records to skip", "schema": {"type": "integer", "minimum": 0}},
    "$count": {"description": "true adds @odata.count", "schema": {"type": "boolean"}},
    "$expand": {
        "description": (
            "Comma-separated navigation properties, nested options in parentheses separated "
            f"by semicolons; at most {cat.MAX_EXPAND_DEPTH} levels deep"
        ),
        "schema": {"type": "string"},
    },
}
COLLECTION_OPTIONS = tuple(QUERY_OPTIONS)
DOCUMENT_LIST_OPTIONS = tuple(o for o in QUERY_OPTIONS if o != "$expand")
SINGLE_OPTIONS = ("$select", "$expand")
BINARY = {"type": "string", "format": "binary"}


def ref(kind: str, name: str) -> dict[str, str]:
    return {"$ref": f"#/components/{kind}/{name}"}


def schema_ref(name: str) -> dict[str, str]:
    return ref("schemas", name)


def option_ref(option: str) -> dict[str, str]:
    return ref("parameters", option.lstrip("$"))


def property_schema(field: cat.Field) -> dict[str, Any]:
    schema: dict[str, Any] = {**JSON_TYPES[field.type], "description": field.meaning}
    if field.max_length is not None:
        schema["maxLength"] = field.max_length
    if not field.required:
        schema["nullable"] = True
    return schema


def navigation_properties(entity: cat.EntitySet) -> Iterator[tuple[str, dict[str, Any]]]:
    """What `$expand` adds: an object (or null), or an array and, with `$count`, its count."""
    for navigation in entity.navigations:
        target = schema_ref(navigation.target_set.type_name)
        if not navigation.many:
            yield navigation.name, {"allOf": [target], "nullable": True}
            continue
        yield f"{navigation.name}@odata.count", {"type": "integer", "minimum": 0}
        yield navigation.name, {"type": "array", "items": target}


def entity_schema(entity: cat.EntitySet) -> dict[str, Any]:
    """An entity as returned; `$select` may leave out any property, so none is required."""
    properties = {f.name: property_schema(f) for f in entity.fields}
    properties.update(navigation_properties(entity))
    return {
        "type": "object",
        "description": f"{entity.qualified_type}; key: {entity.key}",
        "properties": properties,
        "additionalProperties": False,
    }


def context_schema(suffix: str) -> dict[str, Any]:
    return {"type": "string", "pattern": f"/\\$metadata#{suffix}$"}


def single_schema(entity: cat.EntitySet) -> dict[str, Any]:
    """One entity with its `@odata.context` (`.../$metadata#Set/$entity`)."""
    schema = entity_schema(entity)
    context = context_schema(f"{entity.name}/\\$entity")
    schema["properties"] = {"@odata.context": context, **schema["properties"]}
    schema["required"] = ["@odata.context"]
    return schema


def collection_schema(entity: cat.EntitySet) -> dict[str, Any]:
    return {
        "type": "object",
        "description": f"One page of {entity.name}",
        "properties": {
            "@odata.context": context_schema(entity.name),
            "@odata.count": {"type": "integer", "minimum": 0},
            "value": {
                "type": "array",
                "maxItems": cat.PAGE_SIZE,
                "items": schema_ref(entity.type_name),
            },
        },
        "required": ["@odata.context", "value"],
        "additionalProperties": False,
    }


def error_schema() -> dict[str, Any]:
    text = {"type": "string"}
    return {
        "type": "object",
        "properties": {
            "error": {
                "type": "object",
                "properties": {"code": text, "message": text, "details": text},
                "required": ["code", "message", "details"],
            }
        },
        "required": ["error"],
    }


def service_document_schema() -> dict[str, Any]:
    item = {
        "type": "object",
        "properties": {
            "name": {"type": "string", "enum": [e.name for e in cat.ENTITY_SETS]},
            "kind": {"type": "string", "enum": ["EntitySet"]},
            "url": {"type": "string"},
        },
        "required": ["name", "kind", "url"],
    }
    return {
        "type": "object",
        "properties": {
            "@odata.context": {"type": "string", "pattern": "/\\$metadata$"},
            "value": {"type": "array", "items": item},
        },
        "required": ["@odata.context", "value"],
    }


def upload_form_schema() -> dict[str, Any]:
    return {
        "type": "object",
        "properties": {
            "file": {**BINARY, "description": "The file to upload"},
            "document_type": {"type": "string", "description": "Category or type label"},
            "description": {"type": "string", "description": "Human-readable description"},
        },
        "required": ["file"],
    }


def schemas() -> dict[str, Any]:
    found: dict[str, Any] = {}
    for entity in cat.ALL_ENTITIES:
        found[entity.type_name] = entity_schema(entity)
        found[f"{entity.type_name}Entity"] = single_schema(entity)
        found[f"{entity.type_name}Collection"] = collection_schema(entity)
    found[ERROR_SCHEMA] = error_schema()
    found["ServiceDocument"] = service_document_schema()
    found["DocumentUpload"] = upload_form_schema()
    return found


def error_responses() -> dict[str, Any]:
    found: dict[str, Any] = {}
    for status, text in ERROR_STATUSES.items():
        response: dict[str, Any] = {
            "description": text,
            "content": {"application/json": {"schema": schema_ref(ERROR_SCHEMA)}},
        }
        if status == "429":
            response["headers"] = {
                "Retry-After": {
                    "description": "Seconds to wait before the next request",
                    "schema": {"type": "string"},
                }
            }
        found[f"Error{status}"] = response
    return found


def json_ok(schema: dict[str, Any], text: str) -> dict[str, Any]:
    return {"description": text, "content": {"application/json": {"schema": schema}}}


def bytes_ok() -> dict[str, Any]:
    return {
        "description": "The raw bytes of the file, with its own Content-Type",
        "content": {mime: {"schema": BINARY} for mime in cat.ACCEPTED_DOCUMENT_TYPES},
    }


def operation(
    operation_id: str,
    summary: str,
    ok: tuple[str, dict[str, Any]],
    errors: tuple[str, ...] = (),
    options: tuple[str, ...] = (),
    **extra: Any,
) -> dict[str, Any]:
    """An operation: its success response, then the error statuses it (and every path) can get."""
    status, response = ok
    responses = {status: response}
    for code in sorted({*errors, *ALWAYS}):
        responses[code] = ref("responses", f"Error{code}")
    found = {"operationId": operation_id, "summary": summary, "responses": responses, **extra}
    if options:
        found["parameters"] = [option_ref(o) for o in options]
    return found


def key_parameter(name: str, entity: cat.EntitySet) -> dict[str, Any]:
    schema = {k: v for k, v in JSON_TYPES[entity.key_field.type].items() if k != "format"}
    return {
        "name": name,
        "in": "path",
        "required": True,
        "description": f"Key of the {entity.type_name}, written bare",
        "schema": schema,
    }


def entity_set_paths(entity: cat.EntitySet) -> dict[str, Any]:
    key = key_parameter("id", entity)
    return {
        f"/{entity.name}": {
            "get": operation(
                f"list{entity.name}",
                f"One page of {entity.name}",
                ("200", json_ok(schema_ref(f"{entity.type_name}Collection"), "Collection page")),
                ("400",),
                COLLECTION_OPTIONS,
            )
        },
        f"/{entity.name}({{id}})": {
            "parameters": [key],
            "get": operation(
                f"get{entity.type_name}",
                f"One {entity.type_name} by key",
                ("200", json_ok(schema_ref(f"{entity.type_name}Entity"), "The entity")),
                ("400", "404"),
                SINGLE_OPTIONS,
            ),
        },
    }


def document_paths() -> dict[str, Any]:
    """Spec 4.3 and 4.4: documents of one patient, and the direct download."""
    owner = cat.BY_NAME[cat.DOCUMENTS.contained_in or ""]
    doc = cat.DOCUMENTS
    base = f"/{owner.name}({{id}})/{doc.name}"
    patient = key_parameter("id", owner)
    document = key_parameter("documentId", doc)
    return {
        base: {
            "parameters": [patient],
            "get": operation(
                f"list{owner.type_name}{doc.name}",
                "A page of the patient's document metadata",
                ("200", json_ok(schema_ref(f"{doc.type_name}Collection"), "Collection page")),
                ("400", "404"),
                DOCUMENT_LIST_OPTIONS,
            ),
            "post": operation(
                f"upload{owner.type_name}{doc.type_name}",
                "Upload a document (PDF, PNG, JPEG, TIFF or DOCX, at most 25 MB)",
                ("201", json_ok(schema_ref(doc.type_name), "Metadata of the stored document")),
                ("400", "404", "413"),
                requestBody={
                    "required": True,
                    "content": {
                        "multipart/form-data": {
                            "schema": schema_ref("DocumentUpload"),
                            "encoding": {
                                "file": {"contentType": ", ".join(cat.ACCEPTED_DOCUMENT_TYPES)}
                            },
                        }
                    },
                },
            ),
        },
        f"{base}({{documentId}})": {
            "parameters": [patient, document],
            "get": operation(
                f"get{owner.type_name}{doc.type_name}",
                "Metadata of one document",
                ("200", json_ok(schema_ref(f"{doc.type_name}Entity"), "Document metadata")),
                ("400", "404"),
            ),
            "delete": operation(
                f"delete{owner.type_name}{doc.type_name}",
                "Delete one document",
                ("204", {"description": "Deleted; empty body"}),
                ("400", "404"),
            ),
        },
        f"{base}({{documentId}})/$value": {
            "parameters": [patient, document],
            "get": operation(
                f"download{owner.type_name}{doc.type_name}",
                "The document's bytes",
                ("200", bytes_ok()),
                ("400", "404"),
            ),
        },
        "/document/{documentId}": {
            "parameters": [document],
            "get": operation(
                f"download{doc.type_name}",
                "The document's bytes by document id alone; accepts no query parameters",
                ("200", bytes_ok()),
                ("400", "404"),
            ),
        },
    }


def service_paths() -> dict[str, Any]:
    return {
        "/": {
            "get": operation(
                "getServiceDocument",
                "The service document: the available entity sets",
                ("200", json_ok(schema_ref("ServiceDocument"), "Service document")),
            )
        },
        "/$metadata": {
            "get": operation(
                "getMetadata",
                "The EDMX schema",
                (
                    "200",
                    {
                        "description": "EDMX 4.0",
                        "content": {"application/xml": {"schema": {"type": "string"}}},
                    },
                ),
            )
        },
        "/openapi.json": {
            "get": operation(
                "getOpenApi",
                "This OpenAPI description",
                ("200", json_ok({"type": "object"}, "OpenAPI 3.0 document")),
            )
        },
    }


def security_schemes(auth_url: str) -> dict[str, Any]:
    return {
        "oauth2": {
            "type": "oauth2",
            "description": "OAuth 2.0 client credentials; tokens live 300 seconds.",
            "flows": {
                "clientCredentials": {
                    "tokenUrl": f"{auth_url}/oauth2/token",
                    "scopes": {
                        f"{cat.SCOPE_PREFIX}{{customer}}": (
                            "Access to one customer's records; {customer} is the customer name"
                        )
                    },
                }
            },
        },
        "apiKey": {"type": "apiKey", "in": "header", "name": "x-api-key"},
    }


def openapi(base_url: str, auth_url: str) -> dict[str, Any]:
    """OpenAPI 3.0.3 description of every spec path, as the sandbox really answers them."""
    paths = service_paths()
    for entity in cat.ENTITY_SETS:
        paths.update(entity_set_paths(entity))
    paths.update(document_paths())
    scope = f"{cat.SCOPE_PREFIX}{{customer}}"
    return {
        "openapi": "3.0.3",
        "info": {
            "title": API_TITLE,
            "version": API_VERSION,
            "description": "A subset of OData v4; every body is JSON except document downloads.",
        },
        "servers": [{"url": base_url}],
        "security": [{"oauth2": [scope], "apiKey": []}],
        "paths": paths,
        "components": {
            "securitySchemes": security_schemes(auth_url),
            "parameters": {
                option.lstrip("$"): {"name": option, "in": "query", "required": False, **spec}
                for option, spec in QUERY_OPTIONS.items()
            },
            "schemas": schemas(),
            "responses": error_responses(),
        },
    }
