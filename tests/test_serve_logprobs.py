"""OpenAI API completeness of `anychip serve`: ``logprobs``/``top_logprobs`` on chat and completions
(streamed too), ``echo`` with the prompt's log-probabilities, and ``n`` > 1, parsed by the official
client; every log-probability equals log-softmax of the model's own logits for the same tokens
(one full forward over prompt and completion), and lm-evaluation-harness scores a task through
the server (its vLLM-style tokenizer endpoints) as `anychip eval mc` does."""

from __future__ import annotations

import numpy as np
import pytest
from openai import OpenAI

from serve_helpers import Server


@pytest.fixture(scope="module")
def server(model_dir):
    with Server(model_dir, "cpu", "--max-batch", "8") as s:
        yield s


@pytest.fixture(scope="module")
def client(server):
    return OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)


def reference_logprobs(base, ids: list[int]) -> np.ndarray:
    """log p(ids[i] | ids[:i]) for i >= 1, from one forward of the whole sequence."""
    from anychip.ops.dispatch import place
    from anychip.frontends.paddle import import_paddle
    from anychip_models.llama import LlamaForCausalLM

    paddle = import_paddle()
    model = LlamaForCausalLM(base, ("cpu", 0))
    dev = place(("cpu", 0))
    with paddle.no_grad():
        logits = model(paddle.to_tensor(np.asarray([ids]), place=dev),
                       paddle.to_tensor(np.arange(len(ids))[None], place=dev)).numpy()[0].astype(np.float64)
    lp = logits - np.log(np.exp(logits - logits.max(-1, keepdims=True)).sum(-1, keepdims=True)) - logits.max(-1, keepdims=True)
    return np.array([lp[i - 1, ids[i]] for i in range(1, len(ids))])


def test_echo_gives_the_prompt_and_completion_log_probabilities_of_one_forward(client, base):
    prompt = "The capital of France is"
    reply = client.completions.create(model="model", prompt=prompt, max_tokens=6, temperature=0, logprobs=3,
                                      echo=True, extra_body={"ignore_eos": True})
    choice = reply.choices[0]
    ids = base.tokenizer.encode(prompt, add_bos=base.tokenizer.add_bos)
    lp = choice.logprobs
    assert choice.text.startswith(prompt)
    assert len(lp.tokens) == len(ids) + 6 and lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
    assert "".join(lp.tokens) == choice.text
    assert lp.text_offset == list(np.cumsum([0] + [len(t) for t in lp.tokens[:-1]]))
    generated = [max(top, key=top.get) for top in lp.top_logprobs[len(ids):]]
    assert generated == lp.tokens[len(ids):]  # greedy: the chosen token is the likeliest
    np.testing.assert_allclose(lp.token_logprobs[1:len(ids)], reference_logprobs(base, ids), atol=1e-4)


@pytest.mark.parametrize("n", [1, 2])
def test_echo_with_logprobs_streams_what_the_whole_reply_holds(client, n):
    """Streamed, each choice's first chunk is the echoed prompt with its log-probabilities (sent
    once its prefill gave them), then its tokens; joined, the same text and log-probabilities
    (text offsets included) as the reply that is not streamed."""
    body = dict(model="model", prompt="The capital of France is", max_tokens=5, temperature=0, logprobs=2, echo=True,
                n=n, extra_body={"ignore_eos": True})
    whole = client.completions.create(**body)
    texts, fields = {}, {}
    for chunk in client.completions.create(**body, stream=True):
        for choice in chunk.choices:
            texts[choice.index] = texts.get(choice.index, "") + (choice.text or "")
            if choice.logprobs is not None:
                got = fields.setdefault(choice.index, {"tokens": [], "token_logprobs": [], "text_offset": []})
                for key in got:
                    got[key] += getattr(choice.logprobs, key)
    for choice in whole.choices:
        assert texts[choice.index] == choice.text
        for key, value in fields[choice.index].items():
            want = getattr(choice.logprobs, key)
            if key == "token_logprobs":
                assert value[0] is None and want[0] is None
                np.testing.assert_allclose(value[1:], want[1:], atol=1e-6)
            else:
                assert value == want, key


def test_the_engines_log_probabilities_equal_one_forward_over_prompt_and_completion(base):
    """Prefill (the prompt's, through echo) and every decode step (the completion's), against
    log-softmax of one teacher-forced forward over the same tokens."""
    import threading

    from anychip_models.llama import LlamaForCausalLM
    from anychip_models.sampling import SamplingParams
    from anychip_models.serving.engine import Engine, EngineConfig

    engine = Engine(LlamaForCausalLM(base, ("cpu", 0)), base.tokenizer, EngineConfig(max_batch=2, max_len=64))
    prompt = base.tokenizer.encode("What jumps over the lazy dog?", add_bos=base.tokenizer.add_bos)
    done, events = threading.Event(), []

    def collect(event):
        events.append(event)
        if event.kind != "text":
            done.set()

    engine.submit(prompt, SamplingParams(max_new_tokens=10, temperature=0.7, seed=1, ignore_eos=True, logprobs=3,
                                         prompt_logprobs=3), collect)
    engine.start()
    try:
        assert done.wait(60)
    finally:
        engine.stop()
    c = events[-1].completion
    assert [e.token for e in c.logprobs] == c.tokens and [e.token for e in c.prompt_logprobs] == prompt[1:]
    assert sum(len(e.logprobs) for e in events) == len(c.tokens)  # each entry delivered once
    want = reference_logprobs(base, prompt + c.tokens)
    got = [e.logprob for e in c.prompt_logprobs + c.logprobs]
    np.testing.assert_allclose(got, want, atol=1e-4)
    for e in c.prompt_logprobs + c.logprobs:
        assert len(e.top) == 3 and e.top[0][1] >= e.top[1][1] >= e.top[2][1]
        assert e.logprob <= e.top[0][1] + 1e-12  # nothing is likelier than the likeliest


def test_chat_logprobs_streamed_and_not_agree_and_n_gives_several_choices(client):
    messages = [{"role": "user", "content": "Say hello."}]
    whole = client.chat.completions.create(model="model", messages=messages, max_tokens=8, temperature=0,
                                           logprobs=True, top_logprobs=2)
    content = whole.choices[0].logprobs.content
    assert len(content) == whole.usage.completion_tokens
    for entry in content:
        assert len(entry.top_logprobs) == 2 and entry.top_logprobs[0].logprob >= entry.top_logprobs[1].logprob
        assert entry.token == entry.top_logprobs[0].token and entry.logprob <= 0  # greedy
        assert bytes(entry.bytes).decode("utf-8", "replace") == entry.token
    streamed = []
    for chunk in client.chat.completions.create(model="model", messages=messages, max_tokens=8, temperature=0,
                                                logprobs=True, top_logprobs=2, stream=True):
        for choice in chunk.choices:
            if choice.logprobs is not None:
                streamed.extend(choice.logprobs.content)
    # the second request finds its prompt cached and feeds its last token through a decode step, not
    # a prefill pass: the same tokens, log-probabilities equal to float rounding
    assert [e.token for e in streamed] == [e.token for e in content]
    np.testing.assert_allclose([e.logprob for e in streamed], [e.logprob for e in content], atol=1e-4)
    three = client.chat.completions.create(model="model", messages=messages, max_tokens=8, temperature=0, n=3)
    assert [c.index for c in three.choices] == [0, 1, 2]
    assert len({c.message.content for c in three.choices}) == 1  # greedy: the same answer three times
    assert three.usage.completion_tokens == 3 * whole.usage.completion_tokens
    sampled = client.completions.create(model="model", prompt="The", max_tokens=8, temperature=1.0, n=4, seed=7)
    again = client.completions.create(model="model", prompt="The", max_tokens=8, temperature=1.0, n=4, seed=7)
    assert [c.text for c in sampled.choices] == [c.text for c in again.choices]  # each choice seeded from seed
    assert len({c.text for c in sampled.choices}) > 1


def test_n_streams_carry_each_choices_index(client):
    texts = {}
    for chunk in client.completions.create(model="model", prompt="Hello", max_tokens=6, temperature=0, n=2,
                                           stream=True):
        for choice in chunk.choices:
            texts[choice.index] = texts.get(choice.index, "") + (choice.text or "")
    assert sorted(texts) == [0, 1] and texts[0] == texts[1]


@pytest.mark.parametrize("path,body,param", [
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "top_logprobs": 2}, "top_logprobs"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "logprobs": True, "top_logprobs": 21},
     "top_logprobs"),
    ("/v1/completions", {"prompt": "hi", "logprobs": 6}, "logprobs"),
    ("/v1/completions", {"prompt": "hi", "n": 0}, "n"),
    ("/v1/completions", {"prompt": "hi", "echo": "yes"}, "echo"),
])
def test_bad_logprob_requests_are_refused_naming_the_field(server, path, body, param):
    import httpx

    reply = httpx.post(server.url + path, json={"max_tokens": 2, **body}, timeout=30)
    assert reply.status_code == 400, reply.text
    assert reply.json()["error"]["param"] == param


def test_lm_eval_scores_the_shipped_task_through_the_server_as_anychip_eval_does(model_dir, tmp_path):
    """lm-evaluation-harness itself (``lm_eval --model local-completions``, tokenizing through the
    server's vLLM-style /tokenize, behind --api-key) scores tests/data/lm_eval/anychip_mc.yaml
    against `anychip serve`: every choice's log-likelihood and the accuracy equal `anychip eval
    mc`'s on the same items."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    data = root / "tests" / "data" / "mc_items.jsonl"
    items = [json.loads(line) for line in data.read_text().splitlines() if line.strip()]
    with Server(model_dir, "cpu", "--api-key", "sesame") as s:
        args = (f"model=model,base_url={s.url}/v1/completions,tokenizer_backend=remote,auth_token=sesame,"
                "num_concurrent=1,max_retries=1")
        env = {**os.environ, "OPENAI_API_KEY": "sesame", "HF_DATASETS_CACHE": str(tmp_path / "hf"),
               "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
        run = subprocess.run([sys.executable, "-m", "lm_eval", "--model", "local-completions", "--model_args", args,
                              "--include_path", "tests/data/lm_eval", "--tasks", "anychip_mc", "--output_path",
                              str(tmp_path / "out"), "--log_samples"], cwd=root, env=env, capture_output=True,
                             text=True, timeout=600)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-4000:]
    results = json.loads(next((tmp_path / "out").rglob("results_*.json")).read_text())
    samples = [json.loads(line) for line in next((tmp_path / "out").rglob("samples_*.jsonl")).read_text().splitlines()]
    served = {sample["doc_id"]: [float(r[0]) for r in sample["filtered_resps"]] for sample in samples}
    own = subprocess.run([sys.executable, "-m", "anychip.cli.main", "eval", "mc", "--model", str(model_dir), "--data",
                          str(data), "--json"], capture_output=True, text=True, timeout=300)
    assert own.returncode == 0, own.stderr
    mine = json.loads(own.stdout)
    assert sorted(served) == list(range(len(items))) == list(range(mine["items"]))
    np.testing.assert_allclose(np.concatenate([served[i] for i in range(len(items))]),
                               np.concatenate(mine["logliks"]), atol=1e-3)
    assert results["results"]["anychip_mc"]["acc,none"] == mine["accuracy"]


def test_the_tokenizer_endpoints_answer_as_vllms(server, base):
    import httpx

    text = "The capital of France is"
    got = httpx.post(server.url + "/tokenize", json={"prompt": text, "add_special_tokens": False}, timeout=30).json()
    assert got["tokens"] == base.tokenizer.encode(text) and got["count"] == len(got["tokens"])
    back = httpx.post(server.url + "/detokenize", json={"tokens": got["tokens"]}, timeout=30).json()
    assert back["prompt"] == text
    info = httpx.get(server.url + "/tokenizer_info", timeout=30).json()
    assert info["eos_token"] == base.tokenizer.eos_token and info["model_max_length"] > 0
    chat = httpx.post(server.url + "/tokenize", json={"messages": [{"role": "user", "content": "hi"}]}, timeout=30)
    assert chat.status_code in (200, 400)  # 400 only for a model without a chat template, naming messages
    for body, param in (({"prompt": 5}, "prompt"), ({"tokens": [-1]}, "tokens"), ({"prompt": "a", "add_special_tokens": 2},
                                                                                   "add_special_tokens")):
        path = "/detokenize" if "tokens" in body else "/tokenize"
        reply = httpx.post(server.url + path, json=body, timeout=30)
        assert reply.status_code == 400 and reply.json()["error"]["param"] == param


def test_eval_mc_refuses_bad_items_naming_the_line(tmp_path, model_dir):
    import subprocess
    import sys

    bad = tmp_path / "items.jsonl"
    bad.write_text('{"context": "a", "choices": ["b", "c"], "answer": 0}\n{"context": "a", "choices": ["b"], "answer": 0}\n')
    run = subprocess.run([sys.executable, "-m", "anychip.cli.main", "eval", "mc", "--model", str(model_dir), "--data",
                          str(bad)], capture_output=True, text=True, timeout=120)
    assert run.returncode != 0 and f"{bad}:2: expected" in run.stderr
