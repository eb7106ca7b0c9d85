"""No module of ours imports, at its top or inside a function, a module that imports it back:
a circle makes the order of imports matter and hides which module serves which (the layers
of docs/ARCHITECTURE.md, and one module per job inside each)."""

from __future__ import annotations

import ast
from graphlib import CycleError, TopologicalSorter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("connectors", "warehouse", "sync", "pipelines", "cli")


def modules() -> dict[str, Path]:
    found = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            parts = path.relative_to(ROOT).with_suffix("").parts
            found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def imports(path: Path, known: dict[str, Path]) -> set[str]:
    """The modules of ours `path` imports anywhere in it (`from a import b` may name a module)."""
    named: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            named |= {node.module, *(f"{node.module}.{a.name}" for a in node.names)}
        elif isinstance(node, ast.Import):
            named |= {a.name for a in node.names}
    return named & set(known)


def test_no_module_imports_one_that_imports_it_back() -> None:
    known = modules()
    graph = {name: imports(path, known) - {name} for name, path in known.items()}
    try:
        tuple(TopologicalSorter(graph).static_order())
    except CycleError as error:
        raise AssertionError(f"an import circle: {' -> '.join(error.args[1])}") from None
