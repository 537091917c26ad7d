"""Fine-tuning on a tiny random Llama: the loss falls (full and LoRA), packed examples never see
each other, cpu and a simulated chip agree, checkpoints move between devices, and a run killed
mid-save resumes exactly through the CLI."""

from __future__ import annotations

import json

import numpy as np
import pytest

import anychip
from anychip.frontends.paddle import import_paddle
from anychip_models.loader import load_checkpoint
from anychip_models.lora import LoraConfig
from anychip_models.training import checkpoints
from anychip_models.training.data import ChatFormat, load_sft_data
from anychip_models.training.model import TrainableModel
from anychip_models.training.packing import packed_batches, padded_batches
from anychip_models.training.trainer import Trainer, TrainArgs
from training_helpers import anychip as run_anychip
from training_helpers import as_array, losses, sft_records, write_jsonl

paddle = import_paddle()


@pytest.fixture(scope="module")
def data_file(tmp_path_factory):
    return write_jsonl(tmp_path_factory.mktemp("data") / "train.jsonl", sft_records())


@pytest.fixture(scope="module")
def examples(base, data_file):
    examples, bad = load_sft_data(data_file, ChatFormat.from_tokenizer(base.tokenizer), max_length=64)
    assert not bad
    return examples


def train(base, examples, output, device="cpu", lora=None, steps=6, resume=False, **args):
    model = TrainableModel(base, (device, 0), lora=lora, seed=1)
    settings = dict(max_length=64, batch_size=2, max_steps=steps, lr=3e-3, schedule="constant", seed=3)
    settings.update(args)
    trainer = Trainer(model, base, examples, examples[:4], TrainArgs(**settings), output, progress=False)
    trainer.train(resume=resume)
    return trainer


@pytest.mark.parametrize("lora", [None, LoraConfig(rank=8, alpha=64.0)], ids=["full", "lora"])
def test_loss_decreases(base, examples, tmp_path, lora):
    trainer = train(base, examples, tmp_path, lora=lora, steps=20, lr=5e-3 if lora else 1e-2, zero_padding=True)
    history = as_array([r["loss"] for r in trainer.history if "loss" in r])
    assert history[-3:].mean() < 0.85 * history[:2].mean(), history
    evals = [r["eval_loss"] for r in trainer.history if "eval_loss" in r]
    assert evals and np.isfinite(evals).all()
    assert (tmp_path / "loss.png").stat().st_size > 0
    assert all(r["tokens_per_s"] > 0 for r in trainer.history if "loss" in r)
    assert trainer.history[0]["step"] == 0 and evals[0] > evals[-1]


def test_lora_leaves_base_frozen_and_starts_at_the_base(base, examples):
    model = TrainableModel(base, ("cpu", 0), lora=LoraConfig(rank=4, targets=("q_proj", "v_proj", "down_proj")))
    assert set(model.params) == {f"layers.{i}.{t}.lora_{m}" for i in range(2) for t in ("q_proj", "v_proj", "down_proj")
                                 for m in "AB"}
    plain = TrainableModel(base, ("cpu", 0))
    batch = padded_batches(examples[:2], 2)[0]
    with paddle.no_grad():
        np.testing.assert_allclose(model.batch_loss(batch, 1)[1].numpy(), plain.batch_loss(batch, 1)[1].numpy(),
                                   rtol=1e-6)


def test_packed_examples_never_attend_across(base, examples):
    """Per-token losses of examples packed into one sequence equal those of each example alone;
    without the FlashMask they would not."""
    model = TrainableModel(base, ("cpu", 0))
    batch = packed_batches(examples[:6], max_length=128, batch_size=1)[0]
    assert len(batch.examples) > 2
    with paddle.no_grad():
        packed = model.batch_loss(batch, 1)[1].numpy()
        alone = np.concatenate([model.batch_loss(padded_batches([examples[i]], 1)[0], 1)[1].numpy()
                                for i in batch.examples])
        batch.startend_row_indices = None  # plain causal attention over the whole pack
        leaky = model.batch_loss(batch, 1)[1].numpy()
    np.testing.assert_allclose(packed, alone, rtol=2e-5, atol=2e-6)
    assert not np.allclose(leaky, alone, rtol=1e-3)


def test_recompute_gives_the_same_gradients(base, examples):
    batch = packed_batches(examples[:6], max_length=128, batch_size=1)[0]
    grads = []
    for recompute in (False, True):
        model = TrainableModel(base, ("cpu", 0), recompute=recompute)
        model.batch_loss(batch, batch.loss_tokens)[0].backward()
        grads.append({n: p.grad.numpy() for n, p in model.params.items()})
    for name in grads[0]:
        np.testing.assert_allclose(grads[1][name], grads[0][name], rtol=1e-5, atol=1e-7, err_msg=name)


@pytest.mark.parametrize("device", ["npu", "gcu"])
def test_simulated_chip_matches_cpu(base, examples, tmp_path, device):
    on_cpu = train(base, examples, tmp_path / "cpu", steps=3, zero_padding=True)
    on_sim = train(base, examples, tmp_path / device, device=device, steps=3, zero_padding=True)
    np.testing.assert_allclose([r["loss"] for r in on_sim.history if "loss" in r], [r["loss"] for r in on_cpu.history if "loss" in r], rtol=1e-4)


@pytest.mark.parametrize("first,then", [("npu", "cpu"), ("cpu", "gcu")])
def test_checkpoint_moves_between_devices(base, examples, tmp_path, first, then):
    """Steps 1-2 on one device, resumed on another for steps 3-4: the losses of four steps on
    the second device alone."""
    lora = LoraConfig(rank=4, alpha=8.0)
    straight = train(base, examples, tmp_path / "straight", device=then, lora=lora, steps=4, save_steps=2)
    train(base, examples, tmp_path / "moved", device=first, lora=lora, steps=4, save_steps=2)
    # keep only checkpoint-2, as if the first run had stopped there
    checkpoints.remove_tree(tmp_path / "moved" / "checkpoint-4")
    state = json.loads((tmp_path / "moved" / "checkpoint-2" / "trainer_state.json").read_text())
    assert state["device"] == f"{first}:0"
    resumed = train(base, examples, tmp_path / "moved", device=then, lora=lora, steps=4, save_steps=2, resume=True)
    assert [r["step"] for r in resumed.history] == [0, 1, 2, 3, 4]  # 0: the evaluation before training
    np.testing.assert_allclose([r["loss"] for r in resumed.history if "loss" in r],
                               [r["loss"] for r in straight.history if "loss" in r], rtol=1e-4)


def test_full_checkpoint_is_a_model_folder(base, examples, tmp_path):
    trainer = train(base, examples, tmp_path, steps=2, save_steps=1)
    for folder in (tmp_path / "checkpoint-2", tmp_path):
        loaded = load_checkpoint(folder)
        for name, value in trainer.model.canonical_tensors().items():
            np.testing.assert_array_equal(loaded.tensors[name], value, err_msg=f"{folder}: {name}")
    assert sorted(p.name for p in tmp_path.glob("checkpoint-*")) == ["checkpoint-1", "checkpoint-2"]


def test_output_with_checkpoints_needs_resume(base, examples, tmp_path):
    train(base, examples, tmp_path, steps=1)
    with pytest.raises(FileExistsError, match="resume"):
        train(base, examples, tmp_path, steps=1)


def test_full_finetune_refuses_quantized_weights(tmp_path):
    from model_helpers import tiny_checkpoint

    with pytest.raises(ValueError, match="--weights float"):
        TrainableModel(tiny_checkpoint("int8"), ("cpu", 0))


@pytest.mark.parametrize("bits", ["int8", "int4"])
def test_qlora_trains_on_a_quantized_base(base, examples, tmp_path, bits):
    trainer = train(base, examples, tmp_path, lora=LoraConfig(rank=4, alpha=8.0, base_weights=bits), steps=8,
                    lr=1e-2, zero_padding=True)
    history = as_array([r["loss"] for r in trainer.history if "loss" in r])
    assert history[-3:].mean() < 0.8 * history[:2].mean(), history
    assert trainer.model.model.blocks[0].gate_up.base.bits == int(bits[3:])


# ---- through the CLI, in subprocesses ------------------------------------------------------------

FINETUNE = ["finetune", "--lora", "--lora-rank", "4", "--zero-padding", "--max-length", "64", "--batch-size", "2",
            "--max-steps", "6", "--save-steps", "2", "--lr", "1e-2", "--schedule", "linear", "--warmup-steps", "2"]


def test_killed_mid_save_keeps_the_last_checkpoint_and_resumes_exactly(model_dir, data_file, tmp_path):
    common = FINETUNE + ["--model", model_dir, "--data", data_file]
    straight = run_anychip(*common, "--output", tmp_path / "straight")
    assert straight.returncode == 0, straight.stderr

    out = tmp_path / "killed"
    killed = run_anychip(*common, "--output", out, env={"ANYCHIP_FAULT_CHECKPOINT": "optimizer@4"})
    assert killed.returncode == -9, killed.stderr
    assert checkpoints.latest_checkpoint(out) == out / "checkpoint-2"
    checkpoints.load_checkpoint_state(out)  # intact

    again = run_anychip(*common, "--output", out)
    assert again.returncode != 0 and "resume" in again.stderr

    resumed = run_anychip(*common, "--output", out, "--resume")
    assert resumed.returncode == 0, resumed.stderr
    assert losses(out) == losses(tmp_path / "straight")  # bit for bit on one device
    assert not list(out.glob(".tmp-*"))

    # the adapter generates, and merging it gives a model that generates the same text
    prompt = ["--raw", "What is the capital of France?", "--max-new-tokens", "6", "--weights", "float"]
    from_adapter = run_anychip("generate", "--model", out, *prompt)
    assert from_adapter.returncode == 0, from_adapter.stderr
    merged = run_anychip("lora", "merge", out, "--output", tmp_path / "merged")
    assert merged.returncode == 0, merged.stderr
    from_merged = run_anychip("generate", "--model", tmp_path / "merged", *prompt)
    assert from_merged.stdout == from_adapter.stdout


def test_bad_records_are_reported_with_line_numbers(model_dir, tmp_path):
    data = write_jsonl(tmp_path / "bad.jsonl", sft_records(6) + ['{"src": "x"}', "not json"])
    args = ["finetune", "--model", model_dir, "--data", data, "--max-steps", "1", "--max-length", "64"]
    skipped = run_anychip(*args, "--output", tmp_path / "skip")
    assert skipped.returncode == 0, skipped.stderr
    assert f"{data}:7: missing key 'tgt'" in skipped.stderr and f"{data}:8: invalid JSON" in skipped.stderr
    failed = run_anychip(*args, "--output", tmp_path / "fail", "--on-bad-record", "fail")
    assert failed.returncode != 0 and "line 7: missing key 'tgt'" in failed.stderr
    assert not (tmp_path / "fail" / "config.json").exists()


@pytest.mark.parametrize("device", ["cpu", "npu"])
def test_a_training_step_runs_with_no_fallbacks_and_in_strict_mode(model_dir, data_file, tmp_path, device):
    """The fallback report counts no op on the CPU, on cpu itself and on npu (whose base ops are
    generated and routed from Paddle's ops), and strict mode runs the step."""
    args = ["--device", device, *FINETUNE[:-8], "--max-steps", "1", "--model", model_dir, "--data", data_file]
    report = run_anychip("--report-fallbacks", *args, "--output", tmp_path / "report")
    assert report.returncode == 0, report.stderr
    assert "0 op call(s) ran on the CPU" in report.stderr, report.stderr
    strict = run_anychip(*args, "--output", tmp_path / "strict", env={"ANYCHIP_STRICT": "1"})
    assert strict.returncode == 0, strict.stderr
