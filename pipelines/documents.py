"""The patient documents sync, without Dagster: plan, list, load, and (opt-in) fetch content.

`documents_plan` decides whom to list within the request budget; this module lists them
(several requests in flight, paced by the machine-wide limiter), writes lake batches, loads
them into `clinical.patient_documents` (a full listing is a snapshot: what it lacks gets
`_deleted_at`; a patient listed whole outside it has its own absent documents marked), and
hands content to `documents_content` when asked.

Documents are protected health information: logs carry counts only, never a patient id, a
document id, a URL or content.
"""

from __future__ import annotations

import logging
import os
import time
import uuid
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import duckdb

from connectors.clinical_records.catalogue import DOCUMENTS
from connectors.clinical_records.client import ClinicalClient
from connectors.clinical_records.documents import DocumentsClient
from connectors.clinical_records.errors import NotFound
from connectors.clinical_records.query import F
from connectors.clinical_records.settings import Settings
from pipelines.documents_content import (
    CONTENT_DIR,
    ContentResult,
    content_store,
    content_todo,
    download_content,
    manifest_ddl,
    record_content,
)
from pipelines.documents_plan import (
    DOCS_TABLE,
    LOCK_WAIT_SECONDS,
    DocumentsOptions,
    ListingPlan,
    load_state,
    plan_listing,
)
from warehouse.content_store import PRIVATE_FILE
from warehouse.lake import Lake
from warehouse.load import LoadResult, Warehouse
from warehouse.normalise import REJECT, normalise
from warehouse.private import private_dir

log = logging.getLogger(__name__)

NOTES_DIR = "_notes"
PENDING_NOTES = "pending.txt"
BATCH_ROWS = 5_000


# -- notes left by `clinical-sync documents upload|delete` ---------------------------------


def patient_key(patient_id: str) -> str:
    """A patient id as the warehouse writes it (the key is numeric: "0042" is 42)."""
    text = str(patient_id).strip()
    return str(int(text)) if text.isdigit() else text


def _notes_dir(lake_root: str | Path) -> Path:
    return Path(lake_root) / CONTENT_DIR / NOTES_DIR


def note_patient(lake_root: str | Path, patient_id: str) -> None:
    """Remember a patient whose documents we changed: the next sync lists it whole."""
    folder = _notes_dir(lake_root)
    private_dir(folder)
    fd = os.open(folder / PENDING_NOTES, os.O_WRONLY | os.O_CREAT | os.O_APPEND, PRIVATE_FILE)
    with os.fdopen(fd, "a", encoding="utf-8") as out:
        out.write(patient_key(patient_id) + "\n")  # one short append: atomic


def claim_notes(lake_root: str | Path) -> tuple[list[Path], set[str]]:
    """Take the pending notes (renamed, so new ones start a new file) and any left by a
    failed run; they are released only after the run commits."""
    folder = _notes_dir(lake_root)
    pending = folder / PENDING_NOTES
    if pending.exists():
        os.replace(pending, folder / f"claimed-{uuid.uuid4().hex}.txt")
    files = sorted(folder.glob("claimed-*.txt")) if folder.exists() else []
    lines = (line.strip() for f in files for line in f.read_text(encoding="utf-8").splitlines())
    return files, {line for line in lines if line}


def release_notes(files: Sequence[Path]) -> None:
    for path in files:
        path.unlink(missing_ok=True)


# -- listing --------------------------------------------------------------------------------


@dataclass
class Listing:
    records: list[dict[str, Any]] = field(default_factory=list)
    listed: int = 0
    missing: int = 0  # patients the service no longer knows (404): none of their documents
    whole_ids: list[str] = field(default_factory=list)  # ids seen for the `whole` patients


def list_documents(client: ClinicalClient, plan: ListingPlan) -> Listing:
    """Each planned patient's documents, several requests in flight (the limiter paces them)."""
    docs = DocumentsClient(client)
    jobs: list[tuple[str, datetime | None]] = [(p, None) for p in plan.whole]
    jobs += sorted(plan.since.items())

    def one(job: tuple[str, datetime | None]) -> tuple[list[dict[str, Any]], bool, bool]:
        patient, since = job
        condition = None if since is None else F(DOCUMENTS.cursor) >= since
        try:
            return docs.list(patient, filter=condition), False, since is None
        except NotFound:
            return [], True, since is None

    listing = Listing()
    with ThreadPoolExecutor(max_workers=client.settings.max_in_flight) as pool:
        for records, missing, whole in pool.map(one, jobs):
            listing.listed += 1
            listing.missing += missing
            listing.records += records
            if whole:
                listing.whole_ids += [str(r.get(DOCUMENTS.key)) for r in records]
    return listing


def write_batches(
    lake: Lake, listing: Listing, plan: ListingPlan, run_id: str, extracted_at: datetime
) -> tuple[list[Path], int]:
    """Normalised lake batches of the listing (a full listing always writes one, even empty,
    so that its snapshot marks deletions); returns the files and the rejected rows."""
    records = listing.records
    chunks = [records[i : i + BATCH_ROWS] for i in range(0, len(records), BATCH_ROWS)]
    if not chunks and plan.full:
        chunks = [[]]
    snapshot_id = uuid.uuid4().hex if plan.full else None
    files, rejected = [], 0
    for n, chunk in enumerate(chunks):
        batch = normalise(DOCUMENTS, chunk)
        rejected += sum(1 for r in batch.rejects if r.kind == REJECT)
        last = n == len(chunks) - 1
        files.append(
            lake.write(
                DOCUMENTS,
                batch.table,
                run_id=run_id,
                extracted_at=extracted_at,
                snapshot_id=snapshot_id,
                watermark=plan.patients_mark if last else None,
                snapshot_complete=plan.full and last,
                rejects=batch.rejects,
            )
        )
    return files, rejected


def mark_absent(
    con: duckdb.DuckDBPyConnection, patients: Sequence[str], seen: Sequence[str], at: datetime
) -> int:
    """For patients listed whole outside a full listing: their held documents the listing
    lacked are deleted at the source (`_deleted_at`, which closes their history). One
    statement, so one transaction."""
    if not patients:
        return 0
    (marked,) = con.execute(
        f'UPDATE {DOCS_TABLE} SET "_deleted_at" = ? WHERE "_deleted_at" IS NULL '
        f'AND CAST("patient_id" AS VARCHAR) IN (SELECT unnest(CAST(? AS VARCHAR[]))) '
        f'AND "id" NOT IN (SELECT unnest(CAST(? AS VARCHAR[]))) AND "_extracted_at" <= ?',
        [at, list(patients), list(seen), at],
    ).fetchone()
    return marked


# -- one run --------------------------------------------------------------------------------


@dataclass
class DocumentsReport:
    """What one run did: the figures the asset publishes and the CLI prints (no PHI)."""

    mode: str
    reason: str
    patients_listed: int = 0
    patients_missing: int = 0
    requests_expected: int = 0
    requests_spent: int = 0  # by the listing, retries included
    content_requests: int = 0
    seconds_expected: float = 0.0
    seconds: float = 0.0
    documents_seen: int = 0
    documents_new: int = 0
    documents_updated: int = 0
    documents_deleted: int = 0
    documents_rejected: int = 0
    live_documents: int = 0
    content: ContentResult | None = None

    def metadata(self) -> dict[str, Any]:
        figures = {k: v for k, v in vars(self).items() if k != "content"}
        content = self.content or ContentResult()
        figures.update({f"content_{k}": v for k, v in vars(content).items()})
        figures["content_downloaded_bytes"] = figures.pop("content_bytes")
        return figures


def sync_documents(
    settings: Settings,
    *,
    lake_root: str | Path,
    warehouse_path: str | Path,
    run_id: str,
    options: DocumentsOptions | None = None,
    logger: logging.Logger | Any | None = None,
    now: datetime | None = None,
    started_at: datetime | None = None,
) -> DocumentsReport:
    """Plan, list, load and optionally fetch content; the warehouse is written only briefly."""
    say = logger or log
    options = options or DocumentsOptions()
    started = time.monotonic()
    lake = Lake(Path(lake_root))
    lake.record_source(settings.base_url, settings.customer)
    notes, noted = claim_notes(lake_root)
    plan = plan_listing(load_state(warehouse_path), options, noted, now)
    report = DocumentsReport("full" if plan.full else "incremental", plan.reason)
    report.requests_expected = plan.expected_requests
    report.seconds_expected = round(plan.expected_seconds(settings.rate_limit), 1)
    say.info(
        f"{DOCUMENTS.name}: {report.mode} listing ({plan.reason}): {plan.patients} patients, "
        f"{plan.expected_requests} requests expected, about {report.seconds_expected:g} s "
        f"at {settings.rate_limit:g} requests/s"
    )
    extracted_at = datetime.now(UTC)
    with ClinicalClient(settings, logger=say) as client:
        listing = list_documents(client, plan)
        report.requests_spent = client.stats.requests
        files, report.documents_rejected = write_batches(lake, listing, plan, run_id, extracted_at)
        with Warehouse(warehouse_path, wait=LOCK_WAIT_SECONDS) as wh:
            wh.ensure_schema()
            wh.check_source(settings.base_url, settings.customer)
            for statement in manifest_ddl():
                wh.con.execute(statement)
            loaded: LoadResult = wh.load(
                DOCUMENTS, files, run_id=run_id, snapshot=plan.full, watermark=plan.patients_mark
            )
            scoped = () if plan.full else plan.whole
            absent = mark_absent(wh.con, scoped, listing.whole_ids, extracted_at)
            listed = loaded + LoadResult(soft_deleted=absent)
            wh.add_to_run(
                run_id, [DOCUMENTS.name], listed, full_snapshot=plan.full, started_at=started_at
            )
            store = content_store(lake_root)
            todo = content_todo(wh.con, store) if options.download_content else []
        release_notes(notes)
        if options.download_content:
            say.info(
                f"{DOCUMENTS.name}: {len(todo)} documents to download, one request each: about "
                f"{len(todo) / settings.rate_limit:.0f} s at {settings.rate_limit:g} requests/s"
            )
            rows, report.content = download_content(client, store, todo, run_id)
            with Warehouse(warehouse_path, wait=LOCK_WAIT_SECONDS) as wh:
                record_content(wh.con, rows)
        report.content_requests = client.stats.requests - report.requests_spent
    with Warehouse(warehouse_path, read_only=True, wait=LOCK_WAIT_SECONDS) as wh:
        (report.live_documents,) = wh.con.execute(
            f'SELECT count(*) FROM {DOCS_TABLE} WHERE "_deleted_at" IS NULL'
        ).fetchone()
    report.patients_listed, report.patients_missing = listing.listed, listing.missing
    report.documents_seen = len(listing.records)
    report.documents_new = loaded.inserted + loaded.resurrected
    report.documents_updated = loaded.updated
    report.documents_deleted = loaded.soft_deleted + absent
    report.seconds = round(time.monotonic() - started, 2)
    say.info(
        f"{DOCUMENTS.name}: listed {report.patients_listed} patients "
        f"({report.patients_missing} unknown to the service) with {report.requests_spent} "
        f"requests in {report.seconds:g} s; {report.documents_seen} documents seen, "
        f"{report.documents_new} new, {report.documents_deleted} deleted"
    )
    return report
