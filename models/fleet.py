"""Many deployments in one planner, each independent.

``Fleet`` routes each event to its deployment's state, keeps the event-time
bookkeeping, and hands back the tick reports. It is what ``fleetplan plan``,
the simulator and the audit drive; the Kafka worker keeps the same
per-deployment states in its tables and calls the same functions.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from fleetplan.models.planner import Planner, TickReport
from fleetplan.models.sequencer import advance, offer, watermark_of
from fleetplan.models.state import DeploymentState

INPUT_TYPES = frozenset({"fpm", "fpm_batch", "request", "arrival", "inventory", "control", "ack", "clock"})
"""Events the planner folds; decisions and dead letters are outputs and are skipped."""


@dataclass(frozen=True)
class LateEvent:
    """An input refused because its tick had already fired."""

    deployment: str
    time: float
    last_tick: float
    event: object


class Fleet:
    def __init__(self, planner: Planner) -> None:
        self.planner = planner
        self.states: dict[str, DeploymentState] = {}

    def state(self, deployment: str) -> DeploymentState:
        st = self.states.get(deployment)
        if st is None:
            st = self.states[deployment] = self.planner.new_state(deployment)
        return st

    def offer(self, event) -> LateEvent | None:
        """Buffer one event; a :class:`LateEvent` when it came too late."""
        st = self.state(event.deployment)
        if offer(st, event):
            return None
        return LateEvent(event.deployment, event.time, st.last_tick, event)

    def advance(self, deployment: str, watermark: float) -> list[TickReport]:
        return advance(self.planner, self.state(deployment), watermark)

    def feed(self, event) -> list[TickReport | LateEvent]:
        """Offer one event and fire the ticks its deployment's watermark now allows."""
        if event.type not in INPUT_TYPES:
            return []
        late = self.offer(event)
        if late is not None:
            return [late]
        st = self.states[event.deployment]
        return list(advance(self.planner, st, watermark_of))

    def finish(self) -> list[TickReport]:
        """End of input: fire every tick up to each deployment's last event time."""
        out: list[TickReport] = []
        for name in sorted(self.states):
            st = self.states[name]
            if st.max_time is not None:
                out.extend(advance(self.planner, st, st.max_time))
        return out

    def run(self, events: Iterable) -> list[TickReport | LateEvent]:
        out: list[TickReport | LateEvent] = []
        for event in events:
            out.extend(self.feed(event))
        out.extend(self.finish())
        return out

    def to_data(self) -> dict:
        return {name: st.to_data() for name, st in sorted(self.states.items())}

    def load_data(self, data: dict) -> None:
        self.states = {name: DeploymentState.from_data(d) for name, d in data.items()}
