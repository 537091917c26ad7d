"""A bounded load test of `anychip serve` with hostile clients mixed in: 16 normal streaming
clients, slow clients holding sockets open mid-request, clients that hang up mid-stream, and
oversized bodies, all at once. /health answers within 1 s throughout, every normal request gets
its greedy answer alone, and the server ends with no request running (a hung-up request is
cancelled, or finishes first on a model this fast)."""

from __future__ import annotations

import json
import socket
import threading
import time

import httpx
import pytest

from serve_helpers import Server

PROMPTS = [f"Count from {i}." for i in range(16)]


@pytest.fixture(scope="module")
def server(model_dir):
    with Server(model_dir, "cpu", "--max-batch", "8", "--max-body-bytes", "65536") as s:
        yield s


def complete(url: str, prompt: str, max_tokens: int = 12) -> str:
    """The streamed text of a greedy completion."""
    body = {"model": "model", "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "stream": True,
            "ignore_eos": True}
    parts = []
    with httpx.stream("POST", url + "/v1/completions", json=body, timeout=120) as r:
        assert r.status_code == 200, r.read()
        for line in r.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                chunk = json.loads(line[6:])
                parts.extend(c["text"] for c in chunk["choices"])
    return "".join(parts)


def test_health_stays_fast_and_answers_stay_right_under_mixed_hostile_load(server):
    expected = {p: complete(server.url, p) for p in PROMPTS[:4]}  # alone, before the load
    expected.update({p: complete(server.url, p) for p in PROMPTS[4:]})
    stop = threading.Event()
    health_times, failures, answers = [], [], {}

    def poll_health():
        while not stop.is_set():
            start = time.monotonic()
            try:
                assert httpx.get(server.url + "/health", timeout=5).json()["status"] == "ok"
            except Exception as e:  # noqa: BLE001 - recorded, asserted below
                failures.append(f"health: {e}")
            health_times.append(time.monotonic() - start)
            time.sleep(0.05)

    def normal(prompt):
        try:
            answers[prompt] = complete(server.url, prompt)
        except Exception as e:  # noqa: BLE001
            failures.append(f"{prompt}: {e}")

    def slow_sender():  # headers, then half a body, then silence while holding the socket
        body = json.dumps({"prompt": "slow " * 50, "max_tokens": 4}).encode()
        with socket.create_connection(("127.0.0.1", server.port), timeout=30) as s:
            s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                      b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body[:len(body) // 2])
            stop.wait(20)

    def hang_up_mid_stream():
        body = {"prompt": "Tell me everything.", "max_tokens": 500, "temperature": 0, "stream": True,
                "ignore_eos": True}
        with httpx.stream("POST", server.url + "/v1/completions", json=body, timeout=60) as r:
            for i, _line in enumerate(r.iter_lines()):
                if i >= 6:
                    break  # closes the connection mid-stream

    def oversized():
        reply = httpx.post(server.url + "/v1/completions", content=b'{"prompt": "' + b"a" * 200_000 + b'"}',
                           headers={"Content-Type": "application/json"}, timeout=30)
        if reply.status_code != 413:
            failures.append(f"oversized body: {reply.status_code}")

    threads = [threading.Thread(target=poll_health)]
    threads += [threading.Thread(target=slow_sender) for _ in range(4)]
    threads += [threading.Thread(target=hang_up_mid_stream) for _ in range(4)]
    threads += [threading.Thread(target=oversized) for _ in range(2)]
    threads += [threading.Thread(target=normal, args=(p,)) for p in PROMPTS]
    for t in threads:
        t.start()
    for t in threads[9:]:  # the hang-ups, the oversized bodies and the normal clients
        t.join(300)
    stop.set()
    for t in threads[:9]:
        t.join(60)
    assert not failures, failures
    assert answers == expected
    assert health_times and max(health_times) < 1.0, f"/health took up to {max(health_times):.2f} s"
    deadline = time.monotonic() + 20
    while httpx.get(server.url + "/health").json()["running"] and time.monotonic() < deadline:
        time.sleep(0.1)
    assert httpx.get(server.url + "/health").json()["running"] == 0  # no row kept by a client that left

