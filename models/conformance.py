"""The end-to-end conformance check (``anychip conformance``, section "e2e"; entry point ``llama``
of ``anychip.conformance``): a tiny random Llama trained one step on the device and on the host
CPU, and the two compared stage by stage.

The stages, each one Result: the logits of a packed batch (FlashMask attention), its loss, the
gradients of every parameter, one AdamW step, and 8 greedily decoded tokens. Each stage is
compared from the same inputs, so one broken kernel fails where it acts: the AdamW step starts
from the device's own gradients on both sides (Adam divides by |gradient|, which would blow a
gradient's allowed rounding up into a different update). Everything is built in memory from
fixed seeds, in about a second of compute.

On the cpu itself the baseline is the ops' reference implementations (plain Paddle), run with no
kernel registered: the cpu kernels, together, against what they stand in for.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from anychip import KernelRegistry, fallback_counts
from anychip.conformance import FAIL, PASS, SKIPPED, Result
from anychip.plugins import registry
from anychip.runtime.open import parse_device

SECTION = "e2e"
DTYPE = "float32"
RTOL = 1e-4  # of the largest baseline value of each compared tensor (losses: of the loss)
NEW_TOKENS = 8
LR, WEIGHT_DECAY = 1e-2, 0.1  # large enough that a wrong decay or step size shows above RTOL
STAGES = ("llama_logits", "llama_loss", "llama_gradients", "llama_adamw_step", "llama_greedy_decode")

# A byte-level vocabulary of printable ASCII (any id decodes to text), as GGUF metadata.
_TOKENS = ["<|endoftext|>", "Ġ"] + [chr(c) for c in range(0x21, 0x7F)] + ["Ġt"]
_TOKENIZER = {"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": "gpt-2", "tokenizer.ggml.tokens": _TOKENS,
              "tokenizer.ggml.merges": ["Ġ t"], "tokenizer.ggml.token_type": [3] + [1] * (len(_TOKENS) - 1),
              "tokenizer.ggml.eos_token_id": 0}
# Two packed rows of 32 tokens: [9, 14, 6] and [11, 17], the rest padding.
_EXAMPLE_LENGTHS, _MAX_LENGTH = (9, 14, 6, 11, 17), 32
_PROMPT = "The quick brown fox"


def _tiny_llama():
    """A 2-layer Llama with grouped-query attention and untied embeddings."""
    from .checkpoint import Checkpoint, ModelConfig, tensor_shapes
    from .tokenizer import Tokenizer

    tokenizer = Tokenizer.from_gguf_metadata(_TOKENIZER, "anychip conformance")
    config = ModelConfig(arch="llama", vocab_size=len(_TOKENS), hidden_size=64, intermediate_size=128,
                         num_layers=2, num_heads=4, num_kv_heads=2, head_dim=16, rope_theta=10000.0, rms_eps=1e-5,
                         max_position=128, tie_embeddings=False, qkv_bias=False, name="conformance-tiny")
    rng = np.random.default_rng(0)
    # norm weights at 1 as in trained models; projections small enough to keep activations O(1)
    tensors = {name: np.ones(shape, np.float32) if name.endswith("norm")
               else (rng.standard_normal(shape) * 0.1).astype(np.float32)
               for name, shape in tensor_shapes(config).items()}
    return Checkpoint(config, tensors, tokenizer, Path("<anychip conformance: in memory>"))


def _batch(vocab_size: int):
    from .training.data import Example
    from .training.packing import packed_batches

    rng = np.random.default_rng(1)
    examples = [Example(input_ids=rng.integers(2, vocab_size, n).tolist(),
                        target_mask=[i >= n // 2 for i in range(n)], line=i + 1)
                for i, n in enumerate(_EXAMPLE_LENGTHS)]
    [batch] = packed_batches(examples, max_length=_MAX_LENGTH, batch_size=2)
    return batch


@dataclass
class _Run:
    """What one device produced, stage by stage, and the stages that raised (with how)."""

    values: dict[str, object] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)
    fallbacks: list[str] = field(default_factory=list)


def _train_step(checkpoint, batch, device, run: _Run, step_grads=None) -> None:
    """Forward, backward and one AdamW step into ``run``. ``step_grads``: gradients to step with
    instead of the model's own (the baseline steps with the device's)."""
    from anychip.frontends.paddle import import_paddle

    from .training.model import TrainableModel
    from .training.optimizer import AdamW

    paddle = import_paddle()
    model = TrainableModel(checkpoint, device, seed=0)
    place = model.params["norm"].place
    mask = paddle.to_tensor(batch.startend_row_indices, place=place)
    with paddle.no_grad():
        logits = model.model(paddle.to_tensor(batch.input_ids, place=place),
                             paddle.to_tensor(batch.position_ids, place=place), startend_row_indices=mask)
    run.values["llama_logits"] = logits.numpy()
    loss, _ = model.batch_loss(batch, batch.loss_tokens)
    run.values["llama_loss"] = np.float64(float(loss))
    loss.backward()
    run.values["llama_gradients"] = {name: p.grad.numpy() for name, p in model.params.items()}
    if step_grads is not None:
        for name, p in model.params.items():
            p.grad = paddle.to_tensor(step_grads[name], place=place)
    AdamW(model.params, weight_decay=WEIGHT_DECAY).step(lr=LR, step=1)
    run.values["llama_adamw_step"] = model.state()


def _greedy_decode(checkpoint, device, run: _Run) -> None:
    """Prefill, then the device's decode step (fused where it registers decoder_step): the
    logits of each step [NEW_TOKENS, V] and the greedy tokens."""
    from anychip.ops.dispatch import place
    from anychip.frontends.paddle import import_paddle

    from .llama import KVCache, LlamaForCausalLM

    paddle = import_paddle()

    def to_device(values):
        return paddle.to_tensor(np.asarray(values, dtype=np.int64), place=place(device))

    model = LlamaForCausalLM(checkpoint, device)
    prompt = checkpoint.tokenizer.encode(_PROMPT)
    cache = KVCache(checkpoint.config, 1, len(prompt) + NEW_TOKENS, device)
    steps, tokens = [], []
    with paddle.no_grad():
        logits = model(to_device([prompt]), to_device([range(len(prompt))]), cache,
                       last_index=to_device([len(prompt) - 1]))
        for n in range(NEW_TOKENS):
            steps.append(logits.numpy()[0])
            tokens.append(int(np.argmax(steps[-1])))
            if n + 1 < NEW_TOKENS:
                logits = model.decode(to_device(tokens[-1:]), to_device([len(prompt) + n]), cache)
    run.values["llama_greedy_decode"] = (np.stack(steps), tokens)


def _workload(checkpoint, batch, device: tuple[str, int], step_grads=None) -> _Run:
    """Both parts on ``device``; an exception ends its part (later stages of it are not run)."""
    run = _Run()
    before = fallback_counts()
    parts = ((lambda: _train_step(checkpoint, batch, device, run, step_grads), STAGES[:4]),
             (lambda: _greedy_decode(checkpoint, device, run), STAGES[4:]))
    for part, stages in parts:
        try:
            part()
        except Exception as e:  # noqa: BLE001 - a failing kernel is a finding, reported by stage
            stage = next(s for s in stages if s not in run.values)
            message = " ".join(str(e).split())  # Paddle's errors from a backward span many lines
            run.errors[stage] = f"{type(e).__name__}: {message[:600]}{'...' if len(message) > 600 else ''}"
    # anychip ops only: the Paddle ops a simulated device runs on the CPU are Paddle's business
    run.fallbacks = sorted({op.removeprefix("anychip.") for (dev, op, _dtype), n in fallback_counts().items()
                            if dev == device[0] and op.startswith("anychip.") and n > before.get((dev, op, _dtype), 0)})
    return run


@contextmanager
def _references_only():
    """Every op runs its reference implementation: the registry's kernels are set aside."""
    reg = registry()
    kernels, reg.kernels = reg.kernels, KernelRegistry()
    try:
        yield
    finally:
        reg.kernels = kernels


def _scale_error(got: np.ndarray, want: np.ndarray) -> tuple[float, float]:
    """(largest |got - want|, the tolerance RTOL x largest |want|)."""
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    if got.shape != want.shape:
        raise ValueError(f"shape {list(got.shape)}, expected {list(want.shape)}")
    return float(np.max(np.abs(got - want), initial=0.0)), RTOL * float(np.max(np.abs(want), initial=0.0))


def _compare(stage: str, got, want, against: str) -> Result:
    direction = "bwd" if stage == "llama_gradients" else "fwd"
    if stage == "llama_greedy_decode":  # logits compared up to where the tokens part, if they do
        (got, got_tokens), (want, want_tokens) = got, want
        same = next((n for n, (a, b) in enumerate(zip(got_tokens, want_tokens)) if a != b), len(want_tokens) - 1)
        error, tolerance = _scale_error(got[:same + 1], want[:same + 1])
        ok = got_tokens == want_tokens and error <= tolerance
        detail = f"max |error| of the {same + 1} steps' logits {error:.3g} vs {against}, tolerance {tolerance:.3g}"
        if got_tokens != want_tokens:
            detail = f"greedy tokens {got_tokens}, {against} gave {want_tokens}; {detail}"
        return Result(SECTION, stage, PASS if ok else FAIL, DTYPE, direction, max_error=error, detail=detail)
    if isinstance(want, dict):  # per parameter: the worst one, relative to its own scale
        per_name = {name: _scale_error(got[name], want[name]) for name in want}
        worst = max(per_name, key=lambda n: per_name[n][0] / max(per_name[n][1], 1e-30))
        error, tolerance = per_name[worst]
        where = f" (worst: {worst}, of {len(want)} parameters)"
    else:
        (error, tolerance), where = _scale_error(got, want), ""
    ok = error <= tolerance
    detail = f"max |error| {error:.3g} vs {against}, tolerance {tolerance:.3g}{where}"
    return Result(SECTION, stage, PASS if ok else FAIL, DTYPE, direction, max_error=error, detail=detail)


def _results(device: str, target: _Run, baseline: _Run, against: str) -> list[Result]:
    results = []
    for stage in STAGES:
        direction = "bwd" if stage == "llama_gradients" else "fwd"
        failed = next((r for r in (target, baseline) if stage in r.errors), None)
        if failed is not None:
            side = device if failed is target else against
            results.append(Result(SECTION, stage, FAIL, DTYPE, direction, detail=f"on {side}: {failed.errors[stage]}"))
        elif stage not in target.values or stage not in baseline.values:
            results.append(Result(SECTION, stage, SKIPPED, DTYPE, direction,
                                  detail="not run: an earlier stage failed"))
        else:
            results.append(_compare(stage, target.values[stage], baseline.values[stage], against))
    if target.fallbacks:  # on the first row only: it holds for the whole workload
        results[0].detail += f"; {device} ran these ops' reference implementations: {', '.join(target.fallbacks)}"
    return results


def run(device: str) -> list[Result]:
    """The end-to-end stages on ``device`` ("npu" or "npu:0") against the host CPU."""
    name, index = parse_device(device)
    checkpoint = _tiny_llama()
    batch = _batch(checkpoint.config.vocab_size)
    target = _workload(checkpoint, batch, (name, index))
    grads = target.values.get("llama_gradients")
    if name == "cpu":
        against = "the ops' reference implementations on cpu"
        with _references_only():
            baseline = _workload(checkpoint, batch, ("cpu", 0), grads)
    else:
        against = "cpu"
        baseline = _workload(checkpoint, batch, ("cpu", 0), grads)
    return _results(f"{name}:{index}", target, baseline, against)
