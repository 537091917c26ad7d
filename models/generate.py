"""Text generation: a batch of prompts of different lengths prefilled together into a KV cache
allocated once on the device, then decoded one token per sequence per step, with sampling,
EOS and stop strings, and text streamed out as it becomes final."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from .llama import LlamaForCausalLM, paddle
from .sampling import SamplingParams, TokenLogprob, sample
from anychip.ops.dispatch import place


@dataclass
class Completion:
    prompt_tokens: int
    tokens: list[int] = field(default_factory=list)
    text: str = ""
    finish_reason: str = ""  # "stop" (EOS or a stop string) or "length"
    logprobs: list[TokenLogprob] = field(default_factory=list)         # one per token, when asked for
    prompt_logprobs: list[TokenLogprob] = field(default_factory=list)  # prompt tokens 1.. (echo)


@dataclass
class GenerationStats:
    prefill_tokens: int = 0
    prefill_s: float = 0.0
    decode_tokens: int = 0
    decode_s: float = 0.0

    @property
    def prefill_tok_s(self) -> float:
        return self.prefill_tokens / self.prefill_s if self.prefill_s else 0.0

    @property
    def decode_tok_s(self) -> float:
        return self.decode_tokens / self.decode_s if self.decode_s else 0.0

    def as_dict(self) -> dict:
        return {"prefill_tokens": self.prefill_tokens, "prefill_s": round(self.prefill_s, 4),
                "prefill_tok_s": round(self.prefill_tok_s, 1), "decode_tokens": self.decode_tokens,
                "decode_s": round(self.decode_s, 4), "decode_tok_s": round(self.decode_tok_s, 1)}


class Sequence:
    """One prompt's progress: its tokens, its text (cut at a stop string) and what of it has been
    streamed; shared by batch generation and the server's engine."""

    def __init__(self, prompt: list[int], tokenizer, params: SamplingParams):
        self.prompt, self.tokenizer, self.params = prompt, tokenizer, params
        self.out = Completion(prompt_tokens=len(prompt))
        self.detokenizer = tokenizer.stream_decoder()  # text grows by whole characters only
        self.streamed = 0
        self.hold = max((len(s) for s in params.stop), default=1) - 1

    @property
    def done(self) -> bool:
        return bool(self.out.finish_reason)

    def add(self, token: int) -> None:
        """Appends ``token`` and decides whether the sequence has ended."""
        if not self.params.ignore_eos and token in self.tokenizer.eos_ids:
            self.out.finish_reason = "stop"
            return
        self.out.tokens.append(token)
        piece = self.detokenizer.feed(token)
        self.out.text += piece
        since = max(0, len(self.out.text) - len(piece) - self.hold)  # a stop string can only end in the piece
        stop_at = min((i for i in (self.out.text.find(s, since) for s in self.params.stop) if i >= 0), default=-1)
        if stop_at >= 0:
            self.out.text = self.out.text[:stop_at]
            self.out.finish_reason = "stop"
        elif len(self.out.tokens) >= self.params.max_new_tokens:
            self.out.finish_reason = "length"

    def new_text(self) -> str:
        """Text that is final now: not a possible start of a stop string."""
        end = len(self.out.text)
        if not self.done:
            end -= self.hold
        piece = self.out.text[self.streamed:end] if end > self.streamed else ""
        self.streamed += len(piece)
        return piece


class Generator:
    """Generates with ``model`` (on its device) and ``tokenizer``. ``fused``: decode through the
    device's decoder_step kernel where it has one (else op by op, a counted fallback)."""

    def __init__(self, model: LlamaForCausalLM, tokenizer, fused: bool = True):
        self.model, self.tokenizer, self.fused = model, tokenizer, fused

    def generate(self, prompts: list[list[int]], params: SamplingParams,
                 on_text: Callable[[int, str], None] | None = None) -> tuple[list[Completion], GenerationStats]:
        """Completes every prompt (token ids). ``on_text(i, piece)`` receives prompt i's text as it
        becomes final, in order."""
        params.validate()
        if not prompts or any(len(p) == 0 for p in prompts):
            raise ValueError("every prompt needs at least one token")
        vocab = self.model.config.vocab_size
        for i, p in enumerate(prompts):
            if min(p) < 0 or max(p) >= vocab:
                raise ValueError(f"prompt {i} has token ids outside the vocabulary [0, {vocab})")
        device = self.model.device
        rng = np.random.default_rng(params.seed)
        seqs = [Sequence(p, self.tokenizer, params) for p in prompts]
        lengths = np.array([len(p) for p in prompts], dtype=np.int64)
        width = int(lengths.max())
        cache = self.model.new_cache(len(prompts), width + params.max_new_tokens)
        stats = GenerationStats(prefill_tokens=int(lengths.sum()))

        def to_dev(array):
            return paddle.to_tensor(array, place=place(device))

        def step(logits) -> np.ndarray:
            rows = logits.numpy()
            picked = np.array([sample(rows[i], params, rng, s.prompt + s.out.tokens) if not s.done else 0
                               for i, s in enumerate(seqs)], dtype=np.int64)
            for i, s in enumerate(seqs):
                if not s.done:
                    s.add(int(picked[i]))
                    if on_text is not None and (piece := s.new_text()):
                        on_text(i, piece)
            return picked

        with paddle.no_grad():
            start = time.perf_counter()
            tokens = np.zeros((len(prompts), width), dtype=np.int64)  # right-padded: causal attention
            for i, p in enumerate(prompts):                            # never lets a real token see padding
                tokens[i, :len(p)] = p
            positions = np.broadcast_to(np.arange(width, dtype=np.int64), tokens.shape).copy()
            logits = self.model(to_dev(tokens), to_dev(positions), cache, last_index=to_dev(lengths - 1))
            picked = step(logits)
            stats.prefill_s = time.perf_counter() - start
            start = time.perf_counter()
            for n in range(params.max_new_tokens - 1):
                if all(s.done for s in seqs):
                    break
                logits = self.model.decode(to_dev(picked), to_dev(lengths + n), cache, fused=self.fused)
                stats.decode_tokens += sum(not s.done for s in seqs)
                picked = step(logits)
            stats.decode_s = time.perf_counter() - start
        for i, s in enumerate(seqs):
            if not s.done:
                s.out.finish_reason = "length"
            if on_text is not None and (piece := s.new_text()):
                on_text(i, piece)
        return [s.out for s in seqs], stats
