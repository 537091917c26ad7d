"""Prefix caching: a free cache row keeps its prompt's keys and values, and a later request that
shares a prefix with that prompt prefills only the rest, in that row, with the tokens it gets
without the cache; /metrics counts the reused tokens."""

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


def test_a_shared_prefix_is_prefilled_once_and_answers_do_not_change(long_base):
    from anychip_models.llama import LlamaForCausalLM
    from anychip_models.serving.engine import Engine, EngineConfig

    tok = long_base.tokenizer
    system = tok.encode("You are a careful assistant. " * 20)  # a few hundred tokens shared
    prompts = [system + tok.encode(q) for q in (" What jumps?", " Say hello.", " Count from one.")]
    prompts.append(prompts[2][:len(system) + 2])  # a prompt that is a prefix of the one before
    model = LlamaForCausalLM(long_base, ("cpu", 0))
    cached_engine = Engine(model, tok, EngineConfig(max_batch=1, max_len=1024))
    cached = run(cached_engine, prompts)
    plain = run(Engine(model, tok, EngineConfig(max_batch=1, max_len=1024, prefix_cache=False)), prompts)
    assert [c.tokens for c in cached] == [c.tokens for c in plain]
    # one row: each request reuses what it shares with the one before (at least its last token prefilled)
    want = sum(min(common(a, b), len(b) - 1) for a, b in zip(prompts, prompts[1:]))
    assert want >= 3 * len(system) - 1
    assert cached_engine.metrics.prefix_hit_tokens == want
    assert cached_engine.metrics.prompt_tokens == sum(len(p) for p in prompts)


def test_the_free_row_sharing_the_longest_prefix_is_chosen(long_base):
    from anychip_models.llama import LlamaForCausalLM
    from anychip_models.serving.engine import Engine, EngineConfig

    tok = long_base.tokenizer
    a, b = tok.encode("first topic, " * 10), tok.encode("second matter; " * 10)
    engine = Engine(LlamaForCausalLM(long_base, ("cpu", 0)), tok, EngineConfig(max_batch=2, max_len=512))
    run(engine, [a, b, a + tok.encode(" more"), b + tok.encode(" more")])
    assert engine.metrics.prefix_hit_tokens == len(a) + len(b)  # each found in its own row, not the last used


def test_a_row_is_reused_only_for_what_it_holds(long_base):
    """A prompt diverging from the row's at token k reuses k tokens, then overwrites the rest."""
    from anychip_models.llama import LlamaForCausalLM
    from anychip_models.serving.engine import Engine, EngineConfig

    tok = long_base.tokenizer
    first = tok.encode("alpha beta gamma delta epsilon zeta eta theta")
    second = first[:4] + tok.encode(" omega omega omega")
    engine = Engine(LlamaForCausalLM(long_base, ("cpu", 0)), tok, EngineConfig(max_batch=1, max_len=256))
    got = run(engine, [first, second, first])
    assert engine.metrics.prefix_hit_tokens == 4 + 4  # second: first's 4; third: second's first 4 again
    fresh = run(Engine(LlamaForCausalLM(long_base, ("cpu", 0)), tok,
                       EngineConfig(max_batch=1, max_len=256, prefix_cache=False)), [first, second, first])
    assert [c.tokens for c in got] == [c.tokens for c in fresh]


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
    assert hits == prompt / 2 - 1  # the second request prefilled its last token only
    np.testing.assert_allclose(values["anychip_prefix_cache_hit_rate"], hits / prompt, atol=1e-4)


def test_requests_admitted_together_copy_a_shared_prompt_from_the_first(long_base):
    """The n choices of one prompt (or any requests sharing a prefix, arriving together): the
    first is prefilled, the others copy its keys and values into their own rows, then go their
    own way; their tokens are those of an engine without the cache."""
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
    assert hits == 2 * (len(prompt) - 1)
