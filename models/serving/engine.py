"""Continuous batching: one thread owns the model on its device and runs the scheduler loop.

Between two decode steps the loop drops cancelled requests, admits waiting ones while a cache row
and the token budget allow (prefilled together, right-padded, each into its row: the same logits
bit for bit as alone, tested, and one pass over the weights for all), then decodes one token for
every running request in one ``decode`` call over their rows. A request whose prompt the cache
already holds but for its last few tokens skips the prefill pass: it joins the decode batch at
once and feeds those tokens one a step (a pass of its own costs as much as several steps of
the whole batch, and stalls it meanwhile). A request leaves the batch the step it
finishes, and its row is free for the next. The KV cache is paged (:mod:`.blocks`): a row is a
block table, and a request holds the blocks its tokens fill, taken as it grows, sharing the cached
blocks of a prompt prefix it has in common with earlier requests; the pool's memory grows with the
blocks in use, up to what ``max_batch`` rows of ``max_len`` tokens would take. A request reserves
its prompt plus its ``max_new_tokens`` of the ``max_tokens_in_flight`` budget (and its worst case
of blocks), waits in the queue while they are taken, and is refused (:class:`EngineBusy`) when
the queue is full. (A model with a Prefix Tuning prefix keeps the prefix in every row of a
fixed cache of ``max_batch`` x ``max_len`` slots instead, without prefix caching.)

Callers (the HTTP server) never touch the model: they ``submit`` token ids with sampling
parameters and receive :class:`Event` s through a callback, from the engine's thread.
"""

from __future__ import annotations

import itertools
import sys
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from ..generate import Completion, Sequence
from ..llama import LlamaForCausalLM, paddle
from ..sampling import SamplingParams, sample, token_logprob
from .blocks import BlockPool, Match
from anychip.ops.dispatch import place


class EngineBusy(RuntimeError):
    """The queue is full: the caller should retry later (HTTP 503)."""


class RequestTooLong(ValueError):
    """Prompt plus completion would not fit one cache row (HTTP 400)."""


@dataclass
class EngineConfig:
    max_batch: int = 16                   # cache rows: requests decoding together
    max_len: int = 1024                   # slots per row: one request's prompt + completion
    max_tokens_in_flight: int | None = None  # reserved tokens of running requests; None: all slots
    max_queue: int = 256                  # waiting requests before new ones are refused
    prefill_tokens: int = 4096            # padded tokens (batch x longest prompt) per prefill pass
    prefix_cache: bool = True             # share the cached blocks of a common prompt prefix
    block_size: int = 32                  # token slots per block of the paged KV cache
    join_tokens: int = 4                  # a prompt cached but for at most this many tokens feeds them
                                          # through decode steps instead of a prefill pass
    initial_blocks: int = 16              # blocks the paged cache starts with (it grows as needed)

    def validate(self, context: int) -> None:
        for name in ("max_batch", "max_len", "max_queue", "prefill_tokens", "block_size", "initial_blocks"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.max_len > context:
            raise ValueError(f"max_len {self.max_len} exceeds the model's context of {context} tokens")
        if self.max_tokens_in_flight is not None and self.max_tokens_in_flight < 2:
            raise ValueError(f"max_tokens_in_flight must be >= 2, got {self.max_tokens_in_flight}")

    @property
    def budget(self) -> int:
        return self.max_tokens_in_flight or self.max_batch * self.max_len


@dataclass
class Event:
    """What a request's callback receives: ``text`` pieces in order, then one ``done`` (with the
    completion) or one ``error`` (with a message)."""

    kind: str
    text: str = ""
    completion: Completion | None = None
    error: str = ""
    logprobs: list = field(default_factory=list)  # TokenLogprobs of the tokens since the last event
    prompt_logprobs: list | None = None  # on a request's first text event, when it asked for them


@dataclass
class Handle:
    """A submitted request. ``cancel()`` (from any thread) frees its row at the next step."""

    id: int
    prompt: list[int]
    params: SamplingParams
    on_event: Callable[[Event], None]
    submitted: float = field(default_factory=time.perf_counter)
    first_token: float | None = None
    cancelled: bool = False
    _engine: Engine | None = None

    @property
    def reserved(self) -> int:
        return len(self.prompt) + self.params.max_new_tokens

    def cancel(self) -> None:
        self.cancelled = True
        if self._engine is not None:
            self._engine.wake()


class _Running:
    """A request holding a cache row (with a paged cache: the blocks of its table)."""

    def __init__(self, handle: Handle, row: int, tokenizer):
        self.handle, self.row = handle, row
        self.start = 0  # prompt tokens whose keys and values shared blocks hold (prefix cache)
        self.table: list[int] = []  # its blocks, in slot order (paged)
        self.blocks = 0  # blocks of its worst case, reserved at admission (paged)
        self.copy: Match | None = None  # a cached block to copy into its first own block, before its prefill
        self.seq = Sequence(handle.prompt, tokenizer, handle.params)
        self.rng = np.random.default_rng(handle.params.seed)
        self.unsent: list = []  # token logprobs not yet in an event
        self.texts_sent = False
        self.feeding = 0  # prompt tokens still to go through decode steps (joined after cached blocks)

    @property
    def position(self) -> int:
        """Where the token of the next decode step goes in the cache."""
        if self.feeding:
            return len(self.handle.prompt) - self.feeding
        return len(self.handle.prompt) + len(self.seq.out.tokens) - 1

    @property
    def token(self) -> int:
        """The next decode step's token: a prompt token still to feed, else the last sampled."""
        if self.feeding:
            return self.handle.prompt[-self.feeding]
        return self.seq.out.tokens[-1]


@dataclass
class Metrics:
    """Counters since start; the server renders them for Prometheus."""

    requests: dict = field(default_factory=lambda: {"stop": 0, "length": 0, "cancelled": 0, "error": 0})
    prompt_tokens: int = 0
    prefix_hit_tokens: int = 0  # prompt tokens whose keys and values cached blocks already held
    completion_tokens: int = 0
    decode_steps: int = 0
    decode_s: float = 0.0   # time in batched decode calls (the model, not sampling or streaming)
    prefill_s: float = 0.0
    ttft_sum: float = 0.0
    ttft_count: int = 0
    ttft_buckets: dict = field(default_factory=lambda: dict.fromkeys((0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30), 0))
    recent: deque = field(default_factory=lambda: deque(maxlen=256))  # (time, tokens) of recent steps

    def tokens_per_second(self, window: float = 10.0) -> float:
        now = time.perf_counter()
        steps = [(t, n) for t, n in list(self.recent) if now - t <= window]
        if len(steps) < 2:
            return 0.0
        return sum(n for _, n in steps[1:]) / max(steps[-1][0] - steps[0][0], 1e-9)


def _notify(handle: Handle, event: Event) -> None:
    """Delivers a request's last event; a failing callback is that client's problem alone."""
    try:
        handle.on_event(event)
    except Exception as e:
        print(f"anychip serve: request {handle.id}: its {event.kind} event could not be delivered: {e}",
              file=sys.stderr)


class Engine:
    """Serves ``model`` (already on its device) with ``tokenizer`` under ``config``."""

    def __init__(self, model: LlamaForCausalLM, tokenizer, config: EngineConfig | None = None, fused: bool = True):
        self.model, self.tokenizer, self.fused = model, tokenizer, fused
        self.config = config or EngineConfig()
        c = self.config
        c.validate(model.context)
        self.blocks: BlockPool | None = None
        if model.prefix_len:  # the prefix in every row of a fixed cache, nothing shared
            self.cache = model.new_cache(c.max_batch, c.max_len)
        else:
            limit = c.max_batch * -(-c.max_len // c.block_size)
            self.cache = model.new_paged_cache(c.max_batch, c.max_len, c.block_size, min(limit, c.initial_blocks))
            self.blocks = BlockPool(self.cache, limit)
        # the panel form that batched int8 steps read, built now rather than at the first one
        self.panel_bytes = model.batch_panel_bytes() if hasattr(model, "batch_panel_bytes") else 0
        self.metrics = Metrics()
        self._cond = threading.Condition()
        self._waiting: deque[Handle] = deque()
        self._running: list[_Running] = []
        self._free_rows = list(range(c.max_batch))
        self._ids = itertools.count(1)
        self._stopping = False
        self.failure: str | None = None  # why the engine thread stopped, if it died
        self._thread = threading.Thread(target=self._run, name="anychip-engine", daemon=True)

    @property
    def cache_bytes(self) -> int:
        """Bytes the KV cache holds now."""
        return self.cache.nbytes

    @property
    def fixed_cache_bytes(self) -> int:
        """Bytes a cache of ``max_batch`` rows of ``max_len`` slots would reserve up front."""
        if self.blocks is None:
            return self.cache.nbytes
        return self.cache.block_bytes() * self.config.max_batch * self.config.max_len // self.config.block_size

    # ---- called from any thread ----------------------------------------------------------------

    def start(self) -> Engine:
        self._thread.start()
        return self

    def stop(self) -> None:
        with self._cond:
            self._stopping = True
            self._cond.notify()
        self._thread.join()

    def wake(self) -> None:
        with self._cond:
            self._cond.notify()

    def submit(self, prompt: list[int], params: SamplingParams, on_event: Callable[[Event], None]) -> Handle:
        """Queues a request; raises ValueError (bad parameters), RequestTooLong or EngineBusy
        before anything runs."""
        params.validate()
        if not prompt:
            raise ValueError("the prompt has no tokens")
        vocab = self.model.config.vocab_size
        if min(prompt) < 0 or max(prompt) >= vocab:
            raise ValueError(f"the prompt has token ids outside the vocabulary [0, {vocab})")
        handle = Handle(next(self._ids), list(prompt), params, on_event, _engine=self)
        if handle.reserved > self.config.max_len:
            raise RequestTooLong(f"the prompt ({len(prompt)} tokens) plus max_tokens ({params.max_new_tokens}) is "
                                 f"{handle.reserved} tokens; this server holds at most {self.config.max_len} per "
                                 "request")
        with self._cond:
            if self._stopping:
                raise EngineBusy("the server is shutting down")
            if self.failure is not None:
                raise EngineBusy(f"the engine has stopped: {self.failure}")
            if len(self._waiting) >= self.config.max_queue:
                raise EngineBusy(f"{len(self._waiting)} requests are already waiting; retry later")
            self._waiting.append(handle)
            self._cond.notify()
        return handle

    @property
    def alive(self) -> bool:
        """Whether the engine thread is serving (started, not stopped, not dead)."""
        return self._thread.is_alive() and self.failure is None and not self._stopping

    def snapshot(self) -> dict:
        """Gauges for /metrics and /health."""
        with self._cond:
            gauges = {"queue_depth": sum(not h.cancelled for h in self._waiting), "running": len(self._running),
                      "reserved_tokens": sum(r.handle.reserved for r in self._running),
                      "kv_cache_bytes": self.cache_bytes, "kv_cache_fixed_bytes": self.fixed_cache_bytes,
                      "weight_panel_bytes": self.panel_bytes}
            if self.blocks is not None:
                gauges.update(kv_blocks=self.cache.blocks, kv_blocks_limit=self.blocks.limit,
                              kv_blocks_in_use=self.blocks.in_use, kv_blocks_cached=self.blocks.cached_idle,
                              kv_block_size=self.config.block_size)
            return gauges

    # ---- the engine thread ---------------------------------------------------------------------

    def _run(self) -> None:
        """The thread's body: if the loop itself ever fails, the engine says so (/health) and
        fails every request it holds instead of leaving them waiting forever."""
        try:
            self._loop()
        except BaseException as e:
            self.failure = f"{type(e).__name__}: {e}"
            print(f"anychip serve: the engine stopped: {self.failure}", file=sys.stderr)
            with self._cond:
                waiting, self._waiting = list(self._waiting), deque()
            for handle in waiting:
                self._count("error")
                _notify(handle, Event("error", error=f"the engine stopped: {self.failure}"))
            for request in list(self._running):
                self._finish(request, error=f"the engine stopped: {self.failure}")

    def _loop(self) -> None:
        with paddle.no_grad():
            while True:
                with self._cond:
                    while not (self._stopping or self._waiting or self._running):
                        self._cond.wait()
                    if self._stopping:
                        break
                    admitted = self._admit()
                try:
                    for group in self._prefill_groups(self._join(admitted)):
                        self._prefill(group)
                    self._drop_cancelled()
                    if self._running:
                        self._decode()
                except Exception as e:  # a kernel failure ends the batch, not the server
                    print(f"anychip serve: step failed: {e}", file=sys.stderr)
                    for request in list(self._running):
                        self._finish(request, error=f"generation failed on {self.model.device[0]}: {e}")
        for request in list(self._running):
            self._finish(request, error="the server is shutting down")

    def _admit(self) -> list[_Running]:
        """Under the lock: waiting requests (in order) that a free row and the budget take."""
        admitted = []
        reserved = sum(r.handle.reserved for r in self._running)
        blocks = sum(r.blocks for r in self._running)
        while self._waiting and self._free_rows:
            handle = self._waiting[0]
            if handle.cancelled:
                self._waiting.popleft()
                self._count("cancelled")
                continue
            need = 0 if self.blocks is None else self.blocks.blocks_for(handle.reserved)
            if reserved + handle.reserved > self.config.budget or (self.blocks and blocks + need > self.blocks.limit):
                break
            self._waiting.popleft()
            try:
                request = _Running(handle, self._free_rows[0], self.tokenizer)
            except Exception as e:  # one request's set-up fails that request alone
                self._count("error")
                _notify(handle, Event("error", error=f"the request could not start: {e}"))
                continue
            self._free_rows.pop(0)
            if self.blocks is not None:
                request.blocks = need
                self._take_blocks(request)
            reserved += handle.reserved
            blocks += need
            self._running.append(request)
            admitted.append(request)
        return admitted

    def _take_blocks(self, request: _Running) -> None:
        """The blocks of ``request``'s prompt: the cached whole blocks of the longest run of its
        prompt's whole blocks, then its own, the first of them to be a copy of the cached block
        that agrees with the prompt's next tokens, if one does (at least one prompt token is
        left to prefill, for the logits). Its prompt blocks are offered to later requests at
        once: one admitted in this step with the same prompt (the n choices of one request)
        prefills after it."""
        pool, prompt = self.blocks, request.handle.prompt
        match = Match([])
        if self.config.prefix_cache and request.handle.params.prompt_logprobs is None:
            match = pool.match(prompt)
        request.start = len(match.shared) * pool.size + match.copied
        request.copy = match if match.source is not None else None
        own = [pool.allocate() for _ in range(pool.blocks_for(len(prompt)) - len(match.shared))]
        request.table = match.shared + own
        self.cache.set_table(request.row, request.table)
        # resuming after cached blocks with little left: it joins the decode batch, feeding the
        # rest a step at a time, and offers its blocks only once it has written them (_decode)
        rest = len(prompt) - request.start
        request.feeding = rest if request.start > 0 and rest <= self.config.join_tokens else 0
        if self.config.prefix_cache and not request.feeding:
            pool.register(prompt, request.table)

    def _join(self, admitted: list[_Running]) -> list[_Running]:
        """Counts the admitted requests that join the decode batch feeding (see _take_blocks);
        returns the others, to prefill."""
        for request in admitted:
            if request.feeding:
                self.metrics.prompt_tokens += len(request.handle.prompt)
                self.metrics.prefix_hit_tokens += request.start
        return [r for r in admitted if not r.feeding]

    def _copy_prefix(self, request: _Running) -> None:
        """Copies the part of a cached block that ``request``'s prompt agrees with into its first
        own block, once, before anything writes that block."""
        if request.copy is not None:
            match, request.copy = request.copy, None
            self.model.copy_block(self.cache, match.source, request.table[len(match.shared)])
            self.blocks.copied(match)

    def _tensor(self, array):
        return paddle.to_tensor(array, place=place(self.model.device))

    def _prefill_groups(self, admitted: list[_Running]) -> list[list[_Running]]:
        """The admitted requests in passes of at most ``prefill_tokens`` padded tokens (a prompt
        longer than that goes alone, as does one that wants its prompt's log-probabilities: its
        pass returns every position's logits)."""
        def alone(r):  # a prompt resuming after a cached prefix, or wanting every position's logits
            return r.start > 0 or r.handle.params.prompt_logprobs is not None

        # those resuming after cached blocks go last: another request of this step may fill them
        groups = [[r] for r in admitted if alone(r) and r.start == 0]
        resuming = [[r] for r in admitted if r.start > 0]
        group = []
        for request in sorted((r for r in admitted if not alone(r)), key=lambda r: len(r.handle.prompt)):
            width = len(request.handle.prompt)  # sorted: the longest so far
            if group and (len(group) + 1) * width > self.config.prefill_tokens:
                groups.append(group)
                group = []
            group.append(request)
        return groups + ([group] if group else []) + resuming

    def _prefill(self, group: list[_Running]) -> None:
        lengths = [len(r.handle.prompt) for r in group]
        width = max(lengths)
        ids = np.zeros((len(group), width), dtype=np.int64)  # right-padded: causal attention never
        for i, r in enumerate(group):                       # lets a real token see the padding
            ids[i, :lengths[i]] = r.handle.prompt
        positions = np.broadcast_to(np.arange(width, dtype=np.int64), ids.shape).copy()
        start = time.perf_counter()
        wanted = group[0].handle.params.prompt_logprobs  # such a request is prefilled alone
        cached = group[0].start  # likewise a request resuming after cached blocks
        self._copy_prefix(group[0])  # ... and the part of one that it copies
        if cached:
            rest = np.asarray(group[0].handle.prompt[cached:], dtype=np.int64)[None]
            logits = self.model(self._tensor(rest), self._tensor(np.arange(cached, cached + rest.shape[1])[None]),
                                self.cache, start=cached, last_index=self._tensor(np.array([rest.shape[1] - 1])),
                                cache_rows=[group[0].row]).numpy()
            self.metrics.prefix_hit_tokens += cached
        elif wanted is not None:
            every = self.model(self._tensor(ids), self._tensor(positions), self.cache,
                               cache_rows=[group[0].row]).numpy()[0]
            prompt = group[0].handle.prompt
            group[0].seq.out.prompt_logprobs = [token_logprob(every[i - 1], prompt[i], wanted)
                                                for i in range(1, len(prompt))]
            logits = every[-1:]
        else:
            logits = self.model(self._tensor(ids), self._tensor(positions), self.cache,
                                last_index=self._tensor(np.array(lengths, dtype=np.int64) - 1),
                                cache_rows=[r.row for r in group]).numpy()
        self.metrics.prefill_s += time.perf_counter() - start
        self.metrics.prompt_tokens += sum(lengths)
        for request, row in zip(group, logits):
            self._take_or_fail(request, row)

    def _decode(self) -> None:
        batch = list(self._running)
        if self.blocks is not None:  # a block for each token that starts one
            for r in batch:
                self._copy_prefix(r)
                if r.position >= len(r.table) * self.blocks.size:
                    r.table.append(self.blocks.allocate())
                    self.cache.set_table(r.row, r.table)
        tokens = np.array([r.token for r in batch], dtype=np.int64)
        positions = np.array([r.position for r in batch], dtype=np.int64)
        start = time.perf_counter()
        logits = self.model.decode(self._tensor(tokens), self._tensor(positions), self.cache, fused=self.fused,
                                   cache_rows=[r.row for r in batch]).numpy()
        self.metrics.decode_s += time.perf_counter() - start
        self.metrics.decode_steps += 1
        self.metrics.recent.append((time.perf_counter(), len(batch)))
        for request, row in zip(batch, logits):
            if request.feeding:  # it fed a prompt token: its logits matter after the last one
                request.feeding -= 1
                if request.feeding:
                    continue
                if self.config.prefix_cache:  # written now
                    self.blocks.register(request.handle.prompt, request.table)
            self._take_or_fail(request, row)

    def _take_or_fail(self, request: _Running, logits: np.ndarray) -> None:
        """:meth:`_take`, where a failure (sampling, detokenizing, the client's callback) ends
        that request alone; the batch goes on."""
        try:
            self._take(request, logits)
        except Exception as e:
            print(f"anychip serve: request {request.handle.id} failed: {e}", file=sys.stderr)
            if request in self._running:
                self._finish(request, error=f"generation failed: {e}")

    def _take(self, request: _Running, logits: np.ndarray) -> None:
        """Samples the request's next token from its logits and passes on what became final."""
        seq, handle = request.seq, request.handle
        token = sample(logits, handle.params, request.rng, seq.prompt + seq.out.tokens)
        if handle.first_token is None:
            handle.first_token = time.perf_counter()
            ttft = handle.first_token - handle.submitted
            self.metrics.ttft_sum += ttft
            self.metrics.ttft_count += 1
            for bound in self.metrics.ttft_buckets:
                self.metrics.ttft_buckets[bound] += ttft <= bound
        before = len(seq.out.tokens)
        seq.add(token)
        self.metrics.completion_tokens += len(seq.out.tokens) - before
        if handle.params.logprobs is not None and len(seq.out.tokens) > before:
            entry = token_logprob(logits, token, handle.params.logprobs)
            seq.out.logprobs.append(entry)
            request.unsent.append(entry)
        if (piece := seq.new_text()) and not handle.cancelled:
            first = not request.texts_sent
            handle.on_event(Event("text", text=piece, logprobs=request.unsent,
                                  prompt_logprobs=seq.out.prompt_logprobs if first else None))
            request.unsent, request.texts_sent = [], True
        if seq.done:
            self._finish(request)

    def _drop_cancelled(self) -> None:
        for request in [r for r in self._running if r.handle.cancelled]:
            self._finish(request, cancelled=True)

    def _finish(self, request: _Running, error: str = "", cancelled: bool = False) -> None:
        with self._cond:
            self._running.remove(request)
            self._free_rows.append(request.row)
            if self.blocks is not None:  # a failed request's blocks may hold a partial prefill
                if request.copy is not None:
                    self.blocks.copied(request.copy)
                self.blocks.release(request.table, keep=not error)
                self.cache.set_table(request.row, [])
        handle = request.handle
        if error:
            self._count("error")
            _notify(handle, Event("error", error=error))
        elif cancelled:
            self._count("cancelled")
        else:
            self._count(request.seq.out.finish_reason)
            _notify(handle, Event("done", completion=request.seq.out, logprobs=request.unsent))

    def _count(self, outcome: str) -> None:
        self.metrics.requests[outcome] = self.metrics.requests.get(outcome, 0) + 1
