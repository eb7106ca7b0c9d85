"""Opt-in document content: streamed into the content store under `<LAKE_ROOT>/_documents`
(size checked against the metadata, sha256 computed, owner-only, atomic), recorded in
`ops.document_content`, and skipped next time while the store still holds it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import duckdb

from connectors.clinical_records.client import ClinicalClient
from connectors.clinical_records.documents import DocumentsClient
from warehouse import ops
from warehouse.content_store import ContentMismatch, ContentStore, StoredContent

CONTENT_DIR = "_documents"  # under LAKE_ROOT: the content store
MANIFEST_TABLE = ops.CONTENT_TABLE


def content_store(lake_root: str | Path) -> ContentStore:
    return ContentStore(Path(lake_root) / CONTENT_DIR)


@dataclass(frozen=True)
class ContentItem:
    patient_id: str
    document_id: str
    size: int | None
    content_type: str | None


@dataclass
class ContentResult:
    wanted: int = 0
    downloaded: int = 0
    bytes: int = 0
    already_held: int = 0  # same bytes held under another document (stored once)
    mismatched: int = 0  # size differs from the metadata: nothing kept, retried next run
    missing: int = 0  # deleted at the source meanwhile


def content_todo(con: duckdb.DuckDBPyConnection, store: ContentStore) -> list[ContentItem]:
    """Live documents whose content is not held (no manifest row, another size, file gone)."""
    rows = ops.held_content(con)
    return [
        ContentItem(patient, doc, size, kind)
        for patient, doc, size, kind, sha, held_size in rows
        if sha is None or held_size != size or not store.holds(sha)
    ]


def download_content(
    client: ClinicalClient, store: ContentStore, todo: Sequence[ContentItem], run_id: str
) -> tuple[list[tuple], ContentResult]:
    """Stream each document into the store; returns manifest rows and the figures."""
    docs = DocumentsClient(client)
    result = ContentResult(wanted=len(todo))

    def one(item: ContentItem) -> StoredContent | ContentMismatch:
        scratch = store.scratch()
        try:
            docs.download(item.patient_id, item.document_id, scratch)
            return store.put_file(scratch, expected_size=item.size)
        except ContentMismatch as mismatch:
            return mismatch
        finally:
            scratch.unlink(missing_ok=True)

    rows: list[tuple] = []
    for item, stored in zip(todo, client.each(one, todo), strict=True):
        if stored is None:
            result.missing += 1
        elif isinstance(stored, ContentMismatch):
            result.mismatched += 1
        else:
            result.downloaded += 1
            result.bytes += stored.size
            result.already_held += not stored.written
            rows.append(
                (
                    item.document_id,
                    item.patient_id,
                    stored.sha256,
                    stored.size,
                    item.content_type,
                    datetime.now(UTC),
                    run_id,
                )
            )
    return rows, result


def record_content(con: duckdb.DuckDBPyConnection, rows: Sequence[tuple]) -> None:
    ops.record_content(con, rows)
