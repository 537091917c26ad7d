"""Making anychip devices Paddle CustomDevices.

Paddle loads CustomDevice plugins only once, at ``import paddle``, from $CUSTOM_DEVICE_ROOT. So
before Paddle is imported, anychip writes a folder with one copy of the generic bridge
(``libanychip_paddle_bridge.so``) per available device, each beside a config naming the
device's runtime library, and points $CUSTOM_DEVICE_ROOT at it. Copies, because the dynamic
loader would hand every link to the same file the same single instance.
"""

from __future__ import annotations

import functools
import hashlib
import os
import re
import shutil
import sys
import warnings
from pathlib import Path

from . import fallback, paddle_kernels
from .errors import PaddleImportOrderError
from .host_memory import keep_freed_host_memory
from .host_threads import num_threads
from .native import library_path
from .plugins import registry
from .runtime.errors import AnychipError, DeviceOutOfMemoryError

_paddle = None
_root: Path | None = None  # the $CUSTOM_DEVICE_ROOT this process's Paddle loaded


def cache_dir() -> Path:
    return Path(os.environ.get("ANYCHIP_CACHE_DIR", Path.home() / ".cache" / "anychip"))


def _bridged_devices() -> dict[str, dict]:
    """Config of every device that has a Paddle type and whose runtime comes up here."""
    from .devices import describe

    configs = {}
    for name, spec in sorted(registry().devices.items()):
        if spec.paddle_type is None:
            continue
        info = describe(name)
        if info.status == "unavailable" or info.count == 0:
            continue
        configs[name] = {
            "name": name,
            "paddle_type": spec.paddle_type,
            "sub_type": "simulated" if info.status == "simulated" else "hardware",
            "library": spec.library,
            "symbol": spec.symbol,
            "options": spec.options_string(),
        }
    return configs


def _write_root(configs: dict[str, dict], kernel_libs: dict[str, Path]) -> Path:
    bridge = library_path("anychip_paddle_bridge")
    if not bridge.exists():
        raise FileNotFoundError(
            f"{bridge} is missing: anychip was built without Paddle's headers. Install "
            "paddlepaddle first, then reinstall anychip (see README)")
    text = {n: "".join(f"{k}={v}\n" for k, v in c.items()) for n, c in configs.items()}
    # kernel libraries' paths are content hashes (anychip.paddle_kernels), so they key the root too
    kernels = sorted((n, str(p)) for n, p in kernel_libs.items())
    digest = hashlib.sha256(bridge.read_bytes() + repr((sorted(text.items()), kernels)).encode()).hexdigest()[:16]
    root = cache_dir() / "paddle_devices" / digest
    if not root.exists():
        tmp = root.with_name(f"{digest}.tmp{os.getpid()}")
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        for name, conf in text.items():
            lib = tmp / f"libanychip_{name}.so"
            shutil.copyfile(bridge, lib)
            (tmp / f"libanychip_{name}.so.conf").write_text(conf)
        for name, path in kernel_libs.items():
            shutil.copyfile(path, tmp / f"libanychip_{name}_kernels.so")
        try:
            tmp.rename(root)  # atomic: a concurrent process sees all of it or none
        except OSError:
            shutil.rmtree(tmp, ignore_errors=True)  # another process won the race
    return root


def import_paddle():
    """Imports Paddle with every available anychip device registered in it."""
    global _paddle
    if _paddle is not None:
        return _paddle
    if "paddle" in sys.modules:
        raise PaddleImportOrderError(
            "paddle was imported before anychip could register its devices; Paddle loads "
            "CustomDevices only at import. Call anychip.set_device(...) (or "
            "anychip.paddle_frontend.import_paddle()) before `import paddle`")
    global _root
    keep_freed_host_memory()
    configs = _bridged_devices()
    _root = _write_root(configs, paddle_kernels.libraries(registry().kernels, configs))
    os.environ["CUSTOM_DEVICE_ROOT"] = str(_root)
    count_fallbacks = bool(configs) and not fallback.strict()
    # Strided views need a `contiguous` kernel on a device to become dense again, and Paddle has
    # no CPU fallback for it: a chip without one could not run the ops' references. Dense results
    # for slices and splits instead (their consumers copy non-contiguous inputs anyway).
    os.environ.setdefault("FLAGS_use_stride_kernel", "0")
    if fallback.strict():
        os.environ["FLAGS_enable_api_kernel_fallback"] = "0"
    elif count_fallbacks:
        fallback.start_monitor({c["paddle_type"]: n for n, c in configs.items()})
    with warnings.catch_warnings():
        # Paddle warns about ccache at import for its JIT extension builder, which anychip doesn't use.
        warnings.filterwarnings("ignore", message="No ccache found")
        import paddle

    if count_fallbacks:
        fallback.log_paddle_fallbacks(paddle)
    # Paddle makes the first CustomDevice it loaded its default; stay on the CPU, like a plain
    # Paddle install, until anychip.set_device chooses.
    paddle.set_device("cpu")
    # Paddle's import pins its CPU ops to one thread (OMP_NUM_THREADS=1); give them the threads
    # anychip's kernels use, so a model mixing both runs neither half single-threaded.
    paddle.base.core.set_num_threads(num_threads())

    _paddle = paddle
    return paddle


@functools.lru_cache(maxsize=None)
def place(name: str, index: int):
    """The Paddle place of anychip device ``name:index`` (one object per device: every op's
    outputs need it, and building one costs ~0.5 us)."""
    paddle = import_paddle()
    spec = registry().spec(name)
    if spec.paddle_type is None:
        return paddle.CPUPlace()
    return paddle.CustomPlace(spec.paddle_type, index)


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
    from .runtime.open import open_runtime
    from .selection import get_device

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
    spec = registry().spec(name)
    return "cpu" if spec.paddle_type is None else f"{spec.paddle_type}:{index}"
