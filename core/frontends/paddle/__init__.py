"""Paddle with anychip's devices in it, whichever of the two was imported first.

Paddle loads CustomDevice plugins only once, at ``import paddle``, from $CUSTOM_DEVICE_ROOT
(``root`` says what that folder holds and where it is). ``import_paddle`` imports Paddle
from the folder that matches the devices and kernels registered now; when the script imported
Paddle first (every PaddleNLP script does), it takes that Paddle as it is, with the devices
``pip install`` put in Paddle's own folder, and sets at run time what it would otherwise have
set before the import.
"""

from __future__ import annotations

import functools
import os
import re
import sys
import warnings
from pathlib import Path

from ... import fallback
from ...errors import PaddleImportOrderError
from ...host_memory import keep_freed_host_memory
from ...host_threads import num_threads
from ...plugins import registry
from ...runtime.errors import AnychipError, DeviceOutOfMemoryError

_paddle = None
_root: Path | None = None  # the $CUSTOM_DEVICE_ROOT this process's Paddle loaded
_loaded_types: frozenset[str] = frozenset()  # the CustomDevice types it has (fixed at its import)


def import_paddle():
    """Paddle, with every available anychip device registered in it: imported now from the
    right CustomDevice folder, or, when the script imported Paddle first, taken as it is."""
    global _paddle, _root, _loaded_types
    if _paddle is not None:
        return _paddle
    keep_freed_host_memory()
    if "paddle" in sys.modules:
        paddle = _adopt(sys.modules["paddle"])
    else:
        # Imported where it is used, not with the package: `python -m anychip.frontends.paddle.root`
        # runs that module as __main__, and one its package had imported already made runpy warn.
        from . import root as paddle_root

        _root = paddle_root.prepare()
        os.environ["CUSTOM_DEVICE_ROOT"] = str(_root)
        # Strided views need a `contiguous` kernel on a device to become dense again, and Paddle
        # has no CPU fallback for it: dense results for slices and splits instead (their
        # consumers copy non-contiguous inputs anyway).
        os.environ.setdefault("FLAGS_use_stride_kernel", "0")
        if fallback.strict():
            os.environ["FLAGS_enable_api_kernel_fallback"] = "0"
        # Started before the import, so that the filter also keeps Paddle's loading chatter about
        # anychip's devices off the user's terminal.
        _start_counting(registry().devices)
        with warnings.catch_warnings():
            # Paddle warns about ccache at import for its JIT extension builder, which anychip doesn't use.
            warnings.filterwarnings("ignore", message="No ccache found")
            import paddle
        # Paddle makes the first CustomDevice it loaded its default; stay on the CPU, like a plain
        # Paddle install, until anychip.set_device chooses.
        paddle.set_device("cpu")
    _loaded_types = frozenset(paddle.device.get_all_custom_device_type() or ())
    if _start_counting({n: s for n, s in registry().devices.items() if s.paddle_type in _loaded_types}):
        fallback.log_paddle_fallbacks(paddle)
    # Paddle's import pins its CPU ops to one thread (OMP_NUM_THREADS=1); give them the threads
    # anychip's kernels use, so a model mixing both runs neither half single-threaded.
    paddle.base.core.set_num_threads(num_threads())
    _paddle = paddle
    return paddle


def _adopt(paddle):
    """The Paddle a script imported before anychip, with the settings import_paddle makes
    before an import of its own made at run time instead. Its devices are those its
    CustomDevice folder held at import (``place`` refuses one it lacks)."""
    from . import root as paddle_root  # (as in import_paddle)

    global _root
    _root = Path(os.environ.get("CUSTOM_DEVICE_ROOT") or paddle_root.default_root())
    flags = {"FLAGS_use_stride_kernel": False}  # as above (views made before this call stay strided)
    if fallback.strict():
        flags["FLAGS_enable_api_kernel_fallback"] = False
    paddle.set_flags(flags)
    try:
        current = paddle_root.holds(_root, paddle_root.root_files())
    except OSError:
        current = False
    if not current:
        print(f"anychip: the CustomDevice folder Paddle loaded ({_root}) does not match the anychip devices and "
              "kernels installed now: run `python -m anychip.frontends.paddle.root` to update it, or import anychip "
              "before paddle", file=sys.stderr)
    return paddle


def _start_counting(devices: dict) -> bool:
    """Starts counting Paddle's CPU fallbacks on ``devices`` (anychip name -> spec), unless
    there is none with a Paddle type or strict mode makes a fallback an error; returns whether
    counting is on (a second call finds it started)."""
    names = {spec.paddle_type: name for name, spec in devices.items() if spec.paddle_type}
    if not names or fallback.strict():
        return False
    fallback.start_monitor(names)
    return True


@functools.lru_cache(maxsize=None)
def place(name: str, index: int):
    """The Paddle place of anychip device ``name:index`` (one object per device: every op's
    outputs need it, and building one costs ~0.5 us)."""
    paddle = import_paddle()
    spec = registry().spec(name)
    if spec.paddle_type is None:
        return paddle.CPUPlace()
    _require_loaded(paddle, name, spec.paddle_type)
    return paddle.CustomPlace(spec.paddle_type, index)


def _require_loaded(paddle, name: str, paddle_type: str) -> None:
    if paddle_type not in _loaded_types:
        raise PaddleImportOrderError(
            f"device {name!r} (Paddle type {paddle_type}) is not among the CustomDevices Paddle loaded at "
            f"import from {_root}: Paddle was imported before anychip and its folder lacks this device (installed "
            "since, or its runtime did not come up then). Run `python -m anychip.frontends.paddle.root` to update the "
            "folder, or import anychip before paddle")


def bridge_library(name: str) -> Path:
    """The copy of the Paddle bridge that this process's Paddle loaded for device ``name``."""
    import_paddle()
    lib = _root / f"libanychip_{name}.so"
    if not lib.exists():
        raise FileNotFoundError(f"device {name!r} has no Paddle bridge in {_root}")
    return lib


# How Paddle reports a failed CustomDevice call: the C_Status alone, without the plugin's reason.
_CUSTOM_DEVICE_STATUS = re.compile(r"CustomDevice error, the error code is : (\d+)")
_C_FAILED = 2  # device_ext.h's "resource exhausted": the bridge returns it for out of memory


def device_error(exc: BaseException) -> AnychipError | None:
    """The anychip error behind ``exc`` when it is Paddle's report of a failed call into the
    current device (e.g. an allocation past its memory), else None. The reason is the runtime's
    last error: kept per thread, and the failed call ran on this one."""
    found = _CUSTOM_DEVICE_STATUS.search(str(exc)) if isinstance(exc, OSError) else None
    if found is None:
        return None
    from ...runtime.open import open_runtime
    from ...selection import get_device

    name = get_device().partition(":")[0]
    reason = open_runtime(name).last_error() or f"{name}: a device call failed ({found[0]})"
    return (DeviceOutOfMemoryError if int(found[1]) == _C_FAILED else AnychipError)(reason)


def device_of_place(place) -> tuple[str, int]:
    """The anychip device (name, index) of a Paddle place."""
    if place.is_cpu_place():
        return "cpu", 0
    if place.is_custom_place():
        name = registry().by_paddle_type(place.custom_device_type())
        if name is not None:
            return name, place.custom_device_id()
    raise ValueError(f"{place} is not an anychip device")


def paddle_device_string(name: str, index: int) -> str:
    """Paddle's name of anychip device ``name:index`` (raises if this process's Paddle lacks it)."""
    spec = registry().spec(name)
    if spec.paddle_type is None:
        return "cpu"
    _require_loaded(import_paddle(), name, spec.paddle_type)
    return f"{spec.paddle_type}:{index}"
