"""Every relative link in the project's Markdown resolves: the file, and the heading it names.

The docs cross-reference each other by heading (``sizing.md#headroom-...``),
and a section moved or renamed breaks those links silently on GitHub. The
anchors are GitHub's: the heading lowercased, punctuation but ``-`` and
``_`` dropped, spaces made hyphens, and ``-1``, ``-2`` ... after repeats.
"""

from __future__ import annotations

import re
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[1]
PAGES = sorted(
    [ROOT / "README.md", *ROOT.glob("docs/**/*.md"), *ROOT.glob("bench/**/*.md"),
     *ROOT.glob("examples/**/*.md"), *ROOT.glob("compose/**/*.md")]
)
FENCE = re.compile(r"^```.*?^```", re.S | re.M)
HEADING = re.compile(r"^#{1,6}\s+(.+?)\s*#*\s*$", re.M)
LINK = re.compile(r"\]\(([^)\s]+)\)")
INLINE_LINK = re.compile(r"\[([^\]]*)\]\([^)]*\)")


def slug(heading: str) -> str:
    """GitHub's anchor for a heading's text."""
    text = INLINE_LINK.sub(r"\1", heading).strip().lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


@cache
def anchors(page: Path) -> frozenset[str]:
    seen: dict[str, int] = {}
    out = set()
    for match in HEADING.finditer(FENCE.sub("", page.read_text())):
        base = slug(match.group(1))
        repeat = seen.get(base, 0)
        seen[base] = repeat + 1
        out.add(base if repeat == 0 else f"{base}-{repeat}")
    return frozenset(out)


def test_slugs_follow_github():
    assert slug("Decode's slot count on the window's P90 (tried 2026-12-04, not kept)") == (
        "decodes-slot-count-on-the-windows-p90-tried-2026-12-04-not-kept")
    assert slug("Quantile forecasts (models/quantiles.py)") == "quantile-forecasts-modelsquantilespy"
    assert slug("The `ensemble` and [its members](x.md)") == "the-ensemble-and-its-members"


def test_the_pages_are_found():
    assert ROOT / "README.md" in PAGES and len(PAGES) > 10


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(page: Path):
    broken = []
    for match in LINK.finditer(FENCE.sub("", page.read_text())):
        target = match.group(1)
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists():
            broken.append(f"{target}: no such file")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            broken.append(f"{target}: no heading with that anchor in {dest.name}")
    assert not broken, f"{page.relative_to(ROOT)}: " + "; ".join(broken)


LABELLED_LINK = re.compile(r"\[([\w./-]+\.md)\]\(([^)\s#]*)(?:#[^)\s]*)?\)")


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_a_link_named_after_a_page_goes_to_that_page(page: Path):
    """A link whose text is a file name is read as "that page": it must lead there.

    When forecasting.md's experiments moved to forecasting-history.md, fourteen
    links kept the text ``forecasting.md`` and took the reader to the other page,
    where a search for the section by the name given found nothing.
    """
    wrong = []
    for match in LABELLED_LINK.finditer(FENCE.sub("", page.read_text())):
        label, path = match.groups()
        dest = Path(path).name if path else page.name
        if Path(label).name != dest:
            wrong.append(f"[{label}]({match.group(0).split('](', 1)[1]}")
    assert not wrong, f"{page.relative_to(ROOT)}: " + "; ".join(wrong)
