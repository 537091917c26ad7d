"""Fine-tuning data: jsonl records through both chat formats (the model's jinja template and
PaddleNLP's chat_template.json) with loss masks on the replies, the documented truncation rules,
bad records reported by line; greedy zero-padding packing checked against its rule, packed
batches against the dense block-diagonal mask; the shipped sample data set. All on a tiny
tokenizer built here (ChatML special tokens, a SmolLM2-like template), nothing downloaded."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from anychip.ops import flashmask_dense_mask
from anychip_models.tokenizer import Tokenizer
from anychip_models.training.data import (BadRecord, ChatFormat, DataError, Example, format_bad_records,
                                          load_sft_data, tokenize_record)
from anychip_models.training.packing import (IGNORE, greedy_pack, packed_batches, padded_batches,
                                             padding_efficiency)
from loader_helpers import CHATML, train_tokenizer

SAMPLE = Path(__file__).resolve().parents[1] / "models" / "training" / "sample_data"
SYSTEM = "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
# SmolLM2-135M-Instruct's template: ChatML with a default system prompt when none is given
SMOLLM2_TEMPLATE = ("{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
                    "{{ '" + SYSTEM.replace("\n", "\\n") + "' }}{% endif %}"
                    "{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n'}}"
                    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")


def make_tokenizer(template: str | None) -> Tokenizer:
    backend = train_tokenizer()
    return Tokenizer(backend, bos_id=backend.token_to_id("<|im_start|>"), eos_id=backend.token_to_id("<|im_end|>"),
                     chat_template=template)


@pytest.fixture(scope="module")
def tok():
    return make_tokenizer(SMOLLM2_TEMPLATE)


@pytest.fixture(scope="module", params=["template", "json"])
def fmt(request, tok):
    if request.param == "template":
        return ChatFormat.from_tokenizer(tok)
    return ChatFormat.from_json(SAMPLE / "chat_template.json", tok)


def write_lines(path: Path, lines: list) -> Path:
    path.write_text("".join((x if isinstance(x, str) else json.dumps(x)) + "\n" for x in lines), encoding="utf-8")
    return path


def masked_text(tok, example: Example) -> str:
    return tok.decode([i for i, m in zip(example.input_ids, example.target_mask) if m], skip_special=False)


# ---- chat formats ------------------------------------------------------------------------------------

def test_special_tokens_in_text_map_to_their_ids(tok):
    start, end = tok.token_to_id("<|im_start|>"), tok.token_to_id("<|im_end|>")
    ids = tok.encode("<|im_start|>user\nhi<|im_end|>\n", add_bos=False)
    assert ids[0] == start and end in ids and ids.count(start) == 1
    assert tok.decode(ids, skip_special=False) == "<|im_start|>user\nhi<|im_end|>\n"


def test_one_turn_record(tok, fmt):
    ex = tokenize_record(fmt, {"src": "What is anychip?", "tgt": "A framework."}, 512, line=3)
    text = SYSTEM + "<|im_start|>user\nWhat is anychip?<|im_end|>\n<|im_start|>assistant\nA framework.<|im_end|>\n"
    assert tok.decode(ex.input_ids, skip_special=False) == text and ex.line == 3
    assert ex.input_ids == tok.encode(text)  # segment-wise encoding is the text's encoding here
    # loss on the reply and the turn end the template writes after it, nothing else
    assert masked_text(tok, ex) == "A framework.<|im_end|>\n"
    first = ex.target_mask.index(True)
    assert all(ex.target_mask[first:]) and not any(ex.target_mask[:first])


def test_multi_turn_record(tok, fmt):
    record = {"src": ["Hi there", "And the chips?"], "tgt": ["Hello.", "gpu and npu."]}
    ex = tokenize_record(fmt, record, 512, line=1)
    assert tok.decode(ex.input_ids, skip_special=False) == (
        SYSTEM + "<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\nHello.<|im_end|>\n"
        "<|im_start|>user\nAnd the chips?<|im_end|>\n<|im_start|>assistant\ngpu and npu.<|im_end|>\n")
    assert masked_text(tok, ex) == "Hello.<|im_end|>\ngpu and npu.<|im_end|>\n"
    edges = np.flatnonzero(np.diff([0, *map(int, ex.target_mask), 0]))
    assert len(edges) == 4  # two separate target runs
    system, turns = fmt.segments(record["src"], record["tgt"])
    assert tok.decode(system, skip_special=False) == SYSTEM and len(turns) == 2
    second_user = "<|im_start|>user\nAnd the chips?<|im_end|>\n<|im_start|>assistant\n"
    assert tok.decode(turns[1][0], skip_special=False) == second_user


def test_both_formats_agree_and_prompt_for_inference(tok):
    by_template = ChatFormat.from_tokenizer(tok)
    by_json = ChatFormat.from_json(SAMPLE, tok)  # a folder: its chat_template.json
    src, tgt = ["one", "two", "three"], ["uno", "dos", "tres"]
    assert by_template.segments(src, tgt) == by_json.segments(src, tgt)
    prompt = by_json.prompt_text(src, tgt[:2])
    messages = [{"role": "user", "content": "one"}, {"role": "assistant", "content": "uno"},
                {"role": "user", "content": "two"}, {"role": "assistant", "content": "dos"},
                {"role": "user", "content": "three"}]
    assert prompt == by_template.prompt_text(src, tgt[:2]) == tok.apply_chat_template(messages)
    assert prompt.endswith("<|im_start|>user\nthree<|im_end|>\n<|im_start|>assistant\n")


def test_template_without_default_system():
    fmt = ChatFormat.from_tokenizer(make_tokenizer(CHATML))
    system, turns = fmt.segments(["q"], ["a"])
    assert system == [] and len(turns) == 1


def test_json_format_variables_and_optional_system(tok, tmp_path):
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"conversation": ["[Round {{index}}] Q: {{user}}\nA: ", "{{bot}}<|im_end|>"],
                                "query": "Q: {{query}}\nA: "}))
    fmt = ChatFormat.from_json(path, tok)
    system, turns = fmt.segment_texts(["a", "b"], ["x", "y"])
    assert system == "" and turns == [("[Round 0] Q: a\nA: ", "x<|im_end|>"), ("[Round 1] Q: b\nA: ", "y<|im_end|>")]


@pytest.mark.parametrize("config,message", [
    ({"query": "{{query}}"}, "'conversation' key is missing"),
    ({"conversation": ["{{user}}", "{{bot}}"]}, "'query' key is missing"),
    ({"conversation": ["{{user}}"], "query": "{{query}}"}, "list of two templates"),
    ({"conversation": ["{{ question }}", "{{bot}}"], "query": "{{query}}"}, "'conversation[0]' must contain {{user}}"),
    ({"conversation": ["{{user}}", "{{bot}}"], "query": "{% if %}"}, "'query' is not a valid jinja2 template"),
    ({"conversation": ["{{user}}", 7], "query": "{{query}}"}, "'conversation[1]' must be a string"),
    ({"system": "<|sys|>", "conversation": ["{{user}}", "{{bot}}"], "query": "{{query}}"},
     "<|sys|>, which is not a token of this tokenizer"),
    ({"conversation": ["{{user}}", "{{bot}}"], "query": "{{query}}", "sytem": "x"}, "unknown keys ['sytem']"),
])
def test_bad_chat_template_json(tok, tmp_path, config, message):
    path = tmp_path / "chat_template.json"
    path.write_text(json.dumps(config))
    with pytest.raises(DataError, match="chat_template.json") as info:
        ChatFormat.from_json(path, tok)
    assert message in str(info.value)


def test_chat_template_json_missing_or_invalid(tok, tmp_path):
    with pytest.raises(DataError, match=r"nope\.json: no such chat template file"):
        ChatFormat.from_json(tmp_path / "nope.json", tok)
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(DataError, match=r"bad\.json: not valid JSON"):
        ChatFormat.from_json(tmp_path / "bad.json", tok)
    with pytest.raises(DataError, match="no chat template"):
        ChatFormat.from_tokenizer(make_tokenizer(None))


# ---- truncation ----------------------------------------------------------------------------------------

class CountingFormat(ChatFormat):
    """Segments whose lengths are the texts' lengths: system [1]*n, turn i user [10+i]*len(src[i]),
    bot [20+i]*len(tgt[i])."""

    def __init__(self, system: int):
        super().__init__(None, "counting")
        self.system = system

    def segments(self, src, tgt):
        return [1] * self.system, [([10 + i] * len(u), [20 + i] * len(b)) for i, (u, b) in enumerate(zip(src, tgt))]


def test_truncation_one_turn_cuts_tokens():
    fmt = CountingFormat(system=2)
    ex = tokenize_record(fmt, {"src": "uuu", "tgt": "bbbbb"}, 7, line=1)  # (2 + 3 + 5)[:7]
    assert ex.input_ids == [1, 1, 10, 10, 10, 20, 20] and ex.target_mask == [False] * 5 + [True] * 2
    assert len(tokenize_record(fmt, {"src": "uuu", "tgt": "bbbbb"}, 10, line=1).input_ids) == 10
    with pytest.raises(DataError, match="no target tokens left after truncation to max_length 5"):
        tokenize_record(fmt, {"src": "uuu", "tgt": "bbbbb"}, 5, line=1)


def test_truncation_multi_turn_drops_oldest_turns():
    fmt = CountingFormat(system=2)
    record = {"src": ["uu", "uuu", "u"], "tgt": ["bb", "bbb", "bb"]}  # turns of 4, 6 and 3 tokens
    assert len(tokenize_record(fmt, record, 15, line=1).input_ids) == 15  # all fit
    ex = tokenize_record(fmt, record, 14, line=1)  # the oldest turn no longer fits
    assert ex.input_ids == [1, 1] + [11] * 3 + [21] * 3 + [12] + [22] * 2
    # turn 2 doesn't fit next to turn 3: it and everything older go, though turn 1 alone would fit
    ex = tokenize_record(fmt, record, 10, line=1)
    assert ex.input_ids == [1, 1, 12, 22, 22] and ex.target_mask == [False] * 3 + [True] * 2
    # not even the newest fits: it is cut like a one-turn record; the system stays whole
    ex = tokenize_record(fmt, {"src": ["uu", "uuu"], "tgt": ["bb", "bbbbbb"]}, 8, line=1)
    assert ex.input_ids == [1, 1, 11, 11, 11, 21, 21, 21] and sum(ex.target_mask) == 3


def test_system_never_truncated(tmp_path):
    fmt = CountingFormat(system=6)
    with pytest.raises(DataError, match="system prompt is 6 tokens"):
        tokenize_record(fmt, {"src": "u", "tgt": "b"}, 6, line=1)
    data = write_lines(tmp_path / "d.jsonl", [{"src": "u", "tgt": "b"}])
    with pytest.raises(DataError, match=r"d\.jsonl:1: the system prompt is 6 tokens"):
        load_sft_data(data, fmt, 6, on_bad="skip")  # no record can avoid it: not skipped


def test_truncation_with_the_real_template(tok, fmt):
    system, _ = fmt.segments(["q"], ["a"])
    record = {"src": ["first question " * 5, "second"], "tgt": ["first answer " * 5, "ok then"]}
    full = tokenize_record(fmt, record, 1000, line=1)
    ex = tokenize_record(fmt, record, len(full.input_ids) - 1, line=1)
    assert ex.input_ids[:len(system)] == system and masked_text(tok, ex) == "ok then<|im_end|>\n"


# ---- loading and bad records ----------------------------------------------------------------------------

BAD_LINES = [
    {"src": "fine", "tgt": "good"},                       # 1
    "",                                                   # 2 blank: ignored
    "{not json",                                          # 3
    json.dumps(["src", "tgt"]),                           # 4
    {"tgt": "x"},                                         # 5
    {"src": "x", "tgt": 3},                               # 6
    {"src": "x", "tgt": "  "},                            # 7
    {"src": ["a", "b"], "tgt": ["c"]},                    # 8
    {"src": ["a", 1], "tgt": ["c", "d"]},                 # 9
    {"src": [], "tgt": []},                               # 10
    {"src": ["a", "b"], "tgt": ["c", ""]},                # 11
    {"src": "word " * 400, "tgt": "never reached"},       # 12: truncated away
    {"src": ["also", "fine"], "tgt": ["yes", "good"]},    # 13
]
REASONS = {3: "invalid JSON", 4: "not a JSON object", 5: "missing key 'src'", 6: "'tgt' must be a string or a list",
           7: "empty target", 8: "'src' has 2 turns but 'tgt' has 1", 9: "'src'[1] must be a string",
           10: "'src' is an empty list", 11: "empty target in turn 2",
           12: "no target tokens left after truncation to max_length 128"}


def test_bad_records_skipped_with_line_numbers(fmt, tmp_path):
    path = write_lines(tmp_path / "train.jsonl", BAD_LINES)
    examples, bad = load_sft_data(path, fmt, 128, on_bad="skip")
    assert [e.line for e in examples] == [1, 13]
    assert [b.line for b in bad] == sorted(REASONS) and all(isinstance(b, BadRecord) for b in bad)
    for b in bad:
        assert REASONS[b.line] in b.reason, (b.line, b.reason)
    printed = format_bad_records(tmp_path, bad, limit=2).splitlines()  # a folder: its train.jsonl
    assert printed == [f"{path}:3: {bad[0].reason}", f"{path}:4: {bad[1].reason}", "... and 8 more bad records"]


def test_bad_records_fail(fmt, tmp_path):
    path = write_lines(tmp_path / "train.jsonl", BAD_LINES)
    with pytest.raises(DataError) as info:
        load_sft_data(path, fmt, 128, on_bad="fail")
    message = str(info.value)
    assert str(path) in message and "10 bad records" in message
    assert "line 3: invalid JSON" in message and "line 5: missing key 'src'" in message
    path = write_lines(tmp_path / "ok.jsonl", [BAD_LINES[0], BAD_LINES[-1]])
    assert len(load_sft_data(path, fmt, 128, on_bad="fail")[0]) == 2


def test_data_files_and_folders(fmt, tmp_path):
    write_lines(tmp_path / "train.jsonl", [{"src": "a", "tgt": "b"}] * 3)
    write_lines(tmp_path / "dev.json", [{"src": "a", "tgt": "b"}] * 2)
    assert len(load_sft_data(tmp_path, fmt, 128)[0]) == 3
    assert len(load_sft_data(tmp_path, fmt, 128, split="dev")[0]) == 2
    with pytest.raises(DataError, match="no test.jsonl or test.json"):
        load_sft_data(tmp_path, fmt, 64, split="test")
    with pytest.raises(DataError, match=r"missing\.jsonl: no such data file"):
        load_sft_data(tmp_path / "missing.jsonl", fmt, 64)
    (tmp_path / "array.json").write_text(json.dumps([{"src": "a", "tgt": "b"}]))
    with pytest.raises(DataError, match="one JSON object per line"):
        load_sft_data(tmp_path / "array.json", fmt, 64)


# ---- greedy zero padding ------------------------------------------------------------------------------

def test_greedy_pack_by_hand():
    # rooms: [8] -> 5 in pack 0 [3]; 4 > 3: pack 1 [3, 4]; 3 -> pack 1 [3, 1]; 6: pack 2 [3, 1, 2];
    # 2 -> pack 0, the most room
    assert greedy_pack([5, 4, 3, 6, 2], 8) == [[0, 4], [1, 2], [3]]
    assert greedy_pack([5, 4, 3, 6, 2], 8, buffer_size=2) == [[0], [1], [2], [3], [4]]
    assert greedy_pack([], 8) == []
    with pytest.raises(DataError, match="example 1 has 9 tokens"):
        greedy_pack([3, 9], 8)


@pytest.mark.parametrize("seed", range(12))
def test_greedy_pack_follows_its_rule(seed):
    """Replays the packs example by example: each went into the open pack with the most room (the
    first opened of equals) when it fit there, else opened a new pack; buffers never mix."""
    rng = np.random.default_rng(seed)
    max_length = int(rng.integers(8, 64))
    lengths = rng.integers(1, max_length + 1, size=int(rng.integers(1, 120))).tolist()
    buffer_size = int(rng.integers(1, 40))
    packs = greedy_pack(lengths, max_length, buffer_size)
    assert sorted(i for p in packs for i in p) == list(range(len(lengths)))
    assert packs == greedy_pack(lengths, max_length, buffer_size)  # deterministic
    where = {i: k for k, p in enumerate(packs) for i in p}
    for p in packs:
        assert p == sorted(p) and sum(lengths[i] for i in p) <= max_length
        assert len({i // buffer_size for i in p}) == 1
    opened, room, count = [], [], 0  # pack numbers open in this buffer, their room; packs so far
    for i, n in enumerate(lengths):
        if i % buffer_size == 0:
            opened, room = [], []
        k = where[i]
        if k in opened:
            j = opened.index(k)
            assert room[j] >= n and room[j] == max(room) and room.index(max(room)) == j
        else:
            assert k == count  # packs come in the order they were opened
            count += 1
            assert not room or max(room) < n
            opened.append(k)
            room.append(max_length)
            j = len(room) - 1
        room[j] -= n


def random_examples(rng, count: int, max_length: int) -> list[Example]:
    out = []
    for line in range(count):
        n = int(rng.integers(2, max_length + 1))
        mask = (rng.random(n) < 0.5).tolist()
        out.append(Example(rng.integers(1, 1000, size=n).tolist(), mask, line + 1))
    return out


def expected_labels(e: Example) -> list[int]:
    return [e.input_ids[t + 1] if t + 1 < len(e.input_ids) and e.target_mask[t + 1] else IGNORE
            for t in range(len(e.input_ids))]


def test_packed_batches():
    rng = np.random.default_rng(7)
    examples, max_length = random_examples(rng, 40, 24), 32
    batches = packed_batches(examples, max_length, batch_size=3, buffer_size=16)
    packs = greedy_pack([len(e.input_ids) for e in examples], max_length, 16)
    assert [b.input_ids.shape[0] for b in batches] == [min(3, len(packs) - k) for k in range(0, len(packs), 3)]
    assert [i for b in batches for i in b.examples] == [i for p in packs for i in p]
    rows = iter(packs)
    for batch in batches:
        b = batch.input_ids.shape[0]
        assert batch.input_ids.shape == batch.labels.shape == batch.position_ids.shape == (b, max_length)
        assert batch.input_ids.dtype == batch.labels.dtype == batch.position_ids.dtype == np.int64
        assert batch.startend_row_indices.shape == (b, 1, max_length, 1)
        assert batch.startend_row_indices.dtype == np.int32
        assert batch.real_tokens == sum(len(examples[i].input_ids) for i in batch.examples)
        dense = flashmask_dense_mask(batch.startend_row_indices, max_length, 1, causal=True)
        for r in range(b):
            expected_mask = np.zeros((max_length, max_length), dtype=bool)
            at = 0
            for i in next(rows):
                e = examples[i]
                n = len(e.input_ids)
                assert batch.input_ids[r, at:at + n].tolist() == e.input_ids
                assert batch.position_ids[r, at:at + n].tolist() == list(range(n))  # restart per example
                assert batch.labels[r, at:at + n].tolist() == expected_labels(e)   # never across examples
                expected_mask[at:at + n, at:at + n] = np.tril(np.ones((n, n), dtype=bool))
                at += n
            n = max_length - at  # padding: id 0, no loss, its own document
            assert (batch.input_ids[r, at:] == 0).all() and (batch.labels[r, at:] == IGNORE).all()
            assert batch.position_ids[r, at:].tolist() == list(range(n))
            expected_mask[at:, at:] = np.tril(np.ones((n, n), dtype=bool))
            assert (dense[r, 0] == expected_mask).all()  # block-diagonal causal: no example sees another


def test_packed_rows_hand_case():
    examples = [Example([5, 6, 7], [False, True, True], 1), Example([8, 9], [False, True], 2)]
    (batch,) = packed_batches(examples, 6, batch_size=2)
    assert batch.input_ids.tolist() == [[5, 6, 7, 8, 9, 0]]
    assert batch.labels.tolist() == [[6, 7, IGNORE, 9, IGNORE, IGNORE]]
    assert batch.position_ids.tolist() == [[0, 1, 2, 0, 1, 0]]
    assert batch.startend_row_indices[0, 0, :, 0].tolist() == [3, 3, 3, 5, 5, 6]
    assert batch.examples == [0, 1] and batch.real_tokens == 5


def test_padded_batches():
    examples = [Example([5, 6, 7], [False, True, True], 1), Example([8, 9], [False, True], 2),
                Example([4, 3, 2, 1], [False, False, True, True], 3)]
    first, second = padded_batches(examples, batch_size=2)
    assert first.input_ids.tolist() == [[5, 6, 7], [8, 9, 0]] and first.examples == [0, 1]
    assert first.labels.tolist() == [[6, 7, IGNORE], [9, IGNORE, IGNORE]]
    assert first.position_ids.tolist() == [[0, 1, 2], [0, 1, 2]] and first.startend_row_indices is None
    assert second.input_ids.shape == (1, 4) and second.labels.tolist() == [[IGNORE, 2, 1, IGNORE]]
    assert (first.real_tokens, second.real_tokens) == (5, 4)


def test_padding_efficiency_by_hand():
    examples = [Example([1] * n, [False] + [True] * (n - 1), i) for i, n in enumerate([5, 4, 3, 6, 2])]
    # 20 real tokens; packs [5+2] [4+3] [6] of 8; batches of 3: [5, 4, 3] -> 3 x 5, [6, 2] -> 2 x 6
    assert padding_efficiency(examples, 8, 3) == {"zero_padding": 20 / 24, "padding": 20 / 27,
                                                  "sequences_packed": 3, "sequences_padded": 5}


# ---- the shipped sample data ----------------------------------------------------------------------------

def test_sample_data_loads_cleanly(tok, fmt):
    # (this tokenizer's tiny vocabulary spells most words byte by byte: records are long)
    train, bad = load_sft_data(SAMPLE, fmt, 1024, on_bad="fail")
    dev, bad_dev = load_sft_data(SAMPLE, fmt, 1024, split="dev", on_bad="fail")
    assert (len(train), len(dev), bad, bad_dev) == (300, 40, [], [])
    assert all(any(e.target_mask) and len(e.input_ids) < 1024 for e in train + dev)  # none truncated
    records = [json.loads(line) for line in (SAMPLE / "train.jsonl").read_text().splitlines()]
    multi = sum(isinstance(r["src"], list) for r in records)
    assert 0.1 <= multi / len(records) <= 0.2
    asked = {q for r in records for q in (r["src"] if isinstance(r["src"], list) else [r["src"]])}
    dev_records = [json.loads(line) for line in (SAMPLE / "dev.jsonl").read_text().splitlines()]
    dev_asked = {q for r in dev_records for q in (r["src"] if isinstance(r["src"], list) else [r["src"]])}
    assert not any(q in a for q in dev_asked for a in asked)  # dev phrasings are new
    stats = padding_efficiency(train, 1024, 8)
    assert stats["zero_padding"] > stats["padding"]
