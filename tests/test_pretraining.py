"""Pretraining: raw text tokenized once into a cached token stream, cut into windows across
documents with a causal-document FlashMask (each document's losses are those it has alone), a
model from a config alone, dev perplexity falling, and `anychip pretrain` on every device with
no fallback, its checkpoint moving between devices."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from anychip.frontends.paddle import import_paddle
from anychip_models.loader import load_checkpoint
from anychip_models.training import checkpoints
from anychip_models.training.data import DataError
from anychip_models.training.model import TrainableModel
from anychip_models.training.packing import IGNORE, Batch
from anychip_models.training.pretrain_data import TokenSequences, corpus_files, tokenize_corpus
from anychip_models.training.trainer import TrainArgs, Trainer
from conftest import SIMULATED
from training_helpers import anychip as run_anychip
from training_helpers import strict_on_chip_then_resume_on_cpu
from training_helpers import losses, write_jsonl

paddle = import_paddle()

ROOT = Path(__file__).resolve().parents[1]
SAMPLE_TEXT = ROOT / "models" / "training" / "sample_text"
TINY_LLAMA = ROOT / "models" / "training" / "configs" / "llama-tiny.json"

DOCS = ["The quick brown fox jumps over the lazy dog.",
        "What is the capital of France? The capital of France is Paris, a city on the Seine.",
        "Hello world!",
        "Count from one: 1234567890, and again 1234567890."]


@pytest.fixture
def corpus(tmp_path):
    return write_jsonl(tmp_path / "corpus.jsonl", [{"text": t} for t in DOCS])


def stream_of(corpus, tok, tmp_path):
    stream, bad = tokenize_corpus(corpus, tok, cache_dir=tmp_path / "cache", progress=False)
    assert not bad
    return stream


def test_the_stream_holds_each_document_then_eos(base, corpus, tmp_path):
    tok = base.tokenizer
    stream = stream_of(corpus, tok, tmp_path)
    assert stream.num_documents == len(DOCS)
    for i, text in enumerate(DOCS):
        assert stream.document(i).tolist() == tok.encode(text) + [tok.eos_id]
    assert len(stream) == sum(len(tok.encode(t)) + 1 for t in DOCS)


def test_windows_cross_documents_and_keep_them_apart(base, corpus, tmp_path):
    stream = stream_of(corpus, base.tokenizer, tmp_path)
    L = 16
    seqs = TokenSequences(stream, L)
    assert len(seqs) == -(-(len(stream) - 1) // L)
    tokens = np.asarray(stream.tokens, dtype=np.int64)
    ends = set((np.r_[stream.starts[1:], len(stream)] - 1).tolist())
    for w in range(len(seqs)):
        ids, labels, positions, lens = seqs.window(w)
        start = w * L
        np.testing.assert_array_equal(ids, tokens[start:start + len(ids)])
        for t in range(len(ids)):
            expected = IGNORE if start + t in ends else tokens[start + t + 1]
            assert labels[t] == expected, (w, t)
        assert sum(lens) == len(ids)
        # positions restart where a document starts, i.e. after each end in the window
        at = 0
        for n in lens:
            np.testing.assert_array_equal(positions[at:at + n], np.arange(n))
            at += n
    # the last window is short and padded in its batch: padding is label -100 and its own document
    batch = seqs.batches([len(seqs) - 1], TrainArgs(batch_size=1))[0]
    n = len(seqs.window(len(seqs) - 1)[0])
    assert n < L and batch.input_ids.shape == (1, L)
    assert (batch.labels[0, n:] == IGNORE).all() and batch.real_tokens == n
    assert (batch.startend_row_indices[0, 0, n:, 0] == L).all()


def per_token_losses(model, batch: Batch) -> np.ndarray:
    with paddle.no_grad():
        _, losses_ = model.batch_loss(batch, 1)
    return losses_.numpy()


@pytest.mark.parametrize("device", ["cpu", "npu"])
def test_document_mask_losses_equal_each_document_alone(base, corpus, tmp_path, device):
    """One window holding every document, under the mask: each token's loss is the loss it has
    when its document is run alone. Without the mask, later documents see earlier ones."""
    stream = stream_of(corpus, base.tokenizer, tmp_path)
    model = TrainableModel(base, (device, 0))
    whole = TokenSequences(stream, len(stream) - 1)
    assert len(whole) == 1
    packed = per_token_losses(model, whole.batches([0], TrainArgs())[0])
    alone = []
    for i in range(stream.num_documents):
        doc = np.asarray(stream.document(i), dtype=np.int64)[None]
        labels = np.full_like(doc, IGNORE)
        labels[0, :-1] = doc[0, 1:]
        alone.append(per_token_losses(model, Batch(doc, labels, np.arange(doc.shape[1])[None], None,
                                                   doc.shape[1], [i])))
    alone = np.concatenate(alone)
    assert packed.shape == alone.shape
    np.testing.assert_allclose(packed, alone, rtol=1e-5, atol=1e-5)
    unmasked = per_token_losses(model, TokenSequences(stream, len(stream) - 1, document_mask=False).batches(
        [0], TrainArgs())[0])
    assert len(unmasked) > len(alone)  # each end-of-document token predicts the next document's start
    first = len(stream.document(0)) - 1
    assert not np.allclose(np.delete(unmasked, first)[first:first + 5], alone[first:first + 5], atol=1e-4)


def test_the_corpus_is_tokenized_once(base, corpus, tmp_path, monkeypatch):
    tok = base.tokenizer
    first = stream_of(corpus, tok, tmp_path)
    monkeypatch.setattr(type(tok), "encode", lambda *a, **k: pytest.fail("tokenized again"))
    again = stream_of(corpus, tok, tmp_path)
    np.testing.assert_array_equal(first.tokens, again.tokens)
    assert isinstance(again.tokens, np.memmap)
    monkeypatch.undo()
    write_jsonl(corpus, [{"text": t} for t in DOCS[:2]])  # a changed file is tokenized anew
    assert stream_of(corpus, tok, tmp_path).num_documents == 2


def test_bad_records_are_named_with_file_and_line(base, tmp_path):
    data = write_jsonl(tmp_path / "c.jsonl", [{"text": "fine"}, "not json", {"txt": "x"}, {"text": ""},
                                              {"text": 3}, {"text": "also fine"}])
    stream, bad = tokenize_corpus(data, base.tokenizer, cache_dir=tmp_path / "cache", progress=False)
    assert stream.num_documents == 2
    assert [(b.line, b.reason.split(" (")[0]) for _, b in bad] == [
        (2, "not valid JSON"), (3, 'expected an object with a "text" string'), (4, '"text" is empty'),
        (5, '"text" is int, expected a string')]
    with pytest.raises(DataError, match=r"c.jsonl:3: expected an object"):
        tokenize_corpus(data, base.tokenizer, cache_dir=tmp_path / "cache2", on_bad="fail", progress=False)


def test_folders_split_into_train_and_dev(tmp_path):
    (tmp_path / "dev").mkdir()
    for name in ("a.txt", "b.md", "dev.jsonl", "dev/c.txt", "notes.csv"):
        (tmp_path / name).write_text("text")
    assert [p.name for p in corpus_files(tmp_path, "train")] == ["a.txt", "b.md"]
    assert [p.name for p in corpus_files(tmp_path, "dev")] == ["c.txt", "dev.jsonl"]
    with pytest.raises(DataError, match="notes.csv: expected a .txt, .md, .jsonl file"):
        corpus_files(tmp_path / "notes.csv")


def test_the_trainer_resumes_a_pretraining_run_exactly(base, corpus, tmp_path):
    stream = stream_of(corpus, base.tokenizer, tmp_path)

    def run(output, resume=False):
        trainer = Trainer(TrainableModel(base, ("cpu", 0), seed=1), base, TokenSequences(stream, 12), [],
                          TrainArgs(max_length=12, batch_size=2, max_steps=4, lr=3e-3, save_steps=2, seed=5),
                          output, progress=False, kind="pretrain")
        trainer.train(resume=resume)
        return [r["loss"] for r in trainer.history if "loss" in r]

    straight = run(tmp_path / "straight")
    run(tmp_path / "cut")
    checkpoints.remove_tree(tmp_path / "cut" / "checkpoint-4")
    np.testing.assert_allclose(run(tmp_path / "cut", resume=True), straight, rtol=1e-6)


# ---- the command ---------------------------------------------------------------------------------


def test_pretraining_from_a_config_lowers_dev_perplexity_5x(tmp_path):
    """The shipped tiny Llama config, SmolLM2's tokenizer and the project's own text: dev
    perplexity falls at least 5x from its first evaluation, and the result is a model that
    `anychip generate` loads."""
    out = tmp_path / "run"
    r = run_anychip("pretrain", "--config", TINY_LLAMA, "--data", SAMPLE_TEXT, "--max-steps", 30,
                    "--batch-size", 4, "--max-length", 64, "--eval-steps", 30, "--output", out, timeout=600)
    assert r.returncode == 0, r.stderr
    assert "document mask" in r.stderr and "a new model of" in r.stderr
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    evals = [rec["eval_ppl"] for rec in records if "eval_ppl" in rec]
    assert len(evals) == 2 and evals[0] > 5 * evals[-1], evals
    assert all(rec["tokens_per_s"] > 0 for rec in records if "loss" in rec)
    assert (out / "loss.png").stat().st_size > 0
    model = load_checkpoint(out)
    assert model.config.num_layers == 2 and model.config.vocab_size == 49152
    gen = run_anychip("generate", "--model", out, "--raw", "--max-new-tokens", 4, "anychip is")
    assert gen.returncode == 0, gen.stderr


@pytest.mark.parametrize("device", SIMULATED)
def test_pretraining_runs_strict_on_every_chip_and_resumes_on_cpu(model_dir, corpus, tmp_path, device):
    """From a config alone on a simulated chip in strict mode (no op on the CPU), saved at step
    2, resumed on cpu: the losses of the run that went straight through on cpu."""
    common = ["pretrain", "--config", model_dir / "config.json", "--tokenizer", model_dir, "--data", corpus,
              "--max-length", 16, "--batch-size", 2, "--max-steps", 4, "--save-steps", 2, "--lr", "3e-3"]
    first = strict_on_chip_then_resume_on_cpu(common, tmp_path, device)
    assert f"{device}:0 (simulated)" in first.stderr


def test_pretrain_refuses_bad_arguments_before_any_work(tmp_path, corpus):
    r = run_anychip("pretrain", "--data", corpus, "--output", tmp_path / "x")
    assert r.returncode != 0 and "one of the arguments --config --model is required" in r.stderr
    r = run_anychip("pretrain", "--config", tmp_path / "none.json", "--data", corpus, "--output", tmp_path / "y")
    assert r.returncode != 0 and "none.json: no such file" in r.stderr


def test_pretraining_continues_from_a_model(model_dir, corpus, tmp_path, base):
    """--model: its weights are the start (the first loss is the model's own on the first
    window), and the result is a model folder of the same shape."""
    out = tmp_path / "run"
    r = run_anychip("pretrain", "--model", model_dir, "--data", corpus, "--max-length", 16, "--batch-size", 1,
                    "--max-steps", 3, "--lr", "1e-3", "--seed", 5, "--output", out)
    assert r.returncode == 0, r.stderr
    assert "continuing a model of" in r.stderr
    stream = stream_of(corpus, base.tokenizer, tmp_path)
    seqs = TokenSequences(stream, 16)
    first = int(np.random.default_rng([5, 0]).permutation(len(seqs))[0])
    model = TrainableModel(base, ("cpu", 0))
    batch = seqs.batches([first], TrainArgs(batch_size=1))[0]
    expected = float(per_token_losses(model, batch).mean())
    assert losses(out)[0] == pytest.approx(expected, rel=1e-5)
    assert replace(load_checkpoint(out).config, name="") == replace(load_checkpoint(model_dir).config, name="")
