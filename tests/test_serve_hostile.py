"""`anychip serve` against hostile clients, over loopback only: a request that used to kill the
engine, cross-origin and rebinding requests, a missing API key, a client that hangs up on a
non-streaming request, a 50 MB body, and malformed fields. After each, the server still answers
correctly and /health tells the truth about its engine."""

from __future__ import annotations

import json
import socket
import threading
import time
import urllib.error
import urllib.request

import httpx
import pytest

from serve_helpers import Server

CHAT = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4, "temperature": 0}


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
    with Server(long_model, "cpu", "--max-batch", "2", "--api-key", "s3cret",
                "--allowed-origins", "http://localhost:3000/") as s:
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


# ---- the engine survives ------------------------------------------------------------------------

def test_a_negative_seed_is_refused_and_the_engine_survives(server):
    status, reply = request(server, "/v1/chat/completions", {**CHAT, "seed": -1, "temperature": 1})
    assert status == 400 and reply["error"]["param"] == "seed", reply
    status, reply = request(server, "/v1/chat/completions", {**CHAT, "seed": 2**63, "temperature": 1})
    assert status == 200, reply
    still_serving(server)


@pytest.fixture(scope="module")
def tiny(base):
    from anychip_models.llama import LlamaForCausalLM

    return LlamaForCausalLM(base, ("cpu", 0)), base.tokenizer


def test_one_requests_failure_leaves_the_others_running(tiny):
    """A request whose client callback raises fails alone; before, it failed the whole batch."""
    from anychip_models.sampling import SamplingParams
    from anychip_models.serving.engine import Engine, EngineConfig

    engine = Engine(*tiny, EngineConfig(max_batch=2, max_len=64)).start()
    try:
        done = threading.Event()
        events = []

        def bad(event):
            raise RuntimeError("the client's socket broke")

        def good(event):
            events.append(event.kind)
            if event.kind in ("done", "error"):
                done.set()

        params = SamplingParams(max_new_tokens=12, temperature=0, ignore_eos=True)
        engine.submit([1, 2, 3], params, bad)
        engine.submit([1, 2, 4], params, good)
        assert done.wait(60)
        assert events[-1] == "done", events
        assert engine.alive and engine.metrics.requests.get("error") == 1
    finally:
        engine.stop()


def test_health_reports_an_engine_that_died(tiny):
    from starlette.testclient import TestClient

    from anychip_models.serving.engine import Engine, EngineConfig
    from anychip_models.serving.server import ServedModel, create_app

    engine = Engine(*tiny, EngineConfig(max_batch=1, max_len=64))

    def broken_loop():
        raise RuntimeError("the device was lost")

    engine._loop = broken_loop
    engine.start()
    engine._thread.join(10)
    app = create_app(engine, ServedModel("model", set(), "cpu:0", False, "native"))
    with TestClient(app, base_url="http://127.0.0.1") as http:
        health = http.get("/health")
        assert health.status_code == 503 and "the device was lost" in health.json()["error"]
        reply = http.post("/v1/completions", json={"prompt": "hi", "max_tokens": 2})
        assert reply.status_code == 503 and "the device was lost" in reply.json()["error"]["message"]


# ---- who may call -------------------------------------------------------------------------------

def test_a_cross_origin_text_plain_post_is_refused(server):
    status, reply = request(server, "/v1/chat/completions", json.dumps(CHAT).encode(),
                            {"Content-Type": "text/plain", "Origin": "http://evil.example"})
    assert status in (403, 415), reply
    status, reply = request(server, "/v1/chat/completions", json.dumps(CHAT).encode(), {"Content-Type": "text/plain"})
    assert status == 415 and reply["error"]["code"] == "unsupported_media_type"
    status, reply = request(server, "/v1/chat/completions", CHAT, {"Origin": "http://evil.example"})
    assert status == 403 and reply["error"]["code"] == "forbidden_origin"
    # DNS rebinding: another site's name pointed at 127.0.0.1
    status, reply = request(server, "/v1/chat/completions", CHAT, {"Host": f"evil.example:{server.port}"})
    assert status == 403 and reply["error"]["code"] == "forbidden_host"
    # the server's own chat page (same origin) is welcome
    status, _ = request(server, "/v1/chat/completions", CHAT, {"Origin": server.url})
    assert status == 200
    still_serving(server)


def test_an_api_key_guards_the_api_and_allowed_origins_are_let_in(keyed):
    status, reply = request(keyed, "/v1/chat/completions", CHAT)
    assert status == 401 and reply["error"]["code"] == "invalid_api_key"
    assert request(keyed, "/v1/models", None, {"Authorization": "Bearer wrong"}, method="GET")[0] == 401
    auth = {"Authorization": "Bearer s3cret"}
    assert request(keyed, "/v1/models", None, auth, method="GET")[0] == 200
    assert keyed.get("/health")["status"] == "ok"  # health and the page stay open
    assert "<html" in keyed.text("/").lower()
    status, _ = request(keyed, "/v1/chat/completions", CHAT, {**auth, "Origin": "http://localhost:3000"})
    assert status == 200
    assert request(keyed, "/v1/chat/completions", CHAT, {**auth, "Origin": "http://localhost:4000"})[0] == 403
    still_serving(keyed, auth)


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
    hung_up = time.monotonic()
    while time.monotonic() - hung_up < 10 and server.get("/health")["running"]:
        time.sleep(0.05)
    assert server.get("/health")["running"] == 0, "the request ran on after its client left"
    assert metric(server, 'anychip_requests_total{outcome="cancelled"}') == before + 1
    assert metric(server, "anychip_completion_tokens_total") < 4000
    still_serving(server)


def test_a_50_mb_body_is_refused_at_once_and_health_stays_responsive(server):
    # the server answers as soon as the headers announce 50 MB, and closes without reading them
    # (a client still sending then sees its connection reset, so read the answer off a socket)
    start = time.monotonic()
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as s:
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                  b"Content-Length: " + str(50 << 20).encode() + b"\r\n\r\n" + b'{"prompt": "' + b"a" * 65536)
        answer = s.recv(65536)
    assert answer.startswith(b"HTTP/1.1 413"), answer[:300]
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
        t = time.monotonic()
        assert server.get("/health")["status"] == "ok" and time.monotonic() - t < 1.0
        sender.join(60)
    assert not replies or replies[0].status_code == 413  # or the reset of a client still sending
    still_serving(server)


@pytest.mark.parametrize("body, status, param", [
    ({**CHAT, "model": ["tiny"]}, 400, "model"),
    (b"[" * 100000 + b"]" * 100000, 400, None),
    (b'{"messages": [{"role": "user", "content": "\\ud800"}]}', 400, "messages[0].content"),
    (b'{"prompt": "a\\udfff"}', 400, "prompt"),
])
def test_malformed_fields_get_clear_errors(server, body, status, param):
    path = "/v1/completions" if b"prompt" in (body if isinstance(body, bytes) else b"") else "/v1/chat/completions"
    got, reply = request(server, path, body)
    assert got == status and reply["error"]["param"] == param and reply["error"]["message"], reply
    still_serving(server)


def test_the_unknown_model_error_names_the_served_id(server):
    status, reply = request(server, "/v1/chat/completions", {**CHAT, "model": "gpt-9"})
    assert status == 404 and "'tiny'" in reply["error"]["message"], reply
    listed = [m["id"] for m in server.get("/v1/models")["data"]]
    assert listed == ["tiny"]
