"""Make examples/events/azure_code_10min.jsonl: a recorded log to try `fleetplan plan` on.

The requests are the bundled 10-minute Azure code slice, one finished-request
event each (the trace has arrival times only, so an event's time is its
arrival). The log also holds what a live deployment would have recorded
around them: the starting inventory, the bridge's clock heartbeats in idle
seconds, and for each decision the orchestrator's inventory events and ack
60 s later. The planner decides those decisions
itself while the log is made, so `fleetplan plan` on the log reproduces them.

    .venv/bin/python examples/events/make_example.py
"""

from __future__ import annotations

from pathlib import Path

from fleetplan.bootstrap import build_planner
from fleetplan.eventlog import write_events
from fleetplan.models.fleet import Fleet
from fleetplan.schemas import Ack, ClockEvent, InventoryEvent, RequestRecord
from fleetplan.sim.traces import read_trace

HERE = Path(__file__).parent
EPOCH = 1_700_000_040.0  # an arbitrary start on the one-minute grid
STARTUP_S = 60.0


def main() -> None:
    planner = build_planner(HERE.parent / "configs" / "plan.yaml", "h100-llama3.3-70b")
    fleet = Fleet(planner)
    workers = {"prefill": ["prefill-0"], "decode": ["decode-0"]}
    log = [InventoryEvent(deployment="code", time=EPOCH, worker_id=w[0], role=r, state="ready", gpus=2)
           for r, w in workers.items()]
    for r in read_trace(HERE.parent / "traces" / "azure_code_10min.csv"):
        t = EPOCH + 1.0 + r.arrival_s
        log.append(RequestRecord(deployment="code", time=t, request_id=f"code-{len(log)}",
                                 input_tokens=r.input_tokens, output_tokens=r.output_tokens,
                                 request_received_ms=t * 1000.0))
    # the bridge heartbeats a source idle for a second, so event time (and the
    # ticks) move on through quiet minutes, as in a live deployment
    busy = {int(e.time) for e in log}
    end = int(max(e.time for e in log)) + 1
    log += [ClockEvent(deployment="code", time=float(s)) for s in range(int(EPOCH), end) if s - 1 not in busy]
    log.sort(key=lambda e: e.time)
    out, i = [], 0
    while i < len(log):
        event = log[i]
        out.append(event)
        for report in fleet.feed(event):
            decision = getattr(report, "decision", None)
            if decision is None:
                continue
            done = decision.time + STARTUP_S
            for role, target in decision.targets.items():
                names = workers[role]
                while len(names) < target:
                    names.append(f"{role}-{len(names)}")
                    log.append(InventoryEvent(deployment="code", time=done, worker_id=names[-1],
                                              role=role, state="ready", gpus=2))
                while len(names) > target:
                    log.append(InventoryEvent(deployment="code", time=done, worker_id=names.pop(),
                                              role=role, state="gone", gpus=2))
            log.append(Ack(deployment="code", time=done + 0.5, decision_id=decision.decision_id,
                           status="applied", observed=dict(decision.targets)))
            log[i + 1:] = sorted(log[i + 1:], key=lambda e: e.time)
        i += 1
    with (HERE / "azure_code_10min.jsonl").open("wb") as fh:
        write_events(out, fh)
    print(f"wrote {len(out)} events")


if __name__ == "__main__":
    main()
