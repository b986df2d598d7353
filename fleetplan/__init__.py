"""fleetplan: an SLA-driven autoscaling planner for LLM inference fleets.

The planning core (``fleetplan.models``) is pure; the Kafka runtime
(``fleetplan.streams``), the connectors and the simulator all drive it.
"""

__version__ = "0.1.0"
