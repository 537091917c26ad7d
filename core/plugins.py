"""Plugin discovery: every module in the ``anychip.plugins`` entry-point group.

Built-in chips come in the same way as third-party ones. Each plugin is loaded and each of its
hooks is called in isolation: one that raises (or exits) is recorded with its reason and skipped,
and the rest keep working. The built-in devices (cpu, gpu, xpu, npu, gcu, dcu) and their kernels
belong to the built-in plugins: a third-party plugin that registers a device of such a name, or
kernels for one, is disabled with the reason.
"""

from __future__ import annotations

import traceback
from collections.abc import Iterable
from dataclasses import dataclass, field
from importlib.metadata import entry_points

import pluggy

from . import hookspecs
from .errors import UnknownDeviceError
from .kernels import KernelRegistry
from .spec import DeviceSpec

ENTRY_POINT_GROUP = "anychip.plugins"
# The plugins shipped with anychip: the entry points its own distribution declares for modules of
# its plugin package (setup.py). A third-party package can neither declare entry points for
# anychip's distribution nor, through one of its own, make a plugin count as built-in.
BUILTIN_DISTRIBUTION = "anychip"
BUILTIN_PACKAGE = "anychip_plugins"


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
    ops: dict[str, object] = field(default_factory=dict)  # op name -> OpDef, from anychip_register_ops
    op_plugin: dict[str, str] = field(default_factory=dict)

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


def _is_builtin(ep) -> bool:
    return (getattr(ep.dist, "name", None) == BUILTIN_DISTRIBUTION
            and ep.module.partition(".")[0] == BUILTIN_PACKAGE)


class DeviceClaimError(Exception):
    """A third-party plugin registered kernels for a built-in device."""


def _claim(plugin: str, what: str, device: str, owner: str) -> str:
    return f"plugin {plugin!r} registers {what} {device!r}, which belongs to the built-in {owner} plugin"


class _ThirdPartyKernels:
    """The kernel registry as a third-party plugin's hook sees it: kernels for a built-in device
    are refused (and the refusal kept, should the plugin swallow the error), and what it adds is
    remembered, so that it can be taken back if the plugin is disabled."""

    def __init__(self, registry: KernelRegistry, plugin: str, builtin_devices: dict[str, str]):
        self._registry, self._plugin, self._builtin_devices = registry, plugin, builtin_devices
        self.claim: str | None = None
        self.added: list[tuple[str, str, str]] = []

    def register(self, op, device, dtypes, forward, backward=None, capabilities=()):
        owner = self._builtin_devices.get(device)
        if owner is not None:
            self.claim = _claim(self._plugin, "kernels for device", device, owner)
            raise DeviceClaimError(self.claim)
        dtypes = tuple(dtypes)
        self.added += [(op, device, d) for d in dtypes if self._registry.find(op, device, d) is None]
        self._registry.register(op, device, dtypes, forward, backward, capabilities)

    def find(self, op: str, device: str, dtype: str):
        return self._registry.find(op, device, dtype)

    def kernels(self):
        return self._registry.kernels()

    def count(self, device: str) -> int:
        return self._registry.count(device)


def _listed(result, hook: str, kind: type, kind_name: str, noun: str) -> list:
    """What hook ``hook`` returned, as a list of ``kind``: any iterable (listed once, so that a
    generator is not used up by this check)."""
    if isinstance(result, kind) or not isinstance(result, Iterable):
        raise TypeError(f"{hook} returned {type(result).__name__}, expected a list (or other iterable) of {kind_name}")
    items = list(result)
    for item in items:
        if not isinstance(item, kind):
            raise TypeError(f"{hook} returned a {type(item).__name__} among its {noun}, expected {kind_name}")
    return items


def _device_specs(result) -> list[DeviceSpec]:
    return _listed(result, "anychip_register_devices", DeviceSpec, "anychip.DeviceSpec", "devices")


def _builtin_ops():
    from .ops.defs import BUILTIN  # here: anychip.ops needs this module's registry() when it runs

    return BUILTIN


def _op_definitions(result) -> list:
    from .ops.definition import OpDef

    return _listed(result, "anychip_register_ops", OpDef, "anychip.ops.definition.OpDef", "ops")


def discover() -> Registry:
    """Loads every installed plugin and collects what its hooks register."""
    reg = Registry()
    pm = pluggy.PluginManager("anychip")
    pm.add_hookspecs(hookspecs)

    def call(plugin: str, what: str, fn):
        """fn(), or None with the reason recorded against ``plugin``. Anything but Ctrl-C is
        caught, SystemExit included: one plugin never silences the others."""
        try:
            return fn()
        except KeyboardInterrupt:
            raise
        except BaseException as exc:
            reg.problems.append(PluginProblem(plugin, f"{what}: {_short(exc)}"))
            return None

    # The built-in plugins come first, each hook called plugin by plugin in this order (not in
    # pluggy's, which tryfirst / trylast markers change), so that their devices are theirs
    # whatever a newcomer's name sorts as. A built-in device's name is reserved even when its
    # plugin fails to load (each built-in plugin is named after its chip).
    order: list[str] = []
    builtin_devices: dict[str, str] = {}  # device name -> built-in plugin
    for ep in sorted(entry_points(group=ENTRY_POINT_GROUP), key=lambda e: (not _is_builtin(e), e.name)):
        if _is_builtin(ep):
            builtin_devices[ep.name] = ep.name
        if call(ep.name, "import failed", lambda: pm.register(ep.load(), name=ep.name)):
            order.append(ep.name)
    builtin = set(builtin_devices.values())

    def impls(hook) -> list:
        found = {impl.plugin_name: impl for impl in getattr(pm.hook, hook).get_hookimpls()}
        return [found[name] for name in order if name in found]

    disabled: set[str] = set()
    for impl in impls("anychip_register_devices"):
        plugin = impl.plugin_name
        specs = call(plugin, "anychip_register_devices", lambda: _device_specs(impl.function()))
        if specs is None:
            continue
        claimed = [s.name for s in specs if plugin not in builtin and s.name in builtin_devices]
        if claimed:
            reg.problems.append(PluginProblem(
                plugin, _claim(plugin, "device", claimed[0], builtin_devices[claimed[0]])))
            disabled.add(plugin)
            continue
        for spec in specs:
            owner = reg.device_plugin.get(spec.name)
            if owner is not None:
                reg.problems.append(PluginProblem(
                    plugin, f"device name {spec.name!r} is already provided by plugin {owner!r}"))
                continue
            reg.devices[spec.name] = spec
            reg.device_plugin[spec.name] = plugin
            if plugin in builtin:
                builtin_devices[spec.name] = plugin

    for impl in impls("anychip_register_ops"):
        plugin = impl.plugin_name
        if plugin in disabled:
            continue
        for op in call(plugin, "anychip_register_ops", lambda: _op_definitions(impl.function())) or ():
            owner = "anychip" if op.name in _builtin_ops() else reg.op_plugin.get(op.name)
            if owner is not None:
                reg.problems.append(PluginProblem(plugin, f"anychip_register_ops: op {op.name!r} is already defined by {owner}"))
                continue
            reg.ops[op.name] = op
            reg.op_plugin[op.name] = f"plugin {plugin!r}"

    for impl in impls("anychip_register_kernels"):
        plugin = impl.plugin_name
        if plugin in disabled:
            continue
        if plugin in builtin:
            call(plugin, "anychip_register_kernels", lambda: impl.function(registry=reg.kernels))
            continue
        kernels = _ThirdPartyKernels(reg.kernels, plugin, builtin_devices)
        failed = len(reg.problems)
        call(plugin, "anychip_register_kernels", lambda: impl.function(registry=kernels))
        if kernels.claim is not None:
            del reg.problems[failed:]  # the claim is the reason, whatever the hook did after it
            reg.problems.append(PluginProblem(plugin, kernels.claim))
            disabled.add(plugin)
            reg.kernels.unregister(kernels.added)
            for device in [d for d, p in reg.device_plugin.items() if p == plugin]:
                del reg.devices[device], reg.device_plugin[device]

    for impl in impls("anychip_register_codegen_backends"):
        plugin = impl.plugin_name
        if plugin in disabled:
            continue
        backends = call(plugin, "anychip_register_codegen_backends",
                        lambda: {backend.name: backend for backend in impl.function()})
        reg.codegen_backends.update(backends or {})
    return reg


_registry: Registry | None = None


def registry() -> Registry:
    global _registry
    if _registry is None:
        _registry = discover()
    return _registry
