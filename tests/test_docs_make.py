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


SERVICE_PORTS = {"FLEETPLAN_KAFKA_PORT": 19092, "FLEETPLAN_KAFKA_CONTROLLER_PORT": 19093, "FLEETPLAN_REDIS_PORT": 16379}
"""scripts/services' ports and their defaults: another clone's services hold all three."""


def moved_port_commands() -> list[str]:
    """testing.md's commands that run the services on other ports (code spans and ``sh`` blocks)."""
    text = (ROOT / "docs" / "testing.md").read_text()
    spans = re.findall(r"```sh\n(.*?)```", text, re.S) + re.findall(r"`([^`\n]+)`", text)
    return [s for s in spans if "make" in s and any(f"{v}=" in s for v in SERVICE_PORTS)]


def makes_with_env(command: str) -> list[tuple[str, dict[str, str]]]:
    """Each ``make TARGET`` of a shell snippet, with the variables it sees (exported or its own)."""
    exported: dict[str, str] = {}
    out = []
    for step in re.split(r"&&|;|\n", command):
        words = step.split()
        assigned = {}
        while words and re.match(r"^[A-Z_]+=", words[0]):
            name, _, value = words.pop(0).partition("=")
            assigned[name] = value
        if words[:1] == ["export"]:
            exported.update(dict(w.split("=", 1) for w in words[1:] if "=" in w))
        elif words[:1] == ["make"]:
            out += [(target, {**exported, **assigned}) for target in words[1:]]
    return out


def test_the_moved_port_example_starts_and_tests_the_same_services():
    """testing.md's example moved the broker port for ``make services`` alone.

    ``make test`` runs ``make services`` again, on the default port: kafka.sh
    found its broker not answering there, stopped it and started another on
    19092 (its data formatted anew), so the tests, pointed at 29092, found none.
    And the controller and Redis ports stayed at the defaults that another
    clone's services, the case the paragraph is for, already hold.
    """
    commands = moved_port_commands()
    assert commands
    for command in commands:
        starting = [env for target, env in makes_with_env(command) if "scripts/services/up.sh" in runs(target)]
        assert starting, command
        ports = [{v: int(env.get(v, default)) for v, default in SERVICE_PORTS.items()} for env in starting]
        assert all(p == ports[0] for p in ports), f"{command}: the makes start the services on {ports}"
        assert all(ports[0][v] != default for v, default in SERVICE_PORTS.items()), command
        for target, env in makes_with_env(command):
            if "pytest" in runs(target):
                kafka, redis = starting[-1].get("FLEETPLAN_KAFKA_PORT"), starting[-1].get("FLEETPLAN_REDIS_PORT")
                assert env.get("FLEETPLAN_KAFKA_BOOTSTRAP") == f"127.0.0.1:{kafka}", command
                assert env.get("FLEETPLAN_REDIS_URL") == f"redis://127.0.0.1:{redis}/0", command
