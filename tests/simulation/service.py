"""The sandbox in process, behind an httpx transport: no socket, no thread, no sleep.

Every request runs the sandbox's ASGI app to completion in the caller's thread, so the
service answers in the order the simulation sends, and its drift and faults (seeded) fall on
the same requests every time. Each request is written down with what it showed: the sets it
touched (the one asked, and those expanded into it) and the service's data as it stood when
it answered (`Truth`), which is what a set called exact must equal.
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qsl, unquote, urlsplit

import httpx
import msgspec

from connectors.clinical_records.catalogue import (
    ALL_BY_NAME,
    DOCUMENTS,
    ENTITY_SETS,
    PATIENTS,
    EntitySet,
)
from connectors.sandbox.app import Sandbox
from connectors.sandbox.faults import GARBLED_BODIES
from connectors.sandbox.responses import ConnectionDropped
from connectors.sandbox.routes import API_PREFIX

Records = dict[Any, dict]  # key -> record, as the service holds it


@dataclass
class Truth:
    """The service's data at one moment: every set's records by key, each patient's
    documents. Records are replaced, never changed in place, by the store, so a copy of the
    dictionaries is the data as it stood."""

    sets: dict[str, Records]
    documents: dict[str, frozenset[tuple[Any, ...]]]  # patient -> its documents' metadata


@dataclass
class Served:
    """One answered request to an entity set or a patient's documents."""

    number: int
    touched: frozenset[str]  # sets whose records or counts the answer reflects
    status: int
    truth: Truth  # the data as it stood when the service answered
    patients: frozenset[str] = frozenset()  # whose documents the answer showed
    path: str = ""
    params: dict[str, str] = field(default_factory=dict)


@dataclass
class Journal:
    """What the service answered, in order, and a copy of its data each time it changed."""

    served: list[Served] = field(default_factory=list)
    _truth: Truth | None = None
    _version: tuple[int, ...] = ()

    def forget_truth(self) -> None:
        """The data changed outside any request (a day of changes between runs)."""
        self._truth, self._version = None, ()

    def last_touch(self, name: str) -> Served | None:
        """The last answered request whose answer reflected set `name`."""
        return next((s for s in reversed(self.served) if name in s.touched), None)


def touched_sets(entity: EntitySet, params: dict[str, str]) -> frozenset[str]:
    """The set asked and every set its `$expand` reaches (nested ones too)."""
    names = {entity.name}
    pending = [(entity, params.get("$expand", ""))]
    while pending:
        parent, expand = pending.pop()
        for item in _top_level(expand):
            name, _, nested = item.partition("(")
            nav = parent.navigation.get(name.strip())
            if nav is None:
                continue
            target = ALL_BY_NAME[nav.target]
            names.add(target.name)
            options = dict(
                part.split("=", 1) for part in _top_level(nested[:-1], ";") if "=" in part
            )
            pending.append((target, options.get("$expand", "")))
    return frozenset(names)


def _top_level(text: str, separator: str = ",") -> list[str]:
    """`text` split at `separator` outside parentheses."""
    parts, depth, start = [], 0, 0
    for i, char in enumerate(text):
        depth += {"(": 1, ")": -1}.get(char, 0)
        if char == separator and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    if text[start:]:
        parts.append(text[start:])
    return [p.strip() for p in parts if p.strip()]


class InProcessService(httpx.BaseTransport):
    """An httpx transport that hands every request to the sandbox's app in this thread."""

    def __init__(
        self, sandbox: Sandbox, before: Callable[[httpx.Request], None] = lambda _: None
    ) -> None:
        self.sandbox = sandbox
        self.before = before  # the world's turn before each request: its clock, a kill
        self.journal = Journal()

    def close(self) -> None:
        """Every client of a world shares this service: closing one closes nothing."""

    def shutdown(self) -> None:
        """Nothing held: no loop, no socket."""

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        self.before(request)
        body = request.read()
        sent: dict[str, Any] = {"status": 500, "headers": [], "body": b""}
        dropped = _drive(self._run(request, body, sent))
        if dropped:
            raise httpx.RemoteProtocolError("the sandbox dropped the connection", request=request)
        self._note(request, sent["status"], sent["body"])
        return httpx.Response(
            sent["status"],
            headers=[(k.decode(), v.decode()) for k, v in sent["headers"]],
            content=sent["body"],
            request=request,
        )

    async def _run(self, request: httpx.Request, body: bytes, sent: dict[str, Any]) -> bool:
        url = request.url
        scope = {
            "type": "http",
            "asgi": {"version": "3.0"},
            "http_version": "1.1",
            "method": request.method,
            "scheme": url.scheme,
            "path": unquote(url.path),
            "raw_path": url.raw_path.split(b"?")[0],
            "query_string": url.query,
            "root_path": "",
            "headers": [(k.lower(), v) for k, v in request.headers.raw],
            "client": ("127.0.0.1", 40000),
            "server": (url.host, url.port or 80),
        }
        delivered = False

        async def receive() -> dict[str, Any]:
            nonlocal delivered
            if delivered:
                return {"type": "http.disconnect"}
            delivered = True
            return {"type": "http.request", "body": body, "more_body": False}

        async def send(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                sent["status"], sent["headers"] = message["status"], message.get("headers", [])
            elif message["type"] == "http.response.body":
                sent["body"] += message.get("body", b"")

        try:
            await self.sandbox.app(scope, receive, send)
        except ConnectionDropped:
            return True
        return False

    def _note(self, request: httpx.Request, status: int, body: bytes) -> None:
        """An answer the client can read, to an entity set or a listing of documents, with
        the data it reflects. A 200 whose body is garbled shows nothing (the client retries
        it); a listing answered 404 shows that the patient has no documents (it is gone)."""
        path = urlsplit(str(request.url)).path
        if not path.startswith(API_PREFIX + "/") or request.method != "GET":
            return
        if body in GARBLED_BODIES:
            return
        resource = unquote(path[len(API_PREFIX) + 1 :])
        listing = resource.endswith(")/" + DOCUMENTS.name)
        if status >= 400 and not (status == 404 and listing):
            return
        params = dict(parse_qsl(request.url.query.decode(), keep_blank_values=True))
        name, _, rest = resource.partition("(")
        entity = ALL_BY_NAME.get(name)
        if entity is None:
            return
        patients: frozenset[str] = frozenset()
        if listing:
            touched = frozenset({DOCUMENTS.name})
            patients = frozenset({rest[: -len(")/" + DOCUMENTS.name)]})
        elif rest and "/" in rest:
            return  # one document, or its content: no look at a set
        else:
            touched = touched_sets(entity, params)
            if DOCUMENTS.name in touched:  # patients with their documents
                patients = _patients(body)
        number = len(self.journal.served)
        self.journal.served.append(
            Served(number, touched, status, self._truth(), patients, resource, params)
        )

    def _truth(self) -> Truth:
        """The data as it stands, copied only when it changed since the last copy."""
        store = self.sandbox.store
        documents = store.documents
        version = (len(store.changes), documents._serial, len(documents.content))
        if self.journal._truth is None or version != self.journal._version:
            patients = store.table(PATIENTS.name).by_key
            self.journal._truth = Truth(
                {e.name: dict(store.table(e.name).by_key) for e in ENTITY_SETS},
                {  # a patient's documents show only while the patient is there (else 404)
                    str(p): frozenset(tuple(sorted(m.items())) for m in docs)
                    for p, docs in store.documents.by_patient.items()
                    if p in patients
                },
            )
            self.journal._version = version
        return self.journal._truth


def _drive(coroutine: Coroutine[Any, Any, bool]) -> bool:
    """The app's coroutine run to its end in this thread, without an event loop (whose turns
    were about a tenth of the in-process service's time, cProfile): nothing the sandbox awaits
    here waits on real I/O, and a bare yield (`asyncio.sleep(0)`) is passed over. A real wait
    would be a simulation bug: said."""
    try:
        while True:
            if coroutine.send(None) is not None:
                coroutine.close()
                raise RuntimeError("the sandbox awaited real I/O inside the simulation")
    except StopIteration as done:
        return done.value


def _patients(body: bytes) -> frozenset[str]:
    """The patients a page of Patients carries (none in a garbled answer: the client asks
    it again)."""
    try:
        records = msgspec.json.decode(body).get("value", [])
    except (msgspec.DecodeError, AttributeError):
        return frozenset()
    return frozenset(str(r.get("id")) for r in records if isinstance(r, dict))
