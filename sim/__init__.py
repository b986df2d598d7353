"""The simulator: a workload replayed against simulated engines and a controller.

``REVISION`` names the simulator's behaviour, not the package version. It is
raised by every change that moves a simulated figure (routing, batching,
sizing of the baselines), so a benchmark row that records it says which
simulator measured it, and a committed row from an older revision is known
to be stale (bench/remeasure.py runs such a file again).

- 1: until 2026-12-02.
- 2: from 2026-12-02 (docs/simulate.md, "Revision 2"): the prompt router
  counts the pass in flight, the decode router counts KV transfers in
  flight, requests arriving at one instant share an idle engine's first
  pass, the hindsight sizing reads the last partial window at its own
  length, and the warm initial fleet covers the startup span and no more.
- 3: from 2026-12-05 (docs/simulate.md, "Revision 3"): a rate-scaled trace
  keeps its own last requests where they are (a trace in whole seconds
  ends on its duration, and they were moved to t = 0), and a ServeGen run
  is its own span, not the 10-minute windows around it. Only Mooncake's
  rate-scaled runs and ServeGen runs off the window grid move.
- 4: from 2026-12-05 (docs/simulate.md, "Revision 4"): a decode batch
  whose contexts are shorter than the profile's shortest measured level
  pays per sequence (it was clamped to that level at the same KV usage,
  which timed 256 sequences of 100 tokens like 73 of 350). Runs whose
  decode batches reach such short contexts move: Azure code and ServeGen
  (the quickstart's log is the same byte for byte). A ``--duration`` past
  a trace's end no longer spreads the rate-scaled copies into the empty
  tail after it.
- 5: from 2026-12-05 (docs/simulate.md, "Revision 5"): a full prefix cache
  evicts a prompt's tail blocks first (as vLLM frees them), and a prompt's
  cache hit is looked up when its first chunk is scheduled, not when it is
  routed, so a prompt queued behind one with its prefix hits it. Only
  traces with prefix hashes (``hash_ids``: Mooncake's) move.
"""

REVISION = 5
