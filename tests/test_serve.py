"""`anychip serve` over loopback with the official OpenAI client: answers equal to `Generator`'s,
streaming equal to non-streaming, 16 concurrent streams each equal to its answer alone, a
disconnect freeing its row, bad requests getting OpenAI error objects while the server keeps
serving; and the engine's queue, budget and cancellation in-process, without timing races."""

from __future__ import annotations

import json
import threading
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import httpx
import numpy as np
import pytest
from openai import OpenAI

from serve_helpers import Server

QUESTIONS = ["What is the capital of France?", "Name three colors.", "Count to five.", "Say hello.",
             "Why is the sky blue?", "What is 2 + 2?", "Tell me a joke.", "Describe a cat."]


@pytest.fixture(scope="module")
def server(model_dir):
    with Server(model_dir, "cpu", "--max-batch", "16") as s:
        yield s


@pytest.fixture(scope="module")
def client(server):
    return OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)


def chat_ids(tokenizer, question: str) -> list[int]:
    return tokenizer.encode(tokenizer.apply_chat_template([{"role": "user", "content": question}],
                                                          add_generation_prompt=True))


def generate_alone(base, prompt: list[int], max_tokens: int) -> str:
    from anychip_models.generate import Generator
    from anychip_models.llama import LlamaForCausalLM
    from anychip_models.sampling import SamplingParams

    model = LlamaForCausalLM(base, ("cpu", 0))
    completions, _ = Generator(model, base.tokenizer).generate([prompt], SamplingParams(max_new_tokens=max_tokens))
    return completions[0].text


def stream_text(client, question: str, max_tokens: int, kind: str = "chat") -> tuple[str, list, dict]:
    """The concatenated text, the finish reasons seen, and the usage of one streamed request."""
    parts, finishes, usage = [], [], None
    if kind == "chat":
        stream = client.chat.completions.create(model="model", messages=[{"role": "user", "content": question}],
                                                max_tokens=max_tokens, temperature=0, stream=True,
                                                stream_options={"include_usage": True})
    else:
        stream = client.completions.create(model="model", prompt=question, max_tokens=max_tokens, temperature=0,
                                           stream=True, stream_options={"include_usage": True})
    for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
        for choice in chunk.choices:
            piece = choice.delta.content if kind == "chat" else choice.text
            parts.append(piece or "")
            if choice.finish_reason:
                finishes.append(choice.finish_reason)
    return "".join(parts), finishes, usage


def test_models_and_health_name_the_model_and_device(server, client):
    assert [m.id for m in client.models.list().data] == ["model"]
    health = server.get("/health")
    assert health["status"] == "ok" and health["device"] == "cpu:0" and health["simulated"] is False


def test_chat_answer_is_the_generators(client, base):
    reply = client.chat.completions.create(model="model", messages=[{"role": "user", "content": QUESTIONS[0]}],
                                           max_tokens=24, temperature=0)
    prompt = chat_ids(base.tokenizer, QUESTIONS[0])
    assert reply.choices[0].message.role == "assistant"
    assert reply.choices[0].message.content == generate_alone(base, prompt, 24)
    assert reply.usage.prompt_tokens == len(prompt)
    assert reply.choices[0].finish_reason in ("stop", "length")
    assert reply.object == "chat.completion" and reply.id.startswith("chatcmpl-")


def test_completion_answer_is_the_generators(client, base):
    reply = client.completions.create(model="model", prompt="Once upon a time", max_tokens=20, temperature=0)
    prompt = base.tokenizer.encode("Once upon a time", add_bos=base.tokenizer.add_bos)
    assert reply.choices[0].text == generate_alone(base, prompt, 20)
    assert reply.usage.prompt_tokens == len(prompt) and reply.usage.completion_tokens <= 20


@pytest.mark.parametrize("kind", ["chat", "completion"])
def test_streaming_equals_non_streaming(client, kind):
    text, finishes, usage = stream_text(client, QUESTIONS[1], 30, kind)
    if kind == "chat":
        whole = client.chat.completions.create(model="model", messages=[{"role": "user", "content": QUESTIONS[1]}],
                                               max_tokens=30, temperature=0)
        want = whole.choices[0].message.content
    else:
        whole = client.completions.create(model="model", prompt=QUESTIONS[1], max_tokens=30, temperature=0)
        want = whole.choices[0].text
    assert text == want
    assert finishes == [whole.choices[0].finish_reason]
    assert usage.completion_tokens == whole.usage.completion_tokens


def test_extensions_top_k_repetition_penalty_and_ignore_eos(client):
    reply = client.completions.create(model="model", prompt="Go on", max_tokens=40, temperature=0.8, seed=3,
                                      extra_body={"ignore_eos": True, "top_k": 5, "repetition_penalty": 1.3})
    assert reply.usage.completion_tokens == 40 and reply.choices[0].finish_reason == "length"


def test_sixteen_concurrent_streams_each_get_their_text_alone(server, client):
    cases = [(QUESTIONS[i % len(QUESTIONS)] + " " * (i // len(QUESTIONS)), 8 + 7 * i) for i in range(16)]
    alone = [stream_text(client, q, n)[0] for q, n in cases]
    steps_before = metric(server, "anychip_decode_steps_total")
    with ThreadPoolExecutor(16) as pool:
        together = list(pool.map(lambda case: stream_text(client, *case)[0], cases))
    assert together == alone
    assert len(set(alone)) > 1
    # batched for real: far fewer decode steps than tokens
    tokens = sum(n for _, n in cases)
    assert metric(server, "anychip_decode_steps_total") - steps_before < tokens / 2


def test_bf16_serving_answers_concurrent_streams_as_alone(model_dir):
    """--bf16 (bfloat16 prefill and decode): concurrent streams still each get their text alone,
    prompts prefilled alone or together alike; /v1/models says how it multiplies."""
    with Server(model_dir, "cpu", "--max-batch", "8", "--bf16") as s:
        client = OpenAI(base_url=s.url + "/v1", api_key="unused", max_retries=0)
        cases = [(QUESTIONS[i], 6 + 5 * i) for i in range(8)]
        alone = [stream_text(client, q, n)[0] for q, n in cases]
        with ThreadPoolExecutor(8) as pool:
            together = list(pool.map(lambda case: stream_text(client, *case)[0], cases))
        assert together == alone and len(set(alone)) > 1
        assert s.get("/v1/models")["data"][0]["weights"].endswith(", bf16")


def test_quantized_weights_decode_batches_with_int8_activations(model_dir, tmp_path_factory):
    """On quantized weights the default server decodes steps of 2+ requests with int8
    activations (the small-GEMM path) and says so; a lone request stays exact, so it answers as
    --exact-batches does, where concurrent streams each get their text alone. Only the default
    keeps the panel-ordered copy of the weights that those steps read, and /metrics counts it."""
    from training_helpers import anychip

    out = tmp_path_factory.mktemp("int8") / "model"  # the name stream_text asks for
    run = anychip("quantize", "--model", model_dir, "--type", "wint4", "--output", out)
    assert run.returncode == 0, run.stderr
    cases = [(QUESTIONS[i], 6 + 5 * i) for i in range(8)]
    answers, panels = {}, {}
    for mode in ("default", "--exact-batches"):
        with Server(out, "cpu", "--max-batch", "8", *([] if mode == "default" else [mode])) as s:
            client = OpenAI(base_url=s.url + "/v1", api_key="unused", max_retries=0)
            alone = [stream_text(client, q, n)[0] for q, n in cases]
            with ThreadPoolExecutor(8) as pool:
                together = list(pool.map(lambda case: stream_text(client, *case)[0], cases))
            answers[mode] = alone, together, s.get("/v1/models")["data"][0]["weights"]
            panels[mode] = metric(s, "anychip_weight_panel_bytes")
    assert panels["default"] > 0 and panels["--exact-batches"] == 0, panels
    assert answers["default"][0] == answers["--exact-batches"][0]  # one at a time: exact either way
    alone, together, weights = answers["--exact-batches"]
    assert together == alone and len(set(alone)) > 1 and "int8" not in weights
    _alone, together, weights = answers["default"]
    assert weights.endswith("int8 activations in batches") and all(together)


def metric(server, name: str, labels: str = "") -> float:
    for line in server.text("/metrics").splitlines():
        if line.startswith(name + labels + " "):
            return float(line.split()[-1])
    raise AssertionError(f"{name}{labels} not in /metrics")


@pytest.fixture(scope="module")
def long_server(tmp_path_factory):
    """A server whose model has a 4096-token context: a request of 4000 tokens runs for seconds,
    so a disconnect is certain to come before the request could end by itself."""
    from loader_helpers import random_weights, tiny_config, train_tokenizer, write_hf_folder

    tok = train_tokenizer()
    config = tiny_config(tok, max_position=4096)
    folder = write_hf_folder(tmp_path_factory.mktemp("long") / "model", config, random_weights(config), tok)
    with Server(folder, "cpu", "--max-batch", "2", "--max-len", "4096") as s:
        yield s


def test_a_disconnect_mid_stream_frees_its_row(long_server):
    server = long_server
    body = {"prompt": "Tell me everything.", "max_tokens": 4000, "temperature": 0, "stream": True,
            "ignore_eos": True}
    with httpx.Client(timeout=30) as http:
        with http.stream("POST", server.url + "/v1/completions", json=body) as response:
            data = (line for line in response.iter_lines() if line.startswith("data: "))
            next(data), next(data)  # the role chunk, then generated text: the request holds a row
            assert server.get("/health")["running"] == 1
            # leaving the block closes the connection mid-stream
    for _ in range(200):
        if metric(server, "anychip_requests_total", '{outcome="cancelled"}') == 1:
            break
        threading.Event().wait(0.05)
    assert metric(server, "anychip_requests_total", '{outcome="cancelled"}') == 1
    assert metric(server, "anychip_requests_total", '{outcome="length"}') == 0
    assert server.get("/health")["running"] == 0
    assert metric(server, "anychip_completion_tokens_total") < 4000


def post(server, path: str, data: bytes | dict, method: str = "POST") -> tuple[int, dict]:
    raw = data if isinstance(data, bytes) else json.dumps(data).encode()
    request = urllib.request.Request(server.url + path, data=raw, method=method,
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=30) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


@pytest.mark.parametrize("body, status, param, code", [
    (b"{not json", 400, None, None),
    (b"[1, 2]", 400, None, None),
    ({"model": "gpt-9", "messages": [{"role": "user", "content": "hi"}]}, 404, "model", "model_not_found"),
    ({"messages": []}, 400, "messages", None),
    ({"messages": [{"role": "wizard", "content": "hi"}]}, 400, "messages[0].role", None),
    ({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 100000}, 400, "max_tokens",
     "context_length_exceeded"),
    ({"messages": [{"role": "user", "content": "hi " * 400}]}, 400, "messages", "context_length_exceeded"),
    ({"messages": [{"role": "user", "content": "hi"}], "temperature": -1}, 400, "temperature", None),
    ({"messages": [{"role": "user", "content": "hi"}], "top_p": 0}, 400, "top_p", None),
    ({"messages": [{"role": "user", "content": "hi"}], "max_tokens": "ten"}, 400, "max_tokens", None),
    ({"messages": [{"role": "user", "content": "hi"}], "n": 17}, 400, "n", None),
    ({"messages": [{"role": "user", "content": "hi"}], "ignore_eos": "yes"}, 400, "ignore_eos", None),
    ({"messages": [{"role": "user", "content": "hi"}], "stream": 1}, 400, "stream", None),
    ({"messages": [{"role": "user", "content": "hi"}], "stop": ["a", "b", "c", "d", "e"]}, 400, "stop", None),
])
def test_bad_requests_get_openai_errors_and_the_server_keeps_serving(server, client, body, status, param, code):
    got, reply = post(server, "/v1/chat/completions", body)
    assert got == status, reply
    error = reply["error"]
    assert error["message"] and error["type"] == "invalid_request_error"
    assert error["param"] == param and error["code"] == code
    assert server.get("/health")["status"] == "ok"
    assert client.completions.create(model="model", prompt="ok", max_tokens=2, temperature=0).choices


def test_unknown_routes_and_methods_get_error_objects(server):
    assert post(server, "/v1/nothing", {})[0] == 404
    request = urllib.request.Request(server.url + "/v1/completions", method="GET")
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(request, timeout=30)
    assert e.value.code == 405 and json.loads(e.value.read())["error"]["message"]


def test_metrics_count_requests_tokens_and_time_to_first_token(server, client):
    before = metric(server, "anychip_completion_tokens_total")
    first = metric(server, "anychip_time_to_first_token_seconds_count")
    reply = client.completions.create(model="model", prompt="metrics", max_tokens=5, temperature=0)
    assert metric(server, "anychip_completion_tokens_total") - before == reply.usage.completion_tokens
    assert metric(server, "anychip_time_to_first_token_seconds_count") == first + 1
    text = server.text("/metrics")
    assert 'anychip_info{model="model",device="cpu:0",simulated="false"} 1' in text
    assert "# TYPE anychip_time_to_first_token_seconds histogram" in text


def test_a_simulated_device_says_so(model_dir):
    with Server(model_dir, "npu", "--max-batch", "2") as s:
        assert s.get("/health")["simulated"] is True
        assert s.get("/v1/models")["data"][0]["simulated"] is True
        assert 'simulated="true"' in s.text("/metrics")
        client = OpenAI(base_url=s.url + "/v1", api_key="unused", max_retries=0)
        reply = client.chat.completions.create(model="model", messages=[{"role": "user", "content": "hi"}],
                                               max_tokens=6, temperature=0)
        assert reply.system_fingerprint == "anychip-npu:0-simulated"
    assert "npu:0 (simulated: host speed)" in s.stop()


# ---- the engine in-process: queue, budget and cancellation ---------------------------------------

@pytest.fixture(scope="module")
def tiny(base):
    from anychip_models.llama import LlamaForCausalLM

    return LlamaForCausalLM(base, ("cpu", 0)), base.tokenizer


class Collector:
    def __init__(self):
        self.events, self.done = [], threading.Event()

    def __call__(self, event):
        self.events.append(event)
        if event.kind in ("done", "error"):
            self.done.set()


def params(n: int):
    from anychip_models.sampling import SamplingParams

    return SamplingParams(max_new_tokens=n, ignore_eos=True)


def completions(engine, items) -> list[list[int]]:
    """Submits each (prompt, max_new_tokens) of ``items`` to ``engine`` (not yet started), runs it
    until all are done and returns each one's tokens."""
    collectors = [Collector() for _ in items]
    for (prompt, n), c in zip(items, collectors):
        engine.submit([int(t) for t in prompt], params(n), c)
    engine.start()
    try:
        assert all(c.done.wait(60) for c in collectors)
    finally:
        engine.stop()
    return [c.events[-1].completion.tokens for c in collectors]


def test_a_full_queue_refuses_new_requests(tiny):
    from anychip_models.serving.engine import Engine, EngineBusy, EngineConfig

    engine = Engine(*tiny, EngineConfig(max_batch=1, max_len=64, max_queue=2))  # not started: nothing leaves
    engine.submit([1, 2, 3], params(4), Collector())
    engine.submit([1, 2, 3], params(4), Collector())
    with pytest.raises(EngineBusy, match="2 requests are already waiting"):
        engine.submit([1, 2, 3], params(4), Collector())
    assert engine.snapshot()["queue_depth"] == 2


def test_the_api_answers_503_when_the_queue_is_full(tiny):
    from starlette.testclient import TestClient

    from anychip_models.serving.engine import Engine, EngineConfig
    from anychip_models.serving.server import ServedModel, create_app

    engine = Engine(*tiny, EngineConfig(max_batch=1, max_len=64, max_queue=1))
    engine.submit([1, 2, 3], params(4), Collector())
    app = create_app(engine, ServedModel("model", set(), "cpu:0", False, "native"))
    with TestClient(app, base_url="http://127.0.0.1") as http:  # the server takes loopback Hosts only
        reply = http.post("/v1/completions", json={"prompt": "hi", "max_tokens": 4})
    assert reply.status_code == 503
    assert reply.json()["error"]["code"] == "overloaded"


def test_requests_too_long_for_a_row_are_refused(tiny):
    from anychip_models.serving.engine import Engine, EngineConfig, RequestTooLong

    engine = Engine(*tiny, EngineConfig(max_batch=2, max_len=32))
    with pytest.raises(RequestTooLong, match="at most 32"):
        engine.submit(list(range(1, 20)), params(20), Collector())
    with pytest.raises(ValueError, match="vocabulary"):
        engine.submit([10**6], params(2), Collector())


def test_the_token_budget_holds_a_request_until_room_frees(tiny):
    from anychip_models.serving.engine import Engine, EngineConfig

    engine = Engine(*tiny, EngineConfig(max_batch=2, max_len=64, max_tokens_in_flight=40))
    a, b = Collector(), Collector()
    engine.submit(list(range(1, 11)), params(20), a)   # reserves 30 of 40
    engine.submit(list(range(1, 11)), params(20), b)   # 30 more: must wait for a
    engine.start()
    try:
        assert a.done.wait(60) and b.done.wait(60)
    finally:
        engine.stop()
    # b's first text came after a finished: they never ran together
    assert engine.metrics.decode_steps >= 2 * 19
    assert [e.kind for e in a.events][-1] == "done" and [e.kind for e in b.events][-1] == "done"


def test_a_cancelled_waiting_request_never_runs(tiny):
    from anychip_models.serving.engine import Engine, EngineConfig

    engine = Engine(*tiny, EngineConfig(max_batch=1, max_len=64))
    kept, dropped = Collector(), Collector()
    handle = engine.submit([1, 2, 3], params(5), dropped)
    engine.submit([4, 5, 6], params(5), kept)
    handle.cancel()
    engine.start()
    try:
        assert kept.done.wait(60)
    finally:
        engine.stop()
    assert dropped.events == []
    assert engine.metrics.requests["cancelled"] == 1 and engine.metrics.requests["length"] == 1
    assert engine.metrics.prompt_tokens == 3


def test_rows_are_reused_and_results_do_not_depend_on_the_row(tiny):
    """More requests than rows, all at once: each gets what it gets alone."""
    from anychip_models.serving.engine import Engine, EngineConfig

    prompts = [list(np.random.default_rng(i).integers(1, 200, size=3 + i)) for i in range(6)]

    def run(batch_rows: int, items) -> list[list[int]]:
        return completions(Engine(*tiny, EngineConfig(max_batch=batch_rows, max_len=64)), items)

    items = [(p, 5 + 3 * i) for i, p in enumerate(prompts)]
    alone = [run(1, [item])[0] for item in items]
    assert run(4, items) == alone


def test_a_16bit_kv_cache_serves_rows_alike_in_half_the_memory(base):
    """An engine over a model with a bfloat16 KV cache: half the cache bytes, and requests decoded
    together get what each gets alone."""
    from anychip_models.llama import LlamaForCausalLM
    from anychip_models.serving.engine import Engine, EngineConfig

    config = EngineConfig(max_batch=3, max_len=64)
    model = LlamaForCausalLM(base, ("cpu", 0), kv_dtype="bfloat16")
    wide = Engine(LlamaForCausalLM(base, ("cpu", 0)), base.tokenizer, config)
    prompts = [[int(t) for t in np.random.default_rng(i).integers(1, 200, size=4 + 2 * i)] for i in range(3)]

    def run(items) -> list[list[int]]:
        engine = Engine(model, base.tokenizer, config)
        assert engine.cache_bytes * 2 == wide.cache_bytes
        return completions(engine, [(prompt, 6) for prompt in items])

    assert run(prompts) == [run([p])[0] for p in prompts]


def test_prefill_passes_keep_to_their_token_budget(tiny):
    from anychip_models.serving.engine import Engine, EngineConfig, Handle, _Running

    engine = Engine(*tiny, EngineConfig(max_batch=8, max_len=64, prefill_tokens=12))
    requests = [_Running(Handle(i, [1] * n, params(2), Collector()), i, tiny[1]) for i, n in enumerate((5, 3, 4, 13))]
    groups = [[len(r.handle.prompt) for r in g] for g in engine._prefill_groups(requests)]
    assert groups == [[3, 4], [5], [13]]  # 3 x 5 = 15 padded tokens would pass 12; 13 goes alone


def test_a_burst_of_engine_events_wakes_the_loop_once_and_keeps_their_order():
    """A decode step delivers one event per stream from the engine's thread: the loop is woken
    once for them all (each wake-up is a self-pipe write and a GIL hand-over), and every
    stream's queue gets its events in order."""
    import asyncio

    from anychip_models.serving.server import _Relay

    async def main():
        loop = asyncio.get_running_loop()
        wakes, real = [], loop.call_soon_threadsafe
        loop.call_soon_threadsafe = lambda *a: (wakes.append(a), real(*a))[1]
        relay = _Relay(loop)
        queues = [asyncio.Queue() for _ in range(4)]
        got = [[] for _ in queues]
        for burst in range(2):
            sender = threading.Thread(target=lambda: [relay.put(queues[i % 4], (burst, i)) for i in range(16)])
            sender.start()
            sender.join()  # the loop is held meanwhile, as while it writes other streams
            await asyncio.sleep(0)
            for q, out in zip(queues, got):
                while not q.empty():
                    out.append(q.get_nowait())
            assert len(wakes) == burst + 1
        assert got == [[(b, i) for b in range(2) for i in range(16) if i % 4 == j] for j in range(4)]

    asyncio.run(main())


def test_a_relay_does_not_keep_its_event_loop_alive():
    import asyncio
    import gc
    import weakref

    from anychip_models.serving.server import _Relay

    relays = weakref.WeakKeyDictionary()
    loop = asyncio.new_event_loop()
    relay = relays.setdefault(loop, _Relay(loop))
    gone = weakref.ref(loop)
    loop.close()
    del loop
    gc.collect()
    assert gone() is None and len(relays) == 0
    with pytest.raises(RuntimeError):
        relay.put(asyncio.Queue(), 1)
