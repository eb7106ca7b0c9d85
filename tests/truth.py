"""The comparison every end-to-end test ends with: the source's records through the
warehouse's own normaliser against the live rows of a `clinical` table, by key; and the
records as the service sent them, for comparisons byte for byte."""

from __future__ import annotations

from pathlib import Path

import duckdb

from connectors.clinical_records.catalogue import DOCUMENTS, ENTITY_SETS, EntitySet
from connectors.sandbox.server import SandboxServer
from warehouse.ident import column_list, qualified
from warehouse.normalise import normalise


def sent(server: SandboxServer) -> dict[str, dict[object, dict]]:
    """Every current record by set and key, decoded from the JSON the sandbox sends (its
    `/_sandbox/truth`, encoded as every answer is): strings exactly as sent, decimals as
    their text, numbers as ints. tests/sandbox_wide/ checks that the pages of
    the API send these very values."""
    truth = server.control().truth()
    return {
        entity.name: {r[entity.key]: r for r in truth[entity.name]}
        for entity in (*ENTITY_SETS, DOCUMENTS)
    }


def canonical(entity: EntitySet, records: list[dict]) -> dict[object, dict]:
    """Source records through the warehouse's own normaliser: canonical values by key."""
    names = [f.name for f in entity.fields]
    rows = normalise(entity, records).table.select(names).to_pylist()
    return {r[entity.key]: r for r in rows}


def live_rows(warehouse: str | Path, entity: EntitySet) -> dict[object, dict]:
    """The rows of `clinical.<table>` not marked deleted, by key."""
    with duckdb.connect(str(warehouse), read_only=True) as con:
        con.execute("SET TimeZone = 'UTC'")
        table = con.sql(
            f"SELECT {column_list(f.name for f in entity.fields)} "
            f'FROM {qualified("clinical", entity.table)} WHERE "_deleted_at" IS NULL'
        ).to_arrow_table()
    return {r[entity.key]: r for r in table.to_pylist()}
