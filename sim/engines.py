"""Simulated engines: prefill, decode and aggregated, on the virtual clock.

One class, three roles, vLLM-style iteration scheduling:

- **prefill**: a FCFS queue; each pass computes up to
  ``max_num_batched_tokens`` prompt tokens over at most ``max_num_seqs``
  prompts (chunked prefill: a long prompt spans several passes). A finished
  prompt is handed back to the fleet for the KV transfer to decode.
- **decode**: continuous batching. A request joins at the next iteration
  boundary if a sequence slot and KV space are free, else it waits in the
  engine's queue. Every pass emits one token per running sequence.
- **agg**: decode batch plus chunked prefill piggybacked in the same pass
  (token budget ``max_num_batched_tokens − running``).

Speed (the goal is ≥ 1,000× real time in Python): passes that carry prefill
are simulated one by one (there are about as many as requests), but a pure
decode batch does not change between arrivals and completions, so it runs as
a **macro-step**: ``k`` identical iterations at once, up to the next
completion or ``MAX_MACRO_ITERATIONS``, each taking the pass time at the
batch's mid-segment KV. An arrival cuts the segment at the end of the
iteration in progress, exactly where a real engine would admit it.
Per-request progress is kept implicitly: a request joining at iteration
counter ``c`` with ``n`` tokens to go finishes when the counter reaches
``c + n`` (a heap keyed by that), so a macro-step costs O(log n), not O(n).

KV admission reserves a request's full context (``isl + osl``), so the
cache never overflows and nothing is preempted: the simulator knows the
output length, a real engine would preempt instead. Prefix caching (prefill
and agg engines) keeps the hash blocks of recent prompts in an LRU sized to
the KV cache; a prompt skips the leading blocks cached when its first chunk
is scheduled (a prompt queued behind another with the same prefix hits it),
and a full cache evicts a prompt's tail blocks first.
"""

from __future__ import annotations

import heapq
import math
from collections import OrderedDict, deque

from fleetplan.models.perf import EngineLimits
from fleetplan.sim.clock import VirtualClock
from fleetplan.sim.timing import EngineTiming

MAX_MACRO_ITERATIONS = 32
"""A pure-decode macro-step spans at most this many iterations, so the KV
growth inside one step stays small (pass time is taken at its midpoint) and
sampled FPMs see a fresh batch."""


class SimRequest:
    """One request's life through the fleet; times are virtual seconds."""

    __slots__ = (
        "index", "rid", "arrival", "isl", "osl", "hash_ids", "cached", "prefilled",
        "prefill_start", "prefill_end", "first_token", "end", "prefill_engine",
        "decode_engine", "join_counter",
    )

    def __init__(self, index: int, arrival: float, isl: int, osl: int, hash_ids=()) -> None:
        self.index = index
        self.rid = f"r{index}"
        self.arrival = arrival
        self.isl = max(1, isl)
        self.osl = max(1, osl)
        self.hash_ids = hash_ids
        self.cached = 0
        self.prefilled = 0
        self.prefill_start = -1.0
        self.prefill_end = -1.0
        self.first_token = -1.0
        self.end = -1.0
        self.prefill_engine = None
        self.decode_engine = None
        self.join_counter = 0

    @property
    def prefill_tokens(self) -> int:
        """Prompt tokens this request must compute (cache hits skipped, at least one)."""
        return max(1, self.isl - self.cached)


class Engine:
    """A simulated worker of one role; the fleet owns its lifecycle."""

    def __init__(
        self, worker_id: str, role: str, gpus: int, timing: EngineTiming, limits: EngineLimits,
        clock: VirtualClock, fleet, started: float, prefix_block_tokens: int = 512,
        prefill_first: bool = False,
    ) -> None:
        """``limits`` are the model card's (the planner's config holds the same
        numbers); ``limits.max_kv_tokens`` must be set. ``prefill_first`` (agg
        only) schedules like vLLM before chunked prefill: waiting prompts run in a
        pass of their own while every decode waits."""
        self.worker_id = worker_id
        self.role = role
        self.gpus = gpus
        self.timing = timing
        self.limits = limits
        self.clock = clock
        self.fleet = fleet
        self.started = started
        self.state = "starting"
        self.stopped: float | None = None
        self.does_prefill = role in ("prefill", "agg")
        self.does_decode = role in ("decode", "agg")
        self.prefill_role = role == "prefill"
        self.max_num_batched_tokens = limits.max_num_batched_tokens
        self.max_num_seqs = limits.max_num_seqs
        # queues and batch
        self.waiting: deque[SimRequest] = deque()   # not yet admitted
        # admitted, prompt not done (agg, prefill); FCFS, so prompts finish from the front
        self.prefilling: deque[SimRequest] = deque()
        self.finishing: list[tuple[int, int, SimRequest]] = []  # (finish counter, index, req)
        self.running = 0
        self.kv = 0             # KV tokens held by running sequences at ``counter``
        self.kv_reserved = 0    # full contexts reserved by admitted requests
        self.unstarted = 0      # prompts not started yet (FPM queued)
        self.unstarted_tokens = 0  # their raw prompt tokens
        self.prefill_backlog = 0   # fresh prompt tokens not yet scheduled (router load)
        self.waiting_context = 0   # isl + osl of requests waiting for a decode slot
        self.waiting_kv = 0        # isl + 1 of the same: the KV they bring (FPM queued)
        self.counter = 0        # decode steps completed (every running sequence got a token)
        self.prefill_first = prefill_first and role == "agg"
        self.piggyback = role == "agg" and not self.prefill_first  # decode steps ride in prompt passes
        self.inbound = 0        # KV transfers on their way here (a draining engine waits for them)
        self.inbound_context = 0   # isl + osl of those transfers (router load)
        # the pass (or macro-step) in flight
        self.busy = False
        self._version = 0
        self._seg_start = 0.0
        self._seg_d = 0.0
        self._seg_k = 0
        self._seg_b = 0
        self._seg_kv0 = 0
        self._seg_decodes = True  # False for a prompt-only pass: running sequences wait
        self._chunk: list[tuple[SimRequest, int]] = []
        self._chunk_tokens = 0  # prompt tokens of the pass in flight (router load)
        self._idle_reported = False
        # prefix cache (hash block -> None), LRU
        self._prefix: OrderedDict[int, None] = OrderedDict()
        self.max_kv_tokens = int(limits.max_kv_tokens or 1)
        self.block_tokens = max(1, prefix_block_tokens)
        self._prefix_capacity = max(1, self.max_kv_tokens // self.block_tokens)
        # accounting
        self.iterations = 0

    # -- load, as a router sees it -------------------------------------------------

    @property
    def outstanding(self) -> int:
        """Requests on this engine in any phase."""
        return len(self.waiting) + len(self.prefilling) + self.running

    @property
    def idle(self) -> bool:
        return (
            not self.busy and not self.waiting and not self.prefilling and self.running == 0
            and self.inbound == 0
        )

    def prefill_load(self) -> int:
        """Prompt tokens not yet computed: what a new prompt waits behind.

        The pass in flight counts until it ends, so an engine mid-pass does not
        tie with an idle one.
        """
        return self.prefill_backlog + self._chunk_tokens

    def decode_load(self) -> int:
        """The contexts (``isl + osl``) this engine holds or will hold: admitted,
        waiting for a slot, or still on their way as KV transfers, so the prompts
        of one prefill pass spread over the decode engines instead of piling
        onto the one that looked emptiest when the first was routed."""
        return self.kv_reserved + self.waiting_context + self.inbound_context

    def cached_prefix_tokens(self, req: SimRequest) -> int:
        """Tokens of ``req``'s prompt whose leading blocks this engine has cached."""
        if not req.hash_ids or not self._prefix:
            return 0
        hits = 0
        for h in req.hash_ids:
            if h not in self._prefix:
                break
            hits += 1
        return min(hits * self.block_tokens, req.isl - 1)

    # -- work in -------------------------------------------------------------------

    def enqueue(self, req: SimRequest) -> None:
        """A request routed here: a prompt (prefill, agg) or a transferred KV (decode)."""
        now = self.clock.now
        if self.does_prefill:
            req.cached = self.cached_prefix_tokens(req)  # an estimate until scheduled
            req.prefill_engine = self
            self.unstarted += 1
            self.unstarted_tokens += req.isl
            self.prefill_backlog += req.prefill_tokens
        else:
            req.decode_engine = self
            self.waiting_context += req.isl + req.osl
            self.waiting_kv += req.isl + 1
        self.waiting.append(req)
        self._idle_reported = False
        if not self.busy:
            # Start at the end of this instant, so every request arriving at the same
            # time shares the first pass, as it would in a real scheduler.
            self.busy = True
            self._seg_k = 0
            self._seg_b = 0
            self._seg_d = 0.0
            # what a sample at this instant reports: no pass yet, so the idle engine's (no)
            # KV, not what its last batch started with
            self._seg_kv0 = self.kv
            self._chunk = []
            self._chunk_tokens = 0
            self._version += 1
            self.clock.at_end(now, self._boundary, self._version)
        elif self._seg_k > 1 and self._admissible():
            self._cut_segment(now)

    # -- the iteration loop ----------------------------------------------------------

    def _admissible(self) -> bool:
        waiting = self.waiting
        if not waiting:
            return False
        if self.prefill_role:
            return True
        seqs = self.running + len(self.prefilling)
        if seqs == 0:
            return True  # an empty engine takes anything, even an oversize context
        req = waiting[0]
        return seqs < self.max_num_seqs and self.kv_reserved + req.isl + req.osl <= self.max_kv_tokens

    def _admit(self) -> None:
        waiting = self.waiting
        if not waiting:
            return
        if self.prefill_role:
            self.prefilling.extend(waiting)
            waiting.clear()
            return
        agg = self.role == "agg"
        while self._admissible():
            req = waiting.popleft()
            context = req.isl + req.osl
            self.kv_reserved += context
            if agg:
                self.prefilling.append(req)
            else:
                self.waiting_context -= context
                self.waiting_kv -= req.isl + 1
                self._join_decode(req)

    def _join_decode(self, req: SimRequest) -> None:
        """Start decoding ``req``: its first token exists, ``osl - 1`` to go."""
        counter = self.counter
        req.join_counter = counter
        self.running += 1
        self.kv += req.isl + 1
        heapq.heappush(self.finishing, (counter + req.osl - 1, req.index, req))

    def _schedule(self, now: float) -> None:
        """Start the next pass (or macro-step) at ``now``, or go idle."""
        if self.prefilling:
            piggyback = self.piggyback
            budget = self.max_num_batched_tokens - (self.running if piggyback else 0)
            max_seqs = self.max_num_seqs
            chunk = []
            tokens = 0
            for req in self.prefilling:
                if budget <= 0 or len(chunk) >= max_seqs:
                    break
                if req.prefill_start < 0:
                    self._start_prompt(req, now)
                take = req.prefill_tokens - req.prefilled
                if take > budget:
                    take = budget
                if take <= 0:
                    continue
                chunk.append((req, take))
                budget -= take
                tokens += take
            self.prefill_backlog -= tokens
            if piggyback:
                d = self.timing.mixed_s(tokens, self.running, self.kv)
            else:
                d = self.timing.prefill_s(tokens)
            self._chunk = chunk
            self._chunk_tokens = tokens
            self._start(now, d, 1, piggyback)
            return
        running = self.running
        if running:
            k = self.finishing[0][0] - self.counter
            if k > MAX_MACRO_ITERATIONS:
                k = MAX_MACRO_ITERATIONS
            elif k < 1:
                k = 1
            d = self.timing.decode_s(running, self.kv + running * (k - 1) / 2.0)
            self._chunk = []
            self._start(now, d, k, True)
            return
        self.busy = False
        if self.state == "draining" and self.idle:
            self.fleet.engine_drained(self)

    def _start_prompt(self, req: SimRequest, now: float) -> None:
        """A prompt's first chunk is scheduled: look its prefix up in the cache now.

        A scheduler looks a waiting prompt's prefix up when it schedules it, so a
        prompt queued behind another with the same leading blocks hits them once
        that one is done; the count taken when it was routed here only estimated
        its work (``prefill_backlog``), which now takes the difference.
        """
        before = req.prefill_tokens
        req.cached = self.cached_prefix_tokens(req)
        self.prefill_backlog += req.prefill_tokens - before
        req.prefill_start = now
        self.unstarted -= 1
        self.unstarted_tokens -= req.isl

    def _start(self, now: float, d: float, k: int, decodes: bool) -> None:
        self.busy = True
        self._seg_start = now
        self._seg_d = d
        self._seg_k = k
        self._seg_b = self.running if decodes else 0
        self._seg_decodes = decodes
        self._seg_kv0 = self.kv
        version = self._version + 1
        self._version = version
        self.clock.at(now + d * k, self._boundary, version)

    def _cut_segment(self, now: float) -> None:
        """End the macro-step after the iteration in progress, so new work can join."""
        done = math.floor((now - self._seg_start) / self._seg_d) + 1
        if done >= self._seg_k:
            return
        self._seg_k = done
        self._version += 1
        self.clock.at(self._seg_start + self._seg_d * done, self._boundary, self._version)

    def _boundary(self, version: int) -> None:
        if version != self._version:
            return  # superseded by a cut
        now = self.clock.now
        k = self._seg_k
        if self._seg_decodes:
            self.counter += k
            self.kv += self._seg_b * k
        self.iterations += k
        chunk = self._chunk
        if chunk:
            self._chunk = []
            self._chunk_tokens = 0
            for req, take in chunk:
                req.prefilled += take
                if req.prefilled >= req.prefill_tokens:
                    self._prompt_done(req, now)
        finishing = self.finishing
        if finishing:
            counter = self.counter
            fleet = self.fleet
            while finishing and finishing[0][0] <= counter:
                req = heapq.heappop(finishing)[2]
                context = req.isl + req.osl
                self.running -= 1
                self.kv -= context
                self.kv_reserved -= context
                fleet.request_finished(req, self, now)
        self._admit()
        self._schedule(now)

    def _prompt_done(self, req: SimRequest, now: float) -> None:
        prefilling = self.prefilling
        if prefilling[0] is req:
            prefilling.popleft()  # the usual case: a pass serves the queue from its head
        else:
            prefilling.remove(req)
        req.prefill_end = now
        self._remember_prefix(req)
        if self.role == "prefill":
            self.fleet.prompt_done(req, self, now)
            return
        req.first_token = now
        if req.osl <= 1:
            self.kv_reserved -= req.isl + req.osl
            self.fleet.request_finished(req, self, now)
        else:
            req.decode_engine = self
            self._join_decode(req)

    def _remember_prefix(self, req: SimRequest) -> None:
        """Mark the prompt's blocks most recently used, its leading block last.

        So a full cache evicts a prompt's tail blocks before its leading ones, as
        vLLM (and Dynamo's mocker) free them: a hit needs the leading blocks, and
        evicting those first left the rest cached but unreachable.
        """
        if not req.hash_ids:
            return
        cache = self._prefix
        for h in reversed(req.hash_ids):
            if h in cache:
                cache.move_to_end(h)
            else:
                cache[h] = None
        while len(cache) > self._prefix_capacity:
            cache.popitem(last=False)

    # -- sampled forward-pass metrics ------------------------------------------------

    def sample(self, now: float) -> dict | None:
        """The FPM fields of the pass in flight at ``now``; one idle heartbeat, then None.

        Returns plain numbers (the runner builds the event): wall_time,
        counter, scheduled and queued figures, as Dynamo's FPM v1 reports
        them for one iteration.
        """
        if not self.busy:
            if self._idle_reported:
                return None
            self._idle_reported = True
            return {"wall_time": 0.0, "counter": self.iterations, "sched": (0, 0, 0, 0, 0), "queued": (0, 0, 0, 0)}
        d = self._seg_d
        i = 0
        if self._seg_k > 1:
            i = min(int((now - self._seg_start) / d), self._seg_k - 1)
        chunk = self._chunk
        pre_tokens = 0
        pre_kv = 0
        for r, t in chunk:
            pre_tokens += t
            pre_kv += r.cached + r.prefilled
        decode_kv = self._seg_kv0 + self._seg_b * i if self._seg_decodes else 0
        sched = (len(chunk), pre_tokens, pre_kv, self._seg_b, decode_kv)
        if self.does_prefill:
            queued = (self.unstarted, self.unstarted_tokens, 0, 0)
        else:
            queued = (0, 0, len(self.waiting), self.waiting_kv)
        self._idle_reported = False
        return {"wall_time": d, "counter": self.iterations + i, "sched": sched, "queued": queued}
