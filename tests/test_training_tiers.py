"""LoRA training on every instruction-set tier of the host kernels this CPU has (scalar, avx2,
avx512, amx; each run in a subprocess with ANYCHIP_CPU_ISA capped to it): one step's gradients
agree with the scalar tier's within the ops' float32 tolerance, and a 20-step run learns with
losses that agree across tiers at every step.

The second check also guards the run itself against chaos. A LoRA run at lr 3e-2 with alpha / r
= 8 (this file's configuration before the fix for the "LoRA does not learn on avx512" report) is
chaotic: a 2e-7 relative perturbation of the initial weights turned a learning run on the scalar
tier into a failing one, so each tier's last-bit summation order decided whether the loss test
passed. The tiers' one-step gradients agreed to 2.6e-6 throughout. A run whose tiers agree step
by step is one whose outcome is not luck; the best tier is also rerun with its weights perturbed
by 1e-6, so that the check means something on a CPU with one tier only."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from isa_paths import isa_params

HERE = Path(__file__).parent
STEPS = 20
LORA = dict(rank=8, alpha=64.0)
ARGS = dict(max_length=64, batch_size=2, lr=5e-3, schedule="constant", seed=3, zero_padding=True)


def _perturb(model, paddle, eps: float) -> None:
    rng = np.random.default_rng(9)
    for p in model.params.values():
        a = p.numpy()
        paddle.assign(paddle.to_tensor((a * (1 + eps * rng.standard_normal(a.shape))).astype(np.float32)), p)


def tier_run(model_dir: str, out: str, perturb: float = 0.0) -> None:
    """In the subprocess: one LoRA step's gradients (B made nonzero so that every gradient is
    exercised) and the losses of a STEPS-step run, into `out` (.npz and .json)."""
    import tempfile

    from anychip.frontends.paddle import import_paddle
    from anychip_models.loader import load_checkpoint
    from anychip_models.lora import LoraConfig
    from anychip_models.training.data import ChatFormat, load_sft_data
    from anychip_models.training.model import TrainableModel
    from anychip_models.training.packing import packed_batches
    from anychip_models.training.trainer import Trainer, TrainArgs
    from training_helpers import sft_records, write_jsonl

    paddle = import_paddle()
    base = load_checkpoint(Path(model_dir))
    scratch = Path(tempfile.mkdtemp())
    examples, _ = load_sft_data(write_jsonl(scratch / "train.jsonl", sft_records()),
                                ChatFormat.from_tokenizer(base.tokenizer), max_length=64)
    grads = {}
    if not perturb:
        model = TrainableModel(base, ("cpu", 0), lora=LoraConfig(**LORA), seed=1)
        rng = np.random.default_rng(5)
        for name, t in model.params.items():
            if name.endswith("lora_B"):
                paddle.assign(paddle.to_tensor(rng.standard_normal(t.shape).astype(np.float32) * 0.05), t)
        loss, _ = model.batch_loss(packed_batches(examples[:8], max_length=64, batch_size=2)[0], 10)
        loss.backward()
        grads = {name: t.grad.numpy() for name, t in model.params.items()}
    model = TrainableModel(base, ("cpu", 0), lora=LoraConfig(**LORA), seed=1)
    if perturb:
        _perturb(model, paddle, perturb)
    trainer = Trainer(model, base, examples, examples[:4], TrainArgs(max_steps=STEPS, **ARGS), scratch / "run",
                      progress=False)
    trainer.train()
    np.savez(out + ".npz", **grads)
    Path(out + ".json").write_text(json.dumps([r["loss"] for r in trainer.history if "loss" in r]))


def _run_tier(isa: str, model_dir: Path, out: Path, perturb: float = 0.0):
    code = (f"import sys; sys.path.insert(0, {str(HERE)!r}); import test_training_tiers as t; "
            f"t.tier_run({str(model_dir)!r}, {str(out)!r}, {perturb!r})")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600,
                            env=dict(os.environ, ANYCHIP_CPU_ISA=isa))
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return dict(np.load(str(out) + ".npz")), np.asarray(json.loads(Path(str(out) + ".json").read_text()))


@pytest.fixture(scope="module")
def scalar_run(model_dir, tmp_path_factory):
    return _run_tier("scalar", model_dir, tmp_path_factory.mktemp("tier") / "scalar")


# One step's gradients pass through ~20 ops per layer in float32; each tier sums in its own
# order. Measured: at most 2.6e-6 of each gradient's largest element.
GRAD_RTOL = 1e-4
# Losses of tiers that follow one trajectory: measured within 1e-5 over the run.
LOSS_RTOL = 2e-3


def _check_losses(losses, reference, what):
    np.testing.assert_allclose(losses, reference, rtol=LOSS_RTOL,
                               err_msg=f"{what}: the run is not reproducible to rounding: its outcome is chaos")
    assert losses[-3:].mean() < 0.6 * losses[:2].mean(), f"{what}: the loss did not fall: {losses}"


@pytest.mark.parametrize("isa", isa_params("avx2", "avx512", "amx"))
def test_lora_tiers_agree_with_scalar(isa, scalar_run, model_dir, tmp_path):
    """One LoRA step's gradients and a 20-step run's losses on `isa` against the scalar tier's."""
    scalar_grads, scalar_losses = scalar_run
    grads, losses = _run_tier(isa, model_dir, tmp_path / isa)
    assert set(grads) == set(scalar_grads) and len(grads) > 0
    for name, want in scalar_grads.items():
        err = np.abs(grads[name] - want).max() / np.abs(want).max()
        assert err <= GRAD_RTOL, f"{isa}: gradient of {name} {want.shape} is {err:.2e} off the scalar tier's"
    _check_losses(losses, scalar_losses, isa)


def test_lora_run_is_stable_to_rounding(scalar_run, model_dir, tmp_path):
    """The scalar run learns, and a 1e-6 relative perturbation of its initial weights moves its
    losses by rounding only: the run's outcome does not hinge on last bits."""
    _, scalar_losses = scalar_run
    _, perturbed = _run_tier("scalar", model_dir, tmp_path / "perturbed", perturb=1e-6)
    _check_losses(perturbed, scalar_losses, "scalar, perturbed by 1e-6")
