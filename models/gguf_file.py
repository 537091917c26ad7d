"""GGUF files (llama.cpp's format) -> Checkpoint, read with the ``gguf`` package's GGUFReader.

Tensor types: F32, F16, BF16 (always float32 here) and the block formats Q8_0, Q4_0, Q4_1, either
dequantized (weights="float") or converted block by block into anychip's weight-only layout
(weights="native") without going through float: Q8_0 -> 8 bits; Q4_0 -> 4 bits, w = d (q - 8);
Q4_1 -> 4 bits with offsets, w = d q + m = d (q - 8) + (m + 8 d). All three use groups of 32.

A file is checked before any tensor is read: every count and offset in its header against the
file's size, every tensor's type, shape and bytes against the tensor table (as llama.cpp's reader
does) and the config, every metadata value against the type it must have. A corrupt or hostile
file fails with a CheckpointError naming the file, the key or tensor, and what was expected.
"""

from __future__ import annotations

import math
import re
import sys
import warnings
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType as T
from gguf import GGUFReader, GGUFValueType
from gguf.constants import GGML_QUANT_SIZES
from gguf.gguf_reader import ReaderField
from gguf.quants import dequantize

from .checkpoint import (Checkpoint, CheckpointError, ModelConfig, QuantWeight, is_int, positive_int, positive_number,
                         shown, tensor_shapes)
from .tokenizer import Tokenizer

MAGIC = b"GGUF"
SUPPORTED_TYPES = (T.F32, T.F16, T.BF16, T.Q8_0, T.Q4_0, T.Q4_1)
BLOCK = 32  # elements per Q8_0 / Q4_0 / Q4_1 block
MAX_DIMS = 4  # GGML_MAX_DIMS
# The fewest bytes one entry can take, which bounds a count by the bytes left in the file.
MIN_KV_BYTES = 8 + 4 + 1  # an empty key, the value type, a one-byte value
MIN_TENSOR_INFO_BYTES = 8 + 4 + 4 + 8  # an empty name, n_dims (no dims), the type, the offset
BLOCK_TENSOR = re.compile(r"blk\.(\d+)\.")
# Tensors a file may hold that the model does not use: Llama 3.1's RoPE scaling factors (warned about).
UNUSED_TENSORS = {"rope_freqs.weight"}
TOKEN_IDS = ("bos", "eos", "eot", "eom", "padding")  # the tokenizer.ggml.*_token_id keys the tokenizer reads

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


class _Corrupt(ValueError):
    """A header that describes what the file cannot hold; the message is complete but for the file."""


class _Reader(GGUFReader):
    """GGUFReader with its low-level read (``_get``), its metadata and array parsing replaced, and
    every count, type and offset it reads checked before it is used.

    - Reads past the end of the file fail with a clear message.
    - Counts (metadata entries, tensor infos, array items) are checked against the bytes left in
      the file before they are looped over: a hostile count fails at once instead of walking (or
      allocating) billions of entries.
    - Tensor infos are checked as llama.cpp's reader checks them, before any tensor is mapped: at
      most 4 dims, a GGML type, rows of whole blocks, and each tensor's data exactly where the one
      before it ends (padded to the alignment), the last one ending the file. So a corrupt type,
      dim or offset cannot make a tensor read its neighbour's bytes as weights.
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
            raise self._past_end()
        arr = plain[offset:offset + dtype.itemsize * count].view(dtype)
        return arr.view(arr.dtype.newbyteorder(self.byte_order if override_order is None else override_order))

    def _check_count(self, offs: int, count: int, min_bytes: int, label: str, items: str) -> None:
        """``count`` entries of at least ``min_bytes`` each must fit in the file after ``offs``."""
        left = max(len(self._file_bytes()) - offs, 0)
        if count * min_bytes > left:
            raise _Corrupt(f"{label} is {count}, but the {left} bytes left in the file hold at most "
                           f"{left // min_bytes} {items}")

    @staticmethod
    def _value_type(raw) -> GGUFValueType:
        try:
            return GGUFValueType(int(raw))
        except ValueError:
            raise _Corrupt(f"value type {int(raw)} is not a GGUF value type (0 to {int(max(GGUFValueType))})") \
                from None

    def _build_fields(self, offs, count):
        """gguf's own loop over the metadata, with the count bounded and errors naming the key."""
        self._check_count(offs, int(count), MIN_KV_BYTES, "GGUF.kv_count", "metadata entries")
        for _ in range(int(count)):
            start = offs
            key_length, key_bytes = self._get_str(offs)
            try:
                key = bytes(key_bytes).decode("utf-8")
            except UnicodeDecodeError:
                raise _Corrupt(f"the metadata key at byte {start} is not UTF-8 text") from None
            offs += 8 + len(key_bytes)
            raw_type = self._get(offs, np.uint32)
            try:
                size, parts, indices, types = self._get_field_parts(offs + 4, raw_type[0])
            except _Corrupt as exc:
                raise _Corrupt(f"metadata key {key!r}: {exc}") from None
            self._push_field(ReaderField(start, key, [key_length, key_bytes, raw_type, *parts],
                                         [i + 3 for i in indices], types), skip_sum=True)
            offs += 4 + size
        return offs

    def _get_field_parts(self, orig_offs, raw_type):
        if self._value_type(raw_type) != GGUFValueType.ARRAY:
            return super()._get_field_parts(orig_offs, raw_type)
        item_type, length = self._get(orig_offs, np.uint32), self._get(orig_offs + 4, np.uint64)
        sub = self._value_type(item_type[0])
        head, offs, count = [item_type, length], orig_offs + 12, int(length[0])
        scalar = self.gguf_scalar_to_np.get(sub)
        min_item = np.dtype(scalar).itemsize if scalar else 8 if sub == GGUFValueType.STRING else 12
        self._check_count(offs, count, min_item, "the array length", "items")
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

    def _build_tensor_info(self, offs, count):
        self._check_count(offs, int(count), MIN_TENSOR_INFO_BYTES, "GGUF.tensor_count", "tensor infos")
        fields = []
        for i in range(int(count)):
            try:
                field = self._get_tensor_info_field(offs)
            except UnicodeDecodeError:
                raise _Corrupt(f"the name of tensor info {i} (at byte {offs}) is not UTF-8 text") from None
            n_dims = int(field.parts[2][0])
            if n_dims > MAX_DIMS:  # checked at once: the dims read decide where the next info starts
                raise _Corrupt(f"tensor {field.name!r} has {n_dims} dimensions, at most {MAX_DIMS} are allowed")
            offs += sum(int(part.nbytes) for part in field.parts)
            fields.append(field)
        return offs, fields

    def _build_tensors(self, start_offs, fields):
        size, alignment = len(self._file_bytes()), int(self.alignment)
        expected, previous = 0, None  # where the next tensor's data must start; the tensor before it
        for field in fields:
            name, dims, raw_type, offset = field.name, field.parts[3], int(field.parts[4][0]), int(field.parts[5][0])
            try:
                qtype = T(raw_type)
            except ValueError:
                raise _Corrupt(f"tensor {name!r} has type id {raw_type}, which is not a GGML type") from None
            shape = [int(d) for d in dims]  # GGUF order: the row (fastest) dim first
            block, type_size = GGML_QUANT_SIZES[qtype]
            row = shape[0] if shape else 1
            if row % block:
                raise _Corrupt(f"tensor {name!r} of type {qtype.name} has {row} elements per row, "
                               f"not a multiple of its block size {block}")
            if offset % alignment:
                raise _Corrupt(f"tensor {name!r} has offset {offset}, expected a multiple of {alignment}")
            if offset != expected:
                after = ("the data section starts" if previous is None else
                         f"the data of {previous} ends, padded to {alignment} bytes")
                raise _Corrupt(f"tensor {name!r} has offset {offset}, expected {expected}, where {after}")
            n_bytes = math.prod(shape) // block * type_size
            end = start_offs + offset + n_bytes
            if end > size:
                raise _Corrupt(f"truncated: tensor {name!r} ends at byte {end}, but the file has {size} bytes "
                               f"(it is {qtype.name} {shape} from offset {offset} of the data section)")
            previous = f"{name!r} ({qtype.name} {shape}: {n_bytes} bytes from offset {offset})"
            expected = offset + -(-n_bytes // alignment) * alignment
        # The file ends with the last tensor's data, or with the padding after it: other bytes
        # at the end mean a tensor's size is wrong, or that bytes were cut or added before.
        padded_end = start_offs + expected
        if size not in (end, padded_end) if fields else size > padded_end:
            last = f"the data of its last tensor {previous}" if fields else "its tensor table"
            raise _Corrupt(f"the file has {size} bytes, but {last} ends at byte {padded_end} "
                           f"(padded to {alignment} bytes); a tensor's type or shape must be wrong, or bytes "
                           "were cut or added")
        super()._build_tensors(start_offs, fields)


def open_gguf(path: Path) -> GGUFReader:
    """The reader of a GGUF file whose header and tensor table check out, or CheckpointError."""
    try:
        with open(path, "rb") as f:
            head = f.read(4)
    except OSError as exc:
        raise CheckpointError(f"{path}: cannot read the file ({exc.strerror})") from exc
    if head != MAGIC:
        raise CheckpointError(f"{path}: not a GGUF file (it starts with {head!r}, a GGUF file with {MAGIC!r})")
    try:
        return _Reader(path)
    except _Corrupt as exc:
        raise CheckpointError(f"{path}: {exc}") from None
    except (ValueError, KeyError, IndexError, OverflowError, RecursionError) as exc:  # RecursionError: nested arrays
        raise CheckpointError(f"{path}: unreadable GGUF header ({exc}); the file may be truncated or corrupt") from exc


def metadata(path: Path, reader: GGUFReader) -> dict:
    """Key -> Python value (str, int, float, bool or a list of them) for every metadata key."""
    meta = {}
    for key, field in reader.fields.items():
        if key.startswith("GGUF."):
            continue
        try:
            meta[key] = field.contents()
        except UnicodeDecodeError as exc:
            raise CheckpointError(f"{path}: metadata key {key!r} holds text that is not UTF-8 ({exc.reason})") from None
    return meta


def f32_value(value: float) -> float:
    """A float32 metadata value as the decimal it was written from (1e-05, not 9.99999974e-06)."""
    return float(str(np.float32(value)))


def read_config(path: Path, meta: dict, tensors: dict) -> ModelConfig:
    """The config the metadata gives, checked against the tensors the file holds."""
    arch = meta.get("general.architecture")
    if not isinstance(arch, str) or arch not in ARCHS:
        raise CheckpointError(f"{path}: unsupported architecture {shown(arch)} (supported: {', '.join(ARCHS)})")

    def value(name: str, default=None):
        found = meta.get(f"{arch}.{name}", default)
        if found is None:
            raise CheckpointError(f"{path}: metadata key {arch}.{name} is missing")
        if isinstance(found, list):  # per-layer values (some converters write head counts per layer)
            if not found or found.count(found[0]) != len(found):
                raise CheckpointError(f"{path}: {arch}.{name} differs between layers ({shown(found)}); not supported")
            found = found[0]
        return found

    def count(name: str, default=None) -> int:
        return positive_int(value(name, default), f"{path}: {arch}.{name}")

    def number(name: str, default=None) -> float:
        return f32_value(positive_number(value(name, default), f"{path}: {arch}.{name}"))

    embedding = tensors.get("token_embd.weight")
    if embedding is None:
        raise CheckpointError(f"{path}: tensor 'token_embd.weight' is missing")
    hidden, embedding_shape = count("embedding_length"), [int(d) for d in embedding.shape]
    if len(embedding_shape) != 2 or embedding_shape[0] != hidden:
        raise CheckpointError(f"{path}: {arch}.embedding_length is {hidden}, but tensor 'token_embd.weight' has "
                              f"shape {embedding_shape} (GGUF order: [{hidden}, vocabulary] expected)")
    vocab = embedding_shape[1]
    if meta.get(f"{arch}.vocab_size", vocab) != vocab:
        raise CheckpointError(f"{path}: {arch}.vocab_size is {shown(meta[f'{arch}.vocab_size'])}, but tensor "
                              f"'token_embd.weight' has {vocab} rows")
    heads = count("attention.head_count")
    kv_heads = count("attention.head_count_kv", heads)
    if heads % kv_heads:
        raise CheckpointError(f"{path}: {arch}.attention.head_count {heads} is not a multiple of "
                              f"{arch}.attention.head_count_kv {kv_heads}")
    if f"{arch}.attention.key_length" not in meta and hidden % heads:
        raise CheckpointError(f"{path}: {arch}.embedding_length {hidden} is not a multiple of "
                              f"{arch}.attention.head_count {heads}, and {arch}.attention.key_length is missing")
    head_dim = count("attention.key_length", hidden // heads)
    if head_dim % 2:
        raise CheckpointError(f"{path}: the head size ({arch}.attention.key_length) is {head_dim}; RoPE needs it even")
    rope_dims = count("rope.dimension_count", head_dim)
    if rope_dims != head_dim:
        raise CheckpointError(f"{path}: RoPE over {rope_dims} of {head_dim} head dimensions is not supported")
    layers = count("block_count")
    check_blocks(path, f"{arch}.block_count", layers, tensors)
    scaling = meta.get(f"{arch}.rope.scaling.type", "none")
    if scaling != "none" or "rope_freqs.weight" in tensors:
        warnings.warn(f"{path}: RoPE scaling ({scaling if scaling != 'none' else 'rope_freqs.weight'}) is not "
                      "applied: positions use plain RoPE with the base frequency", stacklevel=3)
    name = meta.get("general.name", "")
    if not isinstance(name, str):
        raise CheckpointError(f"{path}: general.name is {shown(name)}, expected a string")
    return ModelConfig(
        arch=arch,
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=count("feed_forward_length"),
        num_layers=layers,
        num_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=head_dim,
        rope_theta=number("rope.freq_base", 10000.0),
        rms_eps=number("attention.layer_norm_rms_epsilon"),
        max_position=count("context_length"),
        tie_embeddings="output.weight" not in tensors,
        qkv_bias="blk.0.attn_q.bias" in tensors,
        name=name or path.stem,
    )


def check_blocks(path: Path, key: str, count: int, tensors: dict) -> None:
    """The block count against the blk.N tensors the file holds: one beyond them would make the
    loader list billions of tensors to look for (a hang), one below them would drop blocks."""
    present = {int(m.group(1)) for name in tensors if (m := BLOCK_TENSOR.match(name))}
    if len(present) != count or max(present, default=-1) != count - 1:  # i.e. present != {0 .. count-1}
        held = f"{len(present)} blocks, blk.{min(present)} to blk.{max(present)}" if present else "no blocks"
        raise CheckpointError(f"{path}: {key} is {count}, but the file holds tensors of {held}")


def check_tokenizer(path: Path, meta: dict, vocab: int) -> None:
    """The tokenizer.* metadata the tokenizer is built from, of the types it must have, with one
    token per row of the embedding (as llama.cpp requires) and token ids among them."""
    def fail(key: str, expected: str):
        raise CheckpointError(f"{path}: {key} is {shown(meta[key])}, expected {expected}")

    for key in ("tokenizer.ggml.model", "tokenizer.ggml.pre", "tokenizer.chat_template"):
        if key in meta and not isinstance(meta[key], str):
            fail(key, "a string")
    if not isinstance(meta.get("tokenizer.ggml.add_bos_token", False), bool):
        fail("tokenizer.ggml.add_bos_token", "true or false")
    tokens = meta.get("tokenizer.ggml.tokens", [])
    if not isinstance(tokens, list) or not all(isinstance(t, str) for t in tokens):
        fail("tokenizer.ggml.tokens", "a list of strings")
    if "tokenizer.ggml.tokens" in meta and len(tokens) != vocab:
        raise CheckpointError(f"{path}: tokenizer.ggml.tokens has {len(tokens)} tokens, but tensor "
                              f"'token_embd.weight' has {vocab} rows")
    merges = meta.get("tokenizer.ggml.merges", [])
    if not isinstance(merges, list):
        fail("tokenizer.ggml.merges", "a list of strings")
    for i, merge in enumerate(merges):
        if not isinstance(merge, str) or " " not in merge:
            raise CheckpointError(f"{path}: tokenizer.ggml.merges[{i}] is {shown(merge)}, expected two tokens "
                                  "separated by a space")
    types = meta.get("tokenizer.ggml.token_type")
    if types is not None:
        if not isinstance(types, list) or not all(is_int(t) for t in types):
            fail("tokenizer.ggml.token_type", "a list of integers")
        if len(types) != len(tokens):
            raise CheckpointError(f"{path}: tokenizer.ggml.token_type has {len(types)} values, expected one per "
                                  f"token ({len(tokens)})")
    for name in TOKEN_IDS:
        key = f"tokenizer.ggml.{name}_token_id"
        if key in meta and not (is_int(meta[key]) and 0 <= meta[key] < vocab):
            fail(key, f"a token id below {vocab}")


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
    meta = metadata(path, reader)
    by_name = {t.name: t for t in reader.tensors}
    config = read_config(path, meta, by_name)
    shapes = tensor_shapes(config)
    # llama.cpp refuses files with tensors its model does not create: here too, as a corrupt
    # name ('output.weight' -> 'outpuT.weight') would otherwise tie the embeddings silently.
    unused = sorted(by_name.keys() - set(map(gguf_name, shapes)) - UNUSED_TENSORS)
    if unused:
        raise CheckpointError(f"{path}: tensor {unused[0]!r} is not one of the tensors of a {config.arch} model "
                              f"with this metadata ({len(unused)} such); its name may be corrupt")
    check_tokenizer(path, meta, config.vocab_size)
    permuted = ARCHS[config.arch]
    tensors = {}
    for name, shape in shapes.items():
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
    try:
        tokenizer = Tokenizer.from_gguf_metadata(meta, source=str(path))
    except CheckpointError:
        raise
    except Exception as exc:  # noqa: BLE001 - tokenizers raises plain Exception for merges outside the vocabulary
        raise CheckpointError(f"{path}: tokenizer.ggml.tokens and merges do not make a BPE tokenizer ({exc})") from exc
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
