"""Checks of command-line values that every runtime command shares, as problems to name.

Each returns what is wrong with a value (None when it is fine), so a
command reports it in its own way (``fleetplan: error: OPTION: problem``)
before it connects to anything: Kafka, ZMQ or the logging setup would
otherwise find it later, with a traceback or after topics were created.
"""

from __future__ import annotations

import re
import socket
from pathlib import Path

import typer


def bootstrap_problem(value: str) -> str | None:
    """Kafka bootstrap servers: ``host:port[,host:port...]`` with ports in 1..65535."""
    for server in value.split(","):
        host, colon, port = server.strip().rpartition(":")
        if not colon or not host or not port.isdigit() or not 0 < int(port) <= 65535:
            return f"expected host:port[,host:port...] with ports in 1..65535, got {value!r}"
    return None


_TOPIC_NAME = re.compile(r"[A-Za-z0-9._-]{1,249}")


def topic_name_problem(value: str) -> str | None:
    """A whole Kafka topic name (Kafka's rule): 1 to 249 of letters, digits, '.', '_', '-', not ``.`` or ``..``.

    A name Kafka refuses is never created, so a consumer waits for it without
    end and a producer fails on it only when it first sends.
    """
    if not _TOPIC_NAME.fullmatch(value) or value in (".", ".."):
        return f"a Kafka topic name: 1 to 249 letters, digits, '.', '_' or '-' (not . or ..), got {value!r}"
    return None


LOG_LEVELS = ("debug", "info", "warning", "error", "critical")


def log_level_problem(value: str) -> str | None:
    if value.lower() not in LOG_LEVELS:
        return f"one of {', '.join(LOG_LEVELS)}, got {value!r}"
    return None


def port_problem(port: int | None) -> str | None:
    """A port another process already listens on (0 or None: no port, nothing to check)."""
    if not port:
        return None
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(("0.0.0.0", port))
        except OSError as err:
            return f"cannot listen on port {port} ({err.strerror})"
    return None


def path_value(value: str | Path) -> Path:
    """A path option's value, refused when empty (typer's ``parser`` for every ``Path`` option).

    Typer turns ``""`` into ``Path("")``, which is ``Path(".")``: the working
    directory. So ``--out "$DIR"`` with ``DIR`` unset wrote the run's files
    into wherever the command was started, and ``--events ""`` read a
    directory. An empty value is a mistake to name, not a place; ``.`` still
    says the working directory.
    """
    if isinstance(value, Path):  # a default, already a path
        return value
    if not value.strip():
        raise typer.BadParameter("an empty path; give a file or directory (. for the working directory)")
    return Path(value)


PATH = {"parser": path_value, "metavar": "PATH"}
"""The keywords of a ``typer.Option`` taking a path: ``typer.Option("--out", **PATH, help=...)``."""
