"""pyproject's lower bounds are versions the code runs on.

An install may resolve any version at or above a floor (a user's existing
environment, a constraints file, pip's backtracking), so each floor here is
the first release that has what fleetplan uses: below it a command fails or
the worker and the audit stop deciding alike. Found by installing every floor
in a fresh Python 3.11 environment (2026-12-05) and running the CLI and the tests.
"""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.version import Version

PYPROJECT = Path(__file__).resolve().parents[1] / "pyproject.toml"

# package: (the first version that works, what breaks below it)
NEEDED = {
    "redis": ("5.0.2", "redis.asyncio.Redis.aclose() arrived in 5.0.1 (the connector, the orchestrator "
                       "client and the virtual backend close with it), and 5.0.1's BlockingConnectionPool "
                       "hangs a ping to an unreachable Redis for good instead of raising, so the connector "
                       "never says `--redis-url: cannot reach Redis`"),
    "typer": ("0.16.0", "every command's options are annotated `X | None`, which typer reads from 0.12.4 "
                        "(`RuntimeError: Type not yet supported: pathlib.Path | None` before, at "
                        "`fleetplan --help`), and typer before 0.16 breaks on the click 8.2+ it installs "
                        "beside it (`Secondary flag is not valid for non-boolean flag`, then "
                        "`make_metavar() missing 1 required positional argument: 'ctx'`)"),
    "pydantic": ("2.12", "the worker decodes FPM records with msgspec and the audit with pydantic, and "
                         "both must read a record alike (schemas/fpm_wire.py): before 2.11 pydantic kept "
                         "the first of a repeated key where msgspec keeps the last, and 2.11 refused an "
                         "integer such as 10**18 for a float field that msgspec takes, so the audit "
                         "re-folded another FPM than the worker had (tests/schemas/test_fpm_wire.py); "
                         "the JSON Schema files are also those 2.12 writes"),
    "statsmodels": ("0.14.6", "statsmodels' ARIMA (the arima predictor, and so the default ensemble) "
                              "does not import beside pandas 3, which pip installs with it, before "
                              "0.14.6 (`TypeError: deprecate_kwarg() missing 1 required positional "
                              "argument: 'new_arg_name'`)"),
}


def _floors() -> dict[str, list[Version]]:
    """Each dependency's lower bounds (one per environment marker)."""
    floors: dict[str, list[Version]] = {}
    for line in tomllib.loads(PYPROJECT.read_text())["project"]["dependencies"]:
        req = Requirement(line)
        for spec in req.specifier:
            if spec.operator == ">=":
                floors.setdefault(req.name, []).append(Version(spec.version))
    return floors


@pytest.mark.parametrize("package", sorted(NEEDED))
def test_each_floor_is_a_version_the_code_runs_on(package):
    needed, why = NEEDED[package]
    floors = _floors()[package]
    assert floors and all(f >= Version(needed) for f in floors), f"{package}>={needed}: {why}"
