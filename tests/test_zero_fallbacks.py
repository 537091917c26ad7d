"""Issue 7's "must show": on a simulated chip, a tiny random Llama trains (forward, backward,
global-norm clipping, AdamW) and decodes greedily under ANYCHIP_STRICT=1, where any CPU
fallback (a Paddle op or an anychip op without the device's kernel) raises, and its results match
the cpu's. The model code is the real one (anychip_models.training); Paddle's own ops reach the
chip's base-op kernels through the generated Paddle kernel bridge (anychip.frontends.paddle.kernels).

One subprocess per device (Paddle registers devices once per process) runs the same step on cpu
and on the device, with the simulator's memory guard on, and reports both as JSON.
"""

from __future__ import annotations

import json
import textwrap

import numpy as np
import pytest
from conftest import run_python
from training_helpers import sft_records, write_jsonl

STEP = """
import json
import anychip
anychip.set_device({device!r})
from anychip.frontends.paddle import import_paddle
paddle = import_paddle()
from anychip_models.loader import load_checkpoint
from anychip_models.generate import Generator
from anychip_models.llama import LlamaForCausalLM
from anychip_models.sampling import SamplingParams
from anychip_models.training.data import ChatFormat, load_sft_data
from anychip_models.training.model import TrainableModel
from anychip_models.training.optimizer import AdamW
from anychip_models.training.packing import packed_batches

base = load_checkpoint({model!r})
examples, _ = load_sft_data({data!r}, ChatFormat.from_tokenizer(base.tokenizer), max_length=64)
batch = packed_batches(examples[:6], max_length=128, batch_size=1)[0]  # FlashMask: several documents
prompts = [base.tokenizer.encode(text) for text in ("What is the capital of France?", "Say hello.")]

def run(device):
    model = TrainableModel(base, (device, 0), seed=1)
    optimizer = AdamW(model.params, weight_decay=0.01)
    loss, per_token = model.batch_loss(batch, batch.loss_tokens)
    loss.backward()
    norm = optimizer.clip_grad_norm(0.5)  # below the first step's norm: the scaling runs too
    grads = {{n: p.grad.numpy().tolist() for n, p in model.params.items()}}  # as the step gets them
    optimizer.step({lr}, 1)
    optimizer.zero_grad()
    decoder = LlamaForCausalLM(base, (device, 0))
    place = anychip.ops.dispatch.place((device, 0))
    with paddle.no_grad():
        logits = decoder(paddle.to_tensor(batch.input_ids, place=place), paddle.to_tensor(batch.position_ids, place=place))
    completions, _ = Generator(decoder, base.tokenizer).generate(
        prompts, SamplingParams(max_new_tokens=6, ignore_eos=True))
    return dict(loss=float(loss), per_token=per_token.numpy().tolist(), norm=norm,
                params={{n: p.numpy().tolist() for n, p in model.params.items()}}, grads=grads,
                logits=logits.numpy().tolist(), tokens=[c.tokens for c in completions])

results = {{"cpu": run("cpu"), "device": run({device!r})}}
results["fallbacks"] = {{"/".join(k): v for k, v in anychip.fallback.fallback_counts().items()}}
print(json.dumps(results))
"""


@pytest.fixture(scope="module")
def data_file(tmp_path_factory):
    return write_jsonl(tmp_path_factory.mktemp("data") / "train.jsonl", sft_records())


LR = 1e-2
EPS = 1e-8  # AdamW's default, which the step uses
_runs: dict[str, dict] = {}


def strict_run(device: str, model_dir, data_file) -> dict:
    """The step and the decoding on cpu and on ``device``, strict and guarded (cached per device)."""
    if device not in _runs:
        code = textwrap.dedent(STEP).format(device=device, model=str(model_dir), data=str(data_file), lr=LR)
        result = run_python(code, env={"ANYCHIP_STRICT": "1", "ANYCHIP_SIM_CHECK": "1"}, timeout=600)
        assert result.returncode == 0, result.stderr[-4000:]
        _runs[device] = json.loads(result.stdout.strip().splitlines()[-1])
    return _runs[device]


# xpu: hand-written base kernels; npu: generated; gcu and dcu: a mix of both
DEVICES = ["xpu", "npu", "gcu", "dcu"]


@pytest.mark.parametrize("device", DEVICES)
def test_training_step_runs_strict_and_matches_cpu(device, model_dir, data_file):
    out = strict_run(device, model_dir, data_file)
    cpu, dev = out["cpu"], out["device"]
    assert out["fallbacks"] == {}
    np.testing.assert_allclose(dev["loss"], cpu["loss"], rtol=1e-4)
    np.testing.assert_allclose(dev["per_token"], cpu["per_token"], rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(dev["norm"], cpu["norm"], rtol=1e-4)
    assert cpu["norm"] > 0.5  # clipping scaled the gradients
    assert dev["params"].keys() == cpu["params"].keys()
    for name, value in cpu["params"].items():
        want, got = np.asarray(value), np.asarray(dev["params"][name])
        # The tensor as a whole must agree to 1e-4. Element by element: AdamW's first step is
        # lr * g / (|g| + eps), within lr / 100 of lr * sign(g) once |g| exceeds 100 eps, so
        # those elements must agree to lr / 100. Within 100 eps of zero a gradient is mostly
        # rounding noise, whose share of the step follows each device's summation order: those
        # elements are held to a quarter of a full step.
        assert np.linalg.norm(got - want) <= 1e-4 * np.linalg.norm(want), name
        noise = np.abs(np.asarray(cpu["grads"][name])) <= 100 * EPS
        np.testing.assert_allclose(got[~noise], want[~noise], rtol=0, atol=LR / 100, err_msg=name)
        np.testing.assert_allclose(got[noise], want[noise], rtol=0, atol=LR / 4, err_msg=name)


@pytest.mark.parametrize("device", DEVICES)
def test_forward_and_greedy_decode_run_strict_and_match_cpu(device, model_dir, data_file):
    out = strict_run(device, model_dir, data_file)
    cpu, dev = out["cpu"], out["device"]
    np.testing.assert_allclose(dev["logits"], cpu["logits"], rtol=1e-4, atol=1e-5)
    assert dev["tokens"] == cpu["tokens"]
    assert all(len(t) == 6 for t in dev["tokens"])


QUANTIZED_DECODE = """
import json
import anychip
anychip.set_device({device!r})
from anychip.frontends.paddle import import_paddle
paddle = import_paddle()
from anychip_models.loader import load_checkpoint
from anychip_models.generate import Generator
from anychip_models.llama import LlamaForCausalLM
from anychip_models.sampling import SamplingParams

base = load_checkpoint({path!r}, weights="native")
prompts = [base.tokenizer.encode(text) for text in ("What is the capital of France?", "Say hello.")]
tokens = {{}}
for device in ("cpu", {device!r}):
    completions, _ = Generator(LlamaForCausalLM(base, (device, 0)), base.tokenizer).generate(
        prompts, SamplingParams(max_new_tokens=6, ignore_eos=True))
    tokens[device] = [c.tokens for c in completions]
fallbacks = {{"/".join(k): v for k, v in anychip.fallback.fallback_counts().items()}}
print(json.dumps(dict(tokens=tokens, fallbacks=fallbacks)))
"""


@pytest.fixture(scope="module")
def q8_model(tmp_path_factory):
    """A tiny random Llama stored as SmolLM2's file is: Q8_0 weights, Q8_0 (int8) embedding."""
    from gguf import GGMLQuantizationType as T
    from loader_helpers import random_weights, write_gguf
    from model_helpers import CONFIG, TOKENIZER_META

    path = tmp_path_factory.mktemp("q8") / "tiny-q8.gguf"
    return write_gguf(path, CONFIG, random_weights(CONFIG, seed=0), TOKENIZER_META, qtype=T.Q8_0,
                      types={"embed_tokens": T.Q8_0})


@pytest.mark.parametrize("device", DEVICES)
def test_quantized_model_decodes_strict_and_matches_cpu(device, q8_model):
    """A quantized embedding is looked up with plain Paddle ops (an int8 gather, a cast, a
    per-group scale): on every simulated chip those run on the chip's base kernels."""
    code = textwrap.dedent(QUANTIZED_DECODE).format(device=device, path=str(q8_model))
    result = run_python(code, env={"ANYCHIP_STRICT": "1", "ANYCHIP_SIM_CHECK": "1"}, timeout=600)
    assert result.returncode == 0, result.stderr[-4000:]
    out = json.loads(result.stdout.strip().splitlines()[-1])
    assert out["fallbacks"] == {}
    assert out["tokens"][device] == out["tokens"]["cpu"]
    assert all(len(t) == 6 for t in out["tokens"][device])
