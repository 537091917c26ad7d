"""GGUF checkpoints: tiny random Llama/Qwen2 models written with gguf.GGUFWriter the way llama.cpp's
converter writes them, loaded back in float and native modes.

The RoPE check: a GGUF made from an HF checkpoint (q/k rows permuted as convert_hf_to_gguf.py
does) must load to exactly the HF tensors. Native QuantWeights are checked against gguf's own
dequantization, unpacking the 4-bit nibbles as kernel.h defines them (not with our dequantize)."""

from __future__ import annotations

import warnings
from dataclasses import replace

import numpy as np
import pytest
from gguf import GGMLQuantizationType as T
from gguf.quants import dequantize, quantize

from anychip_models.checkpoint import CheckpointError, QuantWeight
from anychip_models.loader import load_checkpoint
from anychip_models.hf_folder import load_hf_folder
from loader_helpers import (gguf_tensor_name, random_weights, stored_value, tiny_config, tokenizer_metadata,
                            train_tokenizer, write_gguf, write_hf_folder)

QUANTIZED = (T.Q8_0, T.Q4_0, T.Q4_1)


@pytest.fixture(scope="module")
def tok():
    return train_tokenizer()


def make(tmp_path, tok, qtype=T.F32, arch="llama", name="m.gguf", **kw):
    changes = {k: kw.pop(k) for k in ("tie_embeddings", "qkv_bias", "intermediate_size") if k in kw}
    config = tiny_config(tok, arch, **changes)
    weights = random_weights(config)
    path = write_gguf(tmp_path / name, config, weights, tokenizer_metadata(tok), qtype=qtype, **kw)
    return config, weights, path


def quantized_value(w: np.ndarray, qtype: T) -> np.ndarray:
    """What gguf's dequantization gives for ``w`` stored as ``qtype`` (blocks run along rows,
    so this commutes with the row permutation)."""
    return dequantize(quantize(w, qtype), qtype)


def kernel_h_weight(q: QuantWeight) -> np.ndarray:
    """W [N, K] in float64 from anychip's packed layout, read as kernel.h defines it."""
    n, k = q.shape
    if q.bits == 8:
        values = q.qweight.astype(np.float64)
    else:
        assert q.qweight.dtype == np.uint8 and q.qweight.shape == (n, k // 2)
        values = np.empty((n, k))
        for b in range(k // 64):
            block = q.qweight[:, 32 * b:32 * b + 32].astype(np.int64)
            values[:, 64 * b:64 * b + 32] = (block & 0xF) - 8
            values[:, 64 * b + 32:64 * b + 64] = (block >> 4) - 8
    scales = np.repeat(q.scales.astype(np.float64), q.group_size, axis=1)
    offsets = 0 if q.offsets is None else np.repeat(q.offsets.astype(np.float64), q.group_size, axis=1)
    return values * scales + offsets


@pytest.mark.parametrize("arch,tie,bias", [("llama", False, False), ("llama", True, False), ("llama", False, True),
                                           ("qwen2", False, True), ("qwen2", True, True)])
def test_gguf_loads_exactly_the_hf_checkpoint_it_was_converted_from(tmp_path, tok, arch, tie, bias):
    config, weights, path = make(tmp_path, tok, arch=arch, tie_embeddings=tie, qkv_bias=bias)
    hf = load_hf_folder(write_hf_folder(tmp_path / "hf", config, weights, tok))
    gg = load_checkpoint(path)
    assert gg.config == replace(hf.config, name="tiny")
    assert gg.tensors.keys() == hf.tensors.keys() == weights.keys()
    for name, value in hf.tensors.items():
        assert gg.tensors[name].dtype == np.float32
        np.testing.assert_array_equal(gg.tensors[name], value, err_msg=name)
    assert ("lm_head" in gg.tensors) == (not tie)
    assert ("layers.1.k_bias" in gg.tensors) == gg.config.qkv_bias == bias


def test_rope_permutation_is_undone_for_llama_only(tmp_path, tok):
    """A llama-arch file written without the permutation loads permuted rows (the check above
    is not vacuous), and a qwen2 file written with it does too."""
    config, weights, path = make(tmp_path, tok, permute=False)
    q = load_checkpoint(path).tensors["layers.0.q_proj"]
    assert not np.array_equal(q, weights["layers.0.q_proj"])
    assert sorted(map(tuple, q)) == sorted(map(tuple, weights["layers.0.q_proj"]))  # same rows, other order
    config, weights, path = make(tmp_path, tok, arch="qwen2", permute=True, name="q.gguf")
    assert not np.array_equal(load_checkpoint(path).tensors["layers.1.k_proj"], weights["layers.1.k_proj"])


@pytest.mark.parametrize("qtype", [T.F16, T.BF16, *QUANTIZED])
def test_float_mode_equals_gguf_dequantization(tmp_path, tok, qtype):
    config, weights, path = make(tmp_path, tok, qtype=qtype)
    ckpt = load_checkpoint(path, weights="float")
    for name, w in weights.items():
        got = ckpt.tensors[name]
        assert isinstance(got, np.ndarray) and got.dtype == np.float32, name
        if w.ndim == 1:  # norms stay F32 in the file
            np.testing.assert_array_equal(got, w)
        elif qtype == T.F16:
            np.testing.assert_array_equal(got, stored_value(w, "F16"), err_msg=name)
        else:
            np.testing.assert_array_equal(got, quantized_value(w, qtype), err_msg=name)


@pytest.mark.parametrize("qtype", QUANTIZED)
def test_native_mode_keeps_blocks_in_anychip_layout(tmp_path, tok, qtype):
    config, weights, path = make(tmp_path, tok, qtype=qtype, arch="qwen2")
    ckpt = load_checkpoint(path, weights="native")
    bits = 8 if qtype == T.Q8_0 else 4
    for name, w in weights.items():
        got = ckpt.tensors[name]
        if w.ndim == 1:
            assert isinstance(got, np.ndarray) and got.dtype == np.float32, name
            continue
        assert isinstance(got, QuantWeight), name
        n, k = w.shape
        assert (got.bits, got.group_size, got.shape) == (bits, 32, (n, k))
        assert got.qweight.dtype == (np.int8 if bits == 8 else np.uint8)
        assert got.scales.dtype == np.float32 and got.scales.shape == (n, k // 32)
        assert (got.offsets is not None) == (qtype == T.Q4_1)
        want = quantized_value(w, qtype)
        if qtype == T.Q4_1:
            # d (q - 8) + (m + 8 d) rounds once more than gguf's d q + m: within an ulp of the terms
            tol = np.spacing(np.repeat(np.abs(got.offsets) + 8 * np.abs(got.scales), 32, axis=1))
            assert np.all(np.abs(got.dequantize() - want) <= tol), name
            assert np.all(np.abs(kernel_h_weight(got) - want) <= tol), name
        else:
            np.testing.assert_array_equal(got.dequantize(), want, err_msg=name)
            np.testing.assert_array_equal(kernel_h_weight(got), want.astype(np.float64), err_msg=name)


def test_native_rows_are_unpermuted_too(tmp_path, tok):
    """llama arch, Q4_1: the QuantWeight rows (qweight, scales, offsets) are in HF order."""
    config, weights, path = make(tmp_path, tok, qtype=T.Q4_1)
    native = load_checkpoint(path, weights="native").tensors
    floats = load_checkpoint(path, weights="float").tensors
    for name in ("layers.0.q_proj", "layers.1.k_proj"):
        np.testing.assert_allclose(native[name].dequantize(), floats[name], rtol=0, atol=1e-6)
        np.testing.assert_allclose(floats[name], quantized_value(weights[name], T.Q4_1), rtol=0, atol=0)


def test_smollm2_like_mix_and_4bit_rows_not_multiple_of_64_load_as_float(tmp_path, tok):
    """Q8_0 embedding with Q4_1 linears (SmolLM2's file); F = 96, so down_proj's K is not a
    multiple of 64: it loads as float32 with a warning naming it."""
    types = {"embed_tokens": T.Q8_0}
    config, weights, path = make(tmp_path, tok, qtype=T.Q4_1, types=types, intermediate_size=96)
    with pytest.warns(UserWarning, match=r"blk\.\d\.ffn_down\.weight.*K=96"):
        ckpt = load_checkpoint(path, weights="native")
    t = ckpt.tensors
    assert isinstance(t["embed_tokens"], QuantWeight) and t["embed_tokens"].bits == 8
    assert isinstance(t["layers.0.gate_proj"], QuantWeight) and t["layers.0.gate_proj"].bits == 4
    assert isinstance(t["layers.0.down_proj"], np.ndarray)
    np.testing.assert_array_equal(t["layers.0.down_proj"], quantized_value(weights["layers.0.down_proj"], T.Q4_1))


def test_config_from_metadata(tmp_path, tok):
    config, _, path = make(tmp_path, tok, meta={"general.name": "Tiny Test"})
    got = load_checkpoint(path).config
    assert got.name == "Tiny Test"
    assert (got.vocab_size, got.hidden_size, got.intermediate_size, got.num_layers) == (config.vocab_size, 64, 128, 2)
    assert (got.num_heads, got.num_kv_heads, got.head_dim, got.max_position) == (4, 2, 16, 256)
    assert got.rms_eps == 1e-5 and got.rope_theta == 10000.0  # the decimal written, not its float32


def test_rope_scaling_is_reported(tmp_path, tok):
    _, _, path = make(tmp_path, tok, meta={"llama.rope.scaling.type": "linear"})
    with pytest.warns(UserWarning, match="RoPE scaling"):
        load_checkpoint(path)


# ---- errors ----------------------------------------------------------------------------------------

def test_not_a_gguf_file(tmp_path):
    path = tmp_path / "notes.gguf"
    path.write_text("hello, not a model")
    with pytest.raises(CheckpointError, match=r"notes\.gguf: not a GGUF file"):
        load_checkpoint(path)
    with pytest.raises(CheckpointError, match="no such file or folder"):
        load_checkpoint(tmp_path / "missing.gguf")


def test_bad_magic(tmp_path, tok):
    _, _, path = make(tmp_path, tok)
    data = bytearray(path.read_bytes())
    data[:4] = b"GGML"
    path.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match="not a GGUF file.*GGML"):
        load_checkpoint(path)


def test_truncated_file_names_the_cut_tensor(tmp_path, tok):
    _, _, path = make(tmp_path, tok)
    data = path.read_bytes()
    path.write_bytes(data[:len(data) - 5000])
    with pytest.raises(CheckpointError, match=r"m\.gguf: truncated: tensor '[^']+' ends at byte \d+, but the file "
                                              rf"has {len(data) - 5000} bytes"):
        load_checkpoint(path)
    path.write_bytes(data[:300])  # inside the metadata
    with pytest.raises(CheckpointError, match=r"unreadable GGUF header \(the header runs past the end of the "
                                              r"file \(300 bytes\)\); the file may be truncated"):
        load_checkpoint(path)


def test_header_arrays_read_as_gguf_reads_them(tmp_path):
    """anychip's reader walks header arrays its own (faster) way: every kind of value must come
    back as gguf's own GGUFReader gives it, and a cut inside a string array is a clear error."""
    import gguf

    from anychip_models.gguf_file import open_gguf

    path = tmp_path / "arrays.gguf"
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_array("t.strings", ["", "a", "héllo ▁wörld", "x" * 300, "\n"])
    writer.add_array("t.empty", [])
    writer.add_array("t.ints", [3, -1, 2**20])
    writer.add_array("t.floats", [0.5, -2.25, 1e-5])
    writer.add_array("t.bools", [True, False, True])
    writer.add_array("t.nested", [[1, 2], [3]])
    writer.add_string("t.name", "tiny")
    writer.add_uint32("t.count", 7)
    writer.add_tensor("w", np.arange(12, dtype=np.float32).reshape(3, 4))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()

    ours, theirs = open_gguf(path), gguf.GGUFReader(path)
    assert list(ours.fields) == list(theirs.fields)
    for key, field in theirs.fields.items():
        assert ours.fields[key].contents() == field.contents(), key
        assert ours.fields[key].types == field.types, key
    assert ours.fields["t.strings"].contents() == ["", "a", "héllo ▁wörld", "x" * 300, "\n"]
    assert ours.data_offset == theirs.data_offset
    np.testing.assert_array_equal(ours.tensors[0].data, theirs.tensors[0].data)

    data = path.read_bytes()
    cut = data.index(b"x" * 300) + 100  # inside the fourth string
    path.write_bytes(data[:cut])
    with pytest.raises(CheckpointError, match=rf"header runs past the end of the file \({cut} bytes\)"):
        open_gguf(path)


def test_unsupported_tensor_type(tmp_path, tok):
    _, _, path = make(tmp_path, tok, types={"layers.1.up_proj": T.Q5_0})
    with pytest.raises(CheckpointError, match=r"'blk\.1\.ffn_up\.weight' has type Q5_0, which is not supported "
                                              r"\(supported: F32, F16, BF16, Q8_0, Q4_0, Q4_1\)"):
        load_checkpoint(path, weights="native")


def test_missing_tensor(tmp_path, tok):
    _, _, path = make(tmp_path, tok, drop=("layers.1.v_proj",))
    with pytest.raises(CheckpointError,
                       match=r"m\.gguf: tensor 'blk\.1\.attn_v\.weight' \(layers\.1\.v_proj\) is missing"):
        load_checkpoint(path)


def test_shape_mismatch_with_config(tmp_path, tok):
    _, _, path = make(tmp_path, tok, meta={"llama.feed_forward_length": 192})
    with pytest.raises(CheckpointError, match=r"'blk\.0\.ffn_gate\.weight' \(layers\.0\.gate_proj\) has shape "
                                              r"\[128, 64\], the config makes it \[192, 64\]"):
        load_checkpoint(path)


def test_unsupported_architecture(tmp_path, tok):
    _, _, path = make(tmp_path, tok, meta={"general.architecture": "falcon"})
    with pytest.raises(CheckpointError, match=r"unsupported architecture 'falcon' \(supported: llama, qwen2\)"):
        load_checkpoint(path)


def test_bad_weights_mode(tmp_path, tok):
    _, _, path = make(tmp_path, tok)
    with pytest.raises(ValueError, match="weights must be one of float, native"):
        load_checkpoint(path, weights="int4")


def test_names_match_llama_cpp(tmp_path, tok):
    """The GGUF names the helper writes are llama.cpp's (so the tests above test real files)."""
    import gguf

    names = gguf.TENSOR_NAMES
    assert gguf_tensor_name("layers.3.q_proj") == names[gguf.MODEL_TENSOR.ATTN_Q].format(bid=3) + ".weight"
    assert gguf_tensor_name("layers.0.down_proj") == names[gguf.MODEL_TENSOR.FFN_DOWN].format(bid=0) + ".weight"
    assert gguf_tensor_name("embed_tokens") == names[gguf.MODEL_TENSOR.TOKEN_EMBD] + ".weight"
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        load_checkpoint(make(tmp_path, tok)[2])  # a plain file loads without warnings
