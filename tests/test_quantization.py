"""Post-training quantization end to end on a tiny random Llama: calibration records every
projection's input, SmoothQuant's folding leaves the float model unchanged, GPTQ beats rounding
on the model's own layers, and `anychip quantize` -> `anychip eval ppl` / `generate` work for
every scheme."""

from __future__ import annotations

import json

import numpy as np
import pytest

from anychip_models.checkpoint import Checkpoint, QuantWeight, W8A8Weight
from anychip_models.llama import LlamaForCausalLM, paddle
from anychip_models.quantization.ptq import SINK_WEIGHT, _smooth_layer, calibrate, quantize
from anychip_models.training.data import ChatFormat, load_sft_data
from training_helpers import anychip, sft_records, write_jsonl


@pytest.fixture(scope="module")
def calib_file(tmp_path_factory):
    return write_jsonl(tmp_path_factory.mktemp("calib") / "calib.jsonl", sft_records(12))


@pytest.fixture(scope="module")
def sequences(base, calib_file):
    examples, _ = load_sft_data(calib_file, ChatFormat.from_tokenizer(base.tokenizer), 64)
    return [e.input_ids for e in examples]


@pytest.fixture(scope="module")
def stats(base, sequences):
    return calibrate(base, ("cpu", 0), sequences, progress=False)


def logits(checkpoint, ids):
    model = LlamaForCausalLM(checkpoint, ("cpu", 0))
    with paddle.no_grad():
        return model(paddle.to_tensor(np.array([ids])), paddle.to_tensor(np.arange(len(ids))[None])).numpy()[0]


def test_calibration_records_every_projection(base, sequences, stats):
    tokens = sum(map(len, sequences)) + (SINK_WEIGHT - 1) * len(sequences)  # each first token counts SINK_WEIGHT times
    assert sorted(stats) == sorted(f"layers.{i}.{n}" for i in range(2) for n in ("qkv", "o", "gate_up", "down"))
    for name, s in stats.items():
        assert s.hessian.count == tokens, name
        assert (s.absmax > 0).all(), name
    assert stats["layers.0.down"].hessian.matrix.shape == (128, 128)


def test_smoothing_folds_exactly(base, sequences, stats):
    """Scaling the norm weights / up rows by 1/s and the next weights' columns by s leaves the
    float model's function unchanged: all of SmoothQuant's effect is on quantization."""
    tensors = {k: np.asarray(v, dtype=np.float32).copy() for k, v in base.tensors.items()}
    for i in range(base.config.num_layers):
        _smooth_layer(tensors, stats, i, 0.5)
    assert not np.allclose(tensors["layers.0.attn_norm"], base.tensors["layers.0.attn_norm"])
    smoothed = Checkpoint(base.config, tensors, base.tokenizer, base.source)
    np.testing.assert_allclose(logits(smoothed, sequences[0]), logits(base, sequences[0]), rtol=1e-4, atol=1e-4)


def test_schemes_produce_their_formats(base, stats):
    wint4 = quantize(base, "wint4", stats, group_size=64, use_gptq=True, progress=False)
    a8w8 = quantize(base, "a8w8", stats, smooth=True, progress=False)
    assert isinstance(wint4["layers.1.down_proj"], QuantWeight) and wint4["layers.1.down_proj"].bits == 4
    assert isinstance(a8w8["layers.0.q_proj"], W8A8Weight)
    assert isinstance(wint4["embed_tokens"], np.ndarray)  # embedding and head stay float
    with pytest.raises(ValueError, match="calibration"):
        quantize(base, "wint4", None, use_gptq=True)
    with pytest.raises(ValueError, match="a8w8"):
        quantize(base, "wint8", stats, smooth=True)
    with pytest.raises(ValueError, match="group size 128 does not divide the hidden size 64"):
        quantize(base, "wint4", stats, group_size=128)


def test_gptq_beats_rounding_on_the_model(base, sequences, stats):
    """Logit error of the whole model against float, averaged over the calibration sequences."""
    def error(tensors):
        quantized = Checkpoint(base.config, tensors, base.tokenizer, base.source)
        return np.mean([np.abs(logits(quantized, s) - logits(base, s)).mean() for s in sequences[:4]])

    rtn = error(quantize(base, "wint4", stats, group_size=64, progress=False))
    gptq = error(quantize(base, "wint4", stats, group_size=64, use_gptq=True, progress=False))
    assert gptq < rtn, (gptq, rtn)


def test_quantize_eval_and_generate_through_the_cli(model_dir, calib_file, tmp_path):
    text = tmp_path / "text.txt"
    text.write_text("The capital of France is Paris. Hello world! the quick brown fox jumps over. " * 6)
    float_ppl = anychip("eval", "ppl", "--model", model_dir, "--data", text, "--json")
    assert float_ppl.returncode == 0, float_ppl.stderr
    reference = json.loads(float_ppl.stdout)["perplexity"]
    # the same text scored token by token through the decode step, exactly and in bfloat16
    through = anychip("eval", "ppl", "--model", model_dir, "--data", text, "--json", "--through", "decode")
    assert through.returncode == 0, through.stderr
    assert json.loads(through.stdout)["perplexity"] == pytest.approx(reference, rel=1e-4)
    bf16 = anychip("eval", "ppl", "--model", model_dir, "--data", text, "--json", "--through", "decode", "--bf16")
    assert bf16.returncode == 0, bf16.stderr
    result = json.loads(bf16.stdout)
    assert result["bf16"] and result["through"] == "decode"
    assert result["perplexity"] == pytest.approx(reference, rel=2e-2)
    # through a bfloat16 KV cache: close, not the same (the scored keys and values are rounded)
    half = anychip("eval", "ppl", "--model", model_dir, "--data", text, "--json", "--through", "decode",
                   "--kv-cache", "bfloat16")
    assert half.returncode == 0, half.stderr
    result = json.loads(half.stdout)
    assert result["kv_cache"] == "bfloat16"
    assert result["perplexity"] == pytest.approx(reference, rel=2e-2) and result["perplexity"] != reference
    wrong = anychip("eval", "ppl", "--model", model_dir, "--data", text, "--kv-cache", "bfloat16")
    assert wrong.returncode != 0 and "--kv-cache applies to --through decode" in wrong.stderr
    for args in (["--type", "wint8"], ["--type", "wint4", "--group-size", "64", "--gptq"],
                 ["--type", "a8w8", "--smooth"]):
        out = tmp_path / args[1]
        calib = text if "--gptq" in args else calib_file  # a plain text, or the fine-tuning jsonl
        run = anychip("quantize", "--model", model_dir, *args, "--calib", calib, "--output", out)
        assert run.returncode == 0, run.stderr
        meta = json.loads((out / "quantization.json").read_text())
        assert meta["quant_type"] == args[1]
        if len(args) > 2:  # GPTQ and SmoothQuant calibrate; plain rounding does not
            assert meta["method"]["calibration"]["data"] == str(calib)
        ppl = anychip("eval", "ppl", "--model", out, "--data", text, "--json")
        assert ppl.returncode == 0, ppl.stderr
        value = json.loads(ppl.stdout)["perplexity"]
        assert np.isfinite(value) and value < reference * 1.5, (args, value, reference)
        gen = anychip("generate", "--model", out, "--raw", "Hello", "--max-new-tokens", "4", "--device", "npu")
        assert gen.returncode == 0 and "simulated" in gen.stderr, gen.stderr


def test_quantize_needs_calibration_for_gptq(model_dir, tmp_path):
    run = anychip("quantize", "--model", model_dir, "--type", "wint4", "--gptq", "--output", tmp_path / "q")
    assert run.returncode != 0 and "--calib" in run.stderr


def test_quantize_refuses_to_replace_a_file_or_a_full_folder(model_dir, tmp_path):
    """--output an existing file used to be replaced by a model folder, exit 0."""
    precious = tmp_path / "notes.txt"
    precious.write_text("mine")
    run = anychip("quantize", "--model", model_dir, "--type", "wint8", "--output", precious)
    assert run.returncode != 0 and "is a file" in run.stderr and "Traceback" not in run.stderr
    assert precious.read_text() == "mine"
    full = tmp_path / "full"
    full.mkdir()
    (full / "keep.txt").write_text("mine")
    run = anychip("quantize", "--model", model_dir, "--type", "wint8", "--output", full)
    assert run.returncode != 0 and "--overwrite" in run.stderr and (full / "keep.txt").exists()


def test_quantize_with_an_empty_calibration_file_says_so(model_dir, tmp_path):
    empty = tmp_path / "empty.txt"
    empty.write_text("")
    run = anychip("quantize", "--model", model_dir, "--type", "wint4", "--gptq", "--calib", empty,
                  "--output", tmp_path / "q")
    assert run.returncode != 0 and "holds no calibration text" in run.stderr and "Traceback" not in run.stderr
