"""The sandbox's patient documents (spec 4.3): list, upload, read, delete, download."""

from __future__ import annotations

import mimetypes
from dataclasses import dataclass

from starlette.datastructures import UploadFile
from starlette.requests import Request
from starlette.responses import Response

from connectors.clinical_records import catalogue as cat
from connectors.sandbox.config import Customer, SandboxConfig
from connectors.sandbox.errors import ODataError, invalid_query, not_found
from connectors.sandbox.faults import FaultInjector
from connectors.sandbox.odata import parse_query, refuse_or, run_collection
from connectors.sandbox.responses import base_url, envelope, json_response
from connectors.sandbox.routes import Resource, parse_key, query_options
from connectors.sandbox.store import Store


@dataclass
class _ListView:
    """A TableView over a list already sorted by key (patient documents)."""

    rows: list[dict]
    keys: list


class DocumentEndpoints:
    """The document handlers of `Sandbox` (a mixin: the sandbox holds the request's customer
    and store, its switches and its faults)."""

    customer: Customer
    store: Store
    config: SandboxConfig
    faults: FaultInjector

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
        if self.config.refuse_filter_or:
            refuse_or(query)
        if query.expand:
            raise invalid_query("Documents have no navigation properties to expand.")
        if self.faults.should_drift():
            with self.store.lock:
                self._drift_documents()
        rows = self.store.documents.list(patient_id)
        view = _ListView(rows, [r["id"] for r in rows])
        page = run_collection(query, cat.DOCUMENTS, view, self.store.related)
        return json_response(envelope(request, "Documents", page.records, page.count))

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
                # The uploading user is the calling customer's client, as an independent
                # service recorded it (issue 29; spec 2.9: a string, "Uploading user").
                uploaded_by_id=self.customer.client_id,
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
        context = f"{base_url(request)}/$metadata#Documents/$entity"
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
