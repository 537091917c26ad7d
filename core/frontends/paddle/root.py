"""The CustomDevice folder from which Paddle loads anychip's devices.

Paddle loads CustomDevice plugins once, at ``import paddle``, from every ``.so`` in
$CUSTOM_DEVICE_ROOT, by default ``site-packages/paddle_custom_device/``. For every available
device with a Paddle type, the folder holds:

- ``libanychip_<name>.so``: a copy of the generic bridge (``libanychip_paddle_bridge.so``), and
  ``libanychip_<name>.so.conf`` naming the device's runtime library (see bridge.cc);
- ``kernels/libanychip_<name>_kernels.so``: a copy of the Paddle kernel library, and its
  ``.conf`` naming the Paddle kernels to register and the plugin kernels behind them
  (``kernels``). In a subfolder, loaded by the device's bridge: Paddle takes every library
  of the folder itself for a runtime, and warns about each that is not.

Copies, because the dynamic loader would hand every link to the same file the same single
instance. ``pip install`` writes these files into Paddle's default folder (``install``), so
that a plain ``import paddle`` has every anychip device, as Paddle's convention for an installed
CustomDevice is. When anychip imports Paddle itself and that folder does not hold exactly what
the installed plugins give now (a plugin added since, kernels swapped in by a test), it writes
the files into a folder of its cache instead and points $CUSTOM_DEVICE_ROOT there.
"""

from __future__ import annotations

import filecmp
import hashlib
import os
import shutil
from pathlib import Path

from . import kernels as paddle_kernels
from ...native import cache_dir, library_path
from ...plugins import registry

PREFIX = "libanychip_"  # every file anychip owns in a CustomDevice folder starts with it
KERNELS = "kernels"  # the subfolder of the devices' Paddle kernels, anychip's alone


ONLY_ENV = "ANYCHIP_PADDLE_DEVICES"


def only_devices() -> frozenset[str] | None:
    """The devices $ANYCHIP_PADDLE_DEVICES (comma-separated anychip names) limits Paddle to;
    None when unset. A job of several ranks on one chip sets it, because paddle.distributed
    takes the first CustomDevice type Paddle registered for the job's device."""
    value = os.environ.get(ONLY_ENV)
    return None if value is None else frozenset(n.strip() for n in value.split(",") if n.strip())


def device_configs(only: frozenset[str] | None = None) -> dict[str, dict]:
    """Config of every device that has a Paddle type and whose runtime comes up here (only
    those ``only`` names, by default $ANYCHIP_PADDLE_DEVICES's, when set)."""
    from ...devices import describe

    only = only_devices() if only is None else only
    configs = {}
    for name, spec in sorted(registry().devices.items()):
        if spec.paddle_type is None or (only is not None and name not in only):
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


def root_files(only: frozenset[str] | None = None) -> dict[str, Path | str]:
    """{file path in the folder: the library it copies (Path) or its text (str)}, for the
    devices and kernels registered now (``only``: as device_configs)."""
    bridge = library_path("anychip_paddle_bridge")
    if not bridge.exists():
        raise FileNotFoundError(
            f"{bridge} is missing: anychip was built without Paddle's headers. Install "
            "paddlepaddle first, then reinstall anychip (see README)")
    configs = device_configs(only)
    files: dict[str, Path | str] = {}
    for name, conf in configs.items():
        files[f"{PREFIX}{name}.so"] = bridge
        files[f"{PREFIX}{name}.so.conf"] = "".join(f"{k}={v}\n" for k, v in conf.items())
    for name, text in paddle_kernels.configs(registry().kernels, configs).items():
        files[f"{KERNELS}/{PREFIX}{name}_kernels.so"] = paddle_kernels.library()
        files[f"{KERNELS}/{PREFIX}{name}_kernels.so.conf"] = text
    return files


def default_root() -> Path:
    """Paddle's own CustomDevice folder: ``paddle_custom_device`` beside the installed ``paddle``
    package (found without importing it: Paddle must load after the folder is written)."""
    import importlib.util

    spec = importlib.util.find_spec("paddle")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("paddle is not installed")
    return Path(list(spec.submodule_search_locations)[0]).parent / "paddle_custom_device"


def holds(folder: Path, files: dict[str, Path | str]) -> bool:
    """Whether ``folder``'s anychip files are exactly ``files``."""
    if not folder.is_dir():
        return False
    if _present(folder) != set(files):
        return False
    for name, content in files.items():
        path = folder / name
        if isinstance(content, Path):
            if not filecmp.cmp(content, path, shallow=False):
                return False
        elif path.read_text() != content:
            return False
    return True


def _present(folder: Path) -> set[str]:
    """anychip's files in ``folder``, as root_files names them."""
    names = {p.name for p in folder.iterdir() if p.name.startswith(PREFIX)}
    if (folder / KERNELS).is_dir():
        names |= {f"{KERNELS}/{p.name}" for p in (folder / KERNELS).iterdir() if p.name.startswith(PREFIX)}
    return names


def _write_file(path: Path, content: Path | str) -> None:
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    if isinstance(content, Path):
        shutil.copyfile(content, tmp)
    else:
        tmp.write_text(content)
    os.replace(tmp, path)  # atomic: an `import paddle` meanwhile loads the old file or the new


def install(folder: Path | None = None) -> Path:
    """Writes the anychip files into ``folder`` (default: Paddle's own CustomDevice folder),
    replacing anychip's earlier files there and leaving any other vendor's plugins alone.
    ``pip install`` runs this, so that ``import paddle`` alone finds every anychip device."""
    folder = default_root() if folder is None else folder
    files = root_files()
    (folder / KERNELS).mkdir(parents=True, exist_ok=True)
    for stale in _present(folder) - set(files):
        (folder / stale).unlink()
    for name, content in files.items():
        _write_file(folder / name, content)
    return folder


def prepare(only: frozenset[str] | None = None) -> Path:
    """The folder Paddle should load anychip's devices from now: Paddle's own when it holds
    exactly the files of the devices and kernels registered now, else a folder of the cache
    (keyed by the files' content, written once, atomically). ``only``: as device_configs."""
    files = root_files(only)
    try:
        if holds(default_root(), files):
            return default_root()
    except OSError:
        pass  # an unreadable site-packages: the cache will do
    # each library is copied once per device: hash its bytes once, then name it by that hash
    libraries = {path: hashlib.sha256(path.read_bytes()).hexdigest() for path in set(files.values())
                 if isinstance(path, Path)}
    h = hashlib.sha256()
    for name, content in sorted(files.items()):
        h.update(name.encode() + b"\0")
        h.update((libraries[content] if isinstance(content, Path) else content).encode())
        h.update(b"\0")
    digest = h.hexdigest()[:16]
    root = cache_dir() / "paddle_devices" / digest
    if not root.exists():
        tmp = root.with_name(f"{digest}.tmp{os.getpid()}")
        shutil.rmtree(tmp, ignore_errors=True)
        (tmp / KERNELS).mkdir(parents=True)
        for name, content in files.items():
            _write_file(tmp / name, content)
        try:
            tmp.rename(root)  # atomic: a concurrent process sees all of it or none
        except OSError:
            shutil.rmtree(tmp, ignore_errors=True)  # another process won the race
    return root


def job_env(device: str) -> dict[str, str]:
    """The environment under which ``python -m paddle.distributed.launch`` and its ranks see
    anychip device ``device`` alone (none, for a device without a Paddle type such as ``cpu``,
    whose ranks talk through gloo): Paddle's launcher and ``init_parallel_env`` take the first
    CustomDevice type Paddle registered as the job's (its ``FLAGS_selected_<type>s``, its
    ``xccl`` backend, its device count), so with several registered a job could land on another
    chip, or be refused more ranks than that chip has devices."""
    only = frozenset([device]) if registry().spec(device).paddle_type is not None else frozenset()
    return {ONLY_ENV: ",".join(only), "CUSTOM_DEVICE_ROOT": str(prepare(only))}


def main(argv: list[str] | None = None) -> int:
    """``python -m anychip.frontends.paddle.root [FOLDER]``: (re)writes the anychip files of Paddle's
    CustomDevice folder (or FOLDER), e.g. after installing a third-party plugin.
    ``python -m anychip.frontends.paddle.root --job DEVICE``: prints the ``export`` lines that make a
    ``python -m paddle.distributed.launch`` job run on DEVICE (``eval "$(...)"`` them)."""
    import shlex
    import sys

    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--job"]:
        if len(argv) != 2:
            print("usage: python -m anychip.frontends.paddle.root --job DEVICE", file=sys.stderr)
            return 2
        for key, value in job_env(argv[1]).items():
            print(f"export {key}={shlex.quote(value)}")
        return 0
    folder = install(Path(argv[0]) if argv else None)
    devices = ", ".join(f"{name} ({conf['paddle_type']}, {conf['sub_type']})" for name, conf in device_configs().items())
    print(f"anychip: Paddle CustomDevices in {folder}: {devices or 'none'}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
