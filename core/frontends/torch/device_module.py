"""``torch.anychip``: the device module PyTorch looks up by the backend's name (as ``torch.cuda``),
for ``torch.manual_seed``, autocast, ``Tensor.anychip()`` and users who know ``torch.cuda``'s API."""

from __future__ import annotations

import torch

from . import bridge


def _index(device) -> int:
    if device is None:
        return current_device()
    if isinstance(device, int):
        return device
    d = torch.device(device)
    return d.index if d.index is not None else current_device()


def is_available() -> bool:
    return bridge.device_count() > 0


def is_initialized() -> bool:
    return is_available()


def _is_in_bad_fork() -> bool:
    return False


def device_count() -> int:
    return bridge.device_count()


def current_device() -> int:
    return bridge.current_device()


def set_device(device) -> None:
    bridge.set_device(_index(device))


def synchronize(device=None) -> None:
    """Waits for all work on every stream of the device."""
    bridge.synchronize(_index(device))


def manual_seed(seed: int) -> None:
    """Nothing to seed: the device's random numbers are drawn on the host (random ops run as
    counted CPU fallbacks) from the default generator that ``torch.manual_seed`` seeds."""


manual_seed_all = manual_seed


def get_rng_state(device=None) -> torch.Tensor:
    return torch.get_rng_state()


def set_rng_state(new_state: torch.Tensor, device=None) -> None:
    torch.set_rng_state(new_state)


def get_amp_supported_dtype() -> list[torch.dtype]:
    return [torch.bfloat16, torch.float16]


def memory_stats(device=None) -> dict:
    """The plugin's memory statistics (device.h's AnychipMemoryStats) under torch.cuda's keys."""
    s = bridge.memory_stats(_index(device))
    return {"allocated_bytes.all.current": s.allocated_bytes, "allocated_bytes.all.peak": s.peak_allocated_bytes,
            "allocation.all.current": s.num_allocations, "allocation.all.allocated": s.total_allocations,
            "total_bytes": s.total_bytes, "free_bytes": s.free_bytes}


def memory_allocated(device=None) -> int:
    return memory_stats(device)["allocated_bytes.all.current"]


def max_memory_allocated(device=None) -> int:
    return memory_stats(device)["allocated_bytes.all.peak"]


def mem_get_info(device=None) -> tuple[int, int]:
    """(free, total) bytes, as torch.cuda.mem_get_info."""
    s = bridge.memory_stats(_index(device))
    return s.free_bytes, s.total_bytes


def get_device_name(device=None) -> str:
    return bridge.properties(_index(device)).name.decode()
