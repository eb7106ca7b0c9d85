"""`clinical-sync sql`: the published warehouse, read-only, for a quick look or a script.

It opens `WAREHOUSE_PATH` as an analyst's tool would (read-only: it never blocks a sync, and
a sync never blocks it) and prints each result as an aligned table. `-c` runs the given SQL;
without it, statements come from stdin: a small shell on a terminal, a script otherwise.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from decimal import Decimal
from pathlib import Path
from typing import TextIO

import duckdb

from cli.cells import cell
from pipelines import home
from warehouse.connection import open_read_only

PROMPT, MORE = "sql> ", "...> "
QUIT = {".quit", ".exit", "\\q", "quit", "exit"}
NUMBERS = (int, float, Decimal)


class QueryError(Exception):
    """A statement DuckDB refused; its first line is what the user reads."""


def connect(path: Path) -> duckdb.DuckDBPyConnection:
    con = open_read_only(path)
    con.execute("SET TimeZone = 'UTC'")
    return con


def render(columns: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """An aligned table: text left, numbers right (decimals without their scale's trailing
    zeros), NULL spelled out; then the row count."""
    cells = [[cell(v) for v in row] for row in rows]
    numeric = [
        any(isinstance(row[i], NUMBERS) for row in rows)
        and all(row[i] is None or isinstance(row[i], NUMBERS) for row in rows)
        for i in range(len(columns))
    ]
    widths = [max([len(c), *(len(r[i]) for r in cells)]) for i, c in enumerate(columns)]

    def line(values: Sequence[str]) -> str:
        return "  ".join(
            v.rjust(w) if num else v.ljust(w)
            for v, w, num in zip(values, widths, numeric, strict=True)
        ).rstrip()

    out = [line(columns), "  ".join("-" * w for w in widths), *(line(r) for r in cells)]
    out.append(f"({len(rows):,} row{'s' if len(rows) != 1 else ''})")
    return "\n".join(out)


def run(con: duckdb.DuckDBPyConnection, text: str, out: TextIO) -> None:
    """Run every statement in `text`; print each result that has columns."""
    try:
        statements = con.extract_statements(text)
        for statement in statements:
            cursor = con.execute(statement.query)
            if cursor.description:
                columns = [d[0] for d in cursor.description]
                print(render(columns, cursor.fetchall()), file=out)
    except duckdb.Error as error:
        raise QueryError(str(error).strip().splitlines()[0]) from None


def shell(con: duckdb.DuckDBPyConnection, stdin: TextIO, out: TextIO) -> int:
    """Statements end with `;`; `.quit` or end of input leaves. Errors print and go on."""
    print("read-only SQL on the published warehouse; end statements with ;  .quit leaves", file=out)
    buffer: list[str] = []
    while True:
        print(MORE if buffer else PROMPT, end="", file=out, flush=True)
        line = stdin.readline()
        if not line or (not buffer and line.strip() in QUIT):
            print(file=out)
            return 0
        buffer.append(line)
        if line.rstrip().endswith(";"):
            try:
                run(con, "".join(buffer), out)
            except QueryError as error:
                print(f"error: {error}", file=out)
            buffer = []


def sql(args: argparse.Namespace) -> int:
    path = Path(home.warehouse_path())
    if not path.exists():
        print(
            f"clinical-sync: no warehouse at {path} (WAREHOUSE_PATH); `clinical-sync sync` "
            "creates and publishes it (or `clinical-sync demo` for a sandbox one)",
            file=sys.stderr,
        )
        return 1
    with connect(path) as con:
        try:
            if args.command_text is not None:
                run(con, args.command_text, sys.stdout)
            elif sys.stdin.isatty():
                return shell(con, sys.stdin, sys.stdout)
            else:
                run(con, sys.stdin.read(), sys.stdout)
        except QueryError as error:
            print(f"clinical-sync sql: {error}", file=sys.stderr)
            return 1
    return 0
