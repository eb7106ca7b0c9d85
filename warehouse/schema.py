"""Canonical types as Arrow and DuckDB see them, derived from the catalogue.

The catalogue decides each field's canonical type (`Field.canonical`); this module only
maps that decision onto Arrow and DuckDB through lookup tables.
"""

from __future__ import annotations

import pyarrow as pa

from connectors.clinical_records.catalogue import (
    DECIMAL_PRECISION,
    DECIMAL_SCALE,
    Canonical,
    Edm,
    EntitySet,
)

# Canonical (DuckDB type name) -> Arrow type. DuckDB maps these back to the same names.
ARROW_BY_CANONICAL: dict[Canonical, pa.DataType] = {
    Canonical.VARCHAR: pa.string(),
    Canonical.BIGINT: pa.int64(),
    Canonical.DECIMAL: pa.decimal128(DECIMAL_PRECISION, DECIMAL_SCALE),
    Canonical.BOOLEAN: pa.bool_(),
    Canonical.DATE: pa.date32(),
    Canonical.TIMESTAMPTZ: pa.timestamp("us", tz="UTC"),
    Canonical.TIME: pa.time64("us"),
}

# Edm type -> the Arrow type the JSON value arrives as (spec section 2, type notes).
JSON_ARROW_BY_EDM: dict[Edm, pa.DataType] = {
    Edm.STRING: pa.string(),
    Edm.INT32: pa.int64(),
    Edm.DECIMAL: pa.string(),
    Edm.BOOLEAN: pa.bool_(),
    Edm.DATE: pa.string(),
    Edm.DATETIME: pa.string(),
}

# What the columns do not hold as sent, as one JSON object per row (null when nothing):
# members the catalogue does not know, and values that did not fit their column, each
# under its own name (warehouse/normalise.py).
EXTRAS = "_extras"
EXTRAS_TYPE = pa.string()

# Columns the warehouse adds to every clinical table, with their DuckDB types and meanings.
CLINICAL_META: dict[str, tuple[str, str]] = {
    EXTRAS: (
        "JSON",
        "What the columns do not hold as sent (JSON object): members the catalogue does not "
        "know, and values that did not fit their column (null there), under their own names",
    ),
    "_content_hash": (
        "VARCHAR",
        "64-bit hash of the record's content (16 hex digits); a new version only when it changes",
    ),
    "_extracted_at": ("TIMESTAMPTZ", "When the batch holding this version was extracted"),
    "_synced_at": ("TIMESTAMPTZ", "When this version was loaded into the warehouse"),
    "_run_id": ("VARCHAR", "Run that extracted this version"),
    "_deleted_at": (
        "TIMESTAMPTZ",
        "Set when a full snapshot no longer contains the record; null while it exists",
    ),
}

HISTORY_META: dict[str, tuple[str, str]] = {
    EXTRAS: CLINICAL_META[EXTRAS],
    "_content_hash": CLINICAL_META["_content_hash"],
    "_valid_from": ("TIMESTAMPTZ", "Extraction time at which this version was first seen"),
    "_valid_to": (
        "TIMESTAMPTZ",
        "Extraction time at which a newer version or a deletion replaced it; null if current",
    ),
    "_run_id": CLINICAL_META["_run_id"],
}


def arrow_schema(entity: EntitySet) -> pa.Schema:
    """The normalised batch schema: catalogue fields in canonical types, then `_extras`."""
    fields = [pa.field(f.name, ARROW_BY_CANONICAL[f.canonical]) for f in entity.fields]
    return pa.schema([*fields, pa.field(EXTRAS, EXTRAS_TYPE)])


def json_struct_type(entity: EntitySet) -> pa.StructType:
    """The record as JSON sends it when every value has its spec type (the fast path)."""
    return pa.struct([pa.field(f.name, JSON_ARROW_BY_EDM[f.type]) for f in entity.fields])


# Text the spec bounds this short (statuses, codes, names, places) repeats across records, so
# the lake dictionary-encodes it; ids, free text and times are mostly distinct, and building a
# dictionary for them cost more than it saved (1M of load_throughput's appointments in
# 5,000-row files: extracted in 6.4 s instead of 6.8, 13 MiB instead of 23, loaded as fast).
DICTIONARY_MAX_LENGTH = 50


def dictionary_columns(entity: EntitySet) -> list[str]:
    """The columns the lake writes with a Parquet dictionary."""
    return [
        f.name
        for f in entity.fields
        if f.canonical is Canonical.VARCHAR
        and f.max_length is not None
        and f.max_length <= DICTIONARY_MAX_LENGTH
    ]
