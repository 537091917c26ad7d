"""GGUF files (llama.cpp's format) -> Checkpoint, read with the ``gguf`` package's GGUFReader.

Tensor types: F32, F16, BF16 (always float32 here) and the block formats Q8_0, Q4_0, Q4_1, either
dequantized (weights="float") or converted block by block into anychip's weight-only layout
(weights="native") without going through float: Q8_0 -> 8 bits; Q4_0 -> 4 bits, w = d (q - 8);
Q4_1 -> 4 bits with offsets, w = d q + m = d (q - 8) + (m + 8 d). All three use groups of 32.
"""

from __future__ import annotations

import sys
import warnings
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType as T
from gguf import GGUFReader, GGUFValueType
from gguf.quants import dequantize

from .checkpoint import Checkpoint, CheckpointError, ModelConfig, QuantWeight, tensor_shapes
from .tokenizer import Tokenizer

MAGIC = b"GGUF"
SUPPORTED_TYPES = (T.F32, T.F16, T.BF16, T.Q8_0, T.Q4_0, T.Q4_1)
BLOCK = 32  # elements per Q8_0 / Q4_0 / Q4_1 block

# Architecture -> whether llama.cpp runs it with its "normal" (interleaved-pair) RoPE, for which
# its converter permuted the q/k rows of the Hugging Face weights; NeoX-RoPE archs keep HF order.
ARCHS = {"llama": True, "qwen2": False}

GLOBAL_NAMES = {"embed_tokens": "token_embd.weight", "norm": "output_norm.weight", "lm_head": "output.weight"}
LAYER_NAMES = {"attn_norm": "attn_norm.weight", "q_proj": "attn_q.weight", "k_proj": "attn_k.weight",
               "v_proj": "attn_v.weight", "q_bias": "attn_q.bias", "k_bias": "attn_k.bias",
               "v_bias": "attn_v.bias", "o_proj": "attn_output.weight", "ffn_norm": "ffn_norm.weight",
               "gate_proj": "ffn_gate.weight", "up_proj": "ffn_up.weight", "down_proj": "ffn_down.weight"}


def gguf_name(canonical: str) -> str:
    if canonical.startswith("layers."):
        _, layer, key = canonical.split(".", 2)
        return f"blk.{layer}.{LAYER_NAMES[key]}"
    return GLOBAL_NAMES[canonical]


class _Reader(GGUFReader):
    """GGUFReader with its low-level read (``_get``) and its array parsing replaced.

    - Reads past the end of the file fail with a clear message in the header, and read as zeros
      for tensor data (instead of failing on a short array), so that the loader can name the
      tensor a truncated file cuts.
    - Reads slice a plain ndarray view of the memory map rather than the np.memmap, whose
      per-slice bookkeeping made parsing a 49k-token vocabulary take ~3 s instead of ~1 s.
    - Arrays of numbers become one part, and arrays of strings are walked with plain integer
      reads, instead of two numpy views per element: SmolLM2's header (98k strings) parses in
      ~0.1 s instead of ~0.6 s. The fields' ``contents()`` are the same.
    """

    def _file_bytes(self) -> np.ndarray:
        if self.__dict__.get("_plain") is None:
            self._plain = self.data.view(np.ndarray)
        return self._plain

    def _past_end(self) -> ValueError:
        return ValueError(f"the header runs past the end of the file ({len(self._file_bytes())} bytes)")

    def _get(self, offset, dtype, count=1, override_order=None):
        plain = self._file_bytes()
        dtype, count = np.dtype(dtype), int(count)
        if offset + dtype.itemsize * count > len(plain):
            if "data_offset" not in self.__dict__:  # set once the header is parsed
                raise self._past_end()
            return np.zeros(count, dtype)
        arr = plain[offset:offset + dtype.itemsize * count].view(dtype)
        return arr.view(arr.dtype.newbyteorder(self.byte_order if override_order is None else override_order))

    def _get_field_parts(self, orig_offs, raw_type):
        if raw_type != GGUFValueType.ARRAY:
            return super()._get_field_parts(orig_offs, raw_type)
        item_type, length = self._get(orig_offs, np.uint32), self._get(orig_offs + 4, np.uint64)
        sub = GGUFValueType(int(item_type[0]))
        head, offs, count = [item_type, length], orig_offs + 12, int(length[0])
        scalar = self.gguf_scalar_to_np.get(sub)
        if scalar is not None:
            values = self._get(offs, scalar, count)
            return 12 + int(values.nbytes), head + [values], [2], [GGUFValueType.ARRAY, sub]
        if sub != GGUFValueType.STRING:  # arrays of arrays: gguf's own walk
            return super()._get_field_parts(orig_offs, raw_type)
        # Each string is a uint64 length and its bytes; the parts are memoryview slices (what
        # contents() reads with .tobytes()), their indices every one of them.
        raw = memoryview(self._file_bytes())
        order = sys.byteorder if self.byte_order == "I" else {"little": "big", "big": "little"}[sys.byteorder]
        strings = []
        for _ in range(count):
            size = int.from_bytes(raw[offs:offs + 8], order)  # a cut length reads short: caught below
            if offs + 8 + size > len(raw):
                raise self._past_end()
            strings.append(raw[offs + 8:offs + 8 + size])
            offs += 8 + size
        return offs - orig_offs, head + strings, list(range(2, 2 + count)), [GGUFValueType.ARRAY, sub]


def open_gguf(path: Path) -> GGUFReader:
    """The reader of a GGUF file whose tensor data all lies within the file, or CheckpointError."""
    with open(path, "rb") as f:
        head = f.read(4)
    if head != MAGIC:
        raise CheckpointError(f"{path}: not a GGUF file (it starts with {head!r}, a GGUF file with {MAGIC!r})")
    try:
        reader = _Reader(path)
    except (ValueError, KeyError, IndexError, OverflowError) as exc:
        raise CheckpointError(f"{path}: unreadable GGUF header ({exc}); the file may be truncated or corrupt") from exc
    size = path.stat().st_size
    for t in reader.tensors:
        end = t.data_offset + int(t.n_bytes)
        if end > size:
            raise CheckpointError(f"{path}: truncated: tensor {t.name!r} ends at byte {end}, "
                                  f"but the file has {size} bytes")
    return reader


def metadata(reader: GGUFReader) -> dict:
    """Key -> Python value (str, int, float, bool or a list of them) for every metadata key."""
    return {key: field.contents() for key, field in reader.fields.items() if not key.startswith("GGUF.")}


def f32_value(value: float) -> float:
    """A float32 metadata value as the decimal it was written from (1e-05, not 9.99999974e-06)."""
    return float(str(np.float32(value)))


def read_config(path: Path, meta: dict, tensors: dict) -> ModelConfig:
    arch = meta.get("general.architecture")
    if arch not in ARCHS:
        raise CheckpointError(f"{path}: unsupported architecture {arch!r} (supported: {', '.join(ARCHS)})")

    def key(name: str, default=None):
        value = meta.get(f"{arch}.{name}", default)
        if value is None:
            raise CheckpointError(f"{path}: metadata key {arch}.{name} is missing")
        if isinstance(value, list):  # per-layer values (some converters write head counts per layer)
            if len(set(value)) != 1:
                raise CheckpointError(f"{path}: {arch}.{name} differs between layers ({value}); not supported")
            value = value[0]
        return value

    if "token_embd.weight" not in tensors:
        raise CheckpointError(f"{path}: tensor 'token_embd.weight' is missing")
    hidden, heads = int(key("embedding_length")), int(key("attention.head_count"))
    head_dim = int(key("attention.key_length", hidden // heads))
    rope_dims = int(key("rope.dimension_count", head_dim))
    if rope_dims != head_dim:
        raise CheckpointError(f"{path}: RoPE over {rope_dims} of {head_dim} head dimensions is not supported")
    scaling = meta.get(f"{arch}.rope.scaling.type", "none")
    if scaling != "none" or "rope_freqs.weight" in tensors:
        warnings.warn(f"{path}: RoPE scaling ({scaling if scaling != 'none' else 'rope_freqs.weight'}) is not "
                      "applied: positions use plain RoPE with the base frequency", stacklevel=3)
    return ModelConfig(
        arch=arch,
        vocab_size=int(tensors["token_embd.weight"].shape[1]),  # GGUF shapes list the fastest dim first
        hidden_size=hidden,
        intermediate_size=int(key("feed_forward_length")),
        num_layers=int(key("block_count")),
        num_heads=heads,
        num_kv_heads=int(key("attention.head_count_kv", heads)),
        head_dim=head_dim,
        rope_theta=f32_value(key("rope.freq_base", 10000.0)),
        rms_eps=f32_value(key("attention.layer_norm_rms_epsilon")),
        max_position=int(key("context_length")),
        tie_embeddings="output.weight" not in tensors,
        qkv_bias="blk.0.attn_q.bias" in tensors,
        name=meta.get("general.name") or path.stem,
    )


def to_float(t) -> np.ndarray:
    if t.tensor_type == T.F32:
        return np.array(t.data, dtype=np.float32)
    if t.tensor_type == T.F16:
        return t.data.astype(np.float32)
    if t.tensor_type == T.BF16:
        bits = np.ascontiguousarray(t.data).view(np.uint16)
        return (bits.astype(np.uint32) << 16).view(np.float32)
    return dequantize(t.data, t.tensor_type)


def to_native(t, n: int, k: int) -> QuantWeight:
    """A Q8_0 / Q4_0 / Q4_1 tensor [n, k] in anychip's layout, straight from its blocks."""
    blocks = t.data.reshape(n, k // BLOCK, -1)

    def half(start: int) -> np.ndarray:  # the fp16 field at byte `start` of every block, as f32 [n, k/32]
        return np.ascontiguousarray(blocks[:, :, start:start + 2]).view(np.float16)[..., 0].astype(np.float32)

    if t.tensor_type == T.Q8_0:
        q = np.ascontiguousarray(blocks[:, :, 2:]).view(np.int8).reshape(n, k)
        return QuantWeight(q, half(0), bits=8, group_size=BLOCK)
    # A GGUF Q4 block holds 32 elements, byte i = element i (low nibble) | element i+16 (high);
    # anychip's 64-wide block has byte i = element i (low) | element i+32 (high). Two GGUF blocks
    # (a: elements 0-31, b: 32-63) make one: bytes 0-15 = a.low | b.low << 4, 16-31 = a.high | b.high.
    start = 2 if t.tensor_type == T.Q4_0 else 4
    pairs = blocks[:, :, start:].reshape(n, k // 64, 2, 16)
    a, b = pairs[:, :, 0], pairs[:, :, 1]
    packed = np.concatenate([(a & 0x0F) | ((b & 0x0F) << 4), (a >> 4) | (b & 0xF0)], axis=2).reshape(n, k // 2)
    d = half(0)
    # Stored nibbles are q + 8 in anychip's terms either way: Q4_0's w = d (nibble - 8) exactly;
    # Q4_1's w = d nibble + m = d (nibble - 8) + (m + 8 d).
    offsets = None if t.tensor_type == T.Q4_0 else half(2) + np.float32(8) * d
    return QuantWeight(np.ascontiguousarray(packed), d, bits=4, group_size=BLOCK, offsets=offsets)


def load_gguf(path: Path, weights: str = "float") -> Checkpoint:
    reader = open_gguf(path)
    meta = metadata(reader)
    by_name = {t.name: t for t in reader.tensors}
    config = read_config(path, meta, by_name)
    permuted = ARCHS[config.arch]
    tensors = {}
    for name, shape in tensor_shapes(config).items():
        file_name = gguf_name(name)
        t = by_name.get(file_name)
        if t is None:
            raise CheckpointError(f"{path}: tensor {file_name!r} ({name}) is missing")
        found = tuple(int(d) for d in reversed(t.shape))
        if found != shape:
            raise CheckpointError(f"{path}: tensor {file_name!r} ({name}) has shape {list(found)}, "
                                  f"the config makes it {list(shape)}")
        if t.tensor_type not in SUPPORTED_TYPES:
            raise CheckpointError(f"{path}: tensor {file_name!r} has type {t.tensor_type.name}, which is not supported "
                                  f"(supported: {', '.join(s.name for s in SUPPORTED_TYPES)})")
        value = load_tensor(path, name, t, shape, weights)
        if permuted and name.endswith(("q_proj", "q_bias", "k_proj", "k_bias")):
            heads = config.num_heads if ".q_" in name else config.num_kv_heads
            rows = half_rotation_rows(heads, config.head_dim)
            value = value.take_rows(rows) if isinstance(value, QuantWeight) else value[rows]
        tensors[name] = value
    tokenizer = Tokenizer.from_gguf_metadata(meta, source=str(path))
    return Checkpoint(config=config, tensors=tensors, tokenizer=tokenizer, source=path)


def load_tensor(path: Path, name: str, t, shape: tuple[int, ...], weights: str) -> np.ndarray | QuantWeight:
    quantized = t.tensor_type in (T.Q8_0, T.Q4_0, T.Q4_1)
    is_matrix = name in ("embed_tokens", "lm_head") or name.endswith("_proj")  # norms, biases: float32
    if not (weights == "native" and quantized and is_matrix):
        return to_float(t).reshape(shape)
    n, k = shape
    if t.tensor_type != T.Q8_0 and k % 64:
        warnings.warn(f"{path}: tensor {t.name!r} ({name}) is {t.tensor_type.name} with K={k}, not a multiple of "
                      "64 as anychip's 4-bit layout needs; loaded as float32", stacklevel=3)
        return to_float(t).reshape(shape)
    return to_native(t, n, k)


def half_rotation_rows(num_heads: int, head_dim: int) -> np.ndarray:
    """Row order undoing llama.cpp's converter permutation of q/k rows (it interleaves each head's
    rows so dims 2j, 2j+1 rotate together in its "normal" RoPE): back to the half-rotation pairing
    (j with j + D/2) of Hugging Face and anychip's rotary op. rows[i] is the GGUF row of HF row i."""
    return np.arange(num_heads * head_dim).reshape(num_heads, head_dim // 2, 2).swapaxes(1, 2).reshape(-1)
