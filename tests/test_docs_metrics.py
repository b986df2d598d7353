"""The metrics each service's page lists are those it exports, with their labels.

A dashboard or an alert is written from these pages: a metric left out is
never found, and a label left out makes a query's ``by`` or matcher wrong.
These read each page's metrics section and compare it with the service's
registry.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[1]
DOCUMENTED = re.compile(r"`(fleetplan_\w+)(?:\{([^}]*)\})?`")


def _registry(service: str):
    from fleetplan.connectors.bridge import BridgeMetrics
    from fleetplan.connectors.metrics import ConnectorMetrics
    from fleetplan.streams.metrics import WorkerMetrics

    metrics = {"worker": WorkerMetrics, "bridge": BridgeMetrics, "connector": lambda: ConnectorMetrics("virtual")}[service]()
    for collector in list(metrics.registry._collector_to_names):  # a labelled series exists once set
        if collector._labelnames:
            child = collector.labels(*("x" for _ in collector._labelnames))
            if collector._type == "stateset":
                child.state(collector._states[0])
    return metrics


def _exported(service: str) -> dict[str, set[str]]:
    """Series name (the ``_total`` of counters) -> label names, of one service's registry."""
    out = {}
    for family in _registry(service).registry.collect():
        name = family.name + ("_total" if family.type == "counter" else "")
        labels = set()
        for sample in family.samples:
            labels |= set(sample.labels) - {"le", family.name}  # a histogram's buckets, an enum's state
        out[name] = labels
    return out


def _section(page: str, heading: str) -> str:
    text = (ROOT / "docs" / page).read_text()
    start = text.index(f"\n{heading}\n")
    end = text.find("\n## ", start + 1)
    return text[start:end if end >= 0 else None]


@pytest.mark.parametrize(("service", "page", "heading"), [
    ("worker", "runtime.md", "## Metrics (worker, `--metrics-port`)"),
    ("bridge", "wire-format.md", "## Metrics (`--metrics-port`)"),
])
def test_every_metric_is_listed_with_its_labels(service, page, heading):
    """Each name in the section as ``name{label,...}``, or bare when it has none."""
    documented: dict[str, set[str]] = {}
    for name, labels in DOCUMENTED.findall(_section(page, heading)):
        names = {part.split("=")[0].strip() for part in labels.split(",") if part.strip()}
        documented.setdefault(name, set()).update(names)
    assert documented == _exported(service)


def test_every_connector_metric_is_listed_with_its_labels():
    """The connector's table gives the labels a column of their own."""
    documented: dict[str, set[str]] = {}
    for line in _section("connectors.md", "## Metrics").splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 3 and cells[0].startswith("`fleetplan_"):
            for name, _ in DOCUMENTED.findall(cells[0]):
                documented[name] = {label.strip() for label in cells[1].split(",") if label.strip()}
    assert documented == _exported("connector")
