"""Topic names of the event log (design.md, "The event log").

Every topic is keyed by deployment so that one partition holds one
deployment's history in order.
"""

FPM = "fleetplan.fpm.v1"
REQUESTS = "fleetplan.requests.v1"
INVENTORY = "fleetplan.inventory.v1"
CONTROL = "fleetplan.control.v1"
DECISIONS = "fleetplan.decisions.v1"
ACKS = "fleetplan.acks.v1"
DEADLETTER = "fleetplan.deadletter.v1"

INPUT_TOPICS = (FPM, REQUESTS, INVENTORY, CONTROL, ACKS)
"""Topics the planner folds into its state; decisions are its output."""

ALL_TOPICS = (FPM, REQUESTS, INVENTORY, CONTROL, DECISIONS, ACKS, DEADLETTER)
