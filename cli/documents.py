"""`clinical-sync documents upload|list|download|delete|sync`: the door to spec 4.3.

The connector checks type and size before sending; the service's 400, 404 and 413 become
one clear line each. Exit codes: 0 done, 1 refused (by the checks or the service), 2 a
problem of the operator's setup (configuration, a missing local file, an existing output).
Document ids are printed as the commands' results on stdout, never logged. Upload and delete
leave a note so that the next documents sync lists that patient whole. `sync` runs the
`patient_documents` asset through Dagster, as the `documents_sync` job does.

Module level imports the standard library only: `clinical-sync --help` stays fast.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from cli import exit_codes

REFUSED, SETUP = exit_codes.FAILED, exit_codes.CONFIG
LIST_COLUMNS = (
    "id",
    "file_name",
    "content_type",
    "file_size_bytes",
    "document_type",
    "uploaded_at",
)


def _fail(code: int, text: str) -> int:
    print(f"clinical-sync documents: {text}", file=sys.stderr)
    return code


@contextmanager
def _documents() -> Iterator[Any]:
    """A DocumentsClient for the CLINICAL_* settings (ConfigError reaches `main`: exit 2)."""
    from connectors.clinical_records.client import ClinicalClient
    from connectors.clinical_records.documents import DocumentsClient
    from connectors.clinical_records.settings import Settings

    with ClinicalClient(Settings.from_env()) as client:
        yield DocumentsClient(client)


def _refusal(error: BaseException) -> str | None:
    """What to tell the operator of a refusal (the service's own message follows)."""
    from connectors.clinical_records.documents import DocumentError
    from connectors.clinical_records.errors import BadRequest, NotFound, PayloadTooLarge

    refusals: dict[type[BaseException], str] = {
        DocumentError: "not sent",
        BadRequest: "refused by the service (400 bad request)",
        NotFound: "not found (404): no such patient, or no such document of this patient",
        PayloadTooLarge: "refused by the service (413: the file exceeds the 25 MB limit)",
    }
    return refusals.get(type(error))


def _guarded(command: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
    """Turn the connector's refusals into a message and exit code 1."""

    def run(args: argparse.Namespace) -> int:
        from connectors.clinical_records.errors import ApiError, ClinicalApiError, ConfigError

        try:
            return command(args)
        except ConfigError:
            raise
        except ApiError as error:
            label = _refusal(error) or f"refused by the service ({error.status})"
            detail = ": ".join(p for p in (error.message, error.details) if p)
            return _fail(REFUSED, label + (f": {detail}" if detail else ""))
        except ClinicalApiError as error:
            return _fail(REFUSED, f"{_refusal(error) or 'failed'}: {error}")

    return run


def upload(args: argparse.Namespace) -> int:
    path = Path(args.file)
    if not path.is_file():
        return _fail(SETUP, f"no file at {path}")
    with _documents() as docs:
        meta = docs.upload(
            args.patient,
            path,
            document_type=args.type,
            description=args.description,
            content_type=args.content_type,
        )
    print(
        f"uploaded {meta.get('id')}: {meta.get('file_name')} ({meta.get('content_type')}, "
        f"{meta.get('file_size_bytes')} bytes)"
    )
    return 0


def _cell(value: object) -> str:
    return "-" if value is None else str(value)


def list_documents(args: argparse.Namespace) -> int:
    from cli.output import format_table
    from connectors.clinical_records.catalogue import DOCUMENTS
    from connectors.clinical_records.errors import QueryError
    from connectors.clinical_records.query import F, Query, all_of

    condition = all_of(
        F("document_type") == args.type if args.type else None,
        F(DOCUMENTS.cursor) >= args.since if args.since else None,
    )
    try:
        Query(DOCUMENTS, filter=condition)  # checked before any request
    except QueryError as error:
        return _fail(SETUP, f"--since/--type: {error}")
    with _documents() as docs:
        found = docs.list(args.patient, filter=condition)
    rows = [[_cell(d.get(c)) for c in LIST_COLUMNS] for d in found]
    print(format_table([list(LIST_COLUMNS), *rows]))
    print(f"{len(rows)} documents", file=sys.stderr)
    return 0


def download(args: argparse.Namespace) -> int:
    with _documents() as docs:
        meta = docs.metadata(args.patient, args.document)
        target = Path(args.output) if args.output else Path(Path(meta["file_name"]).name)
        if target.exists() and not args.force:
            return _fail(SETUP, f"{target} exists; choose --output or add --force")
        private = os.umask(0o077)  # protected health information: readable by the owner only
        try:
            size = docs.download(args.patient, args.document, target)
        finally:
            os.umask(private)
    expected = meta.get("file_size_bytes")
    if expected is not None and size != expected:
        target.unlink(missing_ok=True)
        return _fail(REFUSED, f"received {size} bytes where the metadata states {expected}")
    print(f"saved {size} bytes ({meta.get('content_type')}) to {target}")
    return 0


def delete(args: argparse.Namespace) -> int:
    with _documents() as docs:
        docs.delete(args.patient, args.document)
    print("deleted")
    return 0


def sync(args: argparse.Namespace) -> int:
    """The documents' part of the sync through Dagster, as the `documents_sync` job runs it."""
    from cli import log as cli_log
    from cli.output import alert_lines, format_table, tell
    from pipelines import home
    from pipelines.runner import sync_documents

    log = cli_log.log_file("documents sync")
    cli_log.capture(log, verbose=args.verbose)
    with home.instance(runs_here=True) as instance:
        run = sync_documents(
            os.environ,
            lake_root=home.lake_root(),
            warehouse_path=home.warehouse_path(),
            full=args.full,
            content=args.content,
            instance=instance,
            log_level="WARNING" if args.verbose else "CRITICAL",  # the full story: the log
            say=tell,
        )
        cli_log.write_run(instance, run.run_id, log, succeeded=run.success)
    if not run.success:
        return _fail(REFUSED, f"documents sync failed: {run.failure}\n  log:  {log}")
    print(format_table([["figure", "value"], *([k, _cell(v)] for k, v in run.figures.items())]))
    print(f"run {run.run_id}")
    if run.verdict is not None and not run.verdict.exact:
        checks = [c.name for e in run.verdict.not_exact for c in e.failed]
        text = f"run {run.run_id[:8]} is NOT EXACT: failed {', '.join(checks)}"
        return _fail(exit_codes.NOT_EXACT, "\n".join([text, *alert_lines(run.alert)]))
    return 0


def add_parser(sub: argparse._SubParsersAction) -> None:
    """`documents` and its subcommands (imports nothing until one runs)."""
    p = sub.add_parser("documents", help="upload, list, download, delete or sync patient documents")
    actions = p.add_subparsers(dest="action", required=True)

    up = actions.add_parser("upload", help="upload a PDF, PNG, JPEG, TIFF or DOCX (max 25 MB)")
    up.add_argument("patient", help="patient id")
    up.add_argument("file", help="file to upload")
    up.add_argument("--type", help="document_type label, e.g. Prescription")
    up.add_argument("--description", help="human-readable description")
    up.add_argument("--content-type", help="MIME type (default: from the file name)")
    up.set_defaults(func=_guarded(upload))

    ls = actions.add_parser("list", help="a patient's documents")
    ls.add_argument("patient", help="patient id")
    ls.add_argument("--type", help="only this document_type")
    ls.add_argument("--since", metavar="ISO-8601", help="only uploaded at or after (with Z)")
    ls.set_defaults(func=_guarded(list_documents))

    down = actions.add_parser("download", help="save a document's file")
    down.add_argument("patient", help="patient id")
    down.add_argument("document", help="document id")
    down.add_argument("--output", "-o", help="file to write (default: its file name, here)")
    down.add_argument("--force", action="store_true", help="overwrite an existing file")
    down.set_defaults(func=_guarded(download))

    rm = actions.add_parser("delete", help="delete a document")
    rm.add_argument("patient", help="patient id")
    rm.add_argument("document", help="document id")
    rm.set_defaults(func=_guarded(delete))

    sy = actions.add_parser(
        "sync", help="read every patient's documents (in the patients' pages) into the warehouse"
    )
    sy.add_argument("--full", action="store_true", help="as sync --full: a reset")
    sy.add_argument(
        "--content", action="store_true", help="also fetch the files into the content store (PHI)"
    )
    sy.set_defaults(func=_guarded(sync))
