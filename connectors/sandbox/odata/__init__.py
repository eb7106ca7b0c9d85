"""The sandbox's OData query engine (spec 4.2): parse system query options, run them on rows.

`parse_query` validates a request's options against the catalogue into a `Query`;
`run_collection` applies it to a sorted table and `shape` applies `$select`/`$expand` to one
record. Every refusal is an `ODataError` (400) in the spec's error body.
"""

from connectors.sandbox.odata.execute import Page, Related, TableView, run_collection, shape
from connectors.sandbox.odata.filter import Expr, parse_filter
from connectors.sandbox.odata.options import (
    Expand,
    Query,
    capped,
    expands_target,
    parse_query,
    refuse_or,
)

__all__ = [
    "Expand",
    "Expr",
    "Page",
    "Query",
    "Related",
    "TableView",
    "capped",
    "expands_target",
    "parse_filter",
    "parse_query",
    "refuse_or",
    "run_collection",
    "shape",
]
