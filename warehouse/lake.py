"""The Parquet lake: immutable, hive-partitioned batches, everything rebuild needs.

Layout under the root:

    entity=<table>/extracted_date=<YYYY-MM-DD>/<run_id>-<seq>.parquet   normalised rows
    _rejects/entity=<table>/<batch_id>.parquet                           that batch's rejects
    _deletes/entity=<table>/<batch_id>.parquet                           keys found deleted
    _tmp/                                                                files being written
    _journal/run=<run_id>/<step>.json                                    a run's requests, per step
    _source.json                                                         base URL and customer
    _runs/<run_id>.json                                                  how each run ended

A file is written under `_tmp/` and linked into place (`os.link` is atomic and fails if
the name exists, so a file is never rewritten); readers globbing
`<root>/entity=<table>/**/*.parquet` only ever see complete files. Each data file carries
its batch facts (run, extraction time, snapshot, watermark) as Parquet key-value metadata.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from connectors.clinical_records.catalogue import EntitySet
from warehouse.errors import SourceMismatch
from warehouse.normalise import Reject
from warehouse.private import PRIVATE_FILE, create_private, private_dir, tighten_tree
from warehouse.schema import arrow_schema, dictionary_columns

META_KEY = b"clinical_sync.batch"
REJECTS, DELETES = "rejects", "deletes"  # a batch's side files, under `_<kind>/`
SOURCE_FILE = "_source.json"
RUNS = "_runs"  # each run's row of ops.sync_runs, as written when it ended
JOURNAL = "_journal"
# 2: issue 29's typing rule (ids as sent, DECIMAL(38,12), Prescriptions.created_at as text).
# A batch of format 1 still loads (the merge casts each column on read), but what the old
# rule merged or rejected is not in it.
FORMAT_VERSION = 2
RUN_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")
REJECTS_SCHEMA = pa.schema(
    [
        ("entity", pa.string()),
        ("key", pa.string()),
        ("kind", pa.string()),
        ("fields", pa.list_(pa.string())),
        ("reason", pa.string()),
        ("raw_json", pa.string()),
    ]
)


@dataclass(frozen=True)
class BatchInfo:
    """What a lake file says about itself (its key-value metadata)."""

    entity: str
    table: str
    run_id: str
    seq: int
    extracted_at: str  # ISO 8601, UTC
    snapshot_id: str | None
    snapshot_complete: bool
    watermark: str | None
    batch_id: str
    rows: int
    rejects: int
    format: int = FORMAT_VERSION
    deletes: int = 0  # keys the extraction found deleted at the source (reconciliation)
    # [low, high) read whole, keys as text (None: open): a budgeted run's share of a set
    key_range: list[str | None] | None = None

    @property
    def extracted(self) -> datetime:
        return datetime.fromisoformat(self.extracted_at)

    @property
    def order(self) -> tuple[str, str, int]:
        return (self.extracted_at, self.run_id, self.seq)


def side_path(root: Path, kind: str, table: str, batch_id: str) -> Path:
    return Path(root) / f"_{kind}" / f"entity={table}" / f"{batch_id}.parquet"


def _utc(moment: datetime) -> datetime:
    if moment.tzinfo is None:
        raise ValueError("extracted_at must be timezone-aware")
    return moment.astimezone(UTC)


class Lake:
    """Every folder and file of the lake is owner-only (0700, 0600), whatever the umask; a lake
    written before that rule is tightened by its next writer."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root)
        self._private = False

    def _private_dir(self, folder: Path) -> Path:
        if not self._private:
            private_dir(self.root)
            tighten_tree(self.root, f"lake {self.root}")
            self._private = True
        return private_dir(folder)

    def entity_dir(self, entity: EntitySet) -> Path:
        return self.root / f"entity={entity.table}"

    def write(
        self,
        entity: EntitySet,
        table: pa.Table,
        *,
        run_id: str,
        extracted_at: datetime,
        snapshot_id: str | None = None,
        watermark: str | None = None,
        snapshot_complete: bool = False,
        rejects: Sequence[Reject] = (),
        deletes: Sequence[str] = (),
        key_range: tuple[str | None, str | None] | None = None,
    ) -> Path:
        """Write one normalised batch (its rejects, and the keys found deleted at the source
        as text) atomically; return the data file."""
        if not RUN_ID_RE.match(run_id):
            raise ValueError("run_id may hold only letters, digits, '_', '.' and '-'")
        table = table.cast(arrow_schema(entity))
        extracted_at = _utc(extracted_at)
        partition = self.entity_dir(entity) / f"extracted_date={extracted_at.date().isoformat()}"
        self._private_dir(partition)
        tmp_dir = self._private_dir(self.root / "_tmp")
        batch_id = uuid.uuid4().hex
        if rejects:
            rows = [{**asdict(r), "fields": list(r.fields)} for r in rejects]
            self._write_side(REJECTS, entity, batch_id, pa.Table.from_pylist(rows, REJECTS_SCHEMA))
        if deletes:
            keys = pa.table({"key": pa.array(list(deletes), pa.string())})
            self._write_side(DELETES, entity, batch_id, keys)

        seq = 1 + max((self._seq(p) for p in partition.glob(f"{run_id}-*.parquet")), default=0)
        info = BatchInfo(
            entity=entity.name,
            table=entity.table,
            run_id=run_id,
            seq=seq,
            extracted_at=extracted_at.isoformat(),
            snapshot_id=snapshot_id,
            snapshot_complete=snapshot_complete,
            watermark=watermark,
            batch_id=batch_id,
            rows=table.num_rows,
            rejects=len(rejects),
            deletes=len(deletes),
            key_range=list(key_range) if key_range is not None else None,
        )
        tmp = tmp_dir / f"{batch_id}.parquet"
        while True:
            meta = {META_KEY: json.dumps(asdict(info)).encode()}
            pq.write_table(
                table.replace_schema_metadata(meta),
                tmp,
                compression="zstd",
                use_dictionary=dictionary_columns(entity),
            )
            tmp.chmod(PRIVATE_FILE)  # pyarrow creates it with the umask's mode, in private _tmp/
            final = partition / f"{run_id}-{info.seq:06d}.parquet"
            try:
                os.link(tmp, final)
                break
            except FileExistsError:  # another writer took this sequence number
                info = BatchInfo(**{**asdict(info), "seq": info.seq + 1})
            finally:
                tmp.unlink(missing_ok=True)
        return final

    def _write_side(self, kind: str, entity: EntitySet, batch_id: str, table: pa.Table) -> None:
        """A batch's side file (rejects or deletes), in place before the data file is."""
        target = side_path(self.root, kind, entity.table, batch_id)
        self._private_dir(target.parent)
        tmp = self.root / "_tmp" / f"{batch_id}.{kind}.parquet"
        pq.write_table(table, tmp, compression="zstd")
        tmp.chmod(PRIVATE_FILE)
        os.replace(tmp, target)

    @staticmethod
    def _seq(path: Path) -> int:
        tail = path.stem.rsplit("-", 1)[-1]
        return int(tail) if tail.isdigit() else 0

    def files(self, entity: EntitySet) -> list[Path]:
        """Every complete data file of an entity set, oldest batch first."""
        paths = self.entity_dir(entity).glob("extracted_date=*/*.parquet")
        return sorted(paths, key=lambda p: self.info(p).order)

    @staticmethod
    def info(path: Path) -> BatchInfo:
        meta = pq.read_schema(path).metadata or {}
        if META_KEY not in meta:
            raise ValueError(f"{path} is not a clinical-sync lake file (no batch metadata)")
        return BatchInfo(**json.loads(meta[META_KEY]))

    def read(self, path: Path) -> tuple[pa.Table, BatchInfo]:
        table = pq.read_table(path, partitioning=None)
        return table.replace_schema_metadata(None), self.info(path)

    def source(self) -> dict[str, str] | None:
        """The service this lake was extracted from (`base_url`, `customer`), if recorded."""
        path = self.root / SOURCE_FILE
        return json.loads(path.read_text(encoding="utf-8")) if path.exists() else None

    def check_source(self, base_url: str, customer: str) -> None:
        """SourceMismatch when the lake holds another source's data (nothing written)."""
        known = self.source()
        if known is not None and known != {"base_url": base_url, "customer": customer}:
            raise SourceMismatch(
                f"lake {self.root} holds data of customer {known['customer']!r} at "
                f"{known['base_url']}, not {customer!r} at {base_url}; use another LAKE_ROOT, "
                "or sync --force to adopt the new source"
            )

    def record_source(self, base_url: str, customer: str, force: bool = False) -> None:
        """Remember the source once; refuse batches from another one unless `force`."""
        self._private_dir(self.root)  # every extraction passes here: an old lake is tightened
        wanted = {"base_url": base_url, "customer": customer}
        if self.source() == wanted:
            return
        if not force:
            self.check_source(base_url, customer)
        tmp = self.root / f".{SOURCE_FILE}.{uuid.uuid4().hex}"
        with os.fdopen(create_private(tmp), "w", encoding="utf-8") as out:
            out.write(json.dumps(wanted))
        os.replace(tmp, self.root / SOURCE_FILE)

    def record_run(self, row: Mapping[str, Any]) -> None:
        """How a run ended (its row of ops.sync_runs), kept beside its batches so that a
        rebuild keeps the record of the runs even when the warehouse file is lost. (The
        extractions tighten an old lake; this adds one private folder to it.)"""
        folder = private_dir(private_dir(self.root) / RUNS)
        if not RUN_ID_RE.match(str(row["run_id"])):
            raise ValueError("run_id may hold only letters, digits, '_', '.' and '-'")
        text = json.dumps(
            {k: v.isoformat() if isinstance(v, datetime) else v for k, v in row.items()}
        )
        tmp = folder / f".{row['run_id']}.{uuid.uuid4().hex}"
        with os.fdopen(create_private(tmp), "w", encoding="utf-8") as out:
            out.write(text)
        os.replace(tmp, folder / f"{row['run_id']}.json")

    def runs(self) -> list[dict[str, Any]]:
        """Every run's row `record_run` kept, oldest start first."""
        found = []
        for path in sorted((self.root / RUNS).glob("*.json")):
            row = json.loads(path.read_text(encoding="utf-8"))
            for name, value in row.items():
                if name.endswith("_at") and isinstance(value, str):
                    row[name] = datetime.fromisoformat(value)
            found.append(row)
        return sorted(found, key=lambda r: r.get("started_at") or datetime.min.replace(tzinfo=UTC))

    # -- a run's journal: what each extraction step asked, for the run's end -----------------

    def write_journal(self, run_id: str, step: str, payload: dict) -> None:
        """One step's journal of `run_id` (sync/settle.py's `journal`), replacing an earlier
        attempt's; it names sets and times, never a record or an id."""
        if not (RUN_ID_RE.match(run_id) and RUN_ID_RE.match(step)):
            raise ValueError("run and step names may hold only letters, digits, '_', '.', '-'")
        folder = self._private_dir(self.root / JOURNAL / f"run={run_id}")
        tmp = folder / f".{step}.{uuid.uuid4().hex}"
        with os.fdopen(create_private(tmp), "w", encoding="utf-8") as out:
            out.write(json.dumps(payload))
        os.replace(tmp, folder / f"{step}.json")

    def journals(self, run_id: str) -> list[dict]:
        """Every step's journal of `run_id` written so far."""
        folder = self.root / JOURNAL / f"run={run_id}"
        return [json.loads(path.read_text("utf-8")) for path in sorted(folder.glob("*.json"))]

    def drop_journals(self, keep: str | None = None) -> None:
        """Forget the journals of every run but `keep` (a killed run's are of no use: the
        next run reads every set again from what was committed)."""
        for folder in (self.root / JOURNAL).glob("run=*"):
            if folder.name != f"run={keep}":
                shutil.rmtree(folder, ignore_errors=True)

    @staticmethod
    def relative_name(path: Path) -> str:
        """`entity=<t>/extracted_date=<d>/<file>`: a file's identity, whatever the root."""
        return "/".join(Path(path).parts[-3:])

    @staticmethod
    def root_of(path: Path) -> Path:
        return Path(path).parents[2]
