"""I/O at the edges: the decision connector, its backends and the orchestrator client.

- ``base``: the :class:`~fleetplan.connectors.base.Applier` interface a backend implements.
- ``kubernetes``, ``virtual``, ``log``: the backends.
- ``ledger``: the idempotency ledger (apply at most once).
- ``worker``: the connector service (decisions in, acks out).
- ``client``: the orchestrator client, over Redis or Kafka.
- ``bridge``: the ZMQ ingress bridge.
"""
