"""Plugin discovery: every module in the ``anychip.plugins`` entry-point group.

Built-in chips come in the same way as third-party ones. Each plugin is loaded and each of its
hooks is called in isolation: one that raises is recorded with its reason and skipped, and the
rest keep working.
"""

from __future__ import annotations

import traceback
from dataclasses import dataclass, field
from importlib.metadata import entry_points

import pluggy

from . import hookspecs
from .errors import UnknownDeviceError
from .kernels import KernelRegistry
from .spec import DeviceSpec

ENTRY_POINT_GROUP = "anychip.plugins"
BUILTIN_PACKAGE = "anychip_plugins"  # the package of the plugins shipped with anychip (setup.py)


@dataclass
class PluginProblem:
    plugin: str
    reason: str


@dataclass
class Registry:
    devices: dict[str, DeviceSpec] = field(default_factory=dict)
    device_plugin: dict[str, str] = field(default_factory=dict)  # device name -> plugin name
    problems: list[PluginProblem] = field(default_factory=list)
    kernels: KernelRegistry = field(default_factory=KernelRegistry)
    codegen_backends: dict[str, object] = field(default_factory=dict)

    def spec(self, name: str) -> DeviceSpec:
        if name not in self.devices:
            known = ", ".join(sorted(self.devices)) or "none"
            broken = "".join(f"\n  plugin {p.plugin!r} failed to load: {p.reason}" for p in self.problems)
            raise UnknownDeviceError(f"unknown device {name!r}; known devices: {known}{broken}")
        return self.devices[name]

    def by_paddle_type(self, paddle_type: str) -> str | None:
        for name, spec in self.devices.items():
            if spec.paddle_type == paddle_type:
                return name
        return None


def _short(exc: BaseException) -> str:
    frame = traceback.extract_tb(exc.__traceback__)[-1] if exc.__traceback__ else None
    where = f" ({frame.filename.rsplit('/', 1)[-1]}:{frame.lineno})" if frame else ""
    return f"{type(exc).__name__}: {exc}{where}"


def discover() -> Registry:
    """Loads every installed plugin and collects what its hooks register."""
    reg = Registry()
    pm = pluggy.PluginManager("anychip")
    pm.add_hookspecs(hookspecs)
    # The built-in plugins register first, so that their device names (cpu above all) are theirs:
    # a newcomer claiming one is refused, whatever its name sorts as.
    for ep in sorted(entry_points(group=ENTRY_POINT_GROUP),
                     key=lambda e: (not e.value.startswith(BUILTIN_PACKAGE), e.name)):
        try:
            pm.register(ep.load(), name=ep.name)
        except KeyboardInterrupt:
            raise
        except BaseException as exc:  # SystemExit too: one plugin never silences the others
            reg.problems.append(PluginProblem(ep.name, f"import failed: {_short(exc)}"))

    for impl in pm.hook.anychip_register_devices.get_hookimpls():
        try:
            specs = list(impl.function())  # any iterable; a generator must not be used up checking it
            for spec in specs:
                if not isinstance(spec, DeviceSpec):
                    raise TypeError(f"anychip_register_devices returned {type(spec).__name__}, "
                                    "expected anychip.DeviceSpec")
        except KeyboardInterrupt:
            raise
        except BaseException as exc:
            reg.problems.append(PluginProblem(impl.plugin_name, f"anychip_register_devices: {_short(exc)}"))
            continue
        for spec in specs:
            owner = reg.device_plugin.get(spec.name)
            if owner is not None:
                reg.problems.append(PluginProblem(
                    impl.plugin_name, f"device name {spec.name!r} is already provided by plugin {owner!r}"))
                continue
            reg.devices[spec.name] = spec
            reg.device_plugin[spec.name] = impl.plugin_name

    for impl in pm.hook.anychip_register_kernels.get_hookimpls():
        try:
            impl.function(registry=reg.kernels)
        except KeyboardInterrupt:
            raise
        except BaseException as exc:
            reg.problems.append(PluginProblem(impl.plugin_name, f"anychip_register_kernels: {_short(exc)}"))

    for impl in pm.hook.anychip_register_codegen_backends.get_hookimpls():
        try:
            for backend in impl.function():
                reg.codegen_backends[backend.name] = backend
        except Exception as exc:
            reg.problems.append(PluginProblem(
                impl.plugin_name, f"anychip_register_codegen_backends: {_short(exc)}"))
    return reg


_registry: Registry | None = None


def registry() -> Registry:
    global _registry
    if _registry is None:
        _registry = discover()
    return _registry
