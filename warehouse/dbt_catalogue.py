"""The dbt project's files that the catalogue decides (`transform/`): the `clinical` sources,
every table and column with the spec's meanings, its keys' and references' tests; and
`analytics.broken_references`, one SELECT per reference the checks count.

Written by `python -m warehouse.dbt_catalogue` and checked in, so an analyst reads plain YAML
and SQL; `tests/test_transform.py` holds the files equal to what this module writes, so they
never drift from the catalogue.
"""

from __future__ import annotations

import sys
from pathlib import Path

import yaml

from connectors.clinical_records.catalogue import ALL_ENTITIES, BY_NAME, EntitySet
from warehouse.ddl import CLINICAL, SCHEMAS
from warehouse.ident import quote
from warehouse.schema import CLINICAL_META

PROJECT_DIR = Path(__file__).resolve().parents[1] / "transform"
SOURCES_FILE = Path("models") / "clinical" / "sources.yml"
BROKEN_REFERENCES_FILE = Path("models") / "analytics" / "broken_references.sql"
GENERATED = "Generated from connectors/clinical_records/catalogue.py by `python -m warehouse.dbt_catalogue`; do not edit."
LIVE = '"_deleted_at" IS NULL'


def references() -> list[tuple[EntitySet, str, EntitySet, str]]:
    """Every to-one navigation between two synced sets, (source, local, target, remote), in
    the catalogue's order: what `references_found` counts and `broken_references` lists."""
    return [
        (ent, nav.local, BY_NAME[nav.target], nav.remote)
        for ent in ALL_ENTITIES
        for nav in ent.navigations
        if not nav.many and not nav.contained and nav.target in BY_NAME
    ]


def _column(name: str, meaning: str, tests: list[object]) -> dict[str, object]:
    column: dict[str, object] = {"name": name, "description": meaning}
    if tests:
        column["data_tests"] = tests
    return column


def _reference_test(target: EntitySet, remote: str) -> dict[str, object]:
    """A reference of a live row found among the target's rows: WARN, as the source has
    dangling references (the check `references_found` counts them each run)."""
    return {
        "relationships": {
            "arguments": {"to": f"source('{CLINICAL}', '{target.table}')", "field": remote},
            "config": {"severity": "warn", "where": LIVE},
        }
    }


def sources() -> dict[str, object]:
    """`sources.yml`: the clinical tables as dbt sources."""
    refs: dict[tuple[str, str], tuple[EntitySet, str]] = {
        (s.name, local): (t, remote) for s, local, t, remote in references()
    }
    tables = []
    for ent in ALL_ENTITIES:
        columns = []
        for field in ent.fields:
            tests: list[object] = ["primary_key"] if field.name == ent.key else []
            if (ent.name, field.name) in refs:
                tests.append(_reference_test(*refs[ent.name, field.name]))
            columns.append(_column(field.name, field.meaning, tests))
        columns += [_column(name, meaning, []) for name, (_, meaning) in CLINICAL_META.items()]
        tables.append(
            {
                "name": ent.table,
                "description": f"Current {ent.name} ({ent.qualified_type}): one row per "
                f"{ent.key}, soft deletes marked in _deleted_at",
                "meta": {"entity": ent.name},
                "columns": columns,
            }
        )
    return {
        "version": 2,
        "sources": [
            {
                "name": CLINICAL,
                "schema": CLINICAL,
                "description": SCHEMAS[CLINICAL],
                "tables": tables,
            }
        ],
    }


def sources_yaml() -> str:
    body = yaml.safe_dump(sources(), sort_keys=False, width=100, allow_unicode=True)
    return f"# {GENERATED}\n{body}"


def broken_references_sql() -> str:
    """One SELECT per reference: the live rows whose target is missing or deleted. The model
    is incremental (schema.yml): a night's SELECT reads the rows of the children that changed
    and of those whose parent changed, after its pre-hook deleted their rows: filtered
    before the parent is looked up (a filter with subqueries after the anti-join ran it over
    every row of the child's table: 136 ms against 103 at night 366 of a year at scale 10)."""
    parts = []
    for source, local, target, remote in references():
        if remote != target.key:  # a parent's changes are known by its key alone
            raise ValueError(f"{source.name}.{local} refers to {target.name}.{remote}, not its key")
        changed = " OR ".join(
            f"s.{quote(column)} IN {{{{ changed_ids('{ent.name}', "
            f"'{source.field(column).canonical.value}', since) }}}}"
            for column, ent in ((source.key, source), (local, target))
        )
        parts.append(
            f"""SELECT '{source.name}' AS entity, CAST(s.{quote(source.key)} AS VARCHAR) AS record_id,
    '{local}' AS reference, '{target.name}' AS parent_entity,
    CAST(s.{quote(local)} AS VARCHAR) AS parent_id
FROM (
    SELECT * FROM {{{{ source('{CLINICAL}', '{source.table}') }}}} AS s
    WHERE s.{LIVE} AND s.{quote(local)} IS NOT NULL
    {{% if is_incremental() %}} AND ({changed}) {{% endif %}}
) AS s
WHERE NOT EXISTS (
    SELECT 1 FROM {{{{ source('{CLINICAL}', '{target.table}') }}}} AS t
    WHERE t.{quote(remote)} = s.{quote(local)} AND t.{LIVE}
)"""
        )
    head = (
        f"-- {GENERATED}\n"
        "-- Live records whose parent is missing (never sent, or soft-deleted): the source has\n"
        "-- them. One row per broken reference, of every reference the checks count; ids as\n"
        "-- text, so that every kind fits one column. Incremental (macros/changed_records.sql):\n"
        "-- a night builds again the rows of the records that changed and of their children.\n"
        # The model's last build, read once: each changed_ids() without it would query it.
        "{% if is_incremental() %}{% set since = last_built() %}{% endif %}\n"
    )
    return head + "\nUNION ALL\n".join(parts) + "\n"


def generated() -> dict[Path, str]:
    """Each generated file, relative to the project, and its text."""
    return {SOURCES_FILE: sources_yaml(), BROKEN_REFERENCES_FILE: broken_references_sql()}


def write(project: Path = PROJECT_DIR) -> list[Path]:
    """Write the generated files into `project`; the paths written."""
    written = []
    for relative, text in generated().items():
        path = project / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
        written.append(path)
    return written


if __name__ == "__main__":
    for path in write(Path(sys.argv[1]) if len(sys.argv) > 1 else PROJECT_DIR):
        print(path)
