"""``--set KEY=VALUE`` for the bench scripts: config fields overridden from the command line."""

from __future__ import annotations

import argparse

import yaml


def add_set_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="override a config field (a YAML value); repeatable")


def parse_sets(parser: argparse.ArgumentParser, values: list[str]) -> dict:
    """``{key: value}`` of the ``--set`` options; a value without ``=`` is a usage error naming it."""
    out = {}
    for item in values:
        key, sep, value = item.partition("=")
        if not sep or not key:
            parser.error(f"--set {item!r}: expected KEY=VALUE, e.g. --set decode_sizing=rate")
        out[key] = yaml.safe_load(value)
    return out
