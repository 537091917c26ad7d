"""Training checkpoints on disk: numpy arrays and JSON only, so one saved on any device loads on any
other. One checkpoint is a folder ``OUTPUT/checkpoint-<step>/``:

    model.safetensors               the caller's model tensors (names as given)
    model.safetensors.index.json    lists them, so a Hugging Face loader reads model.safetensors alone
    optimizer.safetensors           optimizer state (moments, step counts)
    trainer_state.json              step, scheduler, RNG, data position, metrics...
    <extra files>                   e.g. config.json, tokenizer.json: the folder is then a model folder
    COMPLETE                        written last: file names and sizes (a folder without it is not a checkpoint)

A save writes ``OUTPUT/.tmp-checkpoint-<step>-<pid>/``, fsyncs every file and the folder, then renames
it into place (an existing same-step checkpoint is swapped out atomically, so one of the two is always
complete), fsyncs OUTPUT, and only then deletes checkpoints beyond the retention limit. A process
killed at any point leaves the previous checkpoints intact; its ``.tmp-*`` folder is never read as a
checkpoint and is removed by the next save. One process saves into an OUTPUT at a time.

Fault injection (for tests): ``ANYCHIP_FAULT_CHECKPOINT=<stage>`` makes the saving process SIGKILL
itself right after that stage is written: ``model``, ``optimizer``, ``state`` (its file is fsynced)
or ``before-rename`` (the temporary folder is complete, marker included, but not yet renamed);
``<stage>@<step>`` arms it for the checkpoint of that step only.
"""

from __future__ import annotations

import ctypes
import errno
import json
import os
import re
import shutil
import signal
import sys
from pathlib import Path

import numpy as np
from safetensors import SafetensorError
from safetensors.numpy import load as st_load, save as st_save

MODEL_FILE = "model.safetensors"
MODEL_INDEX = "model.safetensors.index.json"
OPTIMIZER_FILE = "optimizer.safetensors"
STATE_FILE = "trainer_state.json"
MARKER = "COMPLETE"
RESERVED = (MODEL_FILE, MODEL_INDEX, OPTIMIZER_FILE, STATE_FILE, MARKER)

DTYPES = tuple(np.dtype(t) for t in (np.float32, np.float64, np.int64, np.int32, np.uint8, np.int8, np.uint16))
FAULT_ENV = "ANYCHIP_FAULT_CHECKPOINT"
FAULT_STAGES = ("model", "optimizer", "state", "before-rename")

_CHECKPOINT = re.compile(r"checkpoint-(\d+)")
_REPLACED = re.compile(r"\.old-checkpoint-(\d+)-\d+")  # a same-step checkpoint being swapped out (fallback path)


class CheckpointStateError(ValueError):
    """A checkpoint that cannot be loaded; the message names the file."""


# ---- public API ------------------------------------------------------------------------------------

def save_checkpoint(output_dir, step: int, model: dict[str, np.ndarray], optimizer: dict[str, np.ndarray],
                    state: dict, extra: dict[str, bytes] | None = None, keep: int | None = 3) -> Path:
    """Writes ``OUTPUT/checkpoint-<step>/`` atomically and returns it; then deletes the oldest
    complete checkpoints so that ``keep`` remain, the new one included (None: keep all)."""
    step = int(step)
    if step < 0:
        raise ValueError(f"step must be >= 0, got {step}")
    if keep is not None and keep < 1:
        raise ValueError(f"keep must be >= 1 or None, got {keep}")
    fault = _fault_stage(step)
    extra = dict(extra or {})
    for name, data in extra.items():
        _check_file_name(name)
        if name in RESERVED:
            raise ValueError(f"extra file {name!r} would overwrite the checkpoint's own {name}")
        if not isinstance(data, (bytes, bytearray, memoryview)):
            raise TypeError(f"extra file {name!r}: expected bytes, got {type(data).__name__}")
    # Serialize before touching the disk: a bad tensor or state fails without leaving anything.
    model_bytes = _safetensors_bytes(model, "model")
    optimizer_bytes = _safetensors_bytes(optimizer, "optimizer")
    state_bytes = _state_bytes(state)
    index = {"metadata": {"total_size": sum(np.asarray(v).nbytes for v in model.values())},
             "weight_map": dict.fromkeys(sorted(model), MODEL_FILE)}

    output = Path(output_dir)
    make_dirs(output)
    _clean_stale(output)
    final = output / f"checkpoint-{step}"
    tmp = output / f".tmp-checkpoint-{step}-{os.getpid()}"
    tmp.mkdir()
    try:
        files = [(MODEL_FILE, model_bytes, "model"), (OPTIMIZER_FILE, optimizer_bytes, "optimizer"),
                 (STATE_FILE, state_bytes, "state"), (MODEL_INDEX, _json_bytes(index), None),
                 *((name, bytes(data), None) for name, data in extra.items())]
        for name, data, stage in files:
            write_file(tmp / name, data)
            if fault is not None and stage == fault:
                _die()
        marker = {"step": step, "files": {name: len(data) for name, data, _ in files}}
        write_file(tmp / MARKER, _json_bytes(marker))
        fsync_dir(tmp)
        if fault == "before-rename":
            _die()
        old = publish(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if old is not None:
        remove_tree(old)
    if keep is not None:
        others = sorted((s for s in complete_checkpoints(output, replaced=False) if s != step), reverse=True)
        for s in others[keep - 1:]:
            remove_tree(output / f"checkpoint-{s}")
    return final


def latest_checkpoint(output_dir) -> Path | None:
    """The complete checkpoint with the highest step, or None."""
    found = complete_checkpoints(Path(output_dir))
    return found[max(found)] if found else None


def load_checkpoint_state(path) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray], dict]:
    """(model tensors, optimizer state, trainer state) of a checkpoint folder, or of the latest
    complete checkpoint when ``path`` is the output folder."""
    path = Path(path)
    if not path.is_dir():
        raise CheckpointStateError(f"{path}: no such checkpoint or output folder")
    if not _looks_like_checkpoint(path):
        latest = latest_checkpoint(path)
        if latest is None:
            raise CheckpointStateError(f"{path}: no complete checkpoint-<step> folder in it")
        path = latest
    marker_path = path / MARKER
    if not marker_path.is_file():
        raise CheckpointStateError(f"{marker_path}: missing: the checkpoint is incomplete (its save was interrupted)")
    sizes = _read_json(marker_path).get("files", {})
    for name in (MODEL_FILE, OPTIMIZER_FILE, STATE_FILE, *sizes):
        file = path / name
        if not file.is_file():
            raise CheckpointStateError(f"{file}: missing")
        if name in sizes and file.stat().st_size != sizes[name]:
            raise CheckpointStateError(f"{file}: {file.stat().st_size} bytes, {MARKER} recorded {sizes[name]}: "
                                       "the file is truncated or was changed")
    state = _read_json(path / STATE_FILE)
    if not isinstance(state, dict):
        raise CheckpointStateError(f"{path / STATE_FILE}: not a JSON object")
    return _read_safetensors(path / MODEL_FILE), _read_safetensors(path / OPTIMIZER_FILE), state


# ---- atomic folders (also used by anychip_models.export) -----------------------------------------

def write_file(path: Path, data: bytes) -> None:
    """Writes ``data`` and fsyncs it (not the folder)."""
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def fsync_dir(path: Path) -> None:
    """Makes the entries of ``path`` (creations, renames, deletions) durable."""
    if not hasattr(os, "O_DIRECTORY"):  # Windows: folders cannot be fsynced; renames are journaled
        return
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def make_dirs(path: Path) -> None:
    """mkdir -p, each new folder made durable in its parent."""
    missing = []
    while not path.exists():
        missing.append(path)
        path = path.parent
    for folder in reversed(missing):
        folder.mkdir(exist_ok=True)
        fsync_dir(folder.parent)


def publish(tmp: Path, final: Path) -> Path | None:
    """Renames the complete folder ``tmp`` to ``final`` and fsyncs their parent. An existing
    ``final`` is swapped out in one step where the OS can (Linux renameat2 RENAME_EXCHANGE), else
    renamed aside to ``.old-<name>-<pid>`` first (which :func:`complete_checkpoints` still finds).
    Returns the folder now holding the old contents (for the caller to remove), or None."""
    parent = final.parent
    if not final.exists():
        os.rename(tmp, final)
        fsync_dir(parent)
        return None
    if _exchange(tmp, final):
        fsync_dir(parent)
        return tmp
    aside = parent / f".old-{final.name}-{os.getpid()}"
    os.rename(final, aside)
    os.rename(tmp, final)
    fsync_dir(parent)
    return aside


def remove_checkpoints(output_dir) -> None:
    """Deletes every checkpoint folder of OUTPUT, complete or not, and what killed saves left:
    a fresh run over an earlier run's output must neither resume from them nor keep them beside
    its own."""
    for entry in Path(output_dir).iterdir():
        if entry.is_dir() and (_CHECKPOINT.fullmatch(entry.name) or _REPLACED.fullmatch(entry.name)
                               or entry.name.startswith(".tmp-")):
            shutil.rmtree(entry)


def remove_tree(path: Path) -> None:
    """Deletes a folder: first renamed to a ``.tmp-`` name (one atomic step, so a half-deleted
    folder is never read), then removed; a leftover is cleaned by the next save."""
    doomed = path.parent / f".tmp-deleting-{path.name.lstrip('.')}-{os.getpid()}"
    os.rename(path, doomed)
    fsync_dir(path.parent)
    shutil.rmtree(doomed, ignore_errors=True)


def complete_checkpoints(output: Path, replaced: bool = True) -> dict[int, Path]:
    """step -> folder of every complete checkpoint in ``output``. ``replaced``: also a complete
    same-step checkpoint renamed aside by :func:`publish` when the process died before the new one
    took its name."""
    found: dict[int, Path] = {}
    if not output.is_dir():
        return found
    aside = {}
    for entry in output.iterdir():
        if not (entry / MARKER).is_file():
            continue
        if m := _CHECKPOINT.fullmatch(entry.name):
            found[int(m.group(1))] = entry
        elif replaced and (m := _REPLACED.fullmatch(entry.name)):
            aside[int(m.group(1))] = entry
    return {**aside, **found}


# ---- helpers ----------------------------------------------------------------------------------------

def _fault_stage(step: int) -> str | None:
    value = os.environ.get(FAULT_ENV) or None
    if value is None:
        return None
    stage, _, at = value.partition("@")
    if stage not in FAULT_STAGES or (at and not at.isdigit()):
        raise ValueError(f"{FAULT_ENV}={value!r} is not STAGE or STAGE@STEP (stages: {', '.join(FAULT_STAGES)})")
    return stage if not at or int(at) == step else None


def _die() -> None:
    sys.stdout.flush()
    sys.stderr.flush()
    os.kill(os.getpid(), signal.SIGKILL)


def _check_file_name(name: str) -> None:
    if not name or name in (".", "..") or "/" in name or "\\" in name or name.startswith("."):
        raise ValueError(f"extra file name {name!r} must be a plain file name (no folders, not hidden)")


def _safetensors_bytes(tensors: dict, what: str) -> bytes:
    arrays = {}
    for name, value in tensors.items():
        if not isinstance(name, str):
            raise TypeError(f"{what} tensor name {name!r} is not a string")
        array = np.asarray(value)
        if array.dtype not in DTYPES:
            raise TypeError(f"{what} tensor {name!r} has dtype {array.dtype}, which a checkpoint does not store "
                            f"(supported: {', '.join(str(d) for d in DTYPES)})")
        arrays[name] = np.ascontiguousarray(array)
    return st_save(arrays, metadata={"format": "pt"})


def _json_default(value):
    if isinstance(value, np.generic):
        return value.item()
    raise TypeError(f"trainer state holds a {type(value).__name__}, which JSON cannot store "
                    "(store arrays in the optimizer tensors)")


def _state_bytes(state: dict) -> bytes:
    if not isinstance(state, dict):
        raise TypeError(f"state must be a dict, got {type(state).__name__}")
    return _json_bytes(state)


def _json_bytes(value) -> bytes:
    return (json.dumps(value, indent=2, default=_json_default) + "\n").encode("utf-8")


def _read_json(path: Path):
    try:
        return json.loads(path.read_bytes())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise CheckpointStateError(f"{path}: not valid JSON ({exc})") from exc


def _read_safetensors(path: Path) -> dict[str, np.ndarray]:
    try:
        return st_load(path.read_bytes())
    except (SafetensorError, ValueError, TypeError) as exc:
        raise CheckpointStateError(f"{path}: not a readable safetensors file ({exc})") from exc


def _looks_like_checkpoint(path: Path) -> bool:
    return bool(_CHECKPOINT.fullmatch(path.name) or _REPLACED.fullmatch(path.name)) or any(
        (path / name).exists() for name in (MARKER, STATE_FILE, OPTIMIZER_FILE))


def _clean_stale(output: Path) -> None:
    """Removes what killed saves left: ``.tmp-*`` folders, and ``.old-checkpoint-*`` ones (put back
    in place if their replacement never got its name)."""
    for entry in output.iterdir():
        if entry.name.startswith(".tmp-") and entry.is_dir():
            shutil.rmtree(entry, ignore_errors=True)
        elif (m := _REPLACED.fullmatch(entry.name)) and entry.is_dir():
            final = output / f"checkpoint-{m.group(1)}"
            if final.exists() or not (entry / MARKER).is_file():
                shutil.rmtree(entry, ignore_errors=True)
            else:
                os.rename(entry, final)
    fsync_dir(output)


_RENAME_EXCHANGE = 2
_AT_FDCWD = -100


def _exchange(a: Path, b: Path) -> bool:
    """Atomically swaps two paths (Linux renameat2); False where the OS or filesystem cannot."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        renameat2 = ctypes.CDLL(None, use_errno=True).renameat2
    except (OSError, AttributeError):
        return False
    renameat2.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    if renameat2(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):  # not supported here
        return False
    raise OSError(err, os.strerror(err), str(a), None, str(b))
