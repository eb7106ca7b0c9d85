"""Patient documents as the sandbox keeps them: metadata and bytes per patient, by id."""

from __future__ import annotations

import hashlib
from bisect import insort
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any


def hashed_id(patient_id: str, serial: int) -> str:
    return "doc-" + hashlib.sha256(f"{patient_id}/{serial}".encode()).hexdigest()[:20]


def utc_stamp(moment: datetime, serial: int) -> str:
    return moment.isoformat(timespec="microseconds").replace("+00:00", "Z")


@dataclass
class DocumentStore:
    """Patient documents: metadata per patient (sorted by id) and the bytes by id."""

    clock: Any  # () -> datetime, the sandbox clock
    # A new document's id and `uploaded_at` text (the values profile's: connectors/sandbox/wide.py)
    make_id: Callable[[str, int], str] = hashed_id
    stamp: Callable[[datetime, int], str] = utc_stamp
    by_patient: dict[str, list[dict]] = field(default_factory=lambda: defaultdict(list))
    content: dict[str, bytes] = field(default_factory=dict)
    owner: dict[str, str] = field(default_factory=dict)
    _serial: int = 0

    def add(
        self,
        *,
        patient_id: str,
        file_name: str,
        content_type: str,
        data: bytes,
        document_type: str | None,
        description: str | None,
        uploaded_by_id: str,
    ) -> dict:
        self._serial += 1
        doc_id = self.make_id(patient_id, self._serial)
        uploaded = self.clock() + timedelta(microseconds=self._serial)
        meta = {
            "id": doc_id,
            "patient_id": patient_id,
            "file_name": file_name,
            "content_type": content_type,
            "file_size_bytes": len(data),
            "document_type": document_type,
            "description": description,
            "uploaded_by_id": uploaded_by_id,
            "uploaded_at": self.stamp(uploaded, self._serial),
        }
        insort(self.by_patient[patient_id], meta, key=lambda m: m["id"])
        self.content[doc_id] = data
        self.owner[doc_id] = patient_id
        return dict(meta)

    def list(self, patient_id: str) -> list[dict]:
        return self.by_patient.get(patient_id, [])

    def get(self, patient_id: str, doc_id: str) -> tuple[dict, bytes] | None:
        if self.owner.get(doc_id) != patient_id:
            return None
        return self.get_any(doc_id)

    def get_any(self, doc_id: str) -> tuple[dict, bytes] | None:
        patient_id = self.owner.get(doc_id)
        if patient_id is None:
            return None
        meta = next(m for m in self.by_patient[patient_id] if m["id"] == doc_id)
        return dict(meta), self.content[doc_id]

    def delete(self, patient_id: str, doc_id: str) -> bool:
        if self.owner.get(doc_id) != patient_id:
            return False
        self.by_patient[patient_id] = [m for m in self.by_patient[patient_id] if m["id"] != doc_id]
        del self.content[doc_id], self.owner[doc_id]
        return True

    def all(self) -> list[dict]:
        return [dict(m) for docs in self.by_patient.values() for m in docs]


# Small, valid-looking files per accepted type, for seeded documents.
SAMPLE_BYTES: dict[str, bytes] = {
    "application/pdf": b"%PDF-1.4\n% sandbox document\n%%EOF\n",
    "image/png": b"\x89PNG\r\n\x1a\n" + b"\x00" * 24,
    "image/jpeg": b"\xff\xd8\xff\xe0" + b"\x00" * 24 + b"\xff\xd9",
}
