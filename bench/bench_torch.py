"""SmolLM2-135M decode through Hugging Face transformers on PyTorch's anychip device (the npu
plugin, SIMULATED: the host CPU runs its kernels) against the same model on torch's CPU, both
with 2 threads, in one run. Greedy, 32 new tokens after a 6-token prompt; tokens must agree.

    python -m pytest bench/bench_torch.py --benchmark-only -s

The figure is the cost of PyTorch's dispatch into anychip's kernels on this host, not a chip's
speed. Not part of the test run (needs torch and transformers, from requirements-test.txt).
"""

from __future__ import annotations

import os
import time

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

NEW_TOKENS = 32
_RESULTS: dict[str, float] = {}


@pytest.fixture(scope="module")
def model_and_ids(tmp_path_factory):
    import sys

    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))
    from torch_helpers import smollm2_folder
    from transformers import AutoModelForCausalLM, AutoTokenizer

    import anychip.torch as at

    at.enable(os.environ.get("ANYCHIP_TORCH_CHIP", "npu"))
    torch.set_num_threads(2)
    folder = smollm2_folder(tmp_path_factory.mktemp("bench-torch"))
    tok = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder, attn_implementation="sdpa")
    return model, tok("The capital of France is", return_tensors="pt").input_ids


@pytest.mark.parametrize("where", ["cpu", "anychip"])
def test_transformers_decode(benchmark, model_and_ids, where):
    import anychip.torch as at

    model, ids = model_and_ids
    model.to(where)
    x = ids.to(where)

    def decode():
        with torch.no_grad():
            return model.generate(x, max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS, do_sample=False)

    decode()  # warm-up
    start = time.perf_counter()
    tokens = benchmark.pedantic(decode, rounds=3, iterations=1)
    seconds = (time.perf_counter() - start) / 3
    tok_s = NEW_TOKENS / seconds
    _RESULTS[where] = tok_s
    label = f"anychip:0 ({at.enabled_chip()}, simulated)" if where == "anychip" else "torch cpu"
    benchmark.extra_info.update({"device": label, "tokens_per_s": round(tok_s, 2), "new_tokens": NEW_TOKENS})
    if len(_RESULTS) == 2:
        ratio = _RESULTS["anychip"] / _RESULTS["cpu"]
        benchmark.extra_info["ratio_to_torch_cpu"] = round(ratio, 3)
        print(f"\ntransformers decode: torch cpu {_RESULTS['cpu']:.1f} tok/s, {label} {tok_s:.1f} tok/s "
              f"({ratio:.2f}x torch cpu)")
    model.to("cpu")
    assert tokens.shape[1] == ids.shape[1] + NEW_TOKENS
