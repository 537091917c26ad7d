"""Data parallelism (`--nproc N`): ranks started through paddle.distributed.launch give, step for
step, the losses of one process taking the same global batch; a checkpoint saved by 2 ranks
resumes on 1 and the other way round; a rank that dies at a save ends the job with an error and
leaves the previous checkpoint intact; bad flags are refused before any rank starts. On a simulated
chip the ranks sum their gradients through Paddle's xccl collectives, routed by the bridge to the
chip's own, in strict mode; a rank that never arrives or dies ends the job naming it."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from anychip_models.training import checkpoints
from training_helpers import finetune_tiny, losses, sft_folder


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return sft_folder(tmp_path_factory.mktemp("sft-data"))


finetune = finetune_tiny


def eval_losses(output) -> list[float]:
    return [r["eval_loss"] for r in map(json.loads, (output / "metrics.jsonl").read_text().splitlines())
            if "eval_loss" in r]


@pytest.mark.parametrize("method", [[], ["--lora"], ["--prefix-tuning", "--num-prefix-tokens", "4"]],
                         ids=["full", "lora", "prefix"])
def test_two_ranks_give_the_losses_of_one_process_with_the_same_global_batch(model_dir, data, tmp_path, method):
    one = finetune(model_dir, data, tmp_path / "one", "--grad-accum", 2, *method)
    assert one.returncode == 0, one.stderr
    two = finetune(model_dir, data, tmp_path / "two", "--nproc", 2, *method)
    assert two.returncode == 0, two.stderr + two.stdout
    assert len(losses(tmp_path / "two")) == 4
    np.testing.assert_allclose(losses(tmp_path / "two"), losses(tmp_path / "one"), rtol=1e-5)
    np.testing.assert_allclose(eval_losses(tmp_path / "two"), eval_losses(tmp_path / "one"), rtol=1e-5)
    # rank 0 alone wrote the folder: one log line per step and evaluation, a loadable model
    records = [json.loads(line) for line in (tmp_path / "two" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [0, 1, 2, 3, 4]
    assert sorted(checkpoints.complete_checkpoints(tmp_path / "two")) == [2, 4]


def test_a_checkpoint_moves_between_world_sizes(model_dir, data, tmp_path):
    straight = finetune(model_dir, data, tmp_path / "straight", "--grad-accum", 2, "--lora")
    assert straight.returncode == 0, straight.stderr
    for first, then, name in ((["--nproc", 2], ["--grad-accum", 2], "two-then-one"),
                              (["--grad-accum", 2], ["--nproc", 2], "one-then-two")):
        out = tmp_path / name
        assert finetune(model_dir, data, out, "--lora", *first).returncode == 0
        checkpoints.remove_tree(out / "checkpoint-4")
        resumed = finetune(model_dir, data, out, "--lora", "--resume", *then)
        assert resumed.returncode == 0, resumed.stderr + resumed.stdout
        np.testing.assert_allclose(losses(out), losses(tmp_path / "straight"), rtol=1e-5)


def test_a_rank_dying_at_a_save_fails_the_job_and_keeps_the_last_checkpoint(model_dir, data, tmp_path):
    out = tmp_path / "run"
    died = finetune(model_dir, data, out, "--nproc", 2, "--lora", env={"ANYCHIP_FAULT_CHECKPOINT": "optimizer@4"})
    assert died.returncode != 0
    assert "a rank failed" in died.stderr
    assert sorted(checkpoints.complete_checkpoints(out)) == [2]
    resumed = finetune(model_dir, data, out, "--nproc", 2, "--lora", "--resume")
    assert resumed.returncode == 0, resumed.stderr + resumed.stdout
    straight = finetune(model_dir, data, tmp_path / "straight", "--grad-accum", 2, "--lora")
    assert straight.returncode == 0, straight.stderr
    np.testing.assert_allclose(losses(out), losses(tmp_path / "straight"), rtol=1e-5)


def test_bad_nproc_flags_are_refused_before_any_rank_starts(model_dir, data, tmp_path):
    zero = finetune(model_dir, data, tmp_path / "a", "--nproc", 0)
    assert zero.returncode != 0 and "--nproc must be >= 1, got 0" in zero.stderr
    indexed = finetune(model_dir, data, tmp_path / "b", "--nproc", 2, "--device", "npu:1")
    assert indexed.returncode != 0 and "--device npu:1 names one device" in indexed.stderr
    assert "LAUNCH INFO" not in indexed.stdout + indexed.stderr
    many = finetune(model_dir, data, tmp_path / "c", "--nproc", 3, "--device", "npu")
    assert many.returncode != 0 and "--nproc 3 on npu: rank r takes npu:r, and npu has 2 device(s)" in many.stderr
    assert "LAUNCH INFO" not in many.stdout + many.stderr


@pytest.mark.parametrize("method", [[], ["--lora"]], ids=["full", "lora"])
def test_two_npu_ranks_in_strict_mode_give_the_losses_of_one_npu(model_dir, data, tmp_path, method):
    """The gradient all-reduce runs on the chip through Paddle's xccl collectives: no fallback."""
    strict = {"ANYCHIP_STRICT": "1"}
    one = finetune(model_dir, data, tmp_path / "one", "--device", "npu", "--grad-accum", 2, *method, env=strict)
    assert one.returncode == 0, one.stderr
    two = finetune(model_dir, data, tmp_path / "two", "--device", "npu", "--nproc", 2, *method, env=strict)
    assert two.returncode == 0, two.stderr + two.stdout
    assert "finetune on npu:0 (simulated)" in two.stdout + two.stderr
    np.testing.assert_allclose(losses(tmp_path / "two"), losses(tmp_path / "one"), rtol=1e-5)
    np.testing.assert_allclose(eval_losses(tmp_path / "two"), eval_losses(tmp_path / "one"), rtol=1e-5)


@pytest.mark.parametrize("chip", ["xpu", "gcu", "dcu"])
def test_every_simulated_chip_trains_on_two_ranks_without_fallback(model_dir, data, tmp_path, chip):
    straight = finetune(model_dir, data, tmp_path / "cpu", "--grad-accum", 2, "--lora")
    assert straight.returncode == 0, straight.stderr
    two = finetune(model_dir, data, tmp_path / chip, "--device", chip, "--nproc", 2, "--lora",
                   env={"ANYCHIP_STRICT": "1"})
    assert two.returncode == 0, two.stderr + two.stdout
    np.testing.assert_allclose(losses(tmp_path / chip), losses(tmp_path / "cpu"), rtol=1e-5)


def test_a_rank_that_never_arrives_fails_the_others_within_the_timeout(model_dir, data, tmp_path):
    """Rank 1 hangs before step 3's gradient all-reduce: rank 0's collective gives up after
    ANYCHIP_COLLECTIVE_TIMEOUT naming rank 1, the job ends non-zero, checkpoint 2 is intact and
    resumes on one process to the losses of an uninterrupted run."""
    out = tmp_path / "run"
    hung = finetune(model_dir, data, out, "--device", "npu", "--nproc", 2, "--lora",
                    env={"ANYCHIP_FAULT_RANK": "1@3:hang", "ANYCHIP_COLLECTIVE_TIMEOUT": "5"})
    assert hung.returncode != 0
    logs = hung.stderr.split("every rank's log is in ")[-1].strip()
    rank0 = (Path(logs) / "workerlog.0").read_text(errors="replace")
    assert "all_reduce on rank 0 of 2 timed out waiting for the other ranks" in rank0
    assert "not arrived: 1 (ANYCHIP_COLLECTIVE_TIMEOUT=5 s)" in rank0
    assert sorted(checkpoints.complete_checkpoints(out)) == [2]
    resumed = finetune(model_dir, data, out, "--lora", "--resume", "--grad-accum", 2)
    assert resumed.returncode == 0, resumed.stderr
    straight = finetune(model_dir, data, tmp_path / "straight", "--grad-accum", 2, "--lora")
    assert straight.returncode == 0, straight.stderr
    np.testing.assert_allclose(losses(out), losses(tmp_path / "straight"), rtol=1e-5)


def test_a_rank_killed_mid_step_ends_the_job_naming_it(model_dir, data, tmp_path):
    out = tmp_path / "run"
    killed = finetune(model_dir, data, out, "--device", "npu", "--nproc", 2, "--lora",
                      env={"ANYCHIP_FAULT_RANK": "1@3", "ANYCHIP_COLLECTIVE_TIMEOUT": "5"})
    assert killed.returncode != 0
    assert "Container rank 1 status failed" in killed.stdout + killed.stderr  # Paddle's launcher names it
    assert "a rank failed" in killed.stderr
    assert sorted(checkpoints.complete_checkpoints(out)) == [2]


@pytest.mark.parametrize("stage", ["stage1", "stage2"])
def test_sharding_gives_the_losses_of_plain_data_parallelism_and_whole_checkpoints(model_dir, data, tmp_path, stage):
    """The optimizer partitioned across 2 ranks (its state; stage 2 the gradients too): the same
    losses as plain data parallelism within 1e-6, a checkpoint holding every moment, which
    resumes on one process to the same losses."""
    plain = finetune(model_dir, data, tmp_path / "plain", "--nproc", 2)
    assert plain.returncode == 0, plain.stderr
    out = tmp_path / stage
    sharded = finetune(model_dir, data, out, "--nproc", 2, "--sharding", stage)
    assert sharded.returncode == 0, sharded.stderr + sharded.stdout
    np.testing.assert_allclose(losses(out), losses(tmp_path / "plain"), rtol=1e-6)
    np.testing.assert_allclose(eval_losses(out), eval_losses(tmp_path / "plain"), rtol=1e-6)
    whole = checkpoints.load_checkpoint_state(checkpoints.latest_checkpoint(tmp_path / "plain"))[1]
    gathered = checkpoints.load_checkpoint_state(checkpoints.latest_checkpoint(out))[1]
    assert sorted(gathered) == sorted(whole)
    for key in whole:
        np.testing.assert_allclose(gathered[key], whole[key], rtol=1e-4, atol=1e-7, err_msg=key)
    checkpoints.remove_tree(out / "checkpoint-4")
    resumed = finetune(model_dir, data, out, "--resume", "--grad-accum", 2)
    assert resumed.returncode == 0, resumed.stderr
    np.testing.assert_allclose(losses(out), losses(tmp_path / "plain"), rtol=1e-5)


def test_sharding_stage2_on_npu_ranks_in_strict_mode_resumes_from_one_process(model_dir, data, tmp_path):
    """Reduce and broadcast go through the chip's collectives; a one-process checkpoint is
    partitioned on resume."""
    straight = finetune(model_dir, data, tmp_path / "straight", "--grad-accum", 2, "--lora")
    assert straight.returncode == 0, straight.stderr
    out = tmp_path / "run"
    assert finetune(model_dir, data, out, "--grad-accum", 2, "--lora").returncode == 0
    checkpoints.remove_tree(out / "checkpoint-4")
    resumed = finetune(model_dir, data, out, "--lora", "--resume", "--device", "npu", "--nproc", 2,
                       "--sharding", "stage2", env={"ANYCHIP_STRICT": "1"})
    assert resumed.returncode == 0, resumed.stderr + resumed.stdout
    np.testing.assert_allclose(losses(out), losses(tmp_path / "straight"), rtol=1e-5)


def test_sharding_without_ranks_is_refused(model_dir, data, tmp_path):
    alone = finetune(model_dir, data, tmp_path / "a", "--sharding", "stage1")
    assert alone.returncode != 0
    assert "--sharding stage1 partitions the optimizer across ranks: pass --nproc N (N >= 2)" in alone.stderr
