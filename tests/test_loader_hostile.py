"""Corrupt and hostile model files: every one must fail with a CheckpointError that names the file,
the field or tensor and what was expected, before anything runs; never hang, crash, load garbage
or escape as another exception.

GGUF cases mutate a tiny model laid out as SmolLM2's file is (metadata, then a tensor table of
Q8_0 / Q4_1 / F32 tensors), the headline ones the shipped SmolLM2 file itself; safetensors cases
rewrite a tiny Hugging Face folder's header. The fuzz test at the end applies a few hundred seeded
mutations to the tiny GGUF's header and tensor table."""

from __future__ import annotations

import json
import random
import re
import shutil
import signal
import struct
import time
import traceback
import warnings
from contextlib import contextmanager
from dataclasses import replace

import numpy as np
import pytest
from gguf import GGMLQuantizationType as T

from anychip_models.checkpoint import CheckpointError, QuantWeight
from anychip_models.loader import load_checkpoint
from loader_helpers import (random_weights, tiny_config, tokenizer_metadata, train_tokenizer, write_gguf,
                            write_hf_folder)

LOAD_BOUND_S = 20  # one load of a tiny model takes ~15 ms: anything near this is a hang


class Timeout(BaseException):
    """A load still running at its bound (a BaseException, so that no except clause in the loader takes it)."""


def bounded(seconds: float, fn, *args, **kwargs):
    """fn(*args, **kwargs), interrupted by Timeout after ``seconds``."""
    def expire(signum, frame):
        raise Timeout(f"still running after {seconds} s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        return fn(*args, **kwargs)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def load(path, weights="native"):
    return bounded(LOAD_BOUND_S, load_checkpoint, path, weights=weights)


def rejects(path, match=None):
    """The load of ``path`` fails with a CheckpointError naming the file (and matching ``match``)."""
    with pytest.raises(CheckpointError, match=match) as info:
        load(path)
    assert str(path) in str(info.value)


# ---- GGUF: a tiny SmolLM2-like file and where its header values lie ----------------------------------

@pytest.fixture(scope="module")
def tok():
    return train_tokenizer()


def tiny_gguf(path, tok, meta=None, tokenizer_meta=None):
    """2 layers, Q8_0 embedding, Q4_1 linears, F32 norms (SmolLM2's mix); tensors in the table in
    the order token_embd, blk.0.*, blk.1.*, output_norm, output."""
    config = tiny_config(tok)
    return write_gguf(path, config, random_weights(config), tokenizer_meta or tokenizer_metadata(tok),
                      qtype=T.Q4_1, types={"embed_tokens": T.Q8_0}, meta=meta)


class Header:
    """Where every number in an intact GGUF file's header lies (counts, lengths, type ids, dims,
    offsets, scalar values), from the reader's parts, which are views of the file's bytes (gguf's
    own GGUFReader gives the same, but takes ~10 s over SmolLM2's vocabulary)."""

    TENSOR_PARTS = ("name length", "name", "n_dims", "dims", "type", "offset")

    def __init__(self, path):
        from anychip_models.gguf_file import open_gguf

        reader = open_gguf(path)
        base = reader.data.ctypes.data
        self.data_offset = reader.data_offset
        self.slots = {}  # label -> (position, dtype)

        def add(label, part):  # string arrays' items are memoryviews: their lengths are flipped as bytes
            if isinstance(part, np.ndarray) and part.dtype.kind in "uif" and part.size:
                self.slots[label] = (part.ctypes.data - base, part.dtype)

        for name, field in reader.fields.items():
            for i, part in enumerate(field.parts[:8]):  # key, value type, lengths, an array's first items
                add(f"{name}[{i}]", part[:1])
        for t in reader.tensors:
            for what, part in zip(self.TENSOR_PARTS, t.field.parts):
                for j in range(part.size):
                    add(f"{t.name} {what}[{j}]", part[j:j + 1])


def put(data: bytearray, slot, value) -> bytearray:
    """``data`` with the number at ``slot`` replaced by ``value`` (wrapped to its width)."""
    pos, dtype = slot
    if dtype.kind == "f":
        raw = np.array(value, dtype=dtype).tobytes()
    else:
        raw = int(value % (1 << (8 * dtype.itemsize))).to_bytes(dtype.itemsize, "little")
    data[pos:pos + len(raw)] = raw
    return data


def mutated(path, dest, label, value):
    data = bytearray(path.read_bytes())
    dest.write_bytes(put(data, Header(path).slots[label], value))
    return dest


@pytest.fixture(scope="module")
def clean(tmp_path_factory, tok):
    return tiny_gguf(tmp_path_factory.mktemp("clean") / "m.gguf", tok)


@pytest.mark.parametrize("count,match", [
    (2**32 - 1, r"llama\.block_count is 4294967295, but the file holds tensors of 2 blocks, blk\.0 to blk\.1"),
    (3, r"llama\.block_count is 3, but the file holds tensors of 2 blocks"),
    (1, r"llama\.block_count is 1, but the file holds tensors of 2 blocks"),
    (0, r"llama\.block_count is 0, expected a positive integer"),
])
def test_block_count_must_match_the_blocks_present(tmp_path, clean, count, match):
    """2^32-1 made the loader list 4 billion layers' tensors (a hang); 1 or 0 dropped blocks silently."""
    rejects(mutated(clean, tmp_path / "m.gguf", "llama.block_count[3]", count), match)


@pytest.mark.parametrize("key,value,match", [
    ("llama.attention.head_count", 0, r"llama\.attention\.head_count is 0, expected a positive integer"),
    ("llama.attention.head_count_kv", 0, r"llama\.attention\.head_count_kv is 0, expected a positive integer"),
    ("llama.attention.head_count_kv", 3, r"head_count 4 is not a multiple of llama\.attention\.head_count_kv 3"),
    ("llama.embedding_length", 2**31, r"llama\.embedding_length is 2147483648, but tensor 'token_embd\.weight' has "
                                      r"shape \[64, \d+\]"),
    ("llama.context_length", 0, r"llama\.context_length is 0, expected a positive integer"),
])
def test_config_counts_must_be_positive_and_consistent(tmp_path, clean, key, value, match):
    rejects(mutated(clean, tmp_path / "m.gguf", f"{key}[3]", value), match)


@pytest.mark.parametrize("meta,match", [
    ({"llama.block_count": "abc"}, r"llama\.block_count is 'abc', expected a positive integer"),
    ({"llama.embedding_length": 64.0}, r"llama\.embedding_length is 64\.0, expected a positive integer"),
    ({"llama.attention.layer_norm_rms_epsilon": "tiny"},
     r"llama\.attention\.layer_norm_rms_epsilon is 'tiny', expected a positive number"),
    ({"llama.rope.freq_base": float("nan")}, r"llama\.rope\.freq_base is nan, expected a positive number"),
    ({"general.architecture": ["llama"]}, r"unsupported architecture \['llama'\]"),
    ({"general.name": 7}, r"general\.name is 7, expected a string"),
    ({"llama.vocab_size": 5}, r"llama\.vocab_size is 5, but tensor 'token_embd\.weight' has \d+ rows"),
    ({"tokenizer.ggml.bos_token_id": 10**6}, r"tokenizer\.ggml\.bos_token_id is 1000000, expected a token id "
                                             r"below \d+"),
    ({"tokenizer.ggml.merges": ["Ġ t", "nospace"]}, r"tokenizer\.ggml\.merges\[1\] is 'nospace', expected two "
                                                    r"tokens separated by a space"),
    ({"tokenizer.ggml.merges": ["Ġ zzzz"]}, r"tokenizer\.ggml\.tokens and merges do not make a BPE tokenizer"),
    ({"tokenizer.ggml.token_type": [1, 2]}, r"tokenizer\.ggml\.token_type has 2 values, expected one per "
                                            r"token \(\d+\)"),
])
def test_metadata_of_the_wrong_type_or_range(tmp_path, tok, meta, match):
    rejects(tiny_gguf(tmp_path / "m.gguf", tok, meta=meta), match)


def test_token_count_must_match_the_embedding(tmp_path, tok):
    tokenizer_meta = tokenizer_metadata(tok)
    tokenizer_meta["tokenizer.ggml.tokens"] = tokenizer_meta["tokenizer.ggml.tokens"][:-1]
    tokenizer_meta["tokenizer.ggml.token_type"] = tokenizer_meta["tokenizer.ggml.token_type"][:-1]
    rejects(tiny_gguf(tmp_path / "m.gguf", tok, tokenizer_meta=tokenizer_meta),
            r"tokenizer\.ggml\.tokens has \d+ tokens, but tensor 'token_embd\.weight' has \d+ rows")


def test_metadata_text_must_be_utf8(tmp_path, clean):
    data = bytearray(clean.read_bytes())
    pos = data.index(b"tiny")  # general.name
    data[pos] = 0xFF
    (tmp_path / "m.gguf").write_bytes(bytes(data))
    rejects(tmp_path / "m.gguf", r"metadata key 'general\.name' holds text that is not UTF-8")


@pytest.mark.parametrize("label,value,match", [
    ("GGUF.kv_count[0]", 2**64 - 1, r"GGUF\.kv_count is 18446744073709551615, but the \d+ bytes left in the file "
                                    r"hold at most \d+ metadata entries"),
    ("GGUF.tensor_count[0]", 2**40, r"GGUF\.tensor_count is 1099511627776, but the \d+ bytes left in the file "
                                    r"hold at most \d+ tensor infos"),
    ("tokenizer.ggml.tokens[4]", 2**32, r"metadata key 'tokenizer\.ggml\.tokens': the array length is 4294967296, "
                                        r"but the \d+ bytes left in the file hold at most \d+ items"),
    ("tokenizer.ggml.token_type[4]", 2**62, r"metadata key 'tokenizer\.ggml\.token_type': the array length is "
                                            r"4611686018427387904, but"),
    ("general.name[3]", 2**64 - 1, r"header runs past the end of the file"),  # the string's length
    ("llama.block_count[2]", 99, r"metadata key 'llama\.block_count': value type 99 is not a GGUF value type"),
])
def test_header_counts_and_lengths_are_bounded_by_the_file(tmp_path, clean, label, value, match):
    rejects(mutated(clean, tmp_path / "m.gguf", label, value), match)


@pytest.mark.parametrize("label,value,match", [
    # a type whose data is bigger (F16, Q8_0) or smaller (Q4_0) than the bytes the tensor has
    ("token_embd.weight type[0]", T.F16, r"tensor 'blk\.0\.attn_norm\.weight' has offset \d+, expected \d+, where "
                                         r"the data of 'token_embd\.weight' \(F16 \[64, \d+\]"),
    ("token_embd.weight type[0]", T.Q4_0, r"expected \d+, where the data of 'token_embd\.weight' \(Q4_0"),
    ("output.weight type[0]", T.Q4_0, r"the file has \d+ bytes, but the data of its last tensor 'output\.weight' "
                                      r"\(Q4_0 \[64, \d+\]: \d+ bytes from offset \d+\) ends at byte \d+"),
    ("output.weight type[0]", T.Q8_0, r"truncated: tensor 'output\.weight' ends at byte \d+, but the file has "
                                      r"\d+ bytes"),
    ("token_embd.weight type[0]", 1000, r"tensor 'token_embd\.weight' has type id 1000, which is not a GGML type"),
    ("blk.0.attn_q.weight offset[0]", 3, r"tensor 'blk\.0\.attn_q\.weight' has offset \d+, expected a multiple "
                                         r"of 32"),
    ("blk.0.attn_q.weight offset[0]", 32, r"tensor 'blk\.0\.attn_q\.weight' has offset \d+, expected \d+"),
    ("output.weight offset[0]", 2**63, r"tensor 'output\.weight' has offset 9223372036\d+, expected"),
    ("token_embd.weight dims[1]", 2**40, r"truncated: tensor 'token_embd\.weight' ends at byte \d+, but the file "
                                         r"has \d+ bytes"),
    ("token_embd.weight n_dims[0]", 5, r"tensor 'token_embd\.weight' has 5 dimensions, at most 4 are allowed"),
    ("blk.0.attn_q.weight dims[0]", 48, r"tensor 'blk\.0\.attn_q\.weight' of type Q4_1 has 48 elements per row, "
                                        r"not a multiple of its block size 32"),
])
def test_tensor_table_is_checked_against_types_offsets_and_the_file(tmp_path, clean, label, value, match):
    """A type or offset that does not fit the bytes a tensor has loaded garbage silently."""
    pos, dtype = Header(clean).slots[label]
    old = int.from_bytes(clean.read_bytes()[pos:pos + dtype.itemsize], "little")
    value = old + value if label.endswith("offset[0]") else value  # offsets move by the value; the rest is set
    data = put(bytearray(clean.read_bytes()), (pos, dtype), value)
    (tmp_path / "m.gguf").write_bytes(bytes(data))
    rejects(tmp_path / "m.gguf", match)


def test_every_tensor_must_be_one_the_model_uses(tmp_path, clean):
    """A corrupt name ('output.weight' -> 'outpuT.weight') made the loader tie the embeddings silently."""
    data = bytearray(clean.read_bytes())
    pos = data.index(struct.pack("<Q", 13) + b"output.weight") + 8  # the name in the table, after its length
    data[pos + 5] = ord("T")
    (tmp_path / "m.gguf").write_bytes(bytes(data))
    rejects(tmp_path / "m.gguf", r"tensor 'outpuT\.weight' is not one of the tensors of a llama model")


def test_missing_and_truncated_files_name_the_path(tmp_path, clean):
    from anychip_models.gguf_file import open_gguf

    with pytest.raises(CheckpointError, match=re.escape(f"{tmp_path / 'gone.gguf'}: cannot read the file")):
        open_gguf(tmp_path / "gone.gguf")
    data = clean.read_bytes()
    for cut in range(0, Header(clean).data_offset + 64, 97):  # through the header and tensor table
        (tmp_path / "m.gguf").write_bytes(data[:cut])
        rejects(tmp_path / "m.gguf")


# ---- the shipped SmolLM2 file -----------------------------------------------------------------------------

@pytest.fixture(scope="module")
def smollm2_copy(tmp_path_factory):
    """A copy of SmolLM2-135M-Instruct.Q4_1.gguf and where its header values lie."""
    from anychip_models.hub import resolve

    path = tmp_path_factory.mktemp("smollm2") / "smollm2.gguf"
    shutil.copyfile(resolve("smollm2"), path)
    return path, Header(path)


@contextmanager
def patched(path, slot, value):
    """``path`` with one header value changed, restored afterwards."""
    pos, dtype = slot
    with open(path, "r+b") as f:
        f.seek(pos)
        old = f.read(dtype.itemsize)
        f.seek(pos)
        f.write(put(bytearray(old), (0, dtype), value))
    try:
        yield path
    finally:
        with open(path, "r+b") as f:
            f.seek(pos)
            f.write(old)


@pytest.mark.parametrize("label,value,match", [
    ("llama.block_count[3]", 2**32 - 1, r"llama\.block_count is 4294967295, but the file holds tensors of 30 "
                                        r"blocks, blk\.0 to blk\.29"),
    ("token_embd.weight type[0]", T.F16, r"where the data of 'token_embd\.weight' \(F16 \[576, 49152\]"),
    ("token_embd.weight offset[0]", 3, r"tensor 'token_embd\.weight' has offset 3, expected a multiple of 32"),
])  # (token_embd's data starts the data section: offset 0 + 3)
def test_smollm2_with_a_corrupt_header(smollm2_copy, label, value, match):
    """The reported cases: a hang (block_count), and an empty answer with exit 0 (type, offset)."""
    path, header = smollm2_copy
    with patched(path, header.slots[label], value):
        rejects(path, match)


# ---- Hugging Face folders ---------------------------------------------------------------------------------

@pytest.fixture
def folder(tmp_path, tok):
    config = tiny_config(tok)
    return write_hf_folder(tmp_path / "hf", config, random_weights(config), tok)


def edit_config(folder, **changes):
    cfg = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**cfg, **changes}))


@pytest.mark.parametrize("changes,match", [
    ({"hidden_size": "abc"}, r"config\.json: hidden_size is 'abc', expected a positive integer"),
    ({"num_attention_heads": 0}, r"config\.json: num_attention_heads is 0, expected a positive integer"),
    ({"num_key_value_heads": 3}, r"num_attention_heads 4 is not a multiple of num_key_value_heads 3"),
    ({"rms_norm_eps": -1}, r"config\.json: rms_norm_eps is -1, expected a positive number"),
    ({"tie_word_embeddings": "false"}, r"config\.json: tie_word_embeddings is 'false', expected true or false"),
    ({"num_hidden_layers": 1}, r"config\.json: num_hidden_layers is 1, but .*model\.layers\.1\."),
    # a hang: 4 billion layers' tensor names
    ({"num_hidden_layers": 2**32 - 1}, r"tensor 'model\.layers\.2\.input_layernorm\.weight' \(layers\.2\.attn_norm\) "
                                       r"is missing"),
])
def test_config_json_values(folder, changes, match):
    edit_config(folder, **changes)
    with pytest.raises(CheckpointError, match=match):
        load(folder)


def test_config_json_must_be_an_object(folder):
    (folder / "config.json").write_text("[1, 2]")
    with pytest.raises(CheckpointError, match=r"config\.json: expected a JSON object, got a list"):
        load(folder)


def read_safetensors(path):
    raw = path.read_bytes()
    length = struct.unpack("<Q", raw[:8])[0]
    return json.loads(raw[8:8 + length]), raw[8 + length:]


def write_raw_safetensors(path, header, data: bytes):
    text = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(text)) + text + data)


NORM = "model.layers.0.input_layernorm.weight"  # F32 [64]: 256 bytes


def safetensors_case(header, data):
    """Named edits of a file's header (entries by name), each making it corrupt."""
    norm = header[NORM]
    begin, end = norm["data_offsets"]
    other = next(k for k, v in header.items() if k != NORM and k != "__metadata__" and v["shape"] == norm["shape"])
    return {
        "negative offset": ({**header, NORM: {**norm, "data_offsets": [-100, end - begin - 100]}},
                            rf"tensor '{NORM}' has data_offsets \[-100, 156\], expected two integers "
                            r"0 <= begin <= end"),
        "begin after end": ({**header, NORM: {**norm, "data_offsets": [end, begin]}},
                            rf"tensor '{NORM}' has data_offsets \[{end}, {begin}\], expected two integers"),
        "beyond the data": ({**header, NORM: {**norm, "data_offsets": [len(data), len(data) + 256]}},
                            rf"tensor '{NORM}' has data_offsets \[{len(data)}, {len(data) + 256}\], beyond the "
                            rf"end of the data \({len(data)} bytes\); the file may be truncated"),
        "size": ({**header, NORM: {**norm, "data_offsets": [begin, end - 4]}},
                 rf"tensor '{NORM}' has 252 bytes of data, but F32 \[64\] takes 256"),
        "overlap": ({**header, NORM: {**norm, "data_offsets": header[other]["data_offsets"]}},
                    r"the data of tensors '.+' and '.+' overlap"),
        "no dtype": ({**header, NORM: {k: v for k, v in norm.items() if k != "dtype"}},
                     rf"tensor '{NORM}' has no dtype"),
        "bad shape": ({**header, NORM: {**norm, "shape": [-64]}},
                      rf"tensor '{NORM}' has shape \[-64\], expected a list of non-negative integers"),
        "entry not an object": ({**header, NORM: [1, 2]}, rf"tensor '{NORM}' is \[1, 2\], expected an object"),
        "header a list": (list(header), r"the header is a list, expected a JSON object"),
    }


@pytest.mark.parametrize("case", ["negative offset", "begin after end", "beyond the data", "size", "overlap",
                                  "no dtype", "bad shape", "entry not an object", "header a list"])
def test_safetensors_header_is_checked(folder, case):
    """data_offsets [-100, ...] read the header's own bytes as weights; other entries raised raw errors."""
    path = folder / "model.safetensors"
    header, data = read_safetensors(path)
    bad, match = safetensors_case(header, data)[case]
    write_raw_safetensors(path, bad, data)
    with pytest.raises(CheckpointError, match=rf"{path}: {match}"):
        load(folder)


def test_safetensors_header_nesting_and_index(folder):
    path = folder / "model.safetensors"
    _, data = read_safetensors(path)
    text = b"[" * 100_000 + b"]" * 100_000
    path.write_bytes(struct.pack("<Q", len(text)) + text + data)
    with pytest.raises(CheckpointError, match=rf"{path}: not a safetensors file \(unreadable header"):
        load(folder)

    index = folder / "model.safetensors.index.json"
    index.write_text(json.dumps({"weight_map": {"model.norm.weight": "../../outside.safetensors"}}))
    with pytest.raises(CheckpointError, match=r"shard '\.\./\.\./outside\.safetensors' is not a file name in the "
                                              r"folder"):
        load(folder)
    index.write_text(json.dumps({"weight_map": ["model.safetensors"]}))
    with pytest.raises(CheckpointError, match=r"index\.json: weight_map must map tensor names to shard file names"):
        load(folder)


# ---- fuzz: seeded mutations of the tiny GGUF's header and tensor table ------------------------------------

MUTATIONS = 400
FUZZ_BUDGET_S = 60


def same_checkpoint(got, want) -> str | None:
    """Why ``got`` is not ``want`` (tensors bit for bit, and the config's shape of the model), or None.
    Scalar hyperparameters (RoPE base, eps, context length) may legitimately change with the bytes
    that hold them; names and the tokenizer too."""
    loose = {"name": "", "rope_theta": 0.0, "rms_eps": 0.0, "max_position": 0}
    if replace(got.config, **loose) != replace(want.config, **loose):
        return f"config {got.config} != {want.config}"
    if got.tensors.keys() != want.tensors.keys():
        return f"tensors {sorted(got.tensors.keys() ^ want.tensors.keys())} differ"
    for name, value in want.tensors.items():
        other = got.tensors[name]
        if isinstance(value, QuantWeight):
            if not isinstance(other, QuantWeight) or (value.bits, value.group_size) != (other.bits, other.group_size):
                return f"{name} is not the same kind of weight"
            pairs = [(value.qweight, other.qweight), (value.scales, other.scales),
                     (value.offsets if value.offsets is not None else np.zeros(0),
                      other.offsets if other.offsets is not None else np.zeros(0))]
        else:
            pairs = [(value, other)]
        for a, b in pairs:
            if a.dtype != b.dtype or not np.array_equal(a, b, equal_nan=True):
                return f"tensor {name} differs"
    return None


def mutations(data: bytes, header: Header, seed: int = 0, count: int = MUTATIONS):
    """(description, mutated bytes), deterministic for ``seed``: numbers of the header set to edge or
    random values (type ids, counts, lengths, dims, offsets, scalars), bits flipped and bytes
    overwritten, deleted or inserted in the header and tensor table, and truncations."""
    rng = random.Random(seed)
    labels = sorted(header.slots)
    end = header.data_offset
    for i in range(count):
        kind = rng.choices(["value", "flip", "byte", "delete", "insert", "truncate"], [50, 20, 10, 5, 5, 10])[0]
        out = bytearray(data)
        if kind == "value":
            label = rng.choice(labels)
            pos, dtype = header.slots[label]
            bits = 8 * dtype.itemsize
            old = np.frombuffer(data, dtype, 1, pos)[0].item()
            if dtype.kind == "f":
                value = rng.choice([0.0, -1.0, float("nan"), float("inf"), 1e30, old * 2, old / 3])
            else:
                value = rng.choice([0, 1, old - 1, old + 1, old + 3, old + 32, old * 2, 2**31, 2**32 - 1,
                                    2**(bits - 1), 2**bits - 1, rng.randrange(42), rng.getrandbits(bits)])
            desc = f"{i}: {label} = {value}"
            put(out, (pos, dtype), value)
        elif kind in ("flip", "byte", "delete", "insert"):
            pos = rng.randrange(end)
            if kind == "flip":
                bit = rng.randrange(8)
                out[pos] ^= 1 << bit
                desc = f"{i}: flip bit {bit} of byte {pos}"
            elif kind == "byte":
                out[pos] = rng.randrange(256)
                desc = f"{i}: byte {pos} = {out[pos]}"
            elif kind == "delete":
                del out[pos]
                desc = f"{i}: delete byte {pos}"
            else:
                out.insert(pos, rng.randrange(256))
                desc = f"{i}: insert byte {out[pos]} at {pos}"
        else:
            cut = rng.randrange(end) if rng.random() < 0.7 else rng.randrange(len(data))
            out = out[:cut]
            desc = f"{i}: truncate to {cut} bytes"
        yield desc, bytes(out)


def test_fuzzed_gguf_headers_load_identically_or_fail_clearly(tmp_path, clean, record_property):
    """Every mutation either loads the very same checkpoint (say a token string or the model's name
    changed) or raises CheckpointError; none hangs or raises anything else."""
    data = clean.read_bytes()
    want = {w: load_checkpoint(clean, weights=w) for w in ("native", "float")}
    path = tmp_path / "fuzzed.gguf"
    failures, outcomes = [], {"loaded": 0, "rejected": 0}
    start = time.monotonic()
    for i, (desc, mutated_bytes) in enumerate(mutations(data, Header(clean))):
        weights = ("native", "float")[i % 2]
        path.write_bytes(mutated_bytes)
        left = FUZZ_BUDGET_S - (time.monotonic() - start)
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # e.g. a key turned into rope.scaling.type: warned, and fine
                got = bounded(min(LOAD_BOUND_S, max(left, 0.1)), load_checkpoint, path, weights=weights)
        except CheckpointError as exc:
            assert str(path) in str(exc), (desc, exc)
            outcomes["rejected"] += 1
            continue
        except (Exception, Timeout) as exc:  # noqa: BLE001 - anything else, a hang too, is a failure
            failures.append(f"{desc} ({weights}): {type(exc).__name__}: {exc}\n"
                            + "".join(traceback.format_exception(exc)[-3:]))
            continue
        why = same_checkpoint(got, want[weights])
        if why:
            failures.append(f"{desc} ({weights}): loaded a different checkpoint: {why}")
        else:
            outcomes["loaded"] += 1
    elapsed = time.monotonic() - start
    record_property("fuzz_seconds", round(elapsed, 2))
    print(f"{MUTATIONS} mutations in {elapsed:.1f} s: {outcomes}")
    assert not failures, f"{len(failures)} of {MUTATIONS} mutations:\n" + "\n".join(failures[:10])
    assert outcomes["rejected"] > MUTATIONS // 2 and outcomes["loaded"] > 0, outcomes
