"""Serving under load: `anychip serve` (continuous batching) with C concurrent streaming clients
against the same server taking one request at a time.

The server runs in a child process on a loopback port (tests/serve_helpers.py's ``Server``) with
``--max-batch`` = the largest client count. For each client count C, C asyncio clients (httpx)
send streaming chat completions (greedy, ``max_tokens`` fixed, ``stream_options.include_usage``)
until N requests are done; C = 1 is the baseline, sequential single-request serving on the same
device. Requests set ``ignore_eos`` (the server's vLLM-style extension), so each generates
exactly ``max_tokens``; the figures still count the tokens the final usage chunk reports. Request
i gets the same prompt at every C, so each point does the same work.

Per request: time to first token (request sent to first non-empty content chunk), per-token
latency ((last content chunk - first) / (tokens - 1)), tokens. Per C: output tok/s (all tokens /
wall time from the first request sent to the last one done), p50/p95 of TTFT and per-token
latency, the mean decode batch the server saw (its decode-step counter), and who used the CPUs
meanwhile (server, clients, other processes: the clients share the machine). Target (reported,
not asserted): with 16 clients, output tok/s >= 5x the sequential (C = 1) tok/s, on a CPU without AMX
(the default server decodes steps of 4+ requests with int8 activations, AVX-512 VNNI there). At the end the
server's /metrics must count exactly the completion and prompt tokens the clients received
(a consistency check that fails the run).

As a script (the full measurement with smollm2: ~3 minutes on a quiet 2-core machine, up to ~6
when other work takes half of it; --requests 32 halves that)::

    python bench/bench_serve.py --device cpu --model smollm2 --clients 1,8,16,32 --requests 64 \\
        --max-tokens 64 --out runs/serve-bench

writes results.json, table.md and serve-load.png to --out. Under pytest-benchmark (the core
case only: 1 and 16 clients)::

    python -m pytest bench/bench_serve.py --benchmark-only

with the script's defaults, overridable through ANYCHIP_BENCH_SERVE_ARGS (e.g.
"--requests 16 --max-tokens 16"); its outputs go to <--bench-out>/serve/.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import os
import platform
import shlex
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import pytest

from anychip_bench.benchlib import cpu_busy_seconds

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))  # serve_helpers.Server

TARGET_CLIENTS = 16
TARGET_RATIO = 5.0
PROMPT_ROOM = 128  # tokens of --max-len kept for the prompt (chat template included): ~50 with smollm2
SIMULATED_NOTE = "simulated: host CPU speed, not the chip's"

TOPICS = [
    "a lighthouse keeper who finds a message in a bottle",
    "a robot learning to paint in an abandoned city",
    "two rival bakers in a small mountain village",
    "a girl who can talk to the wind",
    "the last train across a frozen desert",
    "a detective who solves crimes through smells",
    "a library that rearranges itself every night",
    "an astronaut stranded on a moon covered in forests",
    "a fisherman who catches a talking fish",
    "a clockmaker whose clocks can stop time",
    "a dragon who is afraid of heights",
    "a musician who plays for the stars",
    "a family moving to an island with no roads",
    "a gardener growing a tree made of glass",
    "a thief who only steals forgotten memories",
    "a ship sailing across an ocean of clouds",
]


def prompt(i: int) -> str:
    return (f"Write a long story about {TOPICS[i % len(TOPICS)]}. Describe every character, place and event "
            "in rich detail, with many chapters.")


# ---------------------------------------------------------------------------------------------
# Pure parts: stream accounting, statistics, the table (tests/test_bench_serve.py)


class StreamError(RuntimeError):
    """A streamed completion that broke the protocol or reported an error."""


@dataclass
class RequestRecord:
    """One request's timeline (time.perf_counter seconds) and tokens."""

    start: float
    first: float | None  # first non-empty content chunk
    last: float | None   # last non-empty content chunk
    end: float           # the stream closed
    tokens: int          # completion tokens, from the usage chunk
    prompt_tokens: int
    chunks: int          # non-empty content chunks (a chunk may carry several tokens' text)
    finish_reason: str | None

    @property
    def ttft(self) -> float | None:
        return None if self.first is None else self.first - self.start

    @property
    def per_token(self) -> float | None:
        if self.first is None or self.tokens < 2:
            return None
        return (self.last - self.first) / (self.tokens - 1)


class StreamTally:
    """Reads one response's server-sent events line by line (``feed`` each line with the time it
    arrived) and accounts for them: content chunk times, usage, finish reason, ``[DONE]``.
    Events follow the SSE rules (data lines joined until a blank line; ``:`` comments)."""

    def __init__(self, start: float):
        self.start = start
        self.first = self.last = None
        self.chunks = 0
        self.usage: dict | None = None
        self.finish_reason = None
        self.done = False
        self._data: list[str] = []

    def feed(self, line: str, t: float) -> None:
        line = line.rstrip("\r\n")
        if not line:
            self._dispatch(t)
        elif not line.startswith(":"):
            name, _, value = line.partition(":")
            if name == "data":
                self._data.append(value[1:] if value.startswith(" ") else value)

    def _dispatch(self, t: float) -> None:
        if not self._data:
            return
        data, self._data = "\n".join(self._data), []
        if self.done:
            raise StreamError(f"an event arrived after data: [DONE]: {data[:200]}")
        if data == "[DONE]":
            self.done = True
            return
        try:
            obj = json.loads(data)
        except json.JSONDecodeError:
            raise StreamError(f"an event is not JSON: {data[:200]}") from None
        if "error" in obj:
            error = obj["error"]
            raise StreamError(f"the server reported an error mid-stream: "
                              f"{error.get('message', error) if isinstance(error, dict) else error}")
        for choice in obj.get("choices") or []:
            text = (choice.get("delta") or {}).get("content") if "delta" in choice else choice.get("text")
            if text:
                if self.first is None:
                    self.first = t
                self.last = t
                self.chunks += 1
            if choice.get("finish_reason"):
                self.finish_reason = choice["finish_reason"]
        if obj.get("usage"):
            self.usage = obj["usage"]

    def record(self, end: float) -> RequestRecord:
        """The request's record once the stream has closed; raises StreamError if it is incomplete."""
        self._dispatch(end)  # an event the stream ended without a blank line after
        if not self.done:
            raise StreamError("the stream ended without data: [DONE]")
        if self.usage is None:
            raise StreamError("the stream carried no usage chunk (stream_options.include_usage was sent)")
        tokens = self.usage.get("completion_tokens")
        if not isinstance(tokens, int) or tokens < 0:
            raise StreamError(f"the usage chunk has no valid completion_tokens: {self.usage}")
        return RequestRecord(self.start, self.first, self.last, end, tokens, int(self.usage.get("prompt_tokens", 0)),
                             self.chunks, self.finish_reason)


def percentile(values, q: float) -> float | None:
    """The q-th percentile (0-100) with linear interpolation between ranks (numpy's default);
    None when there are no values."""
    xs = sorted(v for v in values if v is not None)
    if not xs:
        return None
    if not 0 <= q <= 100:
        raise ValueError(f"percentile q must be in [0, 100], got {q}")
    pos = (len(xs) - 1) * q / 100
    lo = int(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def summarize(records: list[RequestRecord], wall_s: float, clients: int) -> dict:
    """One client count's figures from its requests and the run's wall time."""
    if not records:
        raise ValueError("no requests were recorded")
    if wall_s <= 0:
        raise ValueError(f"the wall time must be > 0, got {wall_s}")
    tokens = sum(r.tokens for r in records)
    ttft = [r.ttft for r in records]
    per_token = [r.per_token for r in records]
    return {
        "clients": clients,
        "requests": len(records),
        "output_tokens": tokens,
        "prompt_tokens": sum(r.prompt_tokens for r in records),
        "wall_s": wall_s,
        "output_tok_s": tokens / wall_s,
        "ttft_p50_s": percentile(ttft, 50),
        "ttft_p95_s": percentile(ttft, 95),
        "per_token_p50_s": percentile(per_token, 50),
        "per_token_p95_s": percentile(per_token, 95),
        "latency_p50_s": percentile([r.end - r.start for r in records], 50),
        "tokens_per_request_mean": tokens / len(records),
        "finish_reasons": dict(Counter(r.finish_reason or "none" for r in records)),
    }


def mean_decode_batch(records: list[RequestRecord], decode_steps: int) -> float | None:
    """Requests per batched decode step: each request's first token comes from its prefill, the
    rest from decode steps."""
    if decode_steps <= 0:
        return None
    return sum(max(r.tokens - 1, 0) for r in records) / decode_steps


def add_ratios(rows: list[dict]) -> list[dict]:
    """Sets each row's ``vs_sequential``: its output tok/s over the one-client row's."""
    base = next((r for r in rows if r["clients"] == 1), None)
    for r in rows:
        r["vs_sequential"] = None if base is None else r["output_tok_s"] / base["output_tok_s"]
    return rows


def verdict(rows: list[dict], clients: int = TARGET_CLIENTS, ratio: float = TARGET_RATIO,
            baseline: dict | None = None) -> dict:
    """PASS / MISS (or n/a when not measured) of "output tok/s at ``clients`` >= ``ratio`` x
    sequential". With ``baseline`` (``sequential_baseline``: another run's single-request rate,
    e.g. the server's default configuration), the faster of the two sequential rates is the one
    to beat, so a configuration that is slow one at a time cannot pass by it."""
    target = f"{clients} clients: output tok/s >= {ratio:g}x sequential (1 client)"
    row = next((r for r in rows if r["clients"] == clients), None)
    base = next((r for r in rows if r["clients"] == 1), None)
    if row is None or base is None:
        missing = "1 client" if base is None else f"{clients} clients"
        return {"target": target, "result": "n/a", "ratio": None,
                "line": f"target {target}: n/a ({missing} not measured)"}
    reference, which = base["output_tok_s"], "this run's"
    if baseline is not None and baseline["output_tok_s"] > reference:
        reference, which = baseline["output_tok_s"], f"{baseline['label']}'s"
    got = row["output_tok_s"] / reference
    result = "PASS" if got >= ratio else "MISS"
    return {"target": target, "result": result, "ratio": got,
            "line": f"target {target}: {result} ({got:.2f}x: {row['output_tok_s']:.1f} vs {reference:.1f} tok/s, "
                    f"{which} sequential rate)"}


def sequential_baseline(path: Path) -> dict:
    """The single-request rate of an earlier run's results.json, labelled by its server arguments."""
    try:
        results = json.loads(path.read_text())
        row = next(r for r in results["rows"] if r["clients"] == 1)
        extra = results.get("server", {}).get("extra_args", [])
        return {"file": str(path), "output_tok_s": float(row["output_tok_s"]), "date": results.get("date"),
                "label": "the default server" if not extra else "the server with " + " ".join(extra)}
    except (OSError, ValueError, KeyError, StopIteration) as e:
        raise ValueError(f"--baseline {path}: not a bench_serve results.json with a 1-client row ({e})") from None


def device_label(device: str, simulated: bool) -> str:
    return f"{device} ({SIMULATED_NOTE})" if simulated else device


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1e3:.0f}" if seconds >= 0.1 else f"{seconds * 1e3:.1f}"


def render_table(rows: list[dict], meta: dict) -> str:
    """The Markdown table of the run: one row per client count, the target line under it."""
    head = ["clients", "requests", "output tok/s", "vs sequential", "TTFT p50 / p95 (ms)",
            "per-token p50 / p95 (ms)", "mean decode batch", "model ms / step", "other load"]
    extra = " ".join(meta.get("server", {}).get("extra_args", []))
    lines = [f"# anychip serve under load: {meta['model']} on {device_label(meta['device'], meta['simulated'])}"
             + (f" (serve {extra})" if extra else ""),
             "",
             f"Streaming chat completions, greedy, max_tokens {meta['max_tokens']}, {meta['requests']} requests per "
             f"row; output tok/s = completion tokens / wall time; {meta.get('date', '')}".rstrip("; "),
             *(["", f"CPU: {host['cpu']}, {host['logical_cpus']} logical CPUs, int8 units: {host['int8_units']}"
                f" (ANYCHIP_CPU_ISA: {host['anychip_cpu_isa']})"] if (host := meta.get("host")) else []),
             "",
             "| " + " | ".join(head) + " |",
             "|" + "|".join("---:" for _ in head) + "|"]
    for r in rows:
        who = f"{r['clients']} (sequential)" if r["clients"] == 1 else str(r["clients"])
        ratio = "-" if r.get("vs_sequential") is None else f"{r['vs_sequential']:.2f}x"
        batch = "-" if r.get("mean_decode_batch") is None else f"{r['mean_decode_batch']:.1f}"
        other = (r.get("cpu_share") or {}).get("other")
        other = "-" if other is None else f"{other:.0%}"
        cells = [who, str(r["requests"]), f"{r['output_tok_s']:.1f}", ratio,
                 f"{_ms(r['ttft_p50_s'])} / {_ms(r['ttft_p95_s'])}",
                 f"{_ms(r['per_token_p50_s'])} / {_ms(r['per_token_p95_s'])}", batch, _ms(r.get("decode_step_s")), other]
        lines.append("| " + " | ".join(cells) + " |")
    lines += ["", verdict(rows, baseline=meta.get("baseline"))["line"], "",
              "mean decode batch: requests per batched decode step (server counters); model ms / step: the server's "
              "time inside batched decode calls per step; other load: CPU time of "
              "processes other than the server and the clients, share of all CPUs (above ~10%: rerun on a quiet "
              "machine)"]
    return "\n".join(lines) + "\n"


def parse_metrics(text: str) -> dict[str, float]:
    """Prometheus text exposition -> {"name{labels}": value} (comments skipped)."""
    out = {}
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            key, _, value = line.rpartition(" ")
            try:
                out[key] = float(value)
            except ValueError:
                raise ValueError(f"a /metrics sample has no number: {line!r}") from None
    return out


def server_counts(metrics: dict[str, float]) -> dict[str, int]:
    """The counters the consistency check compares, from parsed /metrics."""
    try:
        done = sum(v for k, v in metrics.items() if k.startswith("anychip_requests_total{"))
        return {"completion_tokens": int(metrics["anychip_completion_tokens_total"]),
                "prompt_tokens": int(metrics["anychip_prompt_tokens_total"]),
                "decode_steps": int(metrics["anychip_decode_steps_total"]), "requests": int(done)}
    except KeyError as e:
        raise ValueError(f"/metrics lacks {e.args[0]}") from None


def consistency(server: dict[str, int], records: list[RequestRecord]) -> dict:
    """The server's counters (since it started) against what the clients received, every request
    (warmups included); ``ok`` only when all agree."""
    client = {"completion_tokens": sum(r.tokens for r in records),
              "prompt_tokens": sum(r.prompt_tokens for r in records), "requests": len(records)}
    wrong = [f"{k}: server {server[k]}, clients {v}" for k, v in client.items() if server[k] != v]
    return {"ok": not wrong, "server": server, "clients": client, "mismatch": wrong}


# ---------------------------------------------------------------------------------------------
# The load


async def _one_request(client, url: str, body: dict) -> RequestRecord:
    start = time.perf_counter()
    async with client.stream("POST", url + "/v1/chat/completions", json=body) as response:
        if response.status_code != 200:
            text = (await response.aread()).decode(errors="replace")
            raise StreamError(f"POST /v1/chat/completions answered {response.status_code}: {text[:500]}")
        tally = StreamTally(start)
        async for line in response.aiter_lines():
            tally.feed(line, time.perf_counter())
    return tally.record(time.perf_counter())


async def _load(url: str, bodies: list[dict], clients: int, on_done=None) -> tuple[list[RequestRecord], float]:
    """``clients`` workers take the next body in turn until all are sent; returns the records (in
    body order) and the wall time from the first request to the last one done."""
    import httpx

    records: list[RequestRecord | None] = [None] * len(bodies)
    queue = iter(range(len(bodies)))  # shared: each worker takes the next index

    async def worker(client):
        for i in queue:
            records[i] = await _one_request(client, url, bodies[i])
            if on_done is not None:
                on_done(records[i])

    # trust_env=False: a proxy from the environment must not sit between us and the loopback server
    limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)
    async with httpx.AsyncClient(timeout=httpx.Timeout(300.0, connect=10.0), limits=limits,
                                 trust_env=False) as client:
        t0 = time.perf_counter()
        await asyncio.gather(*(worker(client) for _ in range(clients)))
        wall = time.perf_counter() - t0
    return records, wall


def _tree_cpu(root: int) -> float | None:
    """CPU seconds (user + system) so far of process ``root`` and its live descendants (the
    server has a stderr-filter child), None where /proc is unreadable."""
    stats = {}
    try:
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit():
                try:
                    fields = (entry / "stat").read_text().rpartition(")")[2].split()
                except OSError:  # it ended meanwhile
                    continue
                stats[int(entry.name)] = (int(fields[1]), int(fields[11]) + int(fields[12]))  # ppid, ticks
    except OSError:
        return None
    if root not in stats:
        return None
    tree, grew = {root}, True
    while grew:  # until no process has a parent in the tree that is not in it yet
        grew = False
        for pid, (ppid, _) in stats.items():
            if ppid in tree and pid not in tree:
                tree.add(pid)
                grew = True
    return sum(stats[pid][1] for pid in tree) / os.sysconf("SC_CLK_TCK")


class CpuMeter:
    """Who used the CPUs during a load, as shares of all of them: the server, these clients, and
    other processes. The clients share the machine with the server, and on a shared 2-core
    machine other work slows the server a lot; each row carries the figures so a reader can tell."""

    def __init__(self, server_pid: int):
        self.pid = server_pid
        self.t0 = self._snapshot()

    def _snapshot(self):
        own = os.times()
        return time.perf_counter(), cpu_busy_seconds(), own.user + own.system, _tree_cpu(self.pid)

    def stop(self) -> dict:
        t1 = self._snapshot()
        span = (t1[0] - self.t0[0]) * (os.cpu_count() or 1)
        if span <= 0 or None in t1 or None in self.t0:
            return {"server": None, "clients": None, "other": None}
        busy, clients, server = (t1[i] - self.t0[i] for i in (1, 2, 3))
        share = lambda v: round(min(1.0, max(0.0, v / span)), 3)  # noqa: E731 -- /proc/stat ticks are coarse
        return {"server": share(server), "clients": share(clients), "other": share(busy - server - clients)}


def host_info() -> dict:
    cpu, flags = platform.processor() or platform.machine(), set()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.partition(":")[2].strip()
            elif line.startswith("flags") and not flags:
                flags = set(line.partition(":")[2].split())
    except OSError:
        pass
    # The target is for CPUs without AMX: which int8 units this one has, and any cap on them
    units = [u for u, flag in (("AMX", "amx_int8"), ("AVX-512 VNNI", "avx512_vnni"), ("AVX-VNNI", "avx_vnni"))
             if flag in flags]
    info = {"cpu": cpu, "logical_cpus": os.cpu_count(), "platform": platform.platform(),
            "python": platform.python_version(), "int8_units": ", ".join(units) or "none",
            "anychip_cpu_isa": os.environ.get("ANYCHIP_CPU_ISA", "(best)")}
    if hasattr(os, "getloadavg"):
        info["loadavg_1m_at_start"] = round(os.getloadavg()[0], 2)
    return info


def git_commit() -> dict:
    def git(*args):
        # --no-optional-locks: status must not refresh (write) the index
        return subprocess.run(["git", "--no-optional-locks", "-C", str(ROOT), *args], capture_output=True,
                              text=True, timeout=30)
    try:
        head = git("rev-parse", "HEAD")
        status = git("status", "--porcelain", "--untracked-files=no")
    except (OSError, subprocess.TimeoutExpired) as e:
        return {"commit": None, "error": str(e)}
    if head.returncode != 0:
        return {"commit": None, "error": head.stderr.strip()}
    return {"commit": head.stdout.strip(), "dirty": bool(status.stdout.strip())}


class LoadBench:
    """A running server plus everything measured against it."""

    def __init__(self, args):
        from serve_helpers import Server

        if args.requests < max(args.clients):
            raise ValueError(f"{args.requests} requests are fewer than the {max(args.clients)} clients: they would "
                             "never all run at once")
        self.args = args
        self.max_len = args.max_len or max(256, PROMPT_ROOM + args.max_tokens)
        self.date = datetime.datetime.now().astimezone().isoformat(timespec="seconds")
        self.host = host_info()
        t0 = time.perf_counter()
        self.server = Server(args.model, args.device, "--max-batch", max(args.clients), "--max-len", self.max_len,
                             *args.server_arg, ready_s=args.ready_s)
        self.startup_s = time.perf_counter() - t0
        self.records: list[RequestRecord] = []  # every request, warmups included
        self.rows: list[dict] = []
        try:
            self.health = self.server.get("/health")
            self._warmup()
            self.warmup_requests = len(self.records)
        except BaseException:
            self.close()
            raise

    def body(self, i: int, max_tokens: int) -> dict:
        return {"model": self.health["model"], "messages": [{"role": "user", "content": prompt(i)}],
                "max_tokens": max_tokens, "temperature": 0, "stream": True, "ignore_eos": True,
                "stream_options": {"include_usage": True}}

    def _run(self, bodies, clients, on_done=None):
        try:
            records, wall = asyncio.run(_load(self.server.url, bodies, clients, on_done))
        except Exception as e:
            stderr = self.server.stop()[-4000:]  # the run cannot go on; what the server said may tell why
            raise RuntimeError(f"the load with {clients} clients failed: {e}\nserver stderr:\n{stderr}") from e
        self.records += records
        return records, wall

    def _warmup(self):
        """First calls pay one-time costs (allocations, first kernel launches) at each batch size:
        one request alone, then a burst as wide as the widest load."""
        self._run([self.body(0, min(8, self.args.max_tokens))], 1)
        widest = max(self.args.clients)
        if widest > 1:
            self._run([self.body(i, 4) for i in range(widest)], widest)

    def counts(self) -> dict[str, int]:
        return server_counts(parse_metrics(self.server.text("/metrics")))

    def decode_seconds(self) -> float:
        return parse_metrics(self.server.text("/metrics")).get("anychip_decode_seconds_total", 0.0)

    def run(self, clients: int) -> dict:
        """The load with ``clients`` concurrent clients: its summary row (also kept in ``rows``)."""
        from tqdm import tqdm

        bodies = [self.body(i, self.args.max_tokens) for i in range(self.args.requests)]
        before, decode_before = self.counts(), self.decode_seconds()
        meter = CpuMeter(self.server.proc.pid)
        with tqdm(total=len(bodies), desc=f"{clients:>3} client{'s' if clients > 1 else ''}", unit="req",
                  file=sys.stderr, disable=self.args.quiet) as bar:
            records, wall = self._run(bodies, clients, lambda r: bar.update(1))
        cpu = meter.stop()
        after = self.counts()
        row = summarize(records, wall, clients)
        row["cpu_share"] = cpu
        steps = after["decode_steps"] - before["decode_steps"]
        row["mean_decode_batch"] = mean_decode_batch(records, steps)
        # the model's own time per batched step, against per-token latency: the rest is scheduling,
        # prefill between steps, sampling and streaming
        row["decode_step_s"] = (self.decode_seconds() - decode_before) / steps if steps else None
        delta = {k: after[k] - before[k] for k in after}
        row["consistent"] = consistency(delta, records)["ok"]
        row["records"] = [{"ttft_s": r.ttft, "per_token_s": r.per_token, "tokens": r.tokens, "chunks": r.chunks,
                           "start_s": r.start - records[0].start, "latency_s": r.end - r.start,
                           "finish_reason": r.finish_reason} for r in records]
        self.rows = sorted([*(r for r in self.rows if r["clients"] != clients), row], key=lambda r: r["clients"])
        add_ratios(self.rows)
        return row

    def meta(self) -> dict:
        return {"model": self.args.model, "served_model": self.health["model"], "device": self.health["device"],
                "simulated": bool(self.health["simulated"]), "max_tokens": self.args.max_tokens,
                "requests": self.args.requests, "date": self.date}

    def results(self, check: dict) -> dict:
        a = self.args
        return {
            **self.meta(),
            "what": "anychip serve under load: C concurrent streaming clients (asyncio + httpx), greedy chat "
                    "completions; tokens from the usage chunk; C = 1 is sequential single-request serving",
            "clients": sorted({r["clients"] for r in self.rows}),
            "server": {"max_batch": self.health["max_batch"], "max_len": self.health["max_len"],
                       "extra_args": list(a.server_arg), "startup_s": round(self.startup_s, 2)},
            "host": self.host,
            "git": git_commit(),
            "baseline": a.baseline,
            "target": verdict(self.rows, baseline=a.baseline),
            "rows": self.rows,
            "consistency": check,
            "warmup_requests": self.warmup_requests,
        }

    def finish(self) -> dict:
        """Stops the server after the final /metrics check; returns the results."""
        try:
            check = consistency(self.counts(), self.records)
        finally:
            self.close()
        return self.results(check)

    def close(self):
        self.server.stop()


def plot(results: dict, path: Path) -> Path | None:
    """Output tok/s vs clients (with the target line) beside TTFT p50/p95 vs clients; None
    without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    rows = results["rows"]
    xs = [r["clients"] for r in rows]
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.4))
    left.plot(xs, [r["output_tok_s"] for r in rows], "o-", color="#2a9d8f", label="output tok/s")
    base = next((r for r in rows if r["clients"] == 1), None)
    if base is not None:
        goal = TARGET_RATIO * base["output_tok_s"]
        left.axhline(goal, color="#e63946", ls="--", lw=1,
                     label=f"target at {TARGET_CLIENTS} clients: {TARGET_RATIO:g}x sequential ({goal:.0f} tok/s)")
        left.axhline(base["output_tok_s"], color="grey", ls=":", lw=1, label="sequential (1 client)")
    for r in rows:
        if r.get("vs_sequential") is not None:
            left.annotate(f"{r['vs_sequential']:.1f}x", (r["clients"], r["output_tok_s"]), textcoords="offset points",
                          xytext=(0, 7), ha="center", fontsize=8)
    left.set_ylabel("total output tokens / s")
    top = max([r["output_tok_s"] for r in rows] + [TARGET_RATIO * base["output_tok_s"] if base else 0])
    left.set_ylim(0, 1.15 * top)  # room for the ratio labels above the points
    left.legend(fontsize=7, loc="lower right")
    for name, q, style in (("p50", "ttft_p50_s", "o-"), ("p95", "ttft_p95_s", "s--")):
        right.plot(xs, [r[q] for r in rows], style, label=f"TTFT {name}")
    right.set_ylabel("time to first token (s)")
    right.set_ylim(bottom=0)
    right.legend(fontsize=8)
    for ax in (left, right):
        ax.set_xscale("log", base=2)
        ax.set_xticks(xs, [str(x) for x in xs])
        ax.minorticks_off()
        ax.set_xlabel("concurrent clients")
        ax.grid(alpha=0.3)
    device = device_label(results["device"], results["simulated"])
    others = [(r.get("cpu_share") or {}).get("other") for r in rows]
    worst = max((o for o in others if o is not None), default=None)
    noisy = f"; other processes used up to {worst:.0%} of the CPUs" if worst is not None and worst > 0.1 else ""
    fig.suptitle(f"anychip serve: {Path(results['model']).name} on {device}\nmax_tokens {results['max_tokens']}, "
                 f"{results['requests']} requests per point{noisy}\n{results['target']['line']}", fontsize=9)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def write_outputs(results: dict, out: Path) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    written = [out / "results.json", out / "table.md"]
    written[0].write_text(json.dumps(results, indent=2) + "\n")
    written[1].write_text(render_table(results["rows"], results))
    png = plot(results, out / "serve-load.png")
    return written + ([png] if png else [])


def _clients(text: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"--clients takes comma-separated integers, got {text!r}") from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"--clients needs counts >= 1, got {text!r}")
    return values


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description="Load-test `anychip serve`: output tok/s, TTFT and per-token latency "
                                            "with C concurrent streaming clients against sequential serving.")
    p.add_argument("--device", default="cpu", help="device to serve on (default cpu)")
    p.add_argument("--model", default="smollm2", help="model name or folder (default smollm2)")
    p.add_argument("--clients", type=_clients, default=[1, 8, 16, 32], metavar="C,C,...",
                   help="client counts (default 1,8,16,32); 1, the sequential baseline, is always run")
    p.add_argument("--requests", type=int, default=64, metavar="N",
                   help="requests per client count (default 64: ~3 minutes in all with smollm2 on 2 cores)")
    p.add_argument("--max-tokens", type=int, default=64, metavar="N", help="max_tokens of every request (default 64)")
    p.add_argument("--max-len", type=int, default=None, metavar="N",
                   help=f"the server's --max-len (default max(256, {PROMPT_ROOM} + max-tokens))")
    p.add_argument("--server-arg", action="append", default=[], metavar="ARG",
                   help="one more argument for `anychip serve` (repeatable; e.g. --server-arg=--weights "
                        "--server-arg=float)")
    p.add_argument("--ready-s", type=float, default=300, help="seconds to wait for the server to start (default 300)")
    p.add_argument("--out", type=Path, default=Path("runs/serve-bench"),
                   help="folder for results.json, table.md, serve-load.png (default runs/serve-bench)")
    p.add_argument("--baseline", type=Path, default=None, metavar="RESULTS",
                   help="results.json of an earlier run (e.g. without --server-arg): the target is then judged "
                        "against the faster of its and this run's single-request rate")
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    return p


def parse_args(argv=None) -> argparse.Namespace:
    p = parser()
    args = p.parse_args(argv)
    if args.requests < 1 or args.max_tokens < 1:
        p.error(f"--requests and --max-tokens must be >= 1, got {args.requests} and {args.max_tokens}")
    args.clients = sorted({1, *args.clients})
    if args.baseline is not None:
        try:
            args.baseline = sequential_baseline(args.baseline)
        except ValueError as e:
            p.error(str(e))
    if args.requests < args.clients[-1]:
        p.error(f"--requests {args.requests} is fewer than the {args.clients[-1]} clients: they would never all "
                "run at once")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    bench = LoadBench(args)
    try:
        for clients in args.clients:
            bench.run(clients)
    except BaseException:
        bench.close()
        raise
    results = bench.finish()
    written = write_outputs(results, args.out)
    print(render_table(results["rows"], results))
    print("written: " + ", ".join(map(str, written)))
    check = results["consistency"]
    if not check["ok"]:
        print(f"FAILED: the server's /metrics disagree with what the clients received: {'; '.join(check['mismatch'])}",
              file=sys.stderr)
        return 1
    return 0


# ---------------------------------------------------------------------------------------------
# pytest-benchmark: the core case (python -m pytest bench/bench_serve.py --benchmark-only)


class _SummaryPlugin:
    """Adds this file's lines to the end of the pytest run (bench/conftest.py's summary covers
    the op cases only)."""

    name = "anychip-serve-summary"

    def __init__(self):
        self.lines: list[str] = []

    def pytest_terminal_summary(self, terminalreporter):
        if self.lines:
            terminalreporter.section("anychip serve under load")
            for line in self.lines:
                terminalreporter.write_line(line)


@pytest.fixture(scope="module")
def serve_load(request):
    """The server for the core case: the script's defaults (ANYCHIP_BENCH_SERVE_ARGS overrides
    them), clients 1 and 16; written to <--bench-out>/serve/ at the end."""
    overrides = shlex.split(os.environ.get("ANYCHIP_BENCH_SERVE_ARGS", ""))
    args = parse_args([*overrides, "--clients", f"1,{TARGET_CLIENTS}", "--quiet"])
    summary = request.config.pluginmanager.get_plugin(_SummaryPlugin.name)
    if summary is None:
        summary = _SummaryPlugin()
        request.config.pluginmanager.register(summary, _SummaryPlugin.name)
    bench = LoadBench(args)
    yield bench
    results = bench.finish()
    out = Path(request.config.getoption("--bench-out", default=".benchmarks/anychip")) / "serve"
    written = write_outputs(results, out)
    summary.lines += render_table(results["rows"], results).splitlines()
    summary.lines.append("written: " + ", ".join(map(str, written)))
    check = results["consistency"]
    assert check["ok"], f"the server's /metrics disagree with what the clients received: {check['mismatch']}"


@pytest.mark.parametrize("clients", [1, TARGET_CLIENTS])
def test_serve_load(benchmark, serve_load, clients):
    benchmark.group = f"anychip serve: {serve_load.args.model}, {serve_load.args.requests} requests"
    row = benchmark.pedantic(serve_load.run, args=(clients,), rounds=1, iterations=1, warmup_rounds=0)
    benchmark.extra_info.update({k: v for k, v in row.items() if k != "records"})
    benchmark.extra_info["device"] = device_label(serve_load.health["device"], serve_load.health["simulated"])
    if clients == TARGET_CLIENTS:
        benchmark.extra_info["target"] = verdict(serve_load.rows)
    assert row["consistent"], f"the server's token counters disagree with the clients' during the {clients}-client load"


if __name__ == "__main__":
    sys.exit(main())
