"""The analytics models as the UI shows them: each view and the clinical tables it joins.

Read from the SQL files themselves, so a new model or a new join shows up in the asset graph
without a line of Python.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from importlib import resources

from connectors.clinical_records.catalogue import BY_TABLE, EntitySet

VIEW_RE = re.compile(r'create\s+or\s+replace\s+view\s+"?analytics"?\."?(\w+)"?', re.IGNORECASE)
TABLE_RE = re.compile(r'"?clinical"?\."?(\w+)"?', re.IGNORECASE)
COMMENT_RE = re.compile(r"^\s*--\s?(.*)$")


@dataclass(frozen=True)
class Model:
    name: str
    description: str
    sources: tuple[EntitySet, ...]


def parse(sql: str) -> Model:
    view = VIEW_RE.search(sql)
    if view is None:
        raise ValueError("an analytics model must CREATE OR REPLACE VIEW analytics.<name>")
    tables = dict.fromkeys(m.group(1) for m in TABLE_RE.finditer(sql))
    comments = [m.group(1) for line in sql.splitlines() if (m := COMMENT_RE.match(line))]
    description = _first_sentence(comments) or f"analytics.{view.group(1)}"
    return Model(view.group(1), description, tuple(BY_TABLE[t] for t in tables if t in BY_TABLE))


def _first_sentence(comments: list[str]) -> str:
    """The comment's first sentence, however many lines it wraps over (the UI shows it)."""
    taken: list[str] = []
    for line in comments:
        taken.append(line.strip())
        if line.rstrip().endswith("."):
            break
    return " ".join(taken)


def models() -> list[Model]:
    """Every model in `warehouse/sql`, in the order the warehouse creates them."""
    folder = resources.files("warehouse") / "sql"
    scripts = sorted((p for p in folder.iterdir() if p.name.endswith(".sql")), key=str)
    return [parse(p.read_text(encoding="utf-8")) for p in scripts]
