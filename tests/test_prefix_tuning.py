"""Prefix Tuning: a prefix made of real tokens' keys and values is exactly those tokens read first
(op by op, packed under a FlashMask, prefilled and decoded, fused or not, on every device), the
encoder gives the same prefix in training as on load, training lowers the loss with gradients
through recomputed layers, the adapter folder loads in generate / eval / serve, `anychip finetune
--prefix-tuning` runs strict on every simulated chip and resumes on cpu, and bad adapters or
flags are refused by name."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest

from anychip.ops import masks
from anychip.ops.dispatch import place
from anychip.frontends.paddle import import_paddle
from anychip_models import prefix as prefix_mod
from anychip_models.checkpoint import CheckpointError
from anychip_models.loader import load_checkpoint
from anychip_models.generate import Generator
from anychip_models.llama import LlamaForCausalLM
from anychip_models.lora import LoraConfig
from anychip_models.prefix import PrefixConfig
from anychip_models.sampling import SamplingParams
from anychip_models.training import checkpoints
from anychip_models.training.data import ChatFormat, load_sft_data
from anychip_models.training.model import TrainableModel
from anychip_models.training.trainer import Trainer, TrainArgs
from conftest import AVAILABLE, SIMULATED
from model_helpers import tiny_checkpoint
from training_helpers import anychip as run_anychip
from training_helpers import strict_on_chip_then_resume_on_cpu
from training_helpers import sft_records, write_jsonl

paddle = import_paddle()


def tensor(array, device):
    return paddle.to_tensor(np.asarray(array), place=place((device, 0)))


def real_prefix(model: LlamaForCausalLM, tokens: np.ndarray) -> np.ndarray:
    """The keys and values ``model`` computes for ``tokens`` at positions 0.., as a prefix
    [L, 2, P, Hk, D]."""
    p = len(tokens)
    cache = model.new_cache(1, p)
    model(tensor(tokens[None], model.device[0]), tensor(np.arange(p)[None], model.device[0]), cache)
    return np.stack([cache.k.numpy()[:, 0], cache.v.numpy()[:, 0]], axis=1)


class _Tokens:
    """Enough of a tokenizer for Generator: no EOS, any text."""

    eos_ids = ()

    def stream_decoder(self):
        class Decoder:
            def feed(self, token):
                return "x"

        return Decoder()


@pytest.mark.parametrize("device", AVAILABLE)
def test_a_prefix_of_real_tokens_is_reading_them_first(device):
    ckpt = tiny_checkpoint("float")
    plain = LlamaForCausalLM(ckpt, (device, 0))
    rng = np.random.default_rng(0)
    x, y, y2 = rng.integers(1, 90, 5), rng.integers(1, 90, 7), rng.integers(1, 90, 4)
    p, t = len(x), len(y)
    with_prefix = LlamaForCausalLM(replace(ckpt, prefix=real_prefix(plain, x)), (device, 0))
    assert with_prefix.prefix_len == p and with_prefix.context == ckpt.config.max_position - p

    def read_first(ids):  # the plain model's logits of ids after x
        full = np.concatenate([x, ids])
        return plain(tensor(full[None], device), tensor(np.arange(len(full))[None], device)).numpy()[0, p:]

    # one sequence, no cache (training, perplexity)
    got = with_prefix(tensor(y[None], device), tensor(np.arange(t)[None], device)).numpy()[0]
    np.testing.assert_allclose(got, read_first(y), rtol=1e-5, atol=1e-5)
    # two documents packed under a causal-document FlashMask: each behind the prefix, alone
    packed = np.concatenate([y, y2])
    positions = np.concatenate([np.arange(t), np.arange(len(y2))])
    se = masks.causal_document([t, len(y2)]).astype(np.int32)
    got = with_prefix(tensor(packed[None], device), tensor(positions[None], device),
                      startend_row_indices=tensor(se, device)).numpy()[0]
    np.testing.assert_allclose(got[:t], read_first(y), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(got[t:], read_first(y2), rtol=1e-5, atol=1e-5)
    # generation: a batch of two prompts prefilled behind the prefix, decoded fused or op by op
    params = SamplingParams(max_new_tokens=10)
    for fused in (True, False):
        out, _ = Generator(with_prefix, _Tokens(), fused=fused).generate([list(y), list(y2)], params)
        for ids, completion in zip((y, y2), out):
            alone, _ = Generator(plain, _Tokens(), fused=fused).generate([list(np.concatenate([x, ids]))], params)
            assert completion.tokens == alone[0].tokens, (fused, completion.tokens, alone[0].tokens)


def test_the_cache_holds_the_prefix_and_the_context_shrinks():
    ckpt = tiny_checkpoint("float")
    c = ckpt.config
    kv = np.random.default_rng(1).standard_normal((c.num_layers, 2, 6, c.num_kv_heads, c.head_dim)).astype(np.float32)
    model = LlamaForCausalLM(replace(ckpt, prefix=kv), ("cpu", 0))
    cache = model.new_cache(3, 10)
    assert cache.max_len == 16
    for row in range(3):
        np.testing.assert_array_equal(cache.k.numpy()[:, row, :6], kv[:, 0])
        np.testing.assert_array_equal(cache.v.numpy()[:, row, :6], kv[:, 1])
    with pytest.raises(ValueError, match="max_len 251 plus the 6 prefix tokens exceeds the model's context of 256"):
        model.new_cache(1, 251)


@pytest.fixture(scope="module")
def examples(base):
    records = sft_records()
    examples, bad = load_sft_data_from(records, base)
    assert not bad
    return examples


def load_sft_data_from(records, base, tmp=None):
    import tempfile
    from pathlib import Path

    folder = Path(tempfile.mkdtemp())
    return load_sft_data(write_jsonl(folder / "train.jsonl", records), ChatFormat.from_tokenizer(base.tokenizer),
                         max_length=64)


@pytest.mark.parametrize("projection", [False, True], ids=["direct", "projection"])
def test_training_lowers_the_loss_and_the_folder_loads_with_that_prefix(base, model_dir, examples, tmp_path,
                                                                       projection):
    config = PrefixConfig(num_prefix_tokens=8, projection=projection, projection_hidden=32, base_model=str(model_dir))
    model = TrainableModel(base, ("cpu", 0), prefix=config, seed=1)
    assert sorted(model.params) == sorted(prefix_mod.encoder_shapes(base.config, config))
    args = TrainArgs(max_length=64, batch_size=2, max_steps=20, lr=1e-1 if not projection else 1e-2,
                     schedule="constant", seed=3, zero_padding=True)
    trainer = Trainer(model, base, examples, examples[:4], args, tmp_path, progress=False)
    trainer.train()
    evals = [r["eval_loss"] for r in trainer.history if "eval_loss" in r]
    assert evals[-1] < 0.9 * evals[0], evals
    assert json.loads((tmp_path / "prefix_config.json").read_text())["format"] == prefix_mod.FORMAT
    loaded = load_checkpoint(tmp_path)
    assert loaded.tensors is not None and loaded.config == base.config
    with paddle.no_grad():
        trained = model.prefix_kv().numpy()
    np.testing.assert_allclose(loaded.prefix, trained, rtol=1e-5, atol=1e-5)
    # the loaded model scores the dev examples as the trainer last did
    dev = Trainer(TrainableModel(loaded_base := load_checkpoint(model_dir), ("cpu", 0), prefix=config, seed=9),
                  loaded_base, examples, examples[:4], args, tmp_path / "again", progress=False)
    dev.model.load_state(checkpoints.load_checkpoint_state(checkpoints.latest_checkpoint(tmp_path))[0])
    assert dev.evaluate()["eval_loss"] == pytest.approx(evals[-1], rel=1e-5)


def test_the_prefix_starts_as_real_tokens_and_gets_its_gradient_through_recompute(base, examples):
    config = PrefixConfig(num_prefix_tokens=6)
    args = TrainArgs(max_length=64, batch_size=2, zero_padding=True)
    batch = Trainer(TrainableModel(base, ("cpu", 0), prefix=config), base, examples, [], args, "/nonexistent",
                    progress=False)._epoch_batches(0)[0]
    grads = []
    for recompute in (False, True):
        model = TrainableModel(base, ("cpu", 0), prefix=config, seed=5, recompute=recompute)
        loss, _ = model.batch_loss(batch, batch.loss_tokens)
        loss.backward()
        grads.append(model.params[prefix_mod.EMBEDDING].grad.numpy())
    assert np.abs(grads[0]).max() > 0
    np.testing.assert_allclose(grads[1], grads[0], rtol=1e-5, atol=1e-7)
    # the initial prefix is the frozen model's own keys and values of P tokens
    model = TrainableModel(base, ("cpu", 0), prefix=config, seed=5)
    plain = LlamaForCausalLM(base, ("cpu", 0))
    tokens = np.random.default_rng(5).integers(0, base.config.vocab_size, size=(1, 6))[0]
    with paddle.no_grad():
        np.testing.assert_allclose(model.prefix_kv().numpy(), real_prefix(plain, tokens), rtol=1e-6, atol=1e-6)


def test_training_refuses_two_adapters_and_a_prefixed_base(base):
    with pytest.raises(ValueError, match="a LoRA adapter or a prefix, not both"):
        TrainableModel(base, ("cpu", 0), lora=LoraConfig(), prefix=PrefixConfig())
    c = base.config
    prefixed = replace(base, prefix=np.zeros((c.num_layers, 2, 2, c.num_kv_heads, c.head_dim), np.float32))
    with pytest.raises(ValueError, match="carries a trained prefix already"):
        TrainableModel(prefixed, ("cpu", 0), prefix=PrefixConfig())
    with pytest.raises(ValueError, match="num_prefix_tokens must be a positive integer, got 0"):
        PrefixConfig(num_prefix_tokens=0)


def write_adapter(folder, base_path, config: PrefixConfig, tensors: dict):
    from safetensors.numpy import save_file

    folder.mkdir(parents=True, exist_ok=True)
    (folder / "prefix_config.json").write_text(replace(config, base_model=str(base_path)).to_json())
    save_file(tensors, str(folder / "model.safetensors"))
    return folder


def test_bad_adapter_folders_are_refused_by_name(base, model_dir, tmp_path):
    config = PrefixConfig(num_prefix_tokens=4)
    good = {prefix_mod.EMBEDDING: np.zeros((4, prefix_mod.kv_width(base.config)), np.float32)}
    cases = {
        "shape": ({prefix_mod.EMBEDDING: np.zeros((3, 7), np.float32)}, r"prefix_encoder.embedding has shape \[3, 7\]"),
        "missing": ({}, "prefix tensor prefix_encoder.embedding is missing"),
        "nan": ({prefix_mod.EMBEDDING: np.full_like(good[prefix_mod.EMBEDDING], np.nan)}, "NaN or infinite"),
        "extra": ({**good, "x": np.zeros(2, np.float32)}, "unexpected tensor x"),
    }
    for name, (tensors, message) in cases.items():
        folder = write_adapter(tmp_path / name, model_dir, config, tensors)
        with pytest.raises(CheckpointError, match=message):
            load_checkpoint(folder)
    folder = write_adapter(tmp_path / "format", model_dir, config, good)
    (folder / "prefix_config.json").write_text('{"format": "something-else"}')
    with pytest.raises(CheckpointError, match="not an anychip prefix config"):
        load_checkpoint(folder)
    (folder / "prefix_config.json").write_text('{"format": "anychip-prefix/1", "num_prefix_tokens": -3}')
    with pytest.raises(CheckpointError, match="num_prefix_tokens must be a positive integer, got -3"):
        load_checkpoint(folder)
    (folder / "prefix_config.json").write_text("{not json")
    with pytest.raises(CheckpointError, match="not a readable prefix config"):
        load_checkpoint(folder)
    folder = write_adapter(tmp_path / "weights", model_dir, config, good)
    (folder / "model.safetensors").unlink()
    with pytest.raises(CheckpointError, match="missing .the prefix encoder's weights"):
        load_checkpoint(folder)


@pytest.fixture(scope="module")
def trained_prefix(model_dir, tmp_path_factory):
    """`anychip finetune --prefix-tuning` on cpu through the CLI: (output folder, data folder)."""
    data = tmp_path_factory.mktemp("prefix-data")
    write_jsonl(data / "train.jsonl", sft_records())
    write_jsonl(data / "dev.jsonl", sft_records(6))
    out = tmp_path_factory.mktemp("prefix-run") / "out"
    result = run_anychip("finetune", "--model", model_dir, "--data", data, "--prefix-tuning", "--num-prefix-tokens", 8,
                         "--zero-padding", "--max-length", 64, "--batch-size", 2, "--max-steps", 6, "--lr", "5e-2",
                         "--output", out)
    assert result.returncode == 0, result.stderr
    assert "Prefix Tuning (8 tokens) training of" in result.stderr
    return out, data


def test_generate_eval_and_serve_load_the_prefix_folder(trained_prefix):
    out, _ = trained_prefix
    result = run_anychip("generate", "--model", out, "--max-new-tokens", 5, "--json", "Say hello.")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["completions"][0]["completion_tokens"] >= 1
    # perplexity through one forward pass and through the decode steps: the same prefix in both
    text = out.parent / "text.txt"
    text.write_text("The capital of France is Paris. Say hello. Hello world! 1234567890 " * 3)
    scores = []
    for through in ("prefill", "decode"):
        ppl = run_anychip("eval", "ppl", "--model", out, "--data", text, "--window", 24, "--through", through,
                          "--json")
        assert ppl.returncode == 0, ppl.stderr
        scores.append(json.loads(ppl.stdout)["perplexity"])
    base_ppl = run_anychip("eval", "ppl", "--model", json.loads((out / "prefix_config.json").read_text())["base_model"],
                           "--data", text, "--window", 24, "--json")
    assert base_ppl.returncode == 0, base_ppl.stderr
    assert scores[1] == pytest.approx(scores[0], rel=1e-4)
    assert scores[0] != pytest.approx(json.loads(base_ppl.stdout)["perplexity"], rel=1e-3)  # the prefix counts
    # the serving engine: each new row's cache holds the prefix, its tokens what generate gives
    from anychip_models.serving.engine import Engine, EngineConfig

    ckpt = load_checkpoint(out)
    model = LlamaForCausalLM(ckpt, ("cpu", 0))
    prompt = ckpt.tokenizer.encode("Say hello.")
    params = SamplingParams(max_new_tokens=6)
    expected, _ = Generator(model, ckpt.tokenizer).generate([prompt], params)
    engine = Engine(model, ckpt.tokenizer, EngineConfig(max_batch=2, max_len=64)).start()
    try:
        events = []
        done = __import__("threading").Event()

        def on_event(event):
            events.append(event)
            if event.kind in ("done", "error"):
                done.set()

        engine.submit(prompt, params, on_event)
        assert done.wait(60)
    finally:
        engine.stop()
    assert events[-1].kind == "done", events[-1]
    assert events[-1].completion.tokens == expected[0].tokens


@pytest.mark.parametrize("device", SIMULATED)
def test_prefix_tuning_runs_strict_on_every_chip_and_resumes_on_cpu(model_dir, trained_prefix, tmp_path, device):
    _, data = trained_prefix
    common = ["finetune", "--model", model_dir, "--data", data, "--prefix-tuning", "--num-prefix-tokens", 8,
              "--zero-padding", "--max-length", 64, "--batch-size", 2, "--max-steps", 4, "--save-steps", 2,
              "--lr", "5e-2"]
    strict_on_chip_then_resume_on_cpu(common, tmp_path, device)


def test_finetune_refuses_bad_prefix_flags_before_any_work(model_dir, trained_prefix, tmp_path):
    _, data = trained_prefix
    common = ["finetune", "--model", model_dir, "--data", data, "--prefix-tuning"]
    both = run_anychip(*common, "--lora", "--output", tmp_path / "a")
    assert both.returncode != 0 and "--lora and --prefix-tuning train different adapters" in both.stderr
    zero = run_anychip(*common, "--num-prefix-tokens", 0, "--output", tmp_path / "b")
    assert zero.returncode != 0 and "--num-prefix-tokens must be >= 1, got 0" in zero.stderr
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


def test_quantize_refuses_a_prefix_adapter_instead_of_dropping_its_prefix(trained_prefix, tmp_path):
    out, _ = trained_prefix
    result = run_anychip("quantize", "--model", out, "--type", "wint8", "--output", tmp_path / "q")
    assert result.returncode != 0 and "is a prefix adapter: quantize its base model" in result.stderr
    assert not (tmp_path / "q").exists()
