"""What the docs say a ``make`` target does is what the Makefile does.

A newcomer meets the project through ``make run`` and ``make test`` and
reads the other targets off the pages; a page that names a target the
Makefile lacks, or says a target installs what it does not, sends them off
on a wrong step. These read the Makefile's rules, prerequisites included.
"""

from __future__ import annotations

import re
from functools import cache
from pathlib import Path

ROOT = Path(__file__).parents[1]
PAGES = sorted([ROOT / "README.md", *ROOT.glob("docs/**/*.md"), *ROOT.glob("examples/**/*.md")])
MAKE = re.compile(r"`make ([a-z][a-z-]*)`")
RULE = re.compile(r"^([^\s:#=][^:=]*):(?!=)([^\n]*)$")


@cache
def rules() -> dict[str, tuple[list[str], str]]:
    """target -> (prerequisites, recipe), with ``$(VAR)`` targets expanded from the Makefile's own values."""
    text = (ROOT / "Makefile").read_text()
    values = dict(re.findall(r"^([A-Z_]+) :?= (.*)$", text, re.M))

    def expand(s: str) -> str:
        for _ in range(4):
            s = re.sub(r"\$\((\w+)\)", lambda m: values.get(m.group(1), m.group(0)), s)
        return s

    out: dict[str, tuple[list[str], str]] = {}
    target = None
    for line in text.splitlines():
        if line.startswith("\t") and target is not None:
            for name in target:
                out[name][1].append(line)
            continue
        match = RULE.match(line)
        if match is None or line.startswith("."):
            target = None
            continue
        target = expand(match.group(1)).split()
        prereqs = expand(match.group(2).split("#")[0]).split()
        for name in target:
            out[name] = (prereqs, [])
    return {name: (prereqs, expand("\n".join(recipe))) for name, (prereqs, recipe) in out.items()}


def runs(target: str) -> str:
    """Every recipe line ``make target`` can run: its own and its prerequisites'."""
    prereqs, recipe = rules().get(target, ([], ""))
    return "\n".join([recipe, *(runs(p) for p in prereqs if p in rules())])


def test_the_makefile_is_read():
    assert {"install", "run", "test", "services"} <= set(rules())
    assert "pip install" in runs("run") and "fleetplan simulate" in runs("run")


def test_every_make_target_a_page_names_exists():
    missing = [f"{page.relative_to(ROOT)}: make {target}"
               for page in PAGES for target in MAKE.findall(page.read_text())
               if target not in rules()]
    assert not missing


def test_a_target_said_to_install_the_prophet_extra_installs_it():
    """benchmarks-sim.md said ``make install`` installs Prophet; since 3d5f20e only ``make test`` does.

    Without it ``bench/quality.py`` leaves the Prophet rows out without a word,
    so a reader who ran ``make install`` to reproduce the tables got fewer rows.
    """
    wrong = []
    for page in PAGES:
        for sentence in re.split(r"(?<=[.;])\s", page.read_text()):
            if "extra" not in sentence or "install" not in sentence:
                continue
            for target in MAKE.findall(sentence):
                if f"`make {target}` installs" in sentence.replace("\n", " ") and "prophet" not in runs(target):
                    wrong.append(f"{page.relative_to(ROOT)}: make {target}")
    assert not wrong
