"""Each table's columns in the Dagster UI: name, DuckDB type and the spec's meaning.

From the catalogue, through the same column list the DDL writes its `COMMENT ON` from, so the
UI and `duckdb_columns()` always say the same.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from dagster import AssetsDefinition, AssetSpec, TableColumn, TableSchema, map_asset_specs

from connectors.clinical_records.catalogue import EntitySet
from pipelines.keys import table_key
from warehouse.ddl import clinical_columns

COLUMN_SCHEMA = "dagster/column_schema"  # the metadata key the UI shows as the column list


def table_schema(entity: EntitySet) -> TableSchema:
    return TableSchema(
        columns=[
            TableColumn(name, type_, description=meaning)
            for name, (type_, meaning) in clinical_columns(entity).items()
        ]
    )


def with_column_schemas(
    assets: Sequence[AssetsDefinition], entities: Iterable[EntitySet]
) -> list[AssetsDefinition]:
    """The assets, each table's with its column schema (`dagster/column_schema`)."""
    schemas = {table_key(e): table_schema(e) for e in entities}

    def describe(spec: AssetSpec) -> AssetSpec:
        schema = schemas.get(spec.key)
        if schema is None:
            return spec
        return spec.merge_attributes(metadata={COLUMN_SCHEMA: schema})

    return list(map_asset_specs(describe, assets))
