"""The plugin author's manual: the hooks an anychip plugin implements.

A plugin is any importable module (or object) listed under the ``anychip.plugins`` entry-point
group whose functions carry the ``@anychip.hookimpl`` marker. anychip's own five chips are
registered exactly this way, so ``plugins/npu/__init__.py`` is a complete worked example.

    # pyproject.toml of a plugin package
    [project.entry-points."anychip.plugins"]
    mychip = "anychip_mychip"

    # anychip_mychip/__init__.py
    import anychip
    from pathlib import Path

    @anychip.hookimpl
    def anychip_register_devices():
        return [anychip.DeviceSpec(
            name="mychip",
            description="MyCorp accelerator",
            library=str(Path(__file__).with_name("libmychip_runtime.so")),
            paddle_type="anychip_mychip",
        )]

A plugin may implement any subset of the hooks. An exception raised by a hook, or by importing
the plugin, disables only that plugin: ``anychip devices`` lists it as unavailable with the error.
"""

from __future__ import annotations

import pluggy

hookspec = pluggy.HookspecMarker("anychip")
hookimpl = pluggy.HookimplMarker("anychip")


@hookspec
def anychip_register_devices():
    """Declare the devices this plugin provides.

    Returns:
        A list of :class:`anychip.DeviceSpec`. Each names the device as users type it
        (``--device mychip``), the shared library implementing ``anychip/device.h`` and its
        entry symbol, the options passed to that entry, and the device type under which the
        Paddle bridge registers it (``None`` for a device that is Paddle's own CPU).

    Names must be unique across all installed plugins; a second plugin claiming a name is
    reported as a conflict and ignored.

    Example (a chip that runs on anychip's simulator until its vendor runtime is bound)::

        @anychip.hookimpl
        def anychip_register_devices():
            return [anychip.simulated_device(
                "mychip", anychip.ChipTraits(model="MyChip X1", vendor="MyCorp",
                                            memory_bytes=32 << 30, dtypes=("float32", "float16")),
                description="MyCorp X1", paddle_type="anychip_mychip")]
    """


@hookspec
def anychip_register_kernels(registry):
    """Register kernels for this plugin's devices.

    Args:
        registry: the :class:`anychip.KernelRegistry`. Call
            ``registry.register(op, device, dtypes, forward, backward=None, capabilities=())``
            once per op and device; ``forward``/``backward`` are callables taking tensor
            descriptors (see ``anychip/kernel.h`` once kernels land).

    Returns:
        Nothing. Registering an op twice for one device and dtype raises ``ValueError``.

    Example::

        @anychip.hookimpl
        def anychip_register_kernels(registry):
            registry.register("rms_norm", "mychip", ("float32",), forward=my_rms_norm)
    """


@hookspec
def anychip_register_codegen_backends():
    """Declare code-generation targets this plugin adds.

    Returns:
        A list of backend objects, each with a unique ``name`` attribute (e.g. ``"mychip-c"``)
        and the methods the CodeGen pipeline calls: ``render(kernel) -> str`` (source text),
        ``compile_command(source_path, output_path) -> list[str]`` and
        ``load(library_path) -> dict`` (kernel name -> callable).

    Example::

        @anychip.hookimpl
        def anychip_register_codegen_backends():
            return [MyChipBackend()]
    """
