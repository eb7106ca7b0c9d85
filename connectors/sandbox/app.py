"""The sandbox as an ASGI app: the spec's paths under /api, the token service under /auth.

Every API request passes the same gate, in order: route, method, credentials (401), rate
limit (429), injected faults, then the handler. Anything refused gets the spec's error body.
Test-only controls (advance the clock, ground truth, faults) live under /_sandbox, off the
spec's paths.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter, deque
from collections.abc import Awaitable, Callable
from contextvars import ContextVar
from dataclasses import asdict, is_dataclass
from typing import Any

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from connectors.clinical_records import catalogue as cat
from connectors.sandbox import metadata
from connectors.sandbox.auth import OAuthError, TokenService
from connectors.sandbox.config import Customer, SandboxConfig, ScriptedDrift
from connectors.sandbox.document_endpoints import DocumentEndpoints
from connectors.sandbox.errors import ODataError, invalid_query, not_found
from connectors.sandbox.faults import ERROR_STATUSES, FaultInjector
from connectors.sandbox.odata import (
    Query,
    capped,
    expands_target,
    parse_query,
    refuse_or,
    run_collection,
    shape,
)
from connectors.sandbox.ratelimit import RateLimiter, retry_after_header
from connectors.sandbox.responses import (
    DroppedResponse,
    base_url,
    envelope,
    error_response,
    json_response,
)
from connectors.sandbox.routes import (
    API_PREFIX,
    AUTH_PREFIX,
    Resource,
    parse_key,
    query_options,
    resolve,
)
from connectors.sandbox.store import Store

CONTROL_PREFIX = "/_sandbox"

log = logging.getLogger("sandbox")


Handler = Callable[[Request, Resource], Awaitable[Response]]


class Sandbox(DocumentEndpoints):
    """One running service: configuration, data, tokens, limits, faults and request counters.

    It serves one customer by default, or several (`SandboxConfig.customers`), each with its
    own store: a request's credentials choose the store it reads and writes (`store`), and
    its API key the bucket of the rate limit."""

    def __init__(
        self,
        config: SandboxConfig,
        store: Store | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.config = config
        self.tokens = TokenService(config, clock)
        self.stores: dict[str, Store] = {}
        for number, customer in enumerate(self.tokens.customers):
            given = store if number == 0 else None  # a store handed in is the default's
            self.stores[customer.name] = given or Store(
                seed=config.seed if customer.seed is None else customer.seed,
                scale=config.scale if customer.scale is None else customer.scale,
                resolved_references=config.resolved_references,
                values=config.values,
                dangling=config.dangling,
            )
        self.default = self.tokens.customers[0]
        self._current: ContextVar[Customer] = ContextVar("sandbox_customer", default=self.default)
        self.limiter = RateLimiter(config.rate, config.burst)
        self.faults = FaultInjector(config)
        self.counters: Counter[str] = Counter()
        # Every collection request served, in the order served: (set, its query options), so
        # a test can tell which request to a set came last (a run's final look at it).
        self.served: deque[tuple[str, dict[str, str]]] = deque(maxlen=100_000)
        self.throttled_by: Counter[str] = Counter()  # per customer, its requests answered 429
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

    @property
    def customer(self) -> Customer:
        """The customer whose credentials the current request carries (each request runs in
        its own context); outside a request, the default customer."""
        return self._current.get()

    @property
    def store(self) -> Store:
        """The current request's customer's store (`customer`)."""
        return self.stores[self.customer.name]

    # -- the gate ---------------------------------------------------------------------------

    async def _api(self, request: Request) -> Response:
        self.counters["requests"] += 1
        response = await self._serve(request)
        self.counters[f"status_{response.status_code}"] += 1
        return response

    async def _serve(self, request: Request) -> Response:
        try:
            customer = self.tokens.check(request.headers)
            self._current.set(customer)
            resource = resolve(request.path_params["path"])
            if request.method not in resource.allowed:
                error = ODataError(
                    405,
                    "MethodNotAllowed",
                    f"{request.method} is not supported on this resource.",
                    "The entity sets are read-only; only patient documents accept POST and DELETE.",
                )
                return error_response(error, {"Allow": ", ".join(resource.allowed)})
            wait = self.limiter.acquire(customer.api_key, customer.rate, customer.burst)
            if wait:
                self.counters["throttled"] += 1
                self.throttled_by[customer.name] += 1
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

    async def _service_document(self, request: Request, _: Resource) -> Response:
        return json_response(metadata.service_document(base_url(request)))

    async def _metadata(self, request: Request, _: Resource) -> Response:
        return Response(metadata.edmx(), media_type="application/xml")

    async def _openapi(self, request: Request, _: Resource) -> Response:
        base = base_url(request)
        auth = f"{request.url.scheme}://{request.url.netloc}{AUTH_PREFIX}"
        return json_response(metadata.openapi(base, auth))

    # -- entity sets ------------------------------------------------------------------------

    async def _collection(self, request: Request, resource: Resource) -> Response:
        entity = resource.entity
        assert entity is not None
        query = self._query(request, entity)
        self.served.append((entity.name, query_options(request)))
        self._drift(entity, query)
        with self.store.lock:
            page = run_collection(query, entity, self.store.table(entity.name), self.store.related)
        return json_response(envelope(request, entity.name, page.records, page.count))

    def _drift(self, entity: cat.EntitySet, query: Query) -> None:
        """What changes before this answer: the set, every `drift_every` collection requests
        (and the documents, where the request lists them), and what the drift script aims at
        this request to the set."""
        c, faults = self.config, self.faults
        every = faults.should_drift()
        due = [(change, faults.script_rng) for change in faults.scripted(entity.name)]
        if every:
            regular = ScriptedDrift(
                entity.name, 0, c.drift_inserts, c.drift_updates, c.drift_deletes
            )
            due.insert(0, (regular, faults.drift_rng))
        with self.store.lock:
            for change, rng in due:
                self.store.drift(
                    entity,
                    inserts=change.inserts,
                    updates=change.updates,
                    deletes=change.deletes,
                    rng=rng,
                    place=change.place,
                )
            if every and expands_target(query, cat.DOCUMENTS.name):
                self._drift_documents()

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
        context = f"{base_url(request)}/$metadata#{entity.name}/$entity"
        return json_response({"@odata.context": context, **body})

    def _query(self, request: Request, entity: cat.EntitySet, *, collection: bool = True) -> Query:
        """The request's options, then the runtime expansion switches (SandboxConfig)."""
        query = parse_query(query_options(request), entity, collection=collection)
        if self.config.refuse_document_expand and expands_target(query, cat.DOCUMENTS.name):
            raise invalid_query(
                f"$expand of {cat.DOCUMENTS.name} is not supported.",
                f"List them per patient: /{cat.PATIENTS.name}({{id}})/{cat.DOCUMENTS.name}.",
            )
        if self.config.refuse_filter_or:
            refuse_or(query)
        if self.config.expand_cap is not None:
            query = capped(query, self.config.expand_cap)
        return query

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
        """Authorised by a customer's API key; data controls act on that customer's store."""
        customer = self.tokens.by_api_key(request.headers.get("x-api-key"))
        if customer is None:
            return error_response(ODataError(401, "Unauthorized", "x-api-key required."))
        self._current.set(customer)
        action = request.path_params["action"]
        body = await request.json() if request.method == "POST" else {}
        try:
            if action == "advance" and request.method == "POST":
                with self.store.lock:
                    return json_response(self.store.advance(**body))
            if action == "faults" and request.method == "POST":
                self.configure(**body)
                return json_response({name: _plain(getattr(self.config, name)) for name in body})
            if action == "plant" and request.method == "POST":
                with self.store.lock:
                    self.store.plant(cat.entity(body["entity"]), body["record"])
                return json_response({"planted": 1})
            if action == "truth":
                with self.store.lock:
                    return json_response(self.store.ground_truth())
            if action == "stats":
                return json_response(self.stats())
            if action == "customers":
                return json_response(self.customer_requests())
            if action == "arrivals":  # when the presented key's requests arrived, in seconds
                key = request.headers["x-api-key"]
                return json_response(list(self.limiter.arrivals.get(key, [])))
            if action == "changes":
                with self.store.lock:
                    return json_response([c.as_dict() for c in self.store.changes])
        except (TypeError, ValueError, KeyError) as error:
            return error_response(ODataError(400, "InvalidControl", str(error)))
        return error_response(not_found(f"Unknown sandbox control {request.method} {action}."))

    def configure(self, **changes: Any) -> None:
        self.config.update(**changes)
        self.limiter.reconfigure(self.config.rate, self.config.burst)
        if "drift_script" in changes:
            self.faults.restart_script()

    def customer_requests(self) -> dict[str, dict[str, object]]:
        """Per customer: when each request its credentials made reached the limit (monotonic
        seconds, admitted or not; `limiter.arrivals` of its API key) and how many got 429."""
        return {
            c.name: {
                "requests": list(self.limiter.arrivals.get(c.api_key, [])),
                "throttled": self.throttled_by[c.name],
            }
            for c in self.tokens.customers
        }

    def stats(self) -> dict[str, int]:
        return {
            **self.counters,
            "tokens_issued": self.tokens.issued,
            **{f"injected_{kind}": n for kind, n in self.faults.injected.items()},
        }


def _plain(value: Any) -> Any:
    """A setting as JSON shows it (a drift script's entries as objects)."""
    if isinstance(value, tuple):
        return [_plain(v) for v in value]
    return asdict(value) if is_dataclass(value) else value


async def unrouted(request: Request, exc: Exception) -> Response:
    """No route matched (a decoded newline defeats `{path:path}`): still the spec's 404 body."""
    return error_response(not_found("Resource not found."))
