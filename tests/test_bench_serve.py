"""The serving benchmark's pure parts (bench/bench_serve.py): stream accounting, percentiles,
aggregation, the target verdict, the table and the /metrics check. No server: fast."""

import importlib.util
import json
import sys
from pathlib import Path

import numpy as np
import pytest

BENCH = Path(__file__).resolve().parents[1] / "bench"


@pytest.fixture(scope="module")
def bs():
    spec = importlib.util.spec_from_file_location("anychip_bench_serve_under_test", BENCH / "bench_serve.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    yield module
    sys.modules.pop(spec.name, None)


def sse(obj) -> list[str]:
    return [f"data: {obj if isinstance(obj, str) else json.dumps(obj)}", ""]


def chat_chunk(text=None, finish=None, first=False):
    delta = {"role": "assistant"} if first else {}
    if text is not None:
        delta["content"] = text
    return {"object": "chat.completion.chunk", "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}


def usage_chunk(completion, prompt=10):
    return {"choices": [], "usage": {"prompt_tokens": prompt, "completion_tokens": completion,
                                     "total_tokens": prompt + completion}}


def feed(tally, events_with_times):
    for t, event in events_with_times:
        for line in sse(event):
            tally.feed(line, t)


def test_tally_counts_the_server_stream(bs):
    tally = bs.StreamTally(start=1.0)
    feed(tally, [(1.1, chat_chunk("", first=True)),  # the role chunk: no content, not the first token
                 (1.5, chat_chunk("Once")), (1.6, chat_chunk(" upon")), (1.9, chat_chunk(" a time")),
                 (1.9, chat_chunk(finish="length")), (1.9, usage_chunk(4, 46)), (1.9, "[DONE]")])
    r = tally.record(end=2.0)
    assert r.tokens == 4 and r.prompt_tokens == 46 and r.chunks == 3 and r.finish_reason == "length"
    assert r.ttft == pytest.approx(0.5)
    assert r.per_token == pytest.approx((1.9 - 1.5) / 3)  # tokens from usage, not chunks


def test_tally_completions_shape_comments_and_multiline_data(bs):
    tally = bs.StreamTally(start=0.0)
    tally.feed(": keep-alive", 0.1)
    text = {"object": "text_completion", "choices": [{"index": 0, "text": "ab", "finish_reason": None}]}
    # one event split over two data lines is joined with a newline (SSE): JSON allows it between tokens
    body = json.dumps(text).replace(", ", ",\n", 1).split("\n")
    for line in [f"data: {body[0]}", f"data:{body[1]}", ""]:
        tally.feed(line + "\r\n", 0.2)
    feed(tally, [(0.3, usage_chunk(1)), (0.3, "[DONE]")])
    r = tally.record(end=0.4)
    assert r.first == 0.2 and r.chunks == 1 and r.tokens == 1 and r.per_token is None


def test_tally_final_event_without_blank_line(bs):
    tally = bs.StreamTally(start=0.0)
    feed(tally, [(0.1, chat_chunk("x")), (0.2, usage_chunk(1))])
    tally.feed("data: [DONE]", 0.3)
    assert tally.record(end=0.3).tokens == 1


@pytest.mark.parametrize("events,message", [
    ([chat_chunk("x"), usage_chunk(1)], "without data: [DONE]"),
    ([chat_chunk("x"), "[DONE]"], "no usage chunk"),
    ([{"error": {"message": "generation failed on cpu: boom"}}], "mid-stream: generation failed on cpu: boom"),
    (["{not json"], "not JSON"),
    ([usage_chunk(1), "[DONE]", chat_chunk("late")], "after data: [DONE]"),
    ([{"choices": [], "usage": {"prompt_tokens": 1}}, "[DONE]"], "no valid completion_tokens"),
])
def test_tally_rejects_broken_streams(bs, events, message):
    tally = bs.StreamTally(start=0.0)
    with pytest.raises(bs.StreamError, match=message.replace("[", r"\[").replace("]", r"\]")):
        feed(tally, [(0.1, e) for e in events])
        tally.record(end=0.2)


def test_percentile_matches_numpy(bs):
    rng = np.random.default_rng(0)
    for n in (1, 2, 5, 33):
        xs = list(rng.random(n))
        for q in (0, 50, 95, 100):
            assert bs.percentile(xs, q) == pytest.approx(np.percentile(xs, q))
    assert bs.percentile([], 50) is None and bs.percentile([None, 3.0, None], 95) == 3.0
    with pytest.raises(ValueError, match="in \\[0, 100\\]"):
        bs.percentile([1.0], 101)


def record(bs, start, first, last, tokens, end=None, finish="length"):
    return bs.RequestRecord(start, first, last, end if end is not None else last, tokens, 10, tokens, finish)


def test_summarize_and_ratios(bs):
    seq = [record(bs, 0, 0.1, 1.1, 11), record(bs, 1.1, 1.3, 2.3, 11)]
    par = [record(bs, 0, 0.2, 0.7, 11), record(bs, 0, 0.4, 0.9, 11), record(bs, 0, 0.3, 0.3, 1, finish="stop")]
    rows = bs.add_ratios([bs.summarize(par, 1.0, 16), bs.summarize(seq, 2.3, 1)])
    p, s = rows
    assert s["output_tok_s"] == pytest.approx(22 / 2.3) and s["vs_sequential"] == pytest.approx(1.0)
    assert p["output_tokens"] == 23 and p["output_tok_s"] == pytest.approx(23.0)
    assert p["vs_sequential"] == pytest.approx(23.0 / (22 / 2.3))
    assert p["ttft_p50_s"] == pytest.approx(0.3) and p["ttft_p95_s"] == pytest.approx(0.39)
    assert p["per_token_p50_s"] == pytest.approx(0.05)  # the 1-token request has no per-token latency
    assert p["finish_reasons"] == {"length": 2, "stop": 1} and p["prompt_tokens"] == 30
    with pytest.raises(ValueError, match="no requests"):
        bs.summarize([], 1.0, 1)
    assert bs.mean_decode_batch(par, 5) == pytest.approx(4.0) and bs.mean_decode_batch(par, 0) is None


def test_verdict(bs):
    rows = [{"clients": 1, "output_tok_s": 50.0}, {"clients": 16, "output_tok_s": 260.0}]
    v = bs.verdict(rows)
    assert v["result"] == "PASS" and v["ratio"] == pytest.approx(5.2)
    assert "PASS (5.20x: 260.0 vs 50.0 tok/s, this run's sequential rate)" in v["line"]
    # a faster single-request rate from another configuration is the one to beat
    faster = {"output_tok_s": 60.0, "label": "the default server"}
    v = bs.verdict(rows, baseline=faster)
    assert v["result"] == "MISS" and "4.33x: 260.0 vs 60.0 tok/s, the default server's sequential rate" in v["line"]
    assert bs.verdict(rows, baseline={"output_tok_s": 40.0, "label": "x"})["ratio"] == pytest.approx(5.2)
    rows[1]["output_tok_s"] = 249.0
    assert bs.verdict(rows)["result"] == "MISS"
    na = bs.verdict(rows[:1])
    assert na["result"] == "n/a" and na["ratio"] is None and "16 clients not measured" in na["line"]


def test_table(bs):
    rows = bs.add_ratios([
        {"clients": 1, "requests": 8, "output_tok_s": 60.0, "ttft_p50_s": 0.12, "ttft_p95_s": 0.2,
         "per_token_p50_s": 0.0151, "per_token_p95_s": 0.02, "mean_decode_batch": 1.0, "decode_step_s": 0.0071,
         "cpu_share": {"server": 0.5, "clients": 0.01, "other": 0.123}},
        {"clients": 16, "requests": 8, "output_tok_s": 200.0, "ttft_p50_s": 0.5, "ttft_p95_s": 1.25,
         "per_token_p50_s": 0.06, "per_token_p95_s": None, "mean_decode_batch": None}])
    meta = {"model": "smollm2", "device": "npu:0", "simulated": True, "max_tokens": 64, "requests": 8,
            "date": "2026-01-01T00:00:00+00:00"}
    text = bs.render_table(rows, meta)
    lines = text.splitlines()
    assert "npu:0 (simulated" in lines[0]
    table = [l for l in lines if l.startswith("|")]
    assert table[0].startswith("| clients | requests | output tok/s | vs sequential | TTFT p50 / p95 (ms) |")
    assert table[2] == "| 1 (sequential) | 8 | 60.0 | 1.00x | 120 / 200 | 15.1 / 20.0 | 1.0 | 7.1 | 12% |"
    assert table[3] == "| 16 | 8 | 200.0 | 3.33x | 500 / 1250 | 60.0 / - | - | - | - |"
    assert any(l.startswith("target 16 clients") and "MISS (3.33x: 200.0 vs 60.0 tok/s" in l for l in lines)
    real = bs.render_table(rows, {**meta, "device": "cpu:0", "simulated": False, "server": {"extra_args": ["--bf16"]}})
    assert "simulated" not in real and real.splitlines()[0].endswith("on cpu:0 (serve --bf16)")


def test_baseline_reads_an_earlier_run(bs, tmp_path):
    path = tmp_path / "results.json"
    path.write_text(json.dumps({"date": "d", "server": {"extra_args": []},
                                "rows": [{"clients": 1, "output_tok_s": 98.5}, {"clients": 16, "output_tok_s": 250.0}]}))
    assert bs.sequential_baseline(path) == {"file": str(path), "output_tok_s": 98.5, "date": "d",
                                            "label": "the default server"}
    path.write_text(json.dumps({"rows": [{"clients": 16, "output_tok_s": 250.0}]}))
    with pytest.raises(ValueError, match="not a bench_serve results.json with a 1-client row"):
        bs.sequential_baseline(path)
    with pytest.raises(SystemExit):
        bs.parse_args(["--baseline", str(tmp_path / "missing.json")])


METRICS = """# HELP anychip_requests_total Requests that left the engine, by outcome.
# TYPE anychip_requests_total counter
anychip_requests_total{outcome="cancelled"} 0
anychip_requests_total{outcome="length"} 2
anychip_requests_total{outcome="stop"} 1
anychip_prompt_tokens_total 30
anychip_completion_tokens_total 23
anychip_decode_steps_total 9
anychip_tokens_per_second 50.63
"""


def test_metrics_consistency(bs):
    counts = bs.server_counts(bs.parse_metrics(METRICS))
    assert counts == {"completion_tokens": 23, "prompt_tokens": 30, "decode_steps": 9, "requests": 3}
    records = [record(bs, 0, 0.2, 0.7, 11), record(bs, 0, 0.4, 0.9, 11), record(bs, 0, 0.3, 0.3, 1)]
    assert bs.consistency(counts, records)["ok"]
    bad = bs.consistency(counts, records[:2])
    assert not bad["ok"] and bad["mismatch"] == [
        "completion_tokens: server 23, clients 22", "prompt_tokens: server 30, clients 20",
        "requests: server 3, clients 2"]
    with pytest.raises(ValueError, match="lacks anychip_completion_tokens_total"):
        bs.server_counts(bs.parse_metrics("anychip_prompt_tokens_total 1\n"))
    with pytest.raises(ValueError, match="no number"):
        bs.parse_metrics("anychip_prompt_tokens_total many\n")


def test_arguments(bs):
    args = bs.parse_args([])
    assert (args.device, args.model, args.clients, args.max_tokens, args.out) == \
        ("cpu", "smollm2", [1, 8, 16, 32], 64, Path("runs/serve-bench"))
    assert bs.parse_args(["--clients", "16,4"]).clients == [1, 4, 16]  # the baseline always runs
    for bad in (["--clients", "0,4"], ["--clients", "a"], ["--requests", "0"], ["--requests", "16"]):
        with pytest.raises(SystemExit):
            bs.parse_args(bad)


def test_cpu_meter_shares(bs):
    import os

    meter = bs.CpuMeter(os.getpid())  # this process as the "server": its CPU counts there
    sum(i * i for i in range(200_000))
    shares = meter.stop()
    assert set(shares) == {"server", "clients", "other"}
    assert all(v is None or 0.0 <= v <= 1.0 for v in shares.values())
    assert bs._tree_cpu(os.getpid()) > 0 and bs._tree_cpu(2**22 + 12345) is None


def test_write_outputs(bs, tmp_path):
    rows = bs.add_ratios([
        {"clients": c, "requests": 16, "output_tok_s": tok_s, "ttft_p50_s": 0.1 * c, "ttft_p95_s": 0.2 * c,
         "per_token_p50_s": 0.02, "per_token_p95_s": 0.03, "mean_decode_batch": float(c),
         "cpu_share": {"server": 0.9, "clients": 0.02, "other": 0.3}, "records": []}
        for c, tok_s in ((1, 60.0), (8, 150.0), (16, 320.0))])
    results = {"model": "/some/where/tiny", "device": "xpu:0", "simulated": True, "max_tokens": 16, "requests": 16,
               "date": "2026-01-01T00:00:00+00:00", "rows": rows, "target": bs.verdict(rows),
               "host": {"cpu": "AMD EPYC", "logical_cpus": 2, "int8_units": "AVX-512 VNNI", "anychip_cpu_isa": "(best)"}}
    written = bs.write_outputs(results, tmp_path / "out")
    assert json.loads((tmp_path / "out" / "results.json").read_text())["target"]["result"] == "PASS"
    table = (tmp_path / "out" / "table.md").read_text()
    assert "| 16 | 16 | 320.0 | 5.33x |" in table
    assert "CPU: AMD EPYC, 2 logical CPUs, int8 units: AVX-512 VNNI (ANYCHIP_CPU_ISA: (best))" in table
    if importlib.util.find_spec("matplotlib"):
        assert (tmp_path / "out" / "serve-load.png") in written
        assert (tmp_path / "out" / "serve-load.png").stat().st_size > 10_000
