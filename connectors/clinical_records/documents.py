"""Patient documents (spec 4.3 and 4.4): upload, list, metadata, download, delete.

Documents are protected health information: their content is streamed from and to files,
never held whole in memory, and no log line or error names a patient or document id (the
transport logs the label "Documents" only).
"""

from __future__ import annotations

import mimetypes
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from connectors.clinical_records.catalogue import (
    ACCEPTED_DOCUMENT_TYPES,
    DOCUMENTS,
    MAX_UPLOAD_BYTES,
    PAGE_SIZE,
    PATIENTS,
)
from connectors.clinical_records.client import (
    ClinicalClient,
    collection_validator,
    entity_validator,
)
from connectors.clinical_records.errors import QueryError
from connectors.clinical_records.keys import to_api
from connectors.clinical_records.query import Expr, OrderItem, Query
from connectors.clinical_records.transport import Call, path_key

LABEL = DOCUMENTS.name
SHOWS = frozenset({DOCUMENTS.name})  # a listing is a look at its patient's documents
EXTRA_TYPES = {".docx": "application/vnd.openxmlformats-officedocument.wordprocessingml.document"}


class DocumentError(QueryError):
    """A document refused before sending: unsupported type or over 25 MB."""


def content_type_of(path: Path, declared: str | None = None) -> str:
    """The MIME type to send: the declared one, else guessed from the file name."""
    guessed = declared or EXTRA_TYPES.get(path.suffix.lower()) or mimetypes.guess_type(path.name)[0]
    if guessed not in ACCEPTED_DOCUMENT_TYPES:
        accepted = ", ".join(ACCEPTED_DOCUMENT_TYPES.values())
        raise DocumentError(f"{path.suffix or 'this file'} is not an accepted type ({accepted})")
    return guessed


class DocumentsClient:
    """Document operations over a `ClinicalClient` (its limiter, token, retries and counters)."""

    def __init__(self, client: ClinicalClient) -> None:
        self.client = client
        self.transport = client.transport

    @staticmethod
    def _path(patient_id: str, document_id: str | None = None) -> str:
        """A patient's documents, the keys in the kinds the spec gives them (keys.to_api):
        a patient held as "00123" is `Patients(00123)`."""
        patient = to_api(PATIENTS.key_field, patient_id)
        path = f"Patients({path_key(patient)})/Documents"
        if document_id is None:
            return path
        return f"{path}({path_key(to_api(DOCUMENTS.key_field, document_id))})"

    def upload(
        self,
        patient_id: str,
        file: str | Path,
        *,
        document_type: str | None = None,
        description: str | None = None,
        content_type: str | None = None,
    ) -> dict[str, Any]:
        """Upload a file as multipart, streamed from disk; type and size checked first."""
        path = Path(file)
        mime = content_type_of(path, content_type)
        size = path.stat().st_size
        if size > MAX_UPLOAD_BYTES:
            raise DocumentError(f"the file has {size} bytes; the limit is {MAX_UPLOAD_BYTES}")
        fields = {
            k: v
            for k, v in (("document_type", document_type), ("description", description))
            if v is not None
        }
        handles: list[Any] = []

        def body() -> dict[str, Any]:
            for handle in handles:
                handle.close()
            handle = path.open("rb")  # reopened per attempt: a retry sends the file again
            handles.append(handle)
            return {"files": {"file": (path.name, handle, mime)}, "data": fields}

        call = Call("POST", self._path(patient_id), LABEL, idempotent=False)
        try:
            return self.transport.json(call, validate=entity_validator, body=body)
        finally:
            for handle in handles:
                handle.close()

    def iter_list(
        self,
        patient_id: str,
        *,
        filter: Expr | None = None,
        select: list[str] | None = None,
        orderby: list[OrderItem] | None = None,
    ) -> Iterator[dict[str, Any]]:
        """Every document of a patient matching the options, all pages ($skip paging)."""
        skip = 0
        while True:
            query = Query(
                DOCUMENTS,
                filter=filter,
                select=select,
                orderby=orderby or [("id", False)],
                top=PAGE_SIZE,
                skip=skip,
            )
            call = Call("GET", self._path(patient_id), LABEL, query.params(), shows=SHOWS)
            records = self.transport.json(call, validate=collection_validator(False))["value"]
            self.client.stats.add(pages=1, records=len(records))
            yield from records
            if len(records) < PAGE_SIZE:
                return
            skip += len(records)

    def list(self, patient_id: str, **options: Any) -> list[dict[str, Any]]:
        return list(self.iter_list(patient_id, **options))

    def metadata(self, patient_id: str, document_id: str) -> dict[str, Any]:
        call = Call("GET", self._path(patient_id, document_id), LABEL)
        body = self.transport.json(call, validate=entity_validator)
        return {k: v for k, v in body.items() if not k.startswith("@odata.")}

    def download(self, patient_id: str, document_id: str, destination: str | Path) -> int:
        """Stream `/Patients(p)/Documents(d)/$value` to a file; returns the byte count."""
        call = Call("GET", self._path(patient_id, document_id) + "/$value", LABEL)
        return self.transport.download(call, Path(destination))

    def download_direct(self, document_id: str, destination: str | Path) -> int:
        """Stream `/document/{id}` (spec 4.4) to a file; returns the byte count."""
        call = Call("GET", f"document/{path_key(document_id)}", LABEL)
        return self.transport.download(call, Path(destination))

    def delete(self, patient_id: str, document_id: str) -> None:
        """Delete a document (204). DELETE is idempotent, so it is retried like a GET."""
        self.transport.json(Call("DELETE", self._path(patient_id, document_id), LABEL))
