"""DPO: PaddleNLP's preference records, shared-prompt packing equal to unpacked pairs (log-probs,
losses and gradients), the tuned model preferring the chosen responses more often than the
reference, and `anychip dpo` on every device with no fallback, resumed on another."""

from __future__ import annotations

import json

import numpy as np
import pytest

from anychip.ops.masks import packed_share_question
from anychip.frontends.paddle import import_paddle
from anychip_models.loader import load_checkpoint
from anychip_models.training.data import ChatFormat, DataError
from anychip_models.training.dpo import preference_accuracy, preference_loss, sequence_logps
from anychip_models.training.model import TrainableModel
from anychip_models.training.preference import (PreferenceData, load_preference_data, packed_pair_batches,
                                                unpacked_pair_batches)
from anychip_models.training.trainer import TrainArgs
from conftest import SIMULATED
from training_helpers import PAIRS
from training_helpers import anychip as run_anychip
from training_helpers import strict_on_chip_then_resume_on_cpu
from training_helpers import write_jsonl

paddle = import_paddle()


def preference_records() -> list[dict]:
    records = []
    for shift in (1, 2):
        for i, (question, answer) in enumerate(PAIRS):
            records.append({"src": question, "tgt": [], "response": [answer, PAIRS[(i + shift) % len(PAIRS)][1]]})
    records.append({"src": [PAIRS[0][0], PAIRS[1][0]], "tgt": [PAIRS[0][1]],  # a two-turn chat
                    "response": [PAIRS[1][1], PAIRS[2][1]]})
    return records


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    folder = tmp_path_factory.mktemp("prefs")
    write_jsonl(folder / "train.jsonl", preference_records())
    write_jsonl(folder / "dev.jsonl", preference_records()[:6])
    return folder


@pytest.fixture(scope="module")
def pairs(base, data_dir):
    pairs, bad = load_preference_data(data_dir, ChatFormat.from_tokenizer(base.tokenizer), max_length=96)
    assert not bad
    return pairs


def test_a_record_becomes_prompt_and_two_responses(base, pairs):
    fmt = ChatFormat.from_tokenizer(base.tokenizer)
    question, answer = PAIRS[0]
    system, turns = fmt.segments([question], [answer])
    assert pairs[0].prompt == system + turns[0][0] and pairs[0].chosen == turns[0][1]
    assert pairs[0].rejected == fmt.segments([question], [PAIRS[1][1]])[1][0][1]
    chat = pairs[-1]  # the earlier turn is part of the prompt
    system, turns = fmt.segments([PAIRS[0][0], PAIRS[1][0]], [PAIRS[0][1], PAIRS[1][1]])
    assert chat.prompt == system + turns[0][0] + turns[0][1] + turns[1][0]


def test_bad_records_are_reported_by_line(base, tmp_path):
    data = write_jsonl(tmp_path / "p.jsonl", [
        {"src": "q", "tgt": [], "response": ["good", "bad"]},
        {"src": "q", "tgt": []},
        {"src": "q", "tgt": [], "response": ["only one"]},
        {"src": "q", "tgt": [], "response": ["", "bad"]},
        {"src": "q", "tgt": [], "response": ["good", "  "]},
        {"src": ["a", "b"], "tgt": [], "response": ["x", "y"]},
        {"src": "", "tgt": [], "response": ["x", "y"]},
        "not json"])
    fmt = ChatFormat.from_tokenizer(base.tokenizer)
    pairs, bad = load_preference_data(data, fmt, max_length=64)
    assert len(pairs) == 1
    assert [(b.line, b.reason) for b in bad][:6] == [
        (2, "missing key 'response' (expected [chosen, rejected])"),
        (3, "'response' must be [chosen, rejected], two strings; got a list of 1"),
        (4, "empty chosen response"), (5, "empty rejected response"),
        (6, "'src' has 2 turns, so 'tgt' needs 1 earlier answers, not 0"), (7, "empty 'src'")]
    assert bad[6].line == 8 and bad[6].reason.startswith("invalid JSON")
    with pytest.raises(DataError, match="line 2: missing key 'response'"):
        load_preference_data(data, fmt, max_length=64, on_bad="fail")


def test_long_responses_are_cut_to_fit_together(base):
    fmt = ChatFormat.from_tokenizer(base.tokenizer)
    from anychip_models.training.preference import tokenize_pair

    pair = tokenize_pair(fmt, {"src": "q", "response": ["word " * 50, "other " * 50]}, 40, 1)
    assert len(pair) == 40 and abs(len(pair.chosen) - len(pair.rejected)) <= 1


def test_the_shared_question_mask_keeps_responses_and_pairs_apart():
    m = packed_share_question([(3, [2, 2]), (2, [1, 1])], 13)[0, 0]
    np.testing.assert_array_equal(m[:, 0], [7, 7, 7, 5, 5, 7, 7, 11, 11, 10, 11, 13, 13])
    assert (m[:, 1] == 13).all()


@pytest.mark.parametrize("loss,expected", [("sigmoid", -0.25), ("ipo", -2.0)])
def test_the_loss_has_its_gradient_where_every_margin_starts(loss, expected):
    """At step 0 the model is the reference, so margins are 0, often exactly: the sigmoid loss's
    gradient there is -beta/2 (IPO's -1/beta), and for large margins it neither overflows nor
    loses its slope."""
    h = paddle.to_tensor(np.array([0.0, -0.0, 1e-30, -200.0, 200.0], np.float32), stop_gradient=False)
    preference_loss(h, beta=0.5, loss=loss).sum().backward()
    grad = h.grad.numpy()
    np.testing.assert_allclose(grad[:3], expected, rtol=1e-6)
    if loss == "sigmoid":
        np.testing.assert_allclose(grad[3:], [-0.5, 0.0], atol=1e-6)
        values = preference_loss(paddle.to_tensor(np.array([0.0, -200.0, 200.0], np.float32)), beta=0.5).numpy()
        np.testing.assert_allclose(values, [np.log(2), 100.0, 0.0], rtol=1e-6, atol=1e-6)


def test_packed_pairs_equal_unpacked_pairs(base, pairs):
    """The same pairs shared-prompt packed and unpacked: equal log-probabilities, DPO losses and
    gradients, with fewer tokens computed when packed."""
    order = list(range(len(pairs)))
    packed = packed_pair_batches(pairs, order, 96, batch_size=len(pairs))
    unpacked = unpacked_pair_batches(pairs, order, batch_size=len(pairs))
    assert len(packed) == len(unpacked) == 1
    assert packed[0].real_tokens < 0.75 * unpacked[0].real_tokens
    assert packed[0].input_ids.shape[0] < len(pairs)  # several pairs share a row
    results = []
    for batch in (packed[0], unpacked[0]):
        model = TrainableModel(base, ("cpu", 0), seed=1)
        chosen, rejected = sequence_logps(model, batch)
        order_back = np.argsort(batch.pairs)
        # an arbitrary reference, so the margins (and the gradients) are not zero
        h = (chosen - rejected) - paddle.to_tensor(np.linspace(-1, 1, len(pairs)).astype(np.float32)[batch.pairs])
        loss = preference_loss(h, beta=0.5).sum()
        loss.backward()
        grads = {name: p.grad.numpy().copy() for name, p in model.params.items()}
        results.append((chosen.numpy()[order_back], rejected.numpy()[order_back], float(loss), grads))
    (c1, r1, l1, g1), (c2, r2, l2, g2) = results
    np.testing.assert_allclose(c1, c2, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(r1, r2, rtol=1e-5, atol=1e-5)
    assert abs(l1 - l2) <= 1e-5 * abs(l2)
    for name in g1:  # float32 sums in another order: within 1e-5 of each gradient's scale
        np.testing.assert_allclose(g1[name], g2[name], rtol=1e-5, atol=1e-5 * np.abs(g2[name]).max(), err_msg=name)
    assert not np.allclose(c1, r1)


def test_dpo_makes_the_model_prefer_the_chosen_responses(model_dir, data_dir, tmp_path, base, pairs):
    out = tmp_path / "run"
    r = run_anychip("dpo", "--model", model_dir, "--data", data_dir, "--max-length", 96, "--zero-padding",
                    "--batch-size", 4, "--max-steps", 12, "--lr", "1e-3", "--beta", "0.5", "--eval-steps", 12,
                    "--output", out)
    assert r.returncode == 0, r.stderr
    assert "shared-prompt packing" in r.stderr
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    trained = [rec for rec in records if "loss" in rec]
    assert {"rewards_chosen", "rewards_rejected", "reward_margin", "reward_accuracy"} <= set(trained[0])
    assert trained[-1]["reward_margin"] > 0
    assert np.mean([rec["loss"] for rec in trained[-3:]]) < 0.5 * trained[0]["loss"], [rec["loss"] for rec in trained]
    evals = [rec for rec in records if "eval_reward_accuracy" in rec]
    assert evals[-1]["eval_reward_margin"] > evals[0]["eval_reward_margin"] == 0
    args = TrainArgs(max_length=96, batch_size=8, zero_padding=True)
    before = preference_accuracy(TrainableModel(base, ("cpu", 0)), PreferenceData(pairs), args)
    after = preference_accuracy(TrainableModel(load_checkpoint(out), ("cpu", 0)), PreferenceData(pairs), args)
    assert after > before, (before, after)
    assert evals[-1]["eval_reward_accuracy"] == 1.0
    assert (out / "loss.png").stat().st_size > 0


@pytest.mark.parametrize("device", SIMULATED)
def test_dpo_runs_strict_on_every_chip_and_resumes_on_cpu(model_dir, data_dir, tmp_path, device):
    """LoRA DPO with packing on a simulated chip under strict mode, saved at step 2 and resumed
    on cpu: the losses of the run that went straight through on cpu."""
    common = ["dpo", "--model", model_dir, "--data", data_dir, "--max-length", 96, "--zero-padding", "--lora",
              "--batch-size", 4, "--max-steps", 4, "--save-steps", 2, "--lr", "5e-3"]
    strict_on_chip_then_resume_on_cpu(common, tmp_path, device)


@pytest.mark.parametrize("method", [[], ["--lora"]], ids=["full", "lora"])
def test_dpo_split_two_ways_gives_one_devices_losses(model_dir, data_dir, tmp_path, method):
    """DPO with --tensor-parallel 2 on 2 npu ranks in strict mode: the reference pass and every
    step's pair losses are one device's within 1e-5, and the run resumes on one process."""
    from training_helpers import losses

    common = ["dpo", "--model", model_dir, "--data", data_dir, "--max-length", 96, "--zero-padding", "--batch-size", 4,
              "--max-steps", 4, "--save-steps", 2, "--lr", "5e-3", *method]
    one = run_anychip(*common, "--output", tmp_path / "one")
    assert one.returncode == 0, one.stderr
    out = tmp_path / "two"
    two = run_anychip(*common, "--output", out, "--device", "npu", "--nproc", 2, "--tensor-parallel", 2,
                      env={"ANYCHIP_STRICT": "1"})
    assert two.returncode == 0, two.stderr + two.stdout
    np.testing.assert_allclose(losses(out), losses(tmp_path / "one"), rtol=1e-5)
    from anychip_models.training import checkpoints

    checkpoints.remove_tree(out / "checkpoint-4")
    resumed = run_anychip(*common, "--output", out, "--resume")
    assert resumed.returncode == 0, resumed.stderr
    np.testing.assert_allclose(losses(out), losses(tmp_path / "one"), rtol=1e-5)
