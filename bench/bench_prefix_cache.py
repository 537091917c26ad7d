"""Prefix caching in `anychip serve`'s engine: the time to first token of a chat request after a
1,000-token system prompt, when the prompt is new (the whole prompt prefilled) and when the paged
cache's blocks still hold the system prompt's whole blocks from the request before (only the rest
prefilled: the question and the system prompt's last partial block).
SmolLM2-135M-Instruct on `cpu`, greedy, one request at a time, the engine in process (no HTTP).
Target: the cached request's TTFT at most 0.25x the first's. The tokens of both are checked
against an engine without the cache.
"""

from __future__ import annotations

import threading
import time

import pytest

from benchlib import Case, FasterThan

SYSTEM_TOKENS = 1000
QUESTIONS = ["What is the capital of France?", "Name three colors.", "Count to five.", "Say hello.",
             "Why is the sky blue?", "What is 2 + 2?"]


@pytest.fixture(scope="module")
def served(pd):
    from anychip_models.loader import load_checkpoint
    from anychip_models.hub import resolve
    from anychip_models.llama import LlamaForCausalLM

    ckpt = load_checkpoint(resolve("smollm2"))
    tok = ckpt.tokenizer
    words = ("anychip serves language models on any device, simulated or real, through one plugin "
             "interface; ").split()
    text = ""
    while len(tok.encode(text)) < SYSTEM_TOKENS:
        text += " ".join(words) + " "
    system = tok.encode(text)[:SYSTEM_TOKENS]
    system_text = tok.decode(system)
    prompts = []
    for q in QUESTIONS:
        chat = tok.apply_chat_template([{"role": "system", "content": system_text}, {"role": "user", "content": q}])
        prompts.append(tok.encode(chat))
    return LlamaForCausalLM(ckpt, ("cpu", 0)), tok, prompts


def ttft_and_tokens(engine, prompt, max_new_tokens: int = 8):
    from anychip_models.sampling import SamplingParams

    done, first, events = threading.Event(), [], []

    def collect(event):
        if not first:
            first.append(time.perf_counter())
        events.append(event)
        if event.kind != "text":
            done.set()

    started = time.perf_counter()
    engine.submit(prompt, SamplingParams(max_new_tokens=max_new_tokens, ignore_eos=True), collect)
    assert done.wait(300)
    assert events[-1].kind == "done", events[-1].error
    return first[0] - started, events[-1].completion.tokens


def case(config, prompt_tokens: int) -> Case:
    """FLOPs: the whole prompt's prefill matmuls (2 x weights x tokens); the cached request's row
    counts only the tokens it prefilled."""
    c = config
    layer = c.hidden_size * (c.num_heads + 2 * c.num_kv_heads) * c.head_dim + c.num_heads * c.head_dim * c.hidden_size \
        + 3 * c.hidden_size * c.intermediate_size
    flops = 2.0 * layer * c.num_layers * prompt_tokens
    return Case(f"serve TTFT, {prompt_tokens}-token chat prompt ({SYSTEM_TOKENS}-token system prompt)", "compute",
                flops, peak="fp32", targets=(FasterThan("first-request", 4.0, "the same request with nothing cached"),),
                note="the cached request prefills only what follows the system prompt; tokens checked equal")


@pytest.mark.parametrize("cache", ["first-request", "anychip"])
def test_prefix_cached_ttft(benchmark, bench, served, cache):
    from anychip_models.serving.engine import Engine, EngineConfig

    model, tok, prompts = served
    engine = Engine(model, tok, EngineConfig(max_batch=1, max_len=2048, prefix_cache=cache == "anychip")).start()
    reference = Engine(model, tok, EngineConfig(max_batch=1, max_len=2048, prefix_cache=False)).start()
    try:
        ttft_and_tokens(engine, prompts[-1])  # warm-up; with the cache, its blocks now hold the system prompt
        hits = engine.metrics.prefix_hit_tokens
        samples = []
        for prompt in prompts[:-1]:
            seconds, tokens = ttft_and_tokens(engine, prompt)
            assert tokens == ttft_and_tokens(reference, prompt)[1]
            samples.append(seconds)
        hits = engine.metrics.prefix_hit_tokens - hits
    finally:
        engine.stop()
        reference.stop()
    whole = case(model.config, len(prompts[0]))
    prefilled = len(prompts[0]) - hits / len(samples)
    label = "prefix cached (cached blocks hold the system prompt)" if cache == "anychip" else "nothing cached"
    bench.collector.record(whole, cache, samples, extra_info=benchmark.extra_info, label=label,
                           amount=whole.amount * prefilled / len(prompts[0]),
                           notes=f"median of {len(samples)} requests; {prefilled:.0f} tokens prefilled each")
