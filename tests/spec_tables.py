"""Reads the field tables of the spec (section 2), so tests can hold the catalogue to it."""

from __future__ import annotations

import os
import re
from pathlib import Path

from connectors.clinical_records.catalogue import SPEC_TYPE_WORDS, Edm

REPO = Path(__file__).resolve().parents[1]
SPEC_NAME = "clinical-records-api.md"


def spec_path() -> Path:
    """The spec: CLINICAL_SPEC_PATH, else shared/ next to the clone, else the copy in docs/spec."""
    override = os.environ.get("CLINICAL_SPEC_PATH")
    candidates = (
        [Path(override)]
        if override
        else [REPO.parent / "shared" / "spec" / SPEC_NAME, REPO / "docs" / "spec" / SPEC_NAME]
    )
    for path in candidates:
        if path.is_file():
            return path
    raise FileNotFoundError(f"spec not found at {candidates[0]}; set CLINICAL_SPEC_PATH")


def spec_fields() -> dict[str, dict[str, tuple[Edm, int | None]]]:
    """Type name in the heading ("Patients", "Document") -> field -> (type, max length)."""
    text = spec_path().read_text(encoding="utf-8")
    result: dict[str, dict[str, tuple[Edm, int | None]]] = {}
    for section in re.split(r"^### 2\.\d+ ", text, flags=re.M)[1:]:
        title = section.splitlines()[0].split(" (")[0].strip()
        rows = [line for line in section.splitlines() if line.startswith("|")]
        header = [c.strip() for c in rows[0].strip("|").split("|")]
        fields: dict[str, tuple[Edm, int | None]] = {}
        for row in rows[2:]:
            cells = dict(zip(header, (c.strip() for c in row.strip("|").split("|")), strict=False))
            if "Field" not in cells or cells.get("Type") not in SPEC_TYPE_WORDS:
                break  # the navigation-property table that may follow
            max_text = cells.get("Max", "-")
            max_length = None if max_text == "-" else int(max_text)
            for name in cells["Field"].split(","):
                fields[name.strip()] = (SPEC_TYPE_WORDS[cells["Type"]], max_length)
        result[title] = fields
    return result
