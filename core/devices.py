"""What ``anychip devices`` reports: each registered device's status, size and capabilities."""

from __future__ import annotations

from dataclasses import asdict, dataclass

from .plugins import registry
from .runtime.errors import AnychipError
from .runtime.open import open_runtime, require_hardware
from .runtime.device import Device


@dataclass
class DeviceInfo:
    name: str
    status: str          # "hardware", "simulated" or "unavailable"
    reason: str          # why simulated or unavailable ("" for hardware)
    description: str
    model: str
    count: int
    memory_bytes: int
    dtypes: tuple[str, ...]
    kernels: int
    plugin: str
    vendor_runtime: str = ""

    def as_dict(self) -> dict:
        return asdict(self)


def describe(name: str) -> DeviceInfo:
    reg = registry()
    spec = reg.spec(name)
    base = dict(name=name, description=spec.description, kernels=reg.kernels.count(name),
                plugin=reg.device_plugin[name], vendor_runtime=spec.vendor_runtime)
    try:
        runtime = open_runtime(name)
        if runtime.device_count == 0:
            return DeviceInfo(status="unavailable", reason="the runtime reports 0 devices", model="",
                              count=0, memory_bytes=0, dtypes=(), **base)
        props = Device(runtime, 0).properties
    except (AnychipError, OSError, ValueError) as exc:
        return DeviceInfo(status="unavailable", reason=str(exc), model="", count=0, memory_bytes=0,
                          dtypes=(), **base)
    status = "simulated" if props.simulated else "hardware"
    reason = spec.note
    if props.simulated and require_hardware():
        reason = "refused: ANYCHIP_REQUIRE_HARDWARE=1 and this device is simulated. " + reason
    # The device works, but part of its plugin failed (e.g. its kernels): ops fall back.
    broken = [p.reason for p in reg.problems if p.plugin == base["plugin"]]
    if broken:
        reason = "; ".join([r for r in (reason,) if r] + [f"plugin partly failed ({b}); ops without "
                                                            "kernels run their references" for b in broken])
    return DeviceInfo(status=status, reason=reason, model=props.name, count=runtime.device_count,
                      memory_bytes=props.total_memory, dtypes=props.dtypes, **base)


def describe_all() -> list[DeviceInfo]:
    reg = registry()
    infos = [describe(name) for name in sorted(reg.devices, key=lambda n: (n != "cpu", n))]
    with_devices = set(reg.device_plugin.values())
    reasons: dict[str, list[str]] = {}  # one row per broken plugin, however many of its hooks failed
    for problem in reg.problems:
        if problem.plugin not in with_devices:  # else reported on its devices' rows
            reasons.setdefault(problem.plugin, []).append(problem.reason)
    for plugin, why in reasons.items():
        infos.append(DeviceInfo(name=plugin, status="unavailable", reason=f"plugin failed: {'; '.join(why)}",
                                description="(plugin)", model="", count=0, memory_bytes=0, dtypes=(),
                                kernels=0, plugin=plugin))
    return infos
