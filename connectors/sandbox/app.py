"""The sandbox as an ASGI app: the spec's paths under /api, the token service under /auth.

Every API request passes the same gate, in order: route, method, credentials (401), rate
limit (429), injected faults, then the handler. Anything refused gets the spec's error body.
Test-only controls (advance the clock, ground truth, faults) live under /_sandbox, off the
spec's paths.
"""

from __future__ import annotations

import asyncio
import json
import logging
import mimetypes
import re
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from starlette.applications import Starlette
from starlette.datastructures import UploadFile
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from connectors.clinical_records import catalogue as cat
from connectors.sandbox import metadata
from connectors.sandbox.auth import OAuthError, TokenService
from connectors.sandbox.config import SandboxConfig
from connectors.sandbox.errors import ODataError, invalid_query, not_found
from connectors.sandbox.faults import ERROR_STATUSES, FaultInjector
from connectors.sandbox.odata import (
    Query,
    capped,
    expands_target,
    parse_query,
    run_collection,
    shape,
)
from connectors.sandbox.ratelimit import RateLimiter, retry_after_header
from connectors.sandbox.store import Store

API_PREFIX = "/api"
AUTH_PREFIX = "/auth"
CONTROL_PREFIX = "/_sandbox"

# /X, /X(key), /Patients(key)/Documents, .../Documents(doc), .../Documents(doc)/$value
RESOURCE_PATH = re.compile(
    r"^(?P<set>[A-Za-z]+)(?:\((?P<key>[^()/]*)\))?"
    r"(?:/(?P<docs>Documents)(?:\((?P<doc>[^()/]*)\))?(?P<value>/\$value)?)?$"
)
DIRECT_DOCUMENT_PATH = re.compile(r"^document/(?P<doc>[^/]+)$")
INT_KEY = re.compile(r"-?\d+")


log = logging.getLogger("sandbox")


class ConnectionDropped(Exception):
    """Raised mid-response on purpose, so the server closes the connection (a dropped link)."""


class _DropLogFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.exc_info and isinstance(record.exc_info[1], ConnectionDropped))


logging.getLogger("uvicorn.error").addFilter(_DropLogFilter())


def json_response(body: Any, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    payload = json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode()
    return Response(payload, status, headers, media_type="application/json; charset=utf-8")


def error_response(error: ODataError, headers: dict[str, str] | None = None) -> Response:
    return json_response(error.body(), error.status, headers)


class DroppedResponse(Response):
    """Promises a body, sends a fragment, then fails: the client sees the connection die."""

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [(b"content-type", b"application/json"), (b"content-length", b"4096")],
            }
        )
        await send({"type": "http.response.body", "body": b'{"value":[{"id":', "more_body": True})
        raise ConnectionDropped


@dataclass
class _ListView:
    """A TableView over a list already sorted by key (patient documents)."""

    rows: list[dict]
    keys: list


@dataclass(frozen=True)
class Resource:
    """What a request path names, and the methods allowed on it."""

    kind: str
    allowed: tuple[str, ...]
    entity: cat.EntitySet | None = None
    key: str | None = None
    doc: str | None = None


Handler = Callable[[Request, Resource], Awaitable[Response]]


class Sandbox:
    """One running service: configuration, data, tokens, limits, faults and request counters."""

    def __init__(self, config: SandboxConfig, store: Store | None = None) -> None:
        self.config = config
        self.store = store or Store(
            seed=config.seed,
            scale=config.scale,
            resolved_references=config.resolved_references,
        )
        self.tokens = TokenService(config)
        self.limiter = RateLimiter(config.rate, config.burst)
        self.faults = FaultInjector(config)
        self.counters: Counter[str] = Counter()
        self.handlers: dict[str, Handler] = {
            "service": self._service_document,
            "metadata": self._metadata,
            "openapi": self._openapi,
            "collection": self._collection,
            "entity": self._entity,
            "documents": self._documents,
            "document": self._document,
            "document_value": self._document_value,
            "direct": self._direct_document,
        }
        self.app = Starlette(
            routes=[
                Route(f"{AUTH_PREFIX}/oauth2/token", self._token, methods=["POST"]),
                Route(CONTROL_PREFIX + "/{action}", self._control, methods=["GET", "POST"]),
                Route(
                    API_PREFIX + "/{path:path}",
                    self._api,
                    methods=["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE"],
                ),
            ],
            exception_handlers={404: unrouted},
        )

    # -- the gate ---------------------------------------------------------------------------

    async def _api(self, request: Request) -> Response:
        self.counters["requests"] += 1
        response = await self._serve(request)
        self.counters[f"status_{response.status_code}"] += 1
        return response

    async def _serve(self, request: Request) -> Response:
        try:
            self.tokens.check(request.headers)
            resource = resolve(request.path_params["path"])
            if request.method not in resource.allowed:
                error = ODataError(
                    405,
                    "MethodNotAllowed",
                    f"{request.method} is not supported on this resource.",
                    "The entity sets are read-only; only patient documents accept POST and DELETE.",
                )
                return error_response(error, {"Allow": ", ".join(resource.allowed)})
            wait = self.limiter.acquire(self.config.api_key)
            if wait:
                self.counters["throttled"] += 1
                return self._too_many(wait)
            fault = await self._inject()
            if fault is not None:
                return fault
            return await self.handlers[resource.kind](request, resource)
        except ODataError as error:
            return error_response(error)
        except HTTPException as error:  # Starlette refusing a body, e.g. a malformed upload form
            detail = str(error.detail)
            return error_response(
                ODataError(error.status_code, "InvalidRequest", "Unreadable request.", detail)
            )
        except Exception:
            log.exception("sandbox handler failed")  # the traceback, never the request path
            return error_response(ODataError(500, "InternalServerError", "Unexpected error."))

    async def _inject(self) -> Response | None:
        delay = self.faults.delay()
        if delay:
            await asyncio.sleep(delay)
        kind = self.faults.pick()
        if kind == "error":
            status = self.faults.error_status()
            code, message = ERROR_STATUSES[status]
            return error_response(ODataError(status, code, message, "Injected by the sandbox."))
        if kind == "drop":
            return DroppedResponse()
        if kind == "throttle":
            return self._too_many(1.0)
        if kind == "garble":
            return Response(self.faults.garbled_body(), 200, media_type="application/json")
        return None

    def _too_many(self, wait: float) -> Response:
        self.counters["status_429_sent"] += 1
        error = ODataError(429, "TooManyRequests", "Request rate limit exceeded.", "")
        headers = (
            {"Retry-After": retry_after_header(wait)} if self.faults.with_retry_after() else {}
        )
        return error_response(error, headers)

    # -- service level ----------------------------------------------------------------------

    @staticmethod
    def base_url(request: Request) -> str:
        return f"{request.url.scheme}://{request.url.netloc}{API_PREFIX}"

    async def _service_document(self, request: Request, _: Resource) -> Response:
        return json_response(metadata.service_document(self.base_url(request)))

    async def _metadata(self, request: Request, _: Resource) -> Response:
        return Response(metadata.edmx(), media_type="application/xml")

    async def _openapi(self, request: Request, _: Resource) -> Response:
        base = self.base_url(request)
        auth = f"{request.url.scheme}://{request.url.netloc}{AUTH_PREFIX}"
        return json_response(metadata.openapi(base, auth))

    # -- entity sets ------------------------------------------------------------------------

    async def _collection(self, request: Request, resource: Resource) -> Response:
        entity = resource.entity
        assert entity is not None
        query = self._query(request, entity)
        if self.faults.should_drift():
            c = self.config
            with self.store.lock:
                self.store.drift(
                    entity,
                    inserts=c.drift_inserts,
                    updates=c.drift_updates,
                    deletes=c.drift_deletes,
                    rng=self.faults.drift_rng,
                )
                if expands_target(query, cat.DOCUMENTS.name):
                    self._drift_documents()
        with self.store.lock:
            page = run_collection(query, entity, self.store.table(entity.name), self.store.related)
        return json_response(self._envelope(request, entity.name, page.records, page.count))

    async def _entity(self, request: Request, resource: Resource) -> Response:
        entity = resource.entity
        assert entity is not None and resource.key is not None
        query = self._query(request, entity, collection=False)
        key = parse_key(entity, resource.key)
        with self.store.lock:
            record = self.store.table(entity.name).get(key)
            if record is None:
                raise not_found(f"No {entity.type_name} with key {resource.key}.")
            body = shape(record, query, entity, self.store.related)
        context = f"{self.base_url(request)}/$metadata#{entity.name}/$entity"
        return json_response({"@odata.context": context, **body})

    def _query(self, request: Request, entity: cat.EntitySet, *, collection: bool = True) -> Query:
        """The request's options, then the runtime expansion switches (SandboxConfig)."""
        query = parse_query(query_options(request), entity, collection=collection)
        if self.config.refuse_document_expand and expands_target(query, cat.DOCUMENTS.name):
            raise invalid_query(
                f"$expand of {cat.DOCUMENTS.name} is not supported.",
                f"List them per patient: /{cat.PATIENTS.name}({{id}})/{cat.DOCUMENTS.name}.",
            )
        if self.config.expand_cap is not None:
            query = capped(query, self.config.expand_cap)
        return query

    def _envelope(
        self, request: Request, context: str, records: list[dict], count: int | None
    ) -> dict[str, Any]:
        body: dict[str, Any] = {"@odata.context": f"{self.base_url(request)}/$metadata#{context}"}
        if count is not None:
            body["@odata.count"] = count
        body["value"] = records
        return body

    # -- patient documents ------------------------------------------------------------------

    def _patient_id(self, resource: Resource) -> str:
        assert resource.key is not None
        patient_id = str(parse_key(cat.PATIENTS, resource.key))
        if self.store.table(cat.PATIENTS.name).get(patient_id) is None:
            raise not_found("Patient not found.")
        return patient_id

    async def _documents(self, request: Request, resource: Resource) -> Response:
        patient_id = self._patient_id(resource)
        if request.method == "POST":
            return await self._upload(request, patient_id)
        query = parse_query(query_options(request), cat.DOCUMENTS)
        if query.expand:
            raise invalid_query("Documents have no navigation properties to expand.")
        if self.faults.should_drift():
            with self.store.lock:
                self._drift_documents()
        rows = self.store.documents.list(patient_id)
        view = _ListView(rows, [r["id"] for r in rows])
        page = run_collection(query, cat.DOCUMENTS, view, self.store.related)
        return json_response(self._envelope(request, "Documents", page.records, page.count))

    def _drift_documents(self) -> None:
        """Uploads and deletes between two listings (SandboxConfig's drift); hold the lock."""
        c = self.config
        self.store.drift_documents(
            uploads=c.drift_inserts, deletes=c.drift_deletes, rng=self.faults.drift_rng
        )

    async def _upload(self, request: Request, patient_id: str) -> Response:
        declared = int(request.headers.get("content-length") or 0)
        if declared > cat.MAX_UPLOAD_BYTES + 1024 * 1024:
            raise too_large()
        async with request.form(max_files=1, max_fields=10) as form:
            upload = form.get("file")
            if not isinstance(upload, UploadFile):
                raise ODataError(
                    400, "MissingField", "The form field 'file' is required.", "field: file"
                )
            content_type = upload_type(upload)
            if content_type not in cat.ACCEPTED_DOCUMENT_TYPES:
                raise ODataError(
                    400,
                    "UnsupportedFileType",
                    "The file type is not accepted.",
                    f"Accepted: {', '.join(cat.ACCEPTED_DOCUMENT_TYPES.values())}.",
                )
            data = await upload.read()
            if len(data) > cat.MAX_UPLOAD_BYTES:
                raise too_large()
            fields = {name: form.get(name) for name in ("document_type", "description")}
            meta = self.store.documents.add(
                patient_id=patient_id,
                file_name=upload.filename or "upload",
                content_type=content_type,
                data=data,
                document_type=_text(fields["document_type"]),
                description=_text(fields["description"]),
                uploaded_by_id=SANDBOX_USER_ID,
            )
        return json_response(meta, 201)

    async def _document(self, request: Request, resource: Resource) -> Response:
        patient_id = self._patient_id(resource)
        assert resource.doc is not None
        if request.method == "DELETE":
            if not self.store.documents.delete(patient_id, resource.doc):
                raise not_found("Document not found.")
            return Response(status_code=204)
        found = self.store.documents.get(patient_id, resource.doc)
        if found is None:
            raise not_found("Document not found.")
        context = f"{self.base_url(request)}/$metadata#Documents/$entity"
        return json_response({"@odata.context": context, **found[0]})

    async def _document_value(self, request: Request, resource: Resource) -> Response:
        patient_id = self._patient_id(resource)
        assert resource.doc is not None
        found = self.store.documents.get(patient_id, resource.doc)
        if found is None:
            raise not_found("Document not found.")
        return _bytes_response(*found)

    async def _direct_document(self, request: Request, resource: Resource) -> Response:
        if request.query_params:
            raise invalid_query("/document/{id} accepts no query parameters.")
        assert resource.doc is not None
        found = self.store.documents.get_any(resource.doc)
        if found is None:
            raise not_found("Document not found.")
        return _bytes_response(*found)

    # -- the token service ------------------------------------------------------------------

    async def _token(self, request: Request) -> Response:
        self.counters["token_requests"] += 1
        if not request.headers.get("content-type", "").startswith(
            "application/x-www-form-urlencoded"
        ):
            err = OAuthError(400, "invalid_request", "Use application/x-www-form-urlencoded.")
            return json_response(err.body(), err.status)
        form = await request.form()
        try:
            token = self.tokens.issue({k: str(v) for k, v in form.items()})
        except OAuthError as err:
            return json_response(err.body(), err.status)
        return json_response(token, headers={"Cache-Control": "no-store"})

    # -- test controls, off the spec's paths -------------------------------------------------

    async def _control(self, request: Request) -> Response:
        if request.headers.get("x-api-key") != self.config.api_key:
            return error_response(ODataError(401, "Unauthorized", "x-api-key required."))
        action = request.path_params["action"]
        body = await request.json() if request.method == "POST" else {}
        try:
            if action == "advance" and request.method == "POST":
                with self.store.lock:
                    return json_response(self.store.advance(**body))
            if action == "faults" and request.method == "POST":
                self.configure(**body)
                return json_response({name: getattr(self.config, name) for name in body})
            if action == "plant" and request.method == "POST":
                with self.store.lock:
                    self.store.plant(cat.entity(body["entity"]), body["record"])
                return json_response({"planted": 1})
            if action == "truth":
                with self.store.lock:
                    return json_response(self.store.ground_truth())
            if action == "stats":
                return json_response(self.stats())
            if action == "changes":
                with self.store.lock:
                    return json_response([c.as_dict() for c in self.store.changes])
        except (TypeError, ValueError, KeyError) as error:
            return error_response(ODataError(400, "InvalidControl", str(error)))
        return error_response(not_found(f"Unknown sandbox control {request.method} {action}."))

    def configure(self, **changes: Any) -> None:
        self.config.update(**changes)
        self.limiter.reconfigure(self.config.rate, self.config.burst)

    def stats(self) -> dict[str, int]:
        return {
            **self.counters,
            "tokens_issued": self.tokens.issued,
            **{f"injected_{kind}": n for kind, n in self.faults.injected.items()},
        }


async def unrouted(request: Request, exc: Exception) -> Response:
    """No route matched (a decoded newline defeats `{path:path}`): still the spec's 404 body."""
    return error_response(not_found("Resource not found."))


SANDBOX_USER_ID = "9001"  # the API client's own user, as the service records uploads


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


def upload_type(upload: UploadFile) -> str:
    declared = (upload.content_type or "").split(";")[0].strip().lower()
    if declared and declared != "application/octet-stream":
        return declared
    guessed, _ = mimetypes.guess_type(upload.filename or "")
    return guessed or declared


def too_large() -> ODataError:
    return ODataError(
        413, "PayloadTooLarge", "The file exceeds the 25 MB limit.", "Maximum: 25 MB per document."
    )


def _text(value: object) -> str | None:
    return value if isinstance(value, str) and value else None


def _bytes_response(meta: dict, data: bytes) -> Response:
    return Response(data, media_type=meta["content_type"])
