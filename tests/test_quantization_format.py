"""anychip's quantized folder ("anychip-quant/1"): write_quantized -> load_checkpoint is exact,
broken folders fail naming the file and tensor, and the model runs WINT8 / WINT4 / A8W8 folders
close to the float model, with decode agreeing with prefill and the same greedy tokens on every
device. The weights are quantized here with plain round-to-nearest (the PTQ algorithms are tested
on their own)."""

from __future__ import annotations

import json
import tempfile
from dataclasses import replace
from functools import lru_cache
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from anychip.ops.quant import quantize_numpy
from anychip_models.checkpoint import CheckpointError, QuantWeight, W8A8Weight, tensor_shapes
from anychip_models.loader import load_checkpoint
from anychip_models.quantization.checkpoint import (FORMAT, folder_size, load_quantized, read_quantization,
                                                    write_quantized)
from conftest import SIMULATED
from model_helpers import tiny_checkpoint
from ops_helpers import host, paddle

LINEARS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
SCHEMES = ("wint8", "wint4", "a8w8")
# max |logits - float logits| / max |float logits| over a prompt (round-to-nearest, random weights)
TOLERANCE = {"wint8": 2e-2, "wint4": 2.5e-1, "a8w8": 4e-2}


def w8a8(w: np.ndarray) -> W8A8Weight:
    """Per-output-channel symmetric int8 (round half away from zero), as w8a8_linear takes."""
    scales = np.abs(w).max(axis=1) / 127
    safe = np.where(scales == 0, 1, scales)[:, None]
    q = np.clip(np.sign(w / safe) * np.floor(np.abs(w / safe) + 0.5), -127, 127).astype(np.int8)
    return W8A8Weight(q, scales.astype(np.float32))


def weight_only(w: np.ndarray, bits: int, group_size: int, offsets: bool = False) -> QuantWeight:
    qweight, scales = quantize_numpy(w.T, bits, group_size)
    off = None
    if offsets:  # an asymmetric variant (format coverage): shift each group by a small offset
        off = np.random.default_rng(w.shape[0]).normal(0, 1e-3, scales.shape).astype(np.float32)
    return QuantWeight(qweight, scales, bits, group_size, off)


def quantized_tensors(ckpt, scheme: str) -> dict:
    """The float checkpoint's linears in ``scheme``; the untied head weight-only int8, the
    embedding float (as the PTQ command keeps them)."""
    tensors = dict(ckpt.tensors)
    for i in range(ckpt.config.num_layers):
        for name in LINEARS:
            w = tensors[f"layers.{i}.{name}"]
            if scheme == "wint8":
                tensors[f"layers.{i}.{name}"] = weight_only(w, 8, -1)
            elif scheme == "wint4":
                tensors[f"layers.{i}.{name}"] = weight_only(w, 4, 64, offsets=name in ("o_proj", "down_proj"))
            else:
                tensors[f"layers.{i}.{name}"] = w8a8(w)
    if "lm_head" in tensors:
        tensors["lm_head"] = weight_only(tensors["lm_head"], 8, -1)
    return tensors


@lru_cache(maxsize=None)
def float_checkpoint():
    """The tiny float model with its layers' linears scaled to std 1 / sqrt(64), as trained models
    have them (tiny_checkpoint's std 0.5 makes a chaotic net that amplifies any rounding ~10x)."""
    ckpt = tiny_checkpoint("float", tie=False, qkv_bias=True)
    return replace(ckpt, tensors={name: value * np.float32(0.25) if name.split(".")[-1] in LINEARS else value
                                  for name, value in ckpt.tensors.items()})


# The quantized folders, written once per session; the directory goes when the session ends.
_FOLDERS = tempfile.TemporaryDirectory(prefix="anychip-test-quant-")


@lru_cache(maxsize=None)
def folder(scheme: str):
    ckpt = float_checkpoint()
    path = Path(_FOLDERS.name) / scheme / "model"
    return write_quantized(path, ckpt.config, quantized_tensors(ckpt, scheme), ckpt.tokenizer, scheme,
                           {"rtn": True, "group_size": 64 if scheme == "wint4" else -1})


def model(ckpt, device="cpu"):
    paddle()
    from anychip_models.llama import LlamaForCausalLM

    return LlamaForCausalLM(ckpt, (device, 0))


def ids_tensor(array, device="cpu"):
    from anychip.frontends.paddle import place

    return paddle().to_tensor(np.asarray(array, dtype=np.int64), place=place(device, 0))


def prefill_logits(m, ids) -> np.ndarray:
    return host(m(ids_tensor([ids]), ids_tensor([list(range(len(ids)))])))[0]


PROMPT = [3, 14, 15, 92, 65, 35, 89, 79, 32, 38]


# ---- the format ----------------------------------------------------------------------------------

@pytest.mark.parametrize("scheme", SCHEMES)
def test_round_trip_is_exact(scheme):
    ckpt = float_checkpoint()
    want = quantized_tensors(ckpt, scheme)
    path = folder(scheme)
    assert sorted(p.name for p in path.iterdir()) == sorted(
        ["config.json", "generation_config.json", "model.safetensors", "quantization.json", "tokenizer.json",
         "tokenizer_config.json"])
    got = load_checkpoint(path, weights="native")
    assert replace(got.config, name="") == replace(ckpt.config, name="")
    assert got.tensors.keys() == want.keys()
    for name, value in want.items():
        value_got = got.tensors[name]
        if isinstance(value, QuantWeight):
            assert type(value_got) is type(value), name
            assert (value_got.bits, value_got.group_size) == (value.bits, value.group_size), name
            for part in ("qweight", "scales", "offsets"):
                a, b = getattr(value_got, part), getattr(value, part)
                assert (a is None) == (b is None), (name, part)
                if a is not None:
                    assert a.dtype == b.dtype, (name, part)
                    np.testing.assert_array_equal(a, b, err_msg=f"{name}.{part}")
        else:
            assert value_got.dtype == np.float32
            np.testing.assert_array_equal(value_got, value, err_msg=name)
    # weights="float": every tensor dequantized, W = q * scale exactly
    flat = load_checkpoint(path, weights="float")
    for name, value in want.items():
        expected = value.dequantize() if isinstance(value, QuantWeight) else value
        assert flat.tensors[name].dtype == np.float32
        np.testing.assert_array_equal(flat.tensors[name], expected, err_msg=name)
    # quantization.json: the schemes of every quantized tensor, nothing for the float ones
    quant = read_quantization(path)
    assert quant["format"] == FORMAT and quant["quant_type"] == scheme and quant["method"]["rtn"] is True
    assert set(quant["tensors"]) == {n for n, v in want.items() if isinstance(v, QuantWeight)}
    entry = quant["tensors"]["layers.1.down_proj"]
    assert entry == ({"scheme": "a8w8"} if scheme == "a8w8" else
                     {"scheme": "weight_only", "bits": 4 if scheme == "wint4" else 8,
                      "group_size": 64 if scheme == "wint4" else -1, "offsets": scheme == "wint4"})
    assert quant["tensors"]["lm_head"] == {"scheme": "weight_only", "bits": 8, "group_size": -1, "offsets": False}
    # the tokenizer
    for text in ["Hello world!", "tt t  t", "~{}|"]:
        assert got.tokenizer.encode(text) == ckpt.tokenizer.encode(text)
    assert (got.tokenizer.eos_ids, got.tokenizer.vocab_size) == (ckpt.tokenizer.eos_ids, ckpt.tokenizer.vocab_size)
    # sizes: int4 < int8 < float
    assert folder_size(path) == sum(p.stat().st_size for p in path.iterdir())


def test_quantized_folders_are_smaller(tmp_path):
    from anychip_models.export import write_hf_folder

    ckpt = float_checkpoint()
    flat = folder_size(write_hf_folder(tmp_path / "float", ckpt.config, ckpt.tensors, ckpt.tokenizer))
    sizes = {s: folder_size(folder(s)) for s in SCHEMES}
    assert sizes["wint4"] < sizes["wint8"] < flat and sizes["a8w8"] < flat


def test_rewriting_swaps_the_folder_atomically(tmp_path):
    ckpt = float_checkpoint()
    path = tmp_path / "m"
    write_quantized(path, ckpt.config, quantized_tensors(ckpt, "wint8"), ckpt.tokenizer, "wint8", {})
    write_quantized(path, ckpt.config, quantized_tensors(ckpt, "a8w8"), ckpt.tokenizer, "a8w8", {})
    assert read_quantization(path)["quant_type"] == "a8w8"
    assert isinstance(load_checkpoint(path, weights="native").tensors["layers.0.o_proj"], W8A8Weight)
    assert [p.name for p in tmp_path.iterdir()] == ["m"]  # no temporary folder left


def test_bad_inputs_are_refused_before_writing(tmp_path):
    ckpt = float_checkpoint()
    tensors = quantized_tensors(ckpt, "wint4")
    with pytest.raises(ValueError, match="quant_type"):
        write_quantized(tmp_path / "a", ckpt.config, tensors, ckpt.tokenizer, "int3", {})
    bad = dict(tensors)
    q = bad["layers.0.q_proj"]
    bad["layers.0.q_proj"] = QuantWeight(q.qweight[:, :16], q.scales, 4, 64)
    with pytest.raises(ValueError, match="layers.0.q_proj"):
        write_quantized(tmp_path / "b", ckpt.config, bad, ckpt.tokenizer, "wint4", {})
    del bad["layers.0.q_proj"]
    with pytest.raises(ValueError, match="missing"):
        write_quantized(tmp_path / "c", ckpt.config, bad, ckpt.tokenizer, "wint4", {})
    with pytest.raises(ValueError, match="JSON"):
        write_quantized(tmp_path / "d", ckpt.config, tensors, ckpt.tokenizer, "wint4", {"x": object()})
    assert not any(tmp_path.iterdir())
    with pytest.raises(ValueError, match="int8"):
        W8A8Weight(np.zeros((4, 8), np.uint8), np.ones(4, np.float32))


def copy_folder(scheme, tmp_path):
    import shutil

    return shutil.copytree(folder(scheme), tmp_path / "m")


def test_missing_tensor_names_the_file_and_tensor(tmp_path):
    path = copy_folder("wint4", tmp_path)
    tensors = load_file(path / "model.safetensors")
    del tensors["model.layers.1.mlp.up_proj.weight.scales"]
    save_file(tensors, path / "model.safetensors")
    with pytest.raises(CheckpointError, match=r"/m/model\.safetensors: tensor 'model\.layers\.1\.mlp\.up_proj\.weight"
                                              r"\.scales' \(layers\.1\.up_proj, weight_only\) is missing"):
        load_checkpoint(path, weights="native")
    tensors = load_file(folder("wint4") / "model.safetensors")
    del tensors["model.norm.weight"]
    save_file(tensors, path / "model.safetensors")
    with pytest.raises(CheckpointError, match=r"model\.safetensors: tensor 'model\.norm\.weight' \(norm\) is missing"):
        load_checkpoint(path)


def test_shape_and_dtype_mismatches_name_the_file_and_tensor(tmp_path):
    path = copy_folder("a8w8", tmp_path)
    tensors = load_file(path / "model.safetensors")
    name = "model.layers.0.self_attn.o_proj.weight.qweight"
    tensors[name] = tensors[name][:, :32].copy()
    save_file(tensors, path / "model.safetensors")
    with pytest.raises(CheckpointError, match=r"model\.safetensors: tensor '.*o_proj\.weight\.qweight' "
                                              r"\(layers\.0\.o_proj\) has shape \[64, 32\]"):
        load_checkpoint(path, weights="native")
    tensors[name] = np.zeros((64, 64), np.uint8)
    save_file(tensors, path / "model.safetensors")
    with pytest.raises(CheckpointError, match=r"o_proj\.weight\.qweight.*dtype U8, expected I8"):
        load_checkpoint(path, weights="native")


def edit_quantization(path, edit):
    quant = json.loads((path / "quantization.json").read_text())
    edit(quant)
    (path / "quantization.json").write_text(json.dumps(quant))


def test_bad_scheme_and_corrupt_json_name_the_file_and_tensor(tmp_path):
    path = copy_folder("wint8", tmp_path)
    quant_file = str(path / "quantization.json")
    edit_quantization(path, lambda q: q["tensors"]["layers.0.k_proj"].update(scheme="fp8"))
    with pytest.raises(CheckpointError, match=rf"{quant_file}: tensor 'layers.0.k_proj' has unknown scheme 'fp8'"):
        load_checkpoint(path, weights="native")
    edit_quantization(path, lambda q: q["tensors"]["layers.0.k_proj"].update(scheme="weight_only", bits=3))
    with pytest.raises(CheckpointError, match=r"tensor 'layers.0.k_proj': bits must be 4 or 8"):
        load_checkpoint(path, weights="native")
    edit_quantization(path, lambda q: q["tensors"].update({"layers.0.k_proj": {"scheme": "a8w8"},
                                                           "layers.7.q_proj": {"scheme": "a8w8"}}))
    with pytest.raises(CheckpointError, match=r"tensor 'layers.7.q_proj' is not a tensor of this model"):
        load_checkpoint(path, weights="native")
    (path / "quantization.json").write_text('{"format": "anychip-quant/1", "tensors": {')
    with pytest.raises(CheckpointError, match=rf"{quant_file}: not valid JSON"):
        load_checkpoint(path, weights="float")
    (path / "quantization.json").write_text('{"format": "other"}')
    with pytest.raises(CheckpointError, match="not an anychip quantization file"):
        load_quantized(path)


def test_a_huge_layer_count_fails_at_the_first_missing_layer_instead_of_hanging(tmp_path):
    path = copy_folder("wint8", tmp_path)
    config = json.loads((path / "config.json").read_text())
    layers = config["num_hidden_layers"]
    (path / "config.json").write_text(json.dumps({**config, "num_hidden_layers": 2**32 - 1}))
    edit_quantization(path, lambda q: q["tensors"].update({"layers.4000000000.q_proj": {"scheme": "a8w8"}}))
    with pytest.raises(CheckpointError, match=rf"tensor 'model\.layers\.{layers}\..*' \(layers\.{layers}\.\w+"
                                              r"(, \w+)?\) is missing"):
        load_checkpoint(path, weights="native")
    with pytest.raises(CheckpointError, match=rf"tensor 'model\.layers\.{layers}\."):
        load_checkpoint(path, weights="float")


# ---- the model -----------------------------------------------------------------------------------

@pytest.mark.parametrize("scheme", SCHEMES)
def test_logits_stay_close_to_the_float_model(scheme):
    want = prefill_logits(model(float_checkpoint()), PROMPT)
    ckpt = load_checkpoint(folder(scheme), weights="native")
    m = model(ckpt)
    assert m.a8w8 == (scheme == "a8w8")
    got = prefill_logits(m, PROMPT)
    err = np.abs(got - want).max() / np.abs(want).max()
    assert 0 < err < TOLERANCE[scheme], err
    # the quantized model runs what the folder holds: its dequantized weights in float give the
    # same logits for the weight-only schemes (A8W8 adds the activations' rounding)
    exact = prefill_logits(model(load_checkpoint(folder(scheme), weights="float")), PROMPT)
    np.testing.assert_allclose(got, exact, rtol=0, atol=(3e-2 if scheme == "a8w8" else 2e-4) * np.abs(exact).max())


def decode_logits(m, ids, start: int, fused: bool) -> np.ndarray:
    """Prefill ids[:start] into a cache, then decode the rest one token at a time: the logits
    of positions start-1 .. len-1 (the prefill's last, then each decode step's)."""
    from anychip_models.llama import KVCache

    cache = KVCache(m.config, 1, len(ids) + 1, ("cpu", 0))
    rows = [host(m(ids_tensor([ids[:start]]), ids_tensor([list(range(start))]), cache,
                   last_index=ids_tensor([start - 1])))[0]]
    for pos in range(start, len(ids)):
        rows.append(host(m.decode(ids_tensor([ids[pos]]), ids_tensor([pos]), cache, fused=fused))[0])
    return np.stack(rows)


@pytest.mark.parametrize("scheme", SCHEMES)
def test_decode_agrees_with_prefill(scheme):
    """Weight-only: the fused and op-by-op decode steps equal the prefill's logits (float
    activations everywhere). A8W8: op-by-op decode runs w8a8_linear as prefill does (per-token
    int8 activations: equal up to float rounding); the fused step quantizes activations per run
    of 32 instead (LlamaForCausalLM's doc), so it is within the A8W8 error of prefill and of the
    float model."""
    import anychip

    m = model(load_checkpoint(folder(scheme), weights="native"))
    start = 4
    prefill = prefill_logits(m, PROMPT)[start - 1:]
    scale = np.abs(prefill).max()
    anychip.reset_fallbacks()
    fused = decode_logits(m, PROMPT, start, fused=True)
    assert not any(op == "anychip.decoder_step" for (_dev, op, _dt) in anychip.fallback_counts())
    op_by_op = decode_logits(m, PROMPT, start, fused=False)
    np.testing.assert_allclose(op_by_op, prefill, rtol=0, atol=3e-4 * scale)
    if scheme != "a8w8":
        np.testing.assert_allclose(fused, prefill, rtol=0, atol=3e-4 * scale)
        return
    diff = np.abs(fused - prefill).max() / scale
    assert 1e-6 < diff < 3e-2, diff  # not the per-token product, but within A8W8's error
    flat = prefill_logits(model(float_checkpoint()), PROMPT)[start - 1:]
    assert np.abs(fused - flat).max() / np.abs(flat).max() < TOLERANCE["a8w8"]


@pytest.mark.parametrize("outlier", [1, 20])
def test_per_run_activations_err_less_than_per_token(outlier):
    """The claim behind decoding A8W8 through the fused step: on the same int8 weights, x
    quantized per run of 32 (weight_only_linear x_int8, what decoder_step does) is closer to the
    exact product than x quantized per token (w8a8_linear), the more so with outlier channels."""
    pd = paddle()
    import anychip.ops as ops

    rng = np.random.default_rng(0)
    w = w8a8(rng.normal(0, 0.1, size=(256, 128)).astype(np.float32))
    x = rng.normal(size=(64, 128)).astype(np.float32)
    x[:, 5] *= outlier
    exact = x.astype(np.float64) @ w.dequantize().astype(np.float64).T
    qweight, scales, xt = pd.to_tensor(w.qweight), pd.to_tensor(w.scales), pd.to_tensor(x)
    per_token = host(ops.w8a8_linear(xt, qweight, scales)) - exact
    per_run = host(ops.weight_only_linear(xt, qweight, scales, bits=8, group_size=-1, x_int8=True)) - exact
    assert np.sqrt((per_run ** 2).mean()) < np.sqrt((per_token ** 2).mean())


def test_a8w8_with_a_float_layer_decodes_op_by_op(tmp_path):
    """A recipe that leaves a layer float: the fused step takes one format per kind of linear, so
    the model decodes op by op (not a device fallback), agreeing with prefill."""
    import anychip

    ckpt = float_checkpoint()
    tensors = quantized_tensors(ckpt, "a8w8")
    tensors.update({f"layers.0.{name}": ckpt.tensors[f"layers.0.{name}"] for name in LINEARS})
    path = write_quantized(tmp_path / "m", ckpt.config, tensors, ckpt.tokenizer, "a8w8", {"skip": [0]})
    m = model(load_checkpoint(path, weights="native"))
    assert m.a8w8 and not m._fused_ok
    prefill = prefill_logits(m, PROMPT)[3:]
    anychip.reset_fallbacks()
    decoded = decode_logits(m, PROMPT, 4, fused=True)
    assert not any(op == "anychip.decoder_step" for (_dev, op, _dt) in anychip.fallback_counts())
    np.testing.assert_allclose(decoded, prefill, rtol=0, atol=3e-4 * np.abs(prefill).max())


def test_a8w8_fused_step_takes_int8_weights_with_int8_activations():
    m = model(load_checkpoint(folder("a8w8"), weights="native"))
    weights = m._fused_weights()
    assert weights.x_int8
    lin = weights.layers[0].o
    assert (lin.bits, lin.group_size, lin.offsets) == (8, -1, None)
    assert str(lin.weight.dtype) == "paddle.int8"
    # the int8 weights are the folder's, bit for bit
    want = load_checkpoint(folder("a8w8"), weights="native").tensors["layers.0.o_proj"]
    np.testing.assert_array_equal(host(lin.weight), want.qweight)
    np.testing.assert_array_equal(host(lin.scales), want.scales)


def test_a8w8_linear_is_inference_only():
    pd = paddle()
    from anychip_models.layers import Linear

    lin = Linear(w8a8(np.random.default_rng(0).normal(size=(8, 32)).astype(np.float32)), ("cpu", 0))
    x = pd.to_tensor(np.ones((2, 32), np.float32))
    x.stop_gradient = False
    with pytest.raises(ValueError, match="inference-only"):
        lin(x)
    with pd.no_grad():
        assert lin(x).shape == [2, 8]


def test_concat_rows_keeps_a8w8():
    from anychip_models.layers import concat_rows

    rng = np.random.default_rng(0)
    a, b = (w8a8(rng.normal(size=(n, 64)).astype(np.float32)) for n in (8, 4))
    both = concat_rows([a, b])
    assert isinstance(both, W8A8Weight) and both.shape == (12, 64)
    np.testing.assert_array_equal(both.dequantize(), np.concatenate([a.dequantize(), b.dequantize()]))
    mixed = concat_rows([a, weight_only(rng.normal(size=(4, 64)), 8, -1)])
    assert type(mixed) is QuantWeight and (mixed.bits, mixed.group_size) == (8, -1)


def greedy(ckpt, device, prompts, n=10, fused=True):
    from anychip_models.generate import Generator
    from anychip_models.sampling import SamplingParams

    outs, _ = Generator(model(ckpt, device), ckpt.tokenizer, fused=fused).generate(
        prompts, SamplingParams(max_new_tokens=n, ignore_eos=True))
    return [o.tokens for o in outs]


@pytest.mark.parametrize("scheme", SCHEMES)
@pytest.mark.parametrize("fused", [True, False])
def test_greedy_tokens_identical_on_every_device(scheme, fused):
    """The fused decode step and the op-by-op path (w8a8_linear for A8W8) each give the cpu's
    tokens on every simulated device."""
    ckpt = load_checkpoint(folder(scheme), weights="native")
    prompts = [[5, 9, 2], [7, 1, 3, 3, 8]]
    want = greedy(ckpt, "cpu", prompts, fused=fused)
    for device in SIMULATED:
        assert greedy(ckpt, device, prompts, fused=fused) == want, device


def test_shapes_cover_every_tensor():
    ckpt = float_checkpoint()
    assert set(quantized_tensors(ckpt, "a8w8")) == set(tensor_shapes(ckpt.config))
