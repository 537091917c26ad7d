"""Tensor parallelism (``--tensor-parallel K``): the model split across ranks gives the logits of
one device within 1e-5 and the same greedy tokens; training split 2 ways gives one device's
losses, its checkpoint is whole and resumes on one process; bad degrees are refused."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from anychip_models.training import checkpoints
from anychip_models.tensor_parallel import TensorParallel, check, shard, shard_axis, vocab_chunk
from training_helpers import anychip as run_anychip
from training_helpers import finetune_tiny, losses, sft_folder, write_jsonl

JOB = Path(__file__).with_name("tensor_parallel_job.py")


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return sft_folder(tmp_path_factory.mktemp("sft-data"))


finetune = finetune_tiny


def test_each_tensor_splits_on_its_axis_and_the_vocabulary_in_padded_chunks(base):
    parts = [shard(dict(base.tensors), TensorParallel(rank=r, size=2), base.config.vocab_size) for r in range(2)]
    for name, whole in base.tensors.items():
        axis = shard_axis(name)
        if axis is None:
            assert all(p[name] is whole for p in parts), name
            continue
        joined = np.concatenate([p[name] for p in parts], axis=axis)
        np.testing.assert_array_equal(joined[:whole.shape[0]] if axis == 0 else joined, whole, err_msg=name)
    rows = vocab_chunk(base.config.vocab_size, 2)
    assert parts[0]["embed_tokens"].shape[0] == parts[1]["embed_tokens"].shape[0] == rows
    assert shard_axis("layers.0.o_proj.lora_A") == 1 and shard_axis("layers.0.o_proj.lora_B") is None
    assert shard_axis("layers.0.q_proj.lora_B") == 0 and shard_axis("layers.0.q_proj.lora_A") is None
    with pytest.raises(ValueError, match=r"--tensor-parallel 3 must divide the model's attention heads \(4\)"):
        check(base.config, 3)


def _job(chip: str, model_dir, out: Path, tp: int = 2) -> subprocess.CompletedProcess:
    env = {**os.environ, "CHIP": chip, "TP": str(tp), "MODEL": str(model_dir), "OUT": str(out)}
    if chip != "cpu":
        from anychip.frontends.paddle.root import job_env

        env.update(job_env(chip), ANYCHIP_STRICT="1")
    return subprocess.run([sys.executable, "-m", "paddle.distributed.launch", "--nproc_per_node", str(tp),
                           "--log_dir", str(out / "logs"), str(JOB)], env=env, capture_output=True, text=True,
                          timeout=300)


@pytest.mark.parametrize("chip", ["cpu", "npu"])
def test_two_ranks_give_the_logits_of_one_device(model_dir, base, tmp_path, chip):
    from anychip.ops.dispatch import place
    from anychip.frontends.paddle import import_paddle
    from anychip_models.llama import LlamaForCausalLM

    run = _job(chip, model_dir, tmp_path)
    logs = "".join(p.read_text(errors="replace") for p in sorted((tmp_path / "logs").glob("workerlog.*")))
    assert run.returncode == 0, logs[-4000:]
    got = np.load(tmp_path / "logits.npz")
    paddle = import_paddle()
    model = LlamaForCausalLM(base, ("cpu", 0))
    tokens = got["tokens"]
    dev = place(("cpu", 0))
    with paddle.no_grad():
        cache = model.new_cache(2, 16)
        prefill = model(paddle.to_tensor(tokens, place=dev), paddle.to_tensor(np.tile(np.arange(7), (2, 1)), place=dev),
                        cache)
        step = model.decode(paddle.to_tensor(tokens[:, 0], place=dev), paddle.to_tensor(np.array([7, 7]), place=dev),
                            cache, fused=False)
    assert got["prefill"].shape == tuple(prefill.shape) and got["decode"].shape == tuple(step.shape)
    np.testing.assert_allclose(got["prefill"], prefill.numpy(), atol=1e-5, rtol=1e-5)
    assert got["fused"]  # the fused step by parts, beside op by op
    for decode in ("decode", "decode_op_by_op"):
        np.testing.assert_allclose(got[decode], step.numpy(), atol=1e-5, rtol=1e-5, err_msg=decode)


def test_generate_on_two_ranks_gives_one_devices_greedy_tokens(model_dir):
    common = ["generate", "--model", model_dir, "--raw", "The capital of France is", "--max-new-tokens", 16,
              "--json", "--device", "npu"]
    one = run_anychip(*common)
    assert one.returncode == 0, one.stderr
    two = run_anychip(*common, "--nproc", 2, "--tensor-parallel", 2, env={"ANYCHIP_STRICT": "1"})
    assert two.returncode == 0, two.stderr + two.stdout
    start = two.stdout.index("{")  # rank 0's JSON, after the launcher's lines
    split = json.JSONDecoder().raw_decode(two.stdout[start:])[0]
    whole = json.loads(one.stdout)
    assert split["completions"][0]["text"] == whole["completions"][0]["text"]
    assert split["completions"][0]["completion_tokens"] == whole["completions"][0]["completion_tokens"]
    assert "rank 0 of 2 holds 1/2 of the model (tensor parallel; the fused decode step by half layers)" in two.stdout + two.stderr


@pytest.mark.parametrize("method", [[], ["--lora"]], ids=["full", "lora"])
def test_training_split_two_ways_gives_one_devices_losses_and_a_whole_checkpoint(model_dir, data, tmp_path, method):
    one = finetune(model_dir, data, tmp_path / "one", *method)
    assert one.returncode == 0, one.stderr
    out = tmp_path / "two"
    two = finetune(model_dir, data, out, "--device", "npu", "--nproc", 2, "--tensor-parallel", 2, *method,
                   env={"ANYCHIP_STRICT": "1"})
    assert two.returncode == 0, two.stderr + two.stdout
    np.testing.assert_allclose(losses(out), losses(tmp_path / "one"), rtol=1e-5)
    # whole tensors, as one device saves them, in the checkpoint and the exported model
    for folder in (checkpoints.latest_checkpoint(out), out):
        mine = checkpoints.load_checkpoint_state(folder)[0] if folder != out else None
        if mine is None:
            continue
        theirs = checkpoints.load_checkpoint_state(checkpoints.latest_checkpoint(tmp_path / "one"))[0]
        assert {k: v.shape for k, v in mine.items()} == {k: v.shape for k, v in theirs.items()}
    # saved at step 2 by two ranks, resumed on one process: the uninterrupted run's losses
    checkpoints.remove_tree(out / "checkpoint-4")
    resumed = finetune(model_dir, data, out, "--resume", *method)
    assert resumed.returncode == 0, resumed.stderr
    np.testing.assert_allclose(losses(out), losses(tmp_path / "one"), rtol=1e-5)
    generated = run_anychip("generate", "--model", out, "--raw", "Say hello.", "--max-new-tokens", 4)
    assert generated.returncode == 0, generated.stderr


def test_one_process_checkpoint_resumes_split_two_ways(model_dir, data, tmp_path):
    one = finetune(model_dir, data, tmp_path / "one", "--lora")
    assert one.returncode == 0, one.stderr
    out = tmp_path / "run"
    assert finetune(model_dir, data, out, "--lora").returncode == 0
    checkpoints.remove_tree(out / "checkpoint-4")
    resumed = finetune(model_dir, data, out, "--lora", "--resume", "--nproc", 2, "--tensor-parallel", 2)
    assert resumed.returncode == 0, resumed.stderr + resumed.stdout
    np.testing.assert_allclose(losses(out), losses(tmp_path / "one"), rtol=1e-5)


def test_bad_degrees_are_refused(model_dir, data, tmp_path):
    odd = finetune(model_dir, data, tmp_path / "a", "--nproc", 2, "--tensor-parallel", 3)
    assert odd.returncode != 0 and "--tensor-parallel 3 must be >= 1 and divide --nproc 2" in odd.stderr
    both = finetune(model_dir, data, tmp_path / "b", "--nproc", 2, "--tensor-parallel", 2, "--sharding", "stage1")
    assert both.returncode != 0 and "pass one of them" in both.stderr
    gen = run_anychip("generate", "--model", model_dir, "hi", "--nproc", 2)
    assert gen.returncode != 0 and "must be equal" in gen.stderr
    heads = finetune(model_dir, data, tmp_path / "c", "--nproc", 3, "--tensor-parallel", 3)
    assert heads.returncode != 0
    assert "--tensor-parallel 3 must divide the model's attention heads (4)" in heads.stdout + heads.stderr


def _processes_naming(text: str) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            if text in cmdline:
                found.append(int(entry.name))
    return found


def test_serve_split_two_ways_answers_as_one_device_and_stops_whole(model_dir):
    """Rank 0 serves HTTP and drives rank 1 through every prefill and decode step; concurrent
    requests come back with one device's greedy text; stopping the server ends every rank."""
    from concurrent.futures import ThreadPoolExecutor

    from serve_helpers import Server

    prompts = ["The capital of France is", "Say hello.", "Count from one."]
    expected = []
    for prompt in prompts:
        one = run_anychip("generate", "--model", model_dir, "--raw", prompt, "--max-new-tokens", 10, "--json",
                          "--device", "npu")
        assert one.returncode == 0, one.stderr
        expected.append(json.loads(one.stdout)["completions"][0]["text"])
    marker = str(model_dir)
    with Server(model_dir, "npu", "--nproc", 2, "--tensor-parallel", 2, "--max-batch", 4,
                env={"ANYCHIP_STRICT": "1"}) as server:
        assert server.get("/health")["device"] == "npu:0"

        def complete(prompt: str, n: int = 1):
            import urllib.request

            body = json.dumps({"model": Path(model_dir).name, "prompt": prompt, "max_tokens": 10, "temperature": 0,
                               "n": n}).encode()
            request = urllib.request.Request(server.url + "/v1/completions", body, {"Content-Type": "application/json"})
            with urllib.request.urlopen(request, timeout=120) as r:
                texts = [c["text"] for c in json.loads(r.read())["choices"]]
            return texts[0] if n == 1 else texts

        with ThreadPoolExecutor(3) as pool:
            got = list(pool.map(complete, prompts))
        assert got == expected
        # again, one after the other: each reuses its cached prompt (the followers resume at the
        # same slot as rank 0)
        assert [complete(p) for p in prompts] == expected
        # n choices: the later ones copy the first's keys and values (the followers copy alike)
        assert complete("A prompt no row holds yet, for three choices.", n=3) == [
            json.loads(run_anychip("generate", "--model", model_dir, "--raw",
                                   "A prompt no row holds yet, for three choices.", "--max-new-tokens", 10, "--json",
                                   "--device", "npu").stdout)["completions"][0]["text"]] * 3
        assert "anychip_prefix_cache_hit_tokens_total 0" not in server.text("/metrics")
        assert len(_processes_naming(marker)) >= 3  # the command, and its two ranks
    import time

    deadline = time.monotonic() + 30
    while _processes_naming(marker) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not _processes_naming(marker), "ranks outlived the server"


def test_bfloat16_matmuls_split_two_ways_stay_within_their_rounding(model_dir, data, tmp_path):
    """--compute-dtype bfloat16: a row-parallel product sums two bfloat16 halves in float32, so the
    losses move by bfloat16's rounding, no more."""
    bf16 = ["--lora", "--compute-dtype", "bfloat16"]
    one = finetune(model_dir, data, tmp_path / "one", *bf16)
    assert one.returncode == 0, one.stderr
    two = finetune(model_dir, data, tmp_path / "two", "--nproc", 2, "--tensor-parallel", 2, *bf16)
    assert two.returncode == 0, two.stderr + two.stdout
    np.testing.assert_allclose(losses(tmp_path / "two"), losses(tmp_path / "one"), rtol=1e-3)


def test_pretraining_from_a_config_split_two_ways_gives_one_processs_losses(model_dir, tmp_path):
    """A new model drawn from the seed, then split: the ranks start from the one-device weights."""
    corpus = write_jsonl(tmp_path / "corpus.jsonl", [{"text": f"{a} {b}"} for a, b in
                                                     [("The capital of France is Paris.", "Hello world!"),
                                                      ("the quick brown fox jumps over", "1234567890")] * 6])
    common = ["pretrain", "--config", model_dir / "config.json", "--tokenizer", model_dir, "--data", corpus,
              "--max-length", 16, "--batch-size", 2, "--max-steps", 3, "--lr", "3e-3"]
    one = run_anychip(*common, "--output", tmp_path / "one")
    assert one.returncode == 0, one.stderr
    two = run_anychip(*common, "--nproc", 2, "--tensor-parallel", 2, "--output", tmp_path / "two")
    assert two.returncode == 0, two.stderr + two.stdout
    np.testing.assert_allclose(losses(tmp_path / "two"), losses(tmp_path / "one"), rtol=1e-5)
