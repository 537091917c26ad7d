"""Training checkpoints: exact round trip, retention, same-step replacement, what counts as a
checkpoint, errors naming the file, and a process SIGKILLed at each stage of a save leaving the
previous checkpoint intact."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import numpy as np
import pytest

from anychip_models.training import checkpoints
from anychip_models.training.checkpoints import (FAULT_ENV, FAULT_STAGES, CheckpointStateError, latest_checkpoint,
                                                 load_checkpoint_state, save_checkpoint)


def contents(step: int):
    """A model, optimizer and state that differ per step, in every stored dtype."""
    rng = np.random.default_rng(step)
    model = {"model.embed_tokens.weight": rng.standard_normal((17, 8)).astype(np.float32),
             "model.norm.weight": rng.standard_normal(8).astype(np.float32),
             "bf16_bits": rng.integers(0, 2**16, (3, 5), dtype=np.uint16)}
    optimizer = {"exp_avg.w": rng.standard_normal((17, 8)).astype(np.float32),
                 "exp_avg_sq.w": rng.random((17, 8)).astype(np.float64),
                 "step": np.array([step], np.int64), "i32": np.arange(4, dtype=np.int32),
                 "u8": np.arange(6, dtype=np.uint8), "i8": -np.arange(6, dtype=np.int8)}
    state = {"step": step, "scheduler": {"lr": 1e-4 * step, "warmup": 10}, "rng": {"seed": 7, "pos": [1, 2, 3]},
             "data": {"epoch": 0, "index": step * 4}, "metrics": {"loss": 2.5 / (step + 1)}}
    return model, optimizer, state


def assert_same(loaded, expected):
    for got, want in zip(loaded[:2], expected[:2]):
        assert got.keys() == want.keys()
        for name in want:
            assert got[name].dtype == want[name].dtype, name
            np.testing.assert_array_equal(got[name], want[name], err_msg=name)
    assert loaded[2] == expected[2]


def steps(output):
    return sorted(int(p.name.split("-")[1]) for p in output.iterdir() if p.name.startswith("checkpoint-"))


def test_round_trip(tmp_path):
    expected = contents(5)
    extra = {"config.json": b'{"model_type": "llama"}', "tokenizer.json": b"{}"}
    path = save_checkpoint(tmp_path / "out", 5, *expected, extra=extra)
    assert path == tmp_path / "out" / "checkpoint-5"
    assert {p.name for p in path.iterdir()} == {"model.safetensors", "model.safetensors.index.json",
                                                 "optimizer.safetensors", "trainer_state.json", "COMPLETE", *extra}
    assert (path / "config.json").read_bytes() == extra["config.json"]
    index = json.loads((path / "model.safetensors.index.json").read_text())
    assert set(index["weight_map"]) == set(expected[0])
    assert_same(load_checkpoint_state(path), expected)
    assert_same(load_checkpoint_state(tmp_path / "out"), expected)  # the output folder: its latest
    assert latest_checkpoint(tmp_path / "out") == path
    assert [p.name for p in (tmp_path / "out").iterdir()] == ["checkpoint-5"]  # nothing left over


def test_non_contiguous_arrays_and_numpy_scalars(tmp_path):
    w = np.arange(24, dtype=np.float32).reshape(4, 6)
    path = save_checkpoint(tmp_path, 1, {"w": w.T, "s": w[:, ::2]}, {}, {"loss": np.float32(0.5), "n": np.int64(3)})
    model, optimizer, state = load_checkpoint_state(path)
    np.testing.assert_array_equal(model["w"], w.T)
    np.testing.assert_array_equal(model["s"], w[:, ::2])
    assert optimizer == {} and state == {"loss": 0.5, "n": 3}


def test_refuses_bad_input_before_writing(tmp_path):
    with pytest.raises(TypeError, match="model tensor 'half'.*float16"):
        save_checkpoint(tmp_path, 1, {"half": np.zeros(2, np.float16)}, {}, {})
    with pytest.raises(TypeError, match="optimizer tensor 'b'.*bool"):
        save_checkpoint(tmp_path, 1, {}, {"b": np.zeros(2, bool)}, {})
    with pytest.raises(TypeError, match="JSON"):
        save_checkpoint(tmp_path, 1, {}, {}, {"rng": object()})
    with pytest.raises(ValueError, match="overwrite"):
        save_checkpoint(tmp_path, 1, {}, {}, {}, extra={"trainer_state.json": b"{}"})
    with pytest.raises(ValueError, match="plain file name"):
        save_checkpoint(tmp_path, 1, {}, {}, {}, extra={"../x": b""})
    assert list(tmp_path.iterdir()) == []


def test_retention(tmp_path):
    for step in range(1, 6):
        save_checkpoint(tmp_path, step * 10, *contents(step), keep=2)
        assert steps(tmp_path) == [s * 10 for s in range(max(1, step - 1), step + 1)]
    save_checkpoint(tmp_path, 5, *contents(5), keep=2)  # the new one is never deleted, even the oldest
    assert steps(tmp_path) == [5, 50]
    save_checkpoint(tmp_path, 60, *contents(6), keep=1)
    assert steps(tmp_path) == [60]
    for step in (70, 80, 90):
        save_checkpoint(tmp_path, step, *contents(step), keep=None)
    assert steps(tmp_path) == [60, 70, 80, 90]
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]


@pytest.mark.parametrize("exchange", [True, False], ids=["renameat2", "rename-aside"])
def test_same_step_overwrite(tmp_path, monkeypatch, exchange):
    if not exchange:  # where the OS cannot swap two folders in one step
        monkeypatch.setattr(checkpoints, "_exchange", lambda a, b: False)
    save_checkpoint(tmp_path, 3, *contents(1))
    save_checkpoint(tmp_path, 3, *contents(2), extra={"note.txt": b"new"})
    assert_same(load_checkpoint_state(tmp_path), contents(2))
    assert [p.name for p in tmp_path.iterdir()] == ["checkpoint-3"]


def test_replaced_checkpoint_is_found_and_restored(tmp_path):
    """Killed between moving the old same-step checkpoint aside and renaming the new one in: the
    old one still counts, and the next save puts it back."""
    save_checkpoint(tmp_path, 3, *contents(3))
    (tmp_path / "checkpoint-3").rename(tmp_path / ".old-checkpoint-3-12345")
    assert latest_checkpoint(tmp_path) == tmp_path / ".old-checkpoint-3-12345"
    assert_same(load_checkpoint_state(tmp_path), contents(3))
    save_checkpoint(tmp_path, 4, *contents(4))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint-3", "checkpoint-4"]
    assert_same(load_checkpoint_state(tmp_path / "checkpoint-3"), contents(3))


def test_latest_ignores_incomplete_and_temporary_folders(tmp_path):
    assert latest_checkpoint(tmp_path) is None and latest_checkpoint(tmp_path / "absent") is None
    save_checkpoint(tmp_path, 2, *contents(2))
    (tmp_path / "checkpoint-9").mkdir()  # no marker
    (tmp_path / "checkpoint-9" / "trainer_state.json").write_text("{}")
    tmp = tmp_path / ".tmp-checkpoint-10-999"
    tmp.mkdir()
    (tmp / "COMPLETE").write_text("{}")
    (tmp_path / "checkpoint-final").mkdir()
    (tmp_path / "checkpoint-final" / "COMPLETE").write_text("{}")
    assert latest_checkpoint(tmp_path) == tmp_path / "checkpoint-2"
    save_checkpoint(tmp_path, 3, *contents(3), keep=1)  # stale temp removed; the unknown folders kept
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint-3", "checkpoint-9", "checkpoint-final"]


def test_errors_name_the_file(tmp_path):
    def fails(path, file, why):
        with pytest.raises(CheckpointStateError, match=re.escape(str(file)) + ".*" + why):
            load_checkpoint_state(path)

    fails(tmp_path / "absent", tmp_path / "absent", "no such")
    fails(tmp_path, tmp_path, "no complete checkpoint")
    ckpt = save_checkpoint(tmp_path, 1, *contents(1))
    model = (ckpt / "model.safetensors").read_bytes()

    (ckpt / "model.safetensors").write_bytes(model[:-10])
    fails(ckpt, ckpt / "model.safetensors", "truncated")
    (ckpt / "model.safetensors").write_bytes(b"\xff" * len(model))  # same size, garbage
    fails(ckpt, ckpt / "model.safetensors", "safetensors")
    (ckpt / "model.safetensors").write_bytes(model)

    state = (ckpt / "trainer_state.json").read_bytes()
    (ckpt / "trainer_state.json").write_bytes(b"{" + b" " * (len(state) - 1))
    fails(ckpt, ckpt / "trainer_state.json", "JSON")
    (ckpt / "trainer_state.json").write_bytes(state)

    (ckpt / "optimizer.safetensors").unlink()
    fails(ckpt, ckpt / "optimizer.safetensors", "missing")
    (ckpt / "COMPLETE").unlink()
    fails(ckpt, ckpt / "COMPLETE", "incomplete")
    fails(tmp_path, tmp_path, "no complete checkpoint")


KILLED_SAVE = """
import os, sys
sys.path.insert(0, {tests!r})
from test_training_checkpoints import contents
from anychip_models.training.checkpoints import FAULT_ENV, save_checkpoint
stage = os.environ.pop(FAULT_ENV)
save_checkpoint(sys.argv[1], 1, *contents(1), extra={{"config.json": b"{{}}"}})
os.environ[FAULT_ENV] = stage
save_checkpoint(sys.argv[1], 2, *contents(2), keep=1)
print("not killed")
"""


@pytest.mark.parametrize("stage", FAULT_STAGES)
def test_killed_mid_save_leaves_the_previous_checkpoint(tmp_path, stage):
    code = KILLED_SAVE.format(tests=os.path.dirname(__file__))
    run = subprocess.run([sys.executable, "-c", code, str(tmp_path)], env={**os.environ, FAULT_ENV: stage},
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == -9, run.stdout + run.stderr
    assert latest_checkpoint(tmp_path) == tmp_path / "checkpoint-1"
    assert_same(load_checkpoint_state(tmp_path), contents(1))
    leftovers = [p.name for p in tmp_path.iterdir() if p.name.startswith(".tmp-checkpoint-2-")]
    assert len(leftovers) == 1
    save_checkpoint(tmp_path, 2, *contents(2), keep=1)
    assert [p.name for p in tmp_path.iterdir()] == ["checkpoint-2"]
    assert_same(load_checkpoint_state(tmp_path), contents(2))


def test_unknown_fault_stage_is_refused(tmp_path, monkeypatch):
    monkeypatch.setenv(FAULT_ENV, "halfway")
    with pytest.raises(ValueError, match="halfway"):
        save_checkpoint(tmp_path, 1, {}, {}, {})
