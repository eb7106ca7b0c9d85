"""Where a simulated run's records land: the model (memory, thousands of seeds) or the real
lake and DuckDB warehouse (fewer seeds, to hold the model to the real thing). Both answer
what an extraction starts from and what the warehouse holds, records as the service sent
them."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Protocol

import msgspec

from connectors.clinical_records.catalogue import EntitySet
from connectors.clinical_records.keys import entity_key
from connectors.sandbox.responses import encode_json
from sync.extract import Batches, Extraction, LakeBatches
from sync.state import CommittedState
from tests.simulation.model import MemoryBatches, ModelWarehouse
from tests.truth import canonical, live_rows
from warehouse.lake import Lake
from warehouse.load import Warehouse

_DECODE = msgspec.json.Decoder()


def as_sent(record: dict) -> dict:
    """A record of the service's store as its answers carry it (the sandbox's JSON and back)."""
    return _DECODE.decode(encode_json(record))


class Backend(Protocol):
    batches: Batches

    def committed(self) -> contextlib.AbstractContextManager[Any]: ...

    def load(self, entity: EntitySet, extraction: Extraction) -> None: ...

    def held(self, entity: EntitySet) -> dict[Any, Any]:
        """The live records by key, comparable with `expected`."""
        ...

    def expected(self, entity: EntitySet, records: list[dict]) -> dict[Any, Any]:
        """The service's records as `held` would hold them."""
        ...

    def as_held(self, entity: EntitySet, records: list[dict]) -> list[dict]:
        """Records made for one comparison (no cache), as `held` would hold them."""
        ...


class ModelBackend:
    def __init__(self, root: Path) -> None:
        self.batches = MemoryBatches()
        self.warehouse = ModelWarehouse()
        # The store replaces a record on every change, never edits one: a record's JSON is
        # made once (the record is kept, so its id is not reused).
        self._sent: dict[int, tuple[dict, dict]] = {}

    @contextlib.contextmanager
    def committed(self) -> Iterator[ModelWarehouse]:
        yield self.warehouse

    def load(self, entity: EntitySet, extraction: Extraction) -> None:
        writers = [self.batches.writers[f] for f in extraction.files]
        self.warehouse.load(
            entity, writers, snapshot=extraction.snapshot, watermark=extraction.watermark
        )

    def held(self, entity: EntitySet) -> dict[Any, Any]:
        return self.warehouse.live(entity)

    def expected(self, entity: EntitySet, records: list[dict]) -> dict[Any, Any]:
        out = {}
        for record in records:
            known = self._sent.get(id(record))
            if known is None:
                known = self._sent[id(record)] = (record, as_sent(record))
            out[known[1].get(entity.key)] = known[1]
        return {entity_key(entity, k): v for k, v in out.items()}

    def as_held(self, entity: EntitySet, records: list[dict]) -> list[dict]:
        return [as_sent(r) for r in records]


class DuckDBBackend:
    def __init__(self, root: Path) -> None:
        self.lake = Lake(root / "lake")
        self.path = root / "warehouse.duckdb"
        self.batches = LakeBatches(self.lake)

    def committed(self) -> contextlib.AbstractContextManager[Any]:
        return CommittedState(self.path)

    def load(self, entity: EntitySet, extraction: Extraction) -> None:
        with Warehouse(self.path) as wh:
            wh.ensure_schema()
            wh.load(
                entity,
                extraction.files,
                run_id=extraction.run_id,
                snapshot=extraction.snapshot,
                watermark=extraction.watermark,
            )

    def held(self, entity: EntitySet) -> dict[Any, Any]:
        return live_rows(self.path, entity)

    def expected(self, entity: EntitySet, records: list[dict]) -> dict[Any, Any]:
        return canonical(entity, records)

    def as_held(self, entity: EntitySet, records: list[dict]) -> list[dict]:
        return list(canonical(entity, [as_sent(r) for r in records]).values()) if records else []


BACKENDS = {"model": ModelBackend, "duckdb": DuckDBBackend}
