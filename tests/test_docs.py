"""The manual builds as a site exactly as `make docs` and CI build it, and that build fails on
what a reader would trip over: a link to a missing page or heading, a page left out of the nav."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def build(root: Path) -> subprocess.CompletedProcess[str]:
    """`mkdocs build --strict` of the manual at `root`, as the Makefile runs it."""
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    return subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(root / "site")],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.fixture
def manual(tmp_path: Path) -> Path:
    """A copy of mkdocs.yml and docs/ to break, with BENCHMARKS.md (docs/benchmarks.md includes it)."""
    shutil.copy(ROOT / "mkdocs.yml", tmp_path / "mkdocs.yml")
    shutil.copy(ROOT / "BENCHMARKS.md", tmp_path / "BENCHMARKS.md")
    shutil.copytree(ROOT / "docs", tmp_path / "docs")
    return tmp_path


def test_the_manual_builds_without_a_warning(manual: Path) -> None:
    built = build(manual)
    assert built.returncode == 0, built.stderr[-3000:]
    assert "WARNING" not in built.stderr, built.stderr[-3000:]
    assert (manual / "site" / "index.html").exists()
    assert (manual / "site" / "ARCHITECTURE.html").exists()
    assert (manual / "site" / "operators" / "configuration.html").exists()
    # The repository's BENCHMARKS.md, included whole where make bench writes it.
    first = (ROOT / "BENCHMARKS.md").read_text(encoding="utf-8").splitlines()[0].lstrip("# ")
    assert first in (manual / "site" / "benchmarks.html").read_text(encoding="utf-8")


@pytest.mark.parametrize(
    ("change", "named"),
    [
        ("[the sandbox](SANDBOX.md)", "SANDBOX.md"),  # a page that does not exist
        ("[layers](ARCHITECTURE.md#no-such-heading)", "no-such-heading"),  # nor its heading
    ],
)
def test_a_broken_link_fails_the_build(manual: Path, change: str, named: str) -> None:
    index = manual / "docs" / "index.md"
    index.write_text(index.read_text(encoding="utf-8") + f"\nSee {change}.\n", encoding="utf-8")
    built = build(manual)
    assert built.returncode != 0 and named in built.stderr, built.stderr[-3000:]


def test_a_page_left_out_of_the_nav_fails_the_build(manual: Path) -> None:
    (manual / "docs" / "ORPHAN.md").write_text("# Nobody links here\n", encoding="utf-8")
    built = build(manual)
    assert built.returncode != 0 and "ORPHAN.md" in built.stderr, built.stderr[-3000:]


def test_a_missing_benchmarks_file_fails_the_build(manual: Path) -> None:
    (manual / "BENCHMARKS.md").unlink()
    built = build(manual)
    assert built.returncode != 0 and "BENCHMARKS.md" in built.stderr, built.stderr[-3000:]
