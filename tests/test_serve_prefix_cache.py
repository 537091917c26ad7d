"""The paged KV cache and prefix caching: a request's prompt blocks stay cached after it leaves,
and a later request whose prompt starts with the same tokens shares the whole blocks, copies the
part of the next block it agrees with, and prefills only the rest, getting the tokens it gets
without the cache; blocks are reclaimed least recently
used first under memory pressure; /metrics counts the reused tokens and the cache's blocks and
bytes, which follow the tokens held rather than max-batch x max-len."""

from __future__ import annotations

import threading

import numpy as np
import pytest


@pytest.fixture(scope="module")
def long_base(tmp_path_factory):
    from anychip_models.loader import load_checkpoint
    from loader_helpers import random_weights, tiny_config, train_tokenizer, write_hf_folder

    tok = train_tokenizer()
    config = tiny_config(tok, max_position=2048)
    return load_checkpoint(write_hf_folder(tmp_path_factory.mktemp("long") / "model", config,
                                           random_weights(config), tok))


def run(engine, prompts: list[list[int]], max_new_tokens: int = 12) -> list:
    """Each prompt's completion, one request after the other (each may reuse the last's row)."""
    from anychip_models.sampling import SamplingParams

    engine.start()
    out = []
    try:
        for prompt in prompts:
            done, events = threading.Event(), []

            def collect(event, events=events, done=done):
                events.append(event)
                if event.kind != "text":
                    done.set()

            engine.submit(prompt, SamplingParams(max_new_tokens=max_new_tokens, ignore_eos=True), collect)
            assert done.wait(120)
            assert events[-1].kind == "done", events[-1].error
            out.append(events[-1].completion)
    finally:
        engine.stop()
    return out


def common(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def expected_hits(prompts: list[list[int]]) -> int:
    """Prompt tokens served from cached blocks when the prompts run one after the other and
    every earlier prompt's blocks are still cached: each shares the longest prefix any earlier
    prompt has in common with it (whole blocks by reference, the rest of a block by a copy),
    leaving its last token to prefill."""
    return sum(min(max([common(q, p) for q in prompts[:i]], default=0), len(p) - 1) for i, p in enumerate(prompts))


def test_a_shared_prefix_is_prefilled_once_and_answers_do_not_change(long_base):
    from anychip_models.llama import LlamaForCausalLM
    from anychip_models.serving.engine import Engine, EngineConfig

    tok = long_base.tokenizer
    system = tok.encode("You are a careful assistant. " * 20)  # a few hundred tokens shared
    prompts = [system + tok.encode(q) for q in (" What jumps?", " Say hello.", " Count from one.")]
    prompts.append(prompts[2][:len(system) + 2])  # a prompt that is a prefix of the one before
    model = LlamaForCausalLM(long_base, ("cpu", 0))
    cached_engine = Engine(model, tok, EngineConfig(max_batch=2, max_len=1024))
    cached = run(cached_engine, prompts)
    plain = run(Engine(model, tok, EngineConfig(max_batch=2, max_len=1024, prefix_cache=False)), prompts)
    assert [c.tokens for c in cached] == [c.tokens for c in plain]
    want = expected_hits(prompts)
    assert want >= 3 * len(system)
    assert cached_engine.metrics.prefix_hit_tokens == want
    assert cached_engine.metrics.prompt_tokens == sum(len(p) for p in prompts)


def test_every_earlier_prompts_blocks_stay_cached(long_base):
    """Two prompts in turn, then each extended: each finds its own blocks, not only the last
    request's."""
    from anychip_models.llama import LlamaForCausalLM
    from anychip_models.serving.engine import Engine, EngineConfig

    tok = long_base.tokenizer
    a, b = tok.encode("first topic, " * 10), tok.encode("second matter; " * 10)
    engine = Engine(LlamaForCausalLM(long_base, ("cpu", 0)), tok, EngineConfig(max_batch=2, max_len=512, block_size=4))
    prompts = [a, b, a + tok.encode(" more"), b + tok.encode(" more")]
    run(engine, prompts)
    assert engine.metrics.prefix_hit_tokens == expected_hits(prompts) == len(a) + len(b)


def test_a_prompt_diverging_inside_a_block_copies_the_part_it_shares(long_base):
    """A prompt diverging from a cached one inside block k shares blocks 0 .. k-1, copies block
    k into a block of its own, and prefills from where they differ, leaving the cached block as
    it was (the third request, the first again, finds it intact)."""
    from anychip_models.llama import LlamaForCausalLM
    from anychip_models.serving.engine import Engine, EngineConfig

    tok = long_base.tokenizer
    first = tok.encode("alpha beta gamma delta epsilon zeta eta theta")
    second = first[:6] + tok.encode(" omega omega omega")
    config = dict(max_batch=1, max_len=256, block_size=4)
    engine = Engine(LlamaForCausalLM(long_base, ("cpu", 0)), tok, EngineConfig(**config))
    got = run(engine, [first, second, first])
    assert engine.metrics.prefix_hit_tokens == expected_hits([first, second, first]) == 6 + len(first) - 1
    fresh = run(Engine(LlamaForCausalLM(long_base, ("cpu", 0)), tok, EngineConfig(**config, prefix_cache=False)),
                [first, second, first])
    assert [c.tokens for c in got] == [c.tokens for c in fresh]


def test_cached_blocks_are_reclaimed_under_memory_pressure(long_base):
    """With room for one request's blocks, each new prompt reclaims the cached blocks of the
    last (least recently released first) and answers as without the cache."""
    from anychip_models.llama import LlamaForCausalLM
    from anychip_models.serving.engine import Engine, EngineConfig

    tok = long_base.tokenizer
    prompts = [tok.encode(f"topic {w} " * 4) for w in ("one", "two", "three")]
    prompts.append(prompts[0])  # its blocks were reclaimed by now
    config = dict(max_batch=1, max_len=64, block_size=8, initial_blocks=1)
    engine = Engine(LlamaForCausalLM(long_base, ("cpu", 0)), tok, EngineConfig(**config))
    got = run(engine, prompts, max_new_tokens=6)
    assert engine.cache.blocks == engine.blocks.limit == 8  # grown from 1, never past the limit
    fresh = run(Engine(LlamaForCausalLM(long_base, ("cpu", 0)), tok, EngineConfig(**config, prefix_cache=False)),
                prompts, max_new_tokens=6)
    assert [c.tokens for c in got] == [c.tokens for c in fresh]
    assert engine.metrics.prefix_hit_tokens < expected_hits(prompts)


def test_the_cache_holds_what_requests_fill_not_every_row(long_base):
    """Room for 64 requests of 2,048 tokens, 16 short ones held: the pool is a small share of
    what a cache of 64 x 2,048 slots reserves, and /metrics says both."""
    from anychip_models.llama import LlamaForCausalLM
    from anychip_models.sampling import SamplingParams
    from anychip_models.serving.engine import Engine, EngineConfig

    tok = long_base.tokenizer
    engine = Engine(LlamaForCausalLM(long_base, ("cpu", 0)), tok, EngineConfig(max_batch=64, max_len=2048))
    assert engine.fixed_cache_bytes == 64 * 2048 * engine.cache.block_bytes() // 32
    held = threading.Event()
    seen = []

    def hold(event):  # every request stays in the batch until all 16 decode together
        if event.kind == "text":
            seen.append(engine.snapshot())
            if engine.snapshot()["running"] == 16:
                held.set()

    for i in range(16):
        engine.submit(tok.encode(f"request number {i}: tell me something"), SamplingParams(max_new_tokens=40,
                                                                                          ignore_eos=True), hold)
    engine.start()
    try:
        assert held.wait(120)
        now = engine.snapshot()
    finally:
        engine.stop()
    assert now["running"] == 16 and now["kv_blocks_in_use"] >= 16
    assert now["kv_cache_bytes"] <= now["kv_cache_fixed_bytes"] / 32, now


def test_metrics_report_the_hit_rate(long_base):
    from starlette.testclient import TestClient

    from anychip_models.llama import LlamaForCausalLM
    from anychip_models.serving.engine import Engine, EngineConfig
    from anychip_models.serving.server import ServedModel, create_app

    engine = Engine(LlamaForCausalLM(long_base, ("cpu", 0)), long_base.tokenizer, EngineConfig(max_batch=1, max_len=512))
    app = create_app(engine.start(), ServedModel("model", set(), "cpu:0", False, "native"))
    try:
        with TestClient(app, base_url="http://127.0.0.1") as http:
            body = {"prompt": "The same long prompt, word for word, " * 8, "max_tokens": 2, "temperature": 0}
            for _ in range(2):
                assert http.post("/v1/completions", json=body).status_code == 200
            text = http.get("/metrics").text
    finally:
        engine.stop()
    values = {line.split()[0]: float(line.split()[1]) for line in text.splitlines() if line and not line.startswith("#")}
    hits, prompt = values["anychip_prefix_cache_hit_tokens_total"], values["anychip_prompt_tokens_total"]
    n = int(prompt) // 2
    assert hits == n - 1  # the second request prefilled its last token only
    np.testing.assert_allclose(values["anychip_prefix_cache_hit_rate"], hits / prompt, atol=1e-4)
    blocks = {k: v for k, v in values.items() if k.startswith("anychip_kv_cache_blocks")}
    assert blocks['anychip_kv_cache_blocks{state="in_use"}'] == 0  # both left
    assert blocks['anychip_kv_cache_blocks{state="cached_idle"}'] >= -(-n // 32)  # at least the prompt's blocks
    assert 0 < values["anychip_kv_cache_bytes"] <= values["anychip_kv_cache_fixed_bytes"]


def test_requests_admitted_together_share_the_blocks_of_the_first(long_base):
    """The n choices of one prompt (or any requests sharing a prefix, arriving together): the
    first is prefilled, the others share its whole prompt blocks and prefill the rest after it,
    then go their own way; their tokens are those of an engine without the cache."""
    from anychip_models.llama import LlamaForCausalLM
    from anychip_models.sampling import SamplingParams
    from anychip_models.serving.engine import Engine, EngineConfig

    tok = long_base.tokenizer
    prompt = tok.encode("A shared prompt for every choice, long enough to matter. " * 4)

    def choices(cache: bool):
        engine = Engine(LlamaForCausalLM(long_base, ("cpu", 0)), tok,
                        EngineConfig(max_batch=4, max_len=512, prefix_cache=cache))
        done = [threading.Event() for _ in range(3)]
        out = [None] * 3
        for i in range(3):  # submitted before the engine starts: admitted in one step
            def collect(event, i=i):
                if event.kind != "text":
                    out[i] = event.completion.tokens
                    done[i].set()

            engine.submit(prompt, SamplingParams(max_new_tokens=10, temperature=1.0, seed=11 + i), collect)
        engine.start()
        try:
            assert all(d.wait(120) for d in done)
        finally:
            engine.stop()
        return out, engine.metrics.prefix_hit_tokens

    shared, hits = choices(True)
    alone, none = choices(False)
    assert shared == alone and none == 0
    assert hits == expected_hits([prompt] * 3) == 2 * (len(prompt) - 1)


@pytest.mark.parametrize("device", ["npu", "xpu"])
def test_paged_blocks_are_read_and_written_on_a_simulated_chip_without_fallback(long_base, device):
    """Prefill writing blocks, a resumed prefill reading shared ones, the fused step reading
    block tables: all on the chip, no CPU fallback, the cpu engine's tokens."""
    import anychip
    from anychip_models.llama import LlamaForCausalLM
    from anychip_models.serving.engine import Engine, EngineConfig

    tok = long_base.tokenizer
    system = tok.encode("Shared instructions for every request. " * 3)
    prompts = [system + tok.encode(q) for q in (" One?", " Two?", " Three?")]
    config = dict(max_batch=2, max_len=256, block_size=16)
    want = run(Engine(LlamaForCausalLM(long_base, ("cpu", 0)), tok, EngineConfig(**config)), prompts)
    anychip.reset_fallbacks()
    engine = Engine(LlamaForCausalLM(long_base, (device, 0)), tok, EngineConfig(**config))
    got = run(engine, prompts)
    assert [c.tokens for c in got] == [c.tokens for c in want]
    assert engine.metrics.prefix_hit_tokens == expected_hits(prompts) > 0
    assert not {k: v for k, v in anychip.fallback_counts().items() if k[0].startswith(device)}


def test_a_prompt_cached_but_for_its_last_tokens_joins_the_decode_batch(long_base):
    """A request whose prompt the cache holds but for at most ``join_tokens`` tokens runs no
    prefill pass: it joins the decode batch and feeds those tokens one a step, getting the tokens
    it gets without the cache. Another request admitted in the same step never reads the blocks
    such a request is still writing (it offers them only once fed); a longer rest is prefilled."""
    from anychip_models.llama import LlamaForCausalLM
    from anychip_models.sampling import SamplingParams
    from anychip_models.serving.engine import Engine, EngineConfig

    tok = long_base.tokenizer
    first = tok.encode("one prompt that every later request starts with, word for word")
    more = tok.encode(" and then some more words at its end")
    together = [first, first + more[:3], first + more[:4], first + more[:3]]  # rests 1, 3, 4, 3
    other = tok.encode(" whereas this one goes elsewhere entirely")[:6]
    assert len(other) == 6 and other[0] != more[0]
    config = dict(max_batch=4, max_len=256, block_size=4)

    def serve(cache: bool) -> tuple[list[list[int]], list[float], int]:
        engine = Engine(LlamaForCausalLM(long_base, ("cpu", 0)), tok, EngineConfig(**config, prefix_cache=cache))
        out, prefill = [], []

        def phase(prompts):
            done = [threading.Event() for _ in prompts]
            got = [None] * len(prompts)
            with engine._cond:  # held while submitting: the engine admits them in one step
                for i, prompt in enumerate(prompts):
                    def collect(event, i=i):
                        if event.kind != "text":
                            got[i] = event
                            done[i].set()

                    engine.submit(prompt, SamplingParams(max_new_tokens=8, ignore_eos=True), collect)
            assert all(d.wait(120) for d in done)
            assert all(e.kind == "done" for e in got), [e.error for e in got]
            out.extend(e.completion.tokens for e in got)
            prefill.append(engine.metrics.prefill_s)

        engine.start()
        try:
            phase([first])
            phase(together)
            phase([first + other])  # a rest of 6: a prefill pass of its own
        finally:
            engine.stop()
        return out, prefill, engine.metrics.prefix_hit_tokens

    cached, prefill, hits = serve(True)
    plain, _, _ = serve(False)
    assert cached == plain
    assert prefill[1] == prefill[0] > 0  # the joiners ran no prefill pass
    assert prefill[2] > prefill[1]
    # every later request resumes after `first` (the last of the four, not after the second's
    # blocks: it offers them once fed, a step later than this one's admission)
    assert hits == (len(first) - 1) + 4 * len(first)
