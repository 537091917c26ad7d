"""`anychip serve` against hostile clients, over loopback only: a request that used to kill the
engine, an injected failure in one request, cross-origin and rebinding requests, a missing API
key, a client that hangs up on a non-streaming request, a 50 MB body, and malformed fields.
After each, the server still answers correctly and /health tells the truth about its engine."""

from __future__ import annotations

import json
import re
import socket
import threading
import time
import urllib.error
import urllib.request

import httpx
import pytest

from serve_helpers import Server

CHAT = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4, "temperature": 0}
POISON_SEED = 666  # the request the injected failure picks
BODY_CAP = 32 * 4096  # the default --max-body-bytes of a server of 4096-token rows


@pytest.fixture(scope="module")
def long_model(tmp_path_factory):
    """A model with a 4096-token context: a 4000-token request runs for seconds."""
    from loader_helpers import random_weights, tiny_config, train_tokenizer, write_hf_folder

    tok = train_tokenizer()
    config = tiny_config(tok, max_position=4096)
    return write_hf_folder(tmp_path_factory.mktemp("long") / "model", config, random_weights(config), tok)


@pytest.fixture(scope="module")
def server(long_model):
    with Server(long_model, "cpu", "--max-batch", "2", "--max-len", "4096", "--served-name", "tiny") as s:
        yield s


@pytest.fixture(scope="module")
def keyed(long_model):
    with Server(long_model, "cpu", "--max-batch", "2", "--allowed-origins", "http://localhost:3000/",
                "--max-body-bytes", "2048", env={"ANYCHIP_API_KEY": "s3cret"}) as s:
        yield s


def request(server, path: str, body=None, headers: dict | None = None, method: str = "POST"):
    """(status, parsed JSON reply); ``body`` bytes are sent as they are, anything else as JSON."""
    data = body if isinstance(body, bytes) or body is None else json.dumps(body).encode()
    hdrs = {"Content-Type": "application/json", **(headers or {})}
    req = urllib.request.Request(server.url + path, data=data, method=method, headers=hdrs)
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def still_serving(server, headers: dict | None = None):
    status, reply = request(server, "/v1/chat/completions", CHAT, headers)
    assert status == 200 and reply["choices"][0]["finish_reason"] in ("stop", "length"), reply
    assert server.get("/health")["status"] == "ok"


def metric(server, name: str) -> float:
    for line in server.text("/metrics").splitlines():
        if line.startswith(name + " "):
            return float(line.split()[-1])
    return 0.0


def read_answer(sock: socket.socket) -> bytes:
    """One HTTP response off ``sock``: until its Content-Length is in, or the server closes."""
    data = b""
    try:
        while chunk := sock.recv(65536):
            data += chunk
            head, _, body = data.partition(b"\r\n\r\n")
            length = re.search(rb"(?im)^content-length: *(\d+)", head)
            if length and len(body) >= int(length.group(1)):
                break
    except ConnectionResetError:  # the server closed on bytes it did not read: what came first stays
        pass
    return data


def health_within(server, seconds: float) -> None:
    start = time.monotonic()
    assert server.get("/health")["status"] == "ok"
    assert time.monotonic() - start < seconds, "/health was slow to answer"


# ---- the engine survives ------------------------------------------------------------------------

def test_a_negative_seed_is_refused_and_the_engine_survives(server):
    status, reply = request(server, "/v1/chat/completions", {**CHAT, "seed": -1, "temperature": 1})
    assert status == 400 and reply["error"]["param"] == "seed" and "seed" in reply["error"]["message"], reply
    status, reply = request(server, "/v1/chat/completions", {**CHAT, "seed": 2**63, "temperature": 1})
    assert status == 200, reply
    still_serving(server)


@pytest.fixture(scope="module")
def tiny(base):
    from anychip_models.llama import LlamaForCausalLM

    return LlamaForCausalLM(base, ("cpu", 0)), base.tokenizer


@pytest.fixture
def poisoned_sampling(monkeypatch):
    """The engine's sampling raises for requests seeded POISON_SEED, as a bug in one request would."""
    from anychip_models.serving import engine

    def sample(logits, params, rng, seen):
        if params.seed == POISON_SEED:
            raise RuntimeError("injected failure")
        return real(logits, params, rng, seen)

    real = engine.sample
    monkeypatch.setattr(engine, "sample", sample)


def test_one_requests_failure_leaves_the_others_in_its_batch_running(tiny, poisoned_sampling):
    """Two requests admitted together, one failing while sampling, one whose client's callback
    raises: each fails alone, the third finishes and the engine serves on."""
    from anychip_models.sampling import SamplingParams
    from anychip_models.serving.engine import Engine, EngineConfig

    engine = Engine(*tiny, EngineConfig(max_batch=3, max_len=64))
    kinds = {"poisoned": [], "good": []}

    def broken_client(_event):
        raise RuntimeError("the client's socket broke")

    def params(seed=None):
        return SamplingParams(max_new_tokens=12, temperature=0, ignore_eos=True, seed=seed)

    engine.submit([1, 2, 3], params(POISON_SEED), lambda e: kinds["poisoned"].append(e.kind))
    engine.submit([1, 2, 4], params(), broken_client)
    done = threading.Event()
    engine.submit([1, 2, 5], params(), lambda e: (kinds["good"].append(e.kind), e.kind == "done" and done.set()))
    engine.start()  # after the submits: all three are admitted into one batch
    try:
        assert done.wait(60), kinds
        assert kinds["poisoned"] == ["error"] and kinds["good"][-1] == "done"
        assert engine.alive and engine.metrics.requests["error"] == 2 and engine.metrics.requests["length"] == 1
    finally:
        engine.stop()


def app_client(engine, **kwargs):
    from starlette.testclient import TestClient

    from anychip_models.serving.server import ServedModel, create_app

    app = create_app(engine, ServedModel("model", set(), "cpu:0", False, "native"))
    return TestClient(app, base_url="http://127.0.0.1", **kwargs)  # the server takes loopback Hosts only


def test_a_failing_request_gets_a_500_error_object_and_the_next_is_served(tiny, poisoned_sampling):
    from anychip_models.serving.engine import Engine, EngineConfig

    engine = Engine(*tiny, EngineConfig(max_batch=2, max_len=64)).start()
    try:
        with app_client(engine) as http:
            body = {"prompt": "hi", "max_tokens": 4, "temperature": 0}
            reply = http.post("/v1/completions", json={**body, "seed": POISON_SEED})
            assert reply.status_code == 500, reply.text
            error = reply.json()["error"]
            assert error["code"] == "generation_failed" and "injected failure" in error["message"]
            streamed = http.post("/v1/completions", json={**body, "seed": POISON_SEED, "stream": True}).text
            assert "injected failure" in streamed and streamed.endswith("data: [DONE]\n\n")
            assert http.post("/v1/completions", json=body).status_code == 200
            assert http.get("/health").json()["status"] == "ok"
    finally:
        engine.stop()


def test_health_reports_an_engine_that_died(tiny):
    from anychip_models.serving.engine import Engine, EngineConfig

    engine = Engine(*tiny, EngineConfig(max_batch=1, max_len=64))

    def broken_loop():
        raise RuntimeError("the device was lost")

    engine._loop = broken_loop
    engine.start()
    engine._thread.join(10)
    with app_client(engine) as http:
        health = http.get("/health")
        assert health.status_code == 503 and "the device was lost" in health.json()["error"]
        reply = http.post("/v1/completions", json={"prompt": "hi", "max_tokens": 2})
        assert reply.status_code == 503 and "the device was lost" in reply.json()["error"]["message"]


def test_unforeseen_failures_are_json_and_template_refusals_are_400s(tiny, monkeypatch):
    import jinja2

    from anychip_models.serving.engine import Engine, EngineConfig

    engine = Engine(*tiny, EngineConfig(max_batch=1, max_len=64))  # never started: nothing gets that far
    tokenizer = engine.tokenizer

    def refuse(*_args, **_kwargs):
        raise jinja2.TemplateError("Conversation roles must alternate user/assistant")

    def crash(*_args, **_kwargs):
        raise RuntimeError("a bug")

    monkeypatch.setattr(tokenizer, "apply_chat_template", refuse)
    monkeypatch.setattr(tokenizer, "encode", crash)
    with app_client(engine, raise_server_exceptions=False) as http:
        reply = http.post("/v1/chat/completions", json=CHAT)
        assert reply.status_code == 400 and reply.json()["error"]["param"] == "messages"
        assert "must alternate" in reply.json()["error"]["message"]
        reply = http.post("/v1/completions", json={"prompt": "hi"})
        assert reply.status_code == 500 and reply.headers["content-type"] == "application/json"
        assert reply.json()["error"]["code"] == "internal_error" and "a bug" in reply.json()["error"]["message"]


# ---- who may call -------------------------------------------------------------------------------

def test_a_cross_origin_text_plain_post_is_refused(server):
    status, reply = request(server, "/v1/chat/completions", json.dumps(CHAT).encode(),
                            {"Content-Type": "text/plain", "Origin": "http://evil.example"})
    assert status in (403, 415), reply
    status, reply = request(server, "/v1/chat/completions", json.dumps(CHAT).encode(), {"Content-Type": "text/plain"})
    assert status == 415 and reply["error"]["code"] == "unsupported_media_type"
    for origin in ("http://evil.example", "null", f"http://127.0.0.1:{server.port + 1}", f"http://tiny:{server.port}"):
        status, reply = request(server, "/v1/chat/completions", CHAT, {"Origin": origin})
        assert status == 403 and reply["error"]["code"] == "forbidden_origin", (origin, reply)
    # DNS rebinding: another site's name pointed at 127.0.0.1
    status, reply = request(server, "/v1/chat/completions", CHAT, {"Host": f"evil.example:{server.port}"})
    assert status == 403 and reply["error"]["code"] == "forbidden_host"
    # the server's own chat page (same origin, by any loopback name) is welcome
    for origin in (server.url, f"http://localhost:{server.port}", f"http://[::1]:{server.port}"):
        status, reply = request(server, "/v1/chat/completions", CHAT, {"Origin": origin})
        assert status == 200, (origin, reply)
    assert metric(server, 'anychip_rejected_requests_total{status="403"}') >= 5
    still_serving(server)


def test_origins_own_and_allowed():
    from anychip_models.serving.server import ServerConfig

    def status(config, host, origin):
        refused = config.refusal("POST", "/v1/completions", {"host": host, "origin": origin,
                                                             "content-type": "application/json"})
        return refused.status if refused else 200

    local, everywhere = ServerConfig(), ServerConfig(bind_host="0.0.0.0")
    assert status(local, "127.0.0.1:8000", "http://localhost:8000") == 200
    assert status(local, "localhost:8000", "http://localhost:8001") == 403
    assert status(local, "127.0.0.1:8000", "http://[::1") == 403  # does not parse: names nothing
    # on every address, a name could be another site's pointed at this server: by name only
    assert status(everywhere, "evil.example:8000", "http://evil.example:8000") == 403
    assert status(everywhere, "192.168.1.5:8000", "http://192.168.1.5:8000") == 200
    named = ServerConfig(bind_host="0.0.0.0", allowed_origins={"http://box.lan:8000", " https://App.example/"})
    assert status(named, "box.lan:8000", "http://box.lan:8000") == 200
    assert status(named, "127.0.0.1:8000", "https://app.example") == 200
    assert status(ServerConfig(allowed_origins={"*"}), "evil.example", "http://evil.example") == 200
    with pytest.raises(ValueError, match=r"allowed_origins \(--allowed-origins\).*'localhost:3000' is not an origin"):
        ServerConfig(allowed_origins={"localhost:3000"})


def test_an_api_key_guards_the_api_and_allowed_origins_are_let_in(keyed):
    status, reply = request(keyed, "/v1/chat/completions", CHAT)
    assert status == 401 and reply["error"]["code"] == "invalid_api_key" and reply["error"]["message"]
    assert request(keyed, "/v1/models", None, {"Authorization": "Bearer wrong"}, method="GET")[0] == 401
    auth = {"Authorization": "Bearer s3cret"}
    assert request(keyed, "/v1/models", None, auth, method="GET")[0] == 200
    assert keyed.get("/health")["status"] == "ok"  # health and the page stay open
    page = keyed.text("/")
    assert "<html" in page.lower() and "s3cret" not in page  # the page asks for the key; it never holds it
    status, _ = request(keyed, "/v1/chat/completions", CHAT, {**auth, "Origin": "http://localhost:3000"})
    assert status == 200
    assert request(keyed, "/v1/chat/completions", CHAT, {**auth, "Origin": "http://localhost:4000"})[0] == 403
    status, reply = request(keyed, "/v1/completions", {"prompt": "a" * 2048}, auth)  # --max-body-bytes 2048
    assert status == 413 and "2048 bytes" in reply["error"]["message"], reply
    still_serving(keyed, auth)


def test_help_lists_the_guarding_flags():
    from test_cli import anychip

    result = anychip("serve", "--help")
    assert result.returncode == 0, result.stderr
    for flag in ("--api-key", "ANYCHIP_API_KEY", "--allowed-origins", "--max-body-bytes"):
        assert flag in result.stdout


# ---- what clients send --------------------------------------------------------------------------

def test_a_client_that_hangs_up_on_a_non_streaming_request_cancels_it(server):
    body = json.dumps({"prompt": "Tell me everything.", "max_tokens": 4000, "temperature": 0,
                       "ignore_eos": True}).encode()
    before = metric(server, 'anychip_requests_total{outcome="cancelled"}')
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as s:
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                  b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
        deadline = time.monotonic() + 30
        while server.get("/health")["running"] == 0 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert server.get("/health")["running"] == 1
        started = metric(server, "anychip_completion_tokens_total")
    hung_up = time.monotonic()
    while time.monotonic() - hung_up < 10 and server.get("/health")["running"]:
        time.sleep(0.05)
    freed_after = time.monotonic() - hung_up
    assert server.get("/health")["running"] == 0, "the request ran on after its client left"
    assert metric(server, 'anychip_requests_total{outcome="cancelled"}') == before + 1
    # far from done: the row came free at once, not when 4000 tokens had been written
    assert freed_after < 2 and metric(server, "anychip_completion_tokens_total") - started < 2000, freed_after
    still_serving(server)


def test_a_50_mb_body_is_refused_at_once_and_health_stays_responsive(server):
    # the server answers as soon as the headers announce 50 MB, and closes without reading them
    # (a client still sending then sees its connection reset, so read the answer off a socket)
    start = time.monotonic()
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as s:
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                  b"Content-Length: " + str(50 << 20).encode() + b"\r\n\r\n" + b'{"prompt": "' + b"a" * 65536)
        answer = read_answer(s)
    assert answer.startswith(b"HTTP/1.1 413") and b"request_too_large" in answer, answer[:300]
    assert time.monotonic() - start < 10

    # without a Content-Length (chunked), the cap holds as the body arrives
    def chunks():
        for _ in range(50):
            yield b"a" * (1 << 20)

    def send():
        try:
            replies.append(http.post(server.url + "/v1/completions", content=chunks(),
                                     headers={"Content-Type": "application/json"}))
        except httpx.TransportError:
            pass

    with httpx.Client(timeout=60) as http:
        replies = []
        sender = threading.Thread(target=send)
        sender.start()
        health_within(server, 1.0)
        sender.join(60)
    assert not replies or replies[0].status_code == 413  # or the reset of a client still sending
    still_serving(server)


def test_the_default_cap_scales_with_the_row_and_bounds_the_tokenizer(server):
    """A body at the default cap is read and tokenized (too long for a row: a 400) with /health
    answering meanwhile; a byte more is a 413."""
    def prompt_body(size: int) -> bytes:  # exactly size bytes
        words = b"a b " * ((size - 14) // 4)
        return b'{"prompt": "' + words + b"a" * (size - 14 - len(words)) + b'"}'

    body = prompt_body(BODY_CAP)
    assert len(body) == BODY_CAP
    replies = []
    sender = threading.Thread(target=lambda: replies.append(request(server, "/v1/completions", body)))
    sender.start()
    health_within(server, 1.0)
    sender.join(60)
    status, reply = replies[0]
    assert status == 400 and reply["error"]["code"] == "context_length_exceeded", reply
    status, reply = request(server, "/v1/completions", prompt_body(BODY_CAP + 1))
    assert status == 413 and "--max-body-bytes" in reply["error"]["message"], reply


@pytest.mark.parametrize("body, status, param", [
    ({**CHAT, "model": ["tiny"]}, 400, "model"),
    (b"[" * 60000 + b"]" * 60000, 400, None),  # under the cap, far past Python's recursion limit
    (b'{"messages": [{"role": "user", "content": "\\ud800"}]}', 400, "messages[0].content"),
    (b'{"prompt": "a\\udfff"}', 400, "prompt"),
    (b'{"prompt": "a", "stop": ["\\ud800"]}', 400, "stop"),
    (b'{"prompt": "a", "temperature": NaN}', 400, "temperature"),
    (b'{"prompt": "a", "repetition_penalty": Infinity}', 400, "repetition_penalty"),
    (b'{"prompt": "a", "max_tokens": ' + b"9" * 5000 + b"}", 400, None),
])
def test_malformed_fields_get_clear_errors(server, body, status, param):
    path = "/v1/completions" if b"prompt" in (body if isinstance(body, bytes) else b"") else "/v1/chat/completions"
    got, reply = request(server, path, body)
    assert got == status and reply["error"]["param"] == param and reply["error"]["message"], reply
    assert param is None or param.split("[")[0] in reply["error"]["message"]
    still_serving(server)


def test_errors_quote_a_huge_value_briefly(server):
    status, reply = request(server, "/v1/chat/completions", {**CHAT, "temperature": "x" * 100000})
    assert status == 400 and reply["error"]["param"] == "temperature" and len(reply["error"]["message"]) < 300


def test_the_unknown_model_error_names_the_served_id(server, long_model):
    listed = [m["id"] for m in server.get("/v1/models")["data"]]
    assert listed == ["tiny"]
    status, reply = request(server, "/v1/chat/completions", {**CHAT, "model": "gpt-9"})
    message = reply["error"]["message"]
    assert status == 404 and "'gpt-9'" in message and "'tiny'" in message, reply
    assert str(long_model) not in message  # an alias it accepts, not the id it lists
