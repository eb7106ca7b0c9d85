"""The README stays a front door: short, holding the two commands a fresh clone needs, and
every link in it leading somewhere (the manual's pages are checked by `make docs`; the README
is outside the site, so this is its check)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
MOST_LINES = 250

LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```.*?^```", re.MULTILINE | re.DOTALL)
HEADING = re.compile(r"^#{1,6}\s+(.+?)\s*#*$", re.MULTILINE)


def prose(text: str) -> str:
    """The text outside fenced code blocks, where a link is a link."""
    return FENCE.sub("", text)


def anchors(page: Path) -> set[str]:
    """The anchors a forge gives the page's headings: lowercase, punctuation dropped but `-`
    and `_`, each space a hyphen, a repeated heading numbered (`-1`, `-2`)."""
    seen: dict[str, int] = {}
    found = set()
    for heading in HEADING.findall(prose(page.read_text(encoding="utf-8"))):
        slug = re.sub(r"[^\w\- ]", "", heading.replace("`", "").strip().lower()).replace(" ", "-")
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        found.add(slug if count == 0 else f"{slug}-{count}")
    return found


def relative_links(text: str) -> list[str]:
    """Every link of the prose that names a file of the repository (not a URL)."""
    return [t for t in LINK.findall(prose(text)) if not re.match(r"[a-z][a-z0-9+.-]*:", t)]


def broken_links(page: Path) -> list[str]:
    """The relative links of `page` that name no file, or no heading of it."""
    broken = []
    for link in relative_links(page.read_text(encoding="utf-8")):
        path, _, anchor = link.partition("#")
        target = page.parent / path if path else page
        if not target.is_file():
            broken.append(f"{link}: no file {path}")
        elif anchor and anchor not in anchors(target):
            broken.append(f"{link}: no heading #{anchor} in {path or page.name}")
    return broken


def test_the_readme_is_short_and_holds_the_two_commands() -> None:
    text = README.read_text(encoding="utf-8")
    assert len(text.splitlines()) <= MOST_LINES, f"README.md: keep it at most {MOST_LINES} lines"
    makefile = (ROOT / "Makefile").read_text(encoding="utf-8")
    for target in ("demo", "test"):
        assert f"make {target}" in text
        assert re.search(rf"^{target}:", makefile, re.MULTILINE), f"no `{target}` in the Makefile"


def test_every_link_of_the_readme_leads_somewhere() -> None:
    assert relative_links(README.read_text(encoding="utf-8")), "it links to the manual's pages"
    assert not broken_links(README), "\n".join(broken_links(README))


def test_a_link_to_a_missing_page_or_heading_is_broken(tmp_path: Path) -> None:
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "page.md").write_text("# Page\n\n## Its part\n", encoding="utf-8")
    readme = tmp_path / "README.md"
    readme.write_text(
        "# Front\n\n[a](docs/page.md), [b](docs/page.md#its-part), [c](#front),\n"
        "[d](docs/gone.md), [e](docs/page.md#gone), [f](#gone), [g](https://example.com/x.md)\n"
        "```\n[h](docs/not-a-link-in-code.md)\n```\n",
        encoding="utf-8",
    )
    assert broken_links(readme) == [
        "docs/gone.md: no file docs/gone.md",
        "docs/page.md#gone: no heading #gone in docs/page.md",
        "#gone: no heading #gone in README.md",
    ]


def test_anchors_are_the_forges(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text(
        "# Configuration\n## Pointing it at the real service\n"
        "## Every value the spec allows: `--values wide`\n## Notes\n## Notes\n"
        "```\n# not a heading\n```\n",
        encoding="utf-8",
    )
    assert anchors(page) == {
        "configuration",
        "pointing-it-at-the-real-service",
        "every-value-the-spec-allows---values-wide",
        "notes",
        "notes-1",
    }
