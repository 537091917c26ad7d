"""Declaring a chip that runs on anychip's simulator (``core/src/sim``).

The simulator is a host-memory device with its own allocator and capacity, asynchronous
streams and events. A plugin describes its chip's published traits and gets a device that
behaves like that chip in everything but speed; it is always listed as simulated.

Environment knobs (read when a device is opened):
    ANYCHIP_SIM_CHECK=1       guard device memory with mprotect, so host code that touches it
                              outside the copy functions crashes loudly (tests turn it on)
    ANYCHIP_SIM_DEVICES=N     devices per simulated chip (default: the chip's own default)
    ANYCHIP_SIM_CAPACITY=N    bytes per device, overriding the chip's memory (e.g. to test OOM)
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from .native import library_path
from .dtypes import DTYPE_BITS
from .spec import DeviceSpec


@dataclass(frozen=True)
class ChipTraits:
    model: str               # product name, e.g. "Ascend 910B"
    vendor: str              # e.g. "Huawei"
    memory_bytes: int        # memory per device, as published
    dtypes: tuple[str, ...]  # element types its kernels accept
    devices: int = 2         # devices the simulator presents
    compute_capability: int = 0


def _env_int(name: str, default: int) -> int:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ValueError(f"{name} must be an integer, got {raw!r}") from None
    if value <= 0:
        raise ValueError(f"{name} must be positive, got {value}")
    return value


def simulator_options(name: str, traits: ChipTraits, simulated: bool = True) -> dict:
    """The options string for ``libanychip_sim.so`` (see core/src/sim/simulator.cc)."""
    unknown = [d for d in traits.dtypes if d not in DTYPE_BITS]
    if unknown:
        raise ValueError(f"ChipTraits.dtypes: unknown dtype(s) {unknown}; known: {sorted(DTYPE_BITS)}")
    return {
        "name": name,
        "model": traits.model,
        "vendor": traits.vendor,
        "devices": _env_int("ANYCHIP_SIM_DEVICES", traits.devices) if simulated else traits.devices,
        "capacity": _env_int("ANYCHIP_SIM_CAPACITY", traits.memory_bytes) if simulated else traits.memory_bytes,
        "dtypes": sum(1 << DTYPE_BITS[d] for d in traits.dtypes),
        "cc": traits.compute_capability,
        "checking": int(simulated and os.environ.get("ANYCHIP_SIM_CHECK", "0") == "1"),
        "simulated": int(simulated),
    }


def simulated_device(name: str, traits: ChipTraits, *, description: str, paddle_type: str | None,
                     vendor_runtime: str = "", note: str = "") -> DeviceSpec:
    """A DeviceSpec backed by the simulator with ``traits``."""
    return DeviceSpec(
        name=name,
        description=description,
        library=str(library_path("anychip_sim")),
        options=lambda: simulator_options(name, traits),
        paddle_type=paddle_type,
        vendor_runtime=vendor_runtime,
        note=note,
    )


def find_vendor_library(names: tuple[str, ...], env_dirs: tuple[str, ...] = ()) -> str | None:
    """Path of the first of ``names`` found under ``$VAR/lib64``/``$VAR/lib`` for each of
    ``env_dirs``, or on the loader's search path; None when the vendor runtime is absent."""
    import ctypes.util
    from pathlib import Path

    for var in env_dirs:
        root = os.environ.get(var)
        for sub in ("lib64", "lib", "runtime/lib64"):
            for lib in names:
                if root and (Path(root) / sub / lib).exists():
                    return str(Path(root) / sub / lib)
    for lib in names:
        found = ctypes.util.find_library(lib.removeprefix("lib").split(".so")[0])
        if found:
            return found
    return None


def vendor_device(name: str, traits: ChipTraits, *, description: str, paddle_type: str,
                  vendor_runtime: str, libraries: tuple[str, ...], env_dirs: tuple[str, ...]) -> DeviceSpec:
    """A chip whose vendor runtime anychip does not bind yet: it runs on the simulator with the
    chip's traits, and the note says whether the vendor runtime was seen on this machine."""
    found = find_vendor_library(libraries, env_dirs)
    if found:
        note = f"{vendor_runtime} found at {found}, but anychip does not bind it yet: running on the simulator"
    else:
        note = f"{vendor_runtime} not found ({', '.join(libraries)}): running on the simulator"
    return simulated_device(name, traits, description=description, paddle_type=paddle_type,
                            vendor_runtime=vendor_runtime, note=note)
