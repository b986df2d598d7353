"""Startup specs: what ``--startup`` accepts, and what it refuses before a run."""

from __future__ import annotations

import pytest

from fleetplan.sim.startup import parse_startup


@pytest.mark.parametrize("spec,kind,upper", [
    ("120", "fixed", 120.0),
    ("uniform:60:180", "uniform", 180.0),
    ("normal:120:10", "normal", 120 + 2.326 * 10),
    ("86400", "fixed", 86_400.0),
])
def test_a_spec_parses(spec, kind, upper):
    startup = parse_startup(spec)
    assert startup.kind == kind
    assert startup.upper() == pytest.approx(upper)


@pytest.mark.parametrize("spec,message", [
    ("nan", "startup time must be a finite number of seconds >= 0, got nan"),
    ("inf", "startup time must be a finite number of seconds >= 0, got inf"),
    ("uniform:nan:5", "startup: parameters must be finite and >= 0 (and LO <= HI); got 'uniform:nan:5'"),
    ("uniform:0:inf", "startup: parameters must be finite and >= 0 (and LO <= HI); got 'uniform:0:inf'"),
    ("normal:100:nan", "startup: parameters must be finite and >= 0"),
    ("lognormal:nan:1", "startup: parameters must be finite and >= 0"),
    # the simulator plans a startup ahead a second at a time: 1e7 s (116 days) ran for minutes
    ("1e7", "startup: at most 86400 s (a day), got 1e+07"),
    ("uniform:0:1e7", "startup: at most 86400 s (a day), got 'uniform:0:1e7' (engines planned to start within 1e+07 s)"),
    ("lognormal:100:100", "startup: at most 86400 s (a day), got 'lognormal:100:100' (engines planned to start within"),
])
def test_a_spec_no_run_can_use_is_refused(spec, message):
    with pytest.raises(ValueError) as err:
        parse_startup(spec)
    assert message in str(err.value)
