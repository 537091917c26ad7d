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
the plugin (``sys.exit()`` included), disables only that plugin: ``anychip devices`` lists it as
unavailable with the error. The built-in devices (cpu, gpu, xpu, npu, gcu, dcu) belong to the
plugins shipped with anychip: a plugin that registers a device of such a name, or kernels for one,
is disabled with that reason.
"""

from __future__ import annotations

import pluggy

hookspec = pluggy.HookspecMarker("anychip")
hookimpl = pluggy.HookimplMarker("anychip")


@hookspec
def anychip_register_devices():
    """Declare the devices this plugin provides.

    Returns:
        A list (or any other iterable, such as a generator) of :class:`anychip.DeviceSpec`; any
        other value disables the plugin with the reason. Each names the device as users type it
        (``--device mychip``), the shared library implementing ``anychip/device.h`` and its
        entry symbol, the options passed to that entry, and the device type under which the
        Paddle bridge registers it (``None`` for a device that is Paddle's own CPU).

    Names must be unique across all installed plugins; a second plugin claiming a name is
    reported as a conflict and ignored. A built-in device's name is refused outright: the plugin
    claiming it is disabled.

    Example (a chip that runs on anychip's simulator until its vendor runtime is bound)::

        @anychip.hookimpl
        def anychip_register_devices():
            return [anychip.simulated_device(
                "mychip", anychip.ChipTraits(model="MyChip X1", vendor="MyCorp",
                                            memory_bytes=32 << 30, dtypes=("float32", "float16")),
                description="MyCorp X1", paddle_type="anychip_mychip")]
    """


@hookspec
def anychip_register_ops():
    """Define ops of this plugin's own, beside anychip's (``anychip/ops/defs/``).

    Returns:
        A list of :class:`anychip.ops.definition.OpDef`. Each becomes an op like anychip's own:
        kernels register under its name (``anychip_register_kernels``, called after this hook),
        the conformance kit checks them with its cases, ``anychip ops`` lists it, a base op is
        callable through ``anychip.ops.base_call.run`` and, where it names Paddle kernels, the
        Paddle bridge serves them with its kernels. A name anychip or an earlier plugin already
        defines is refused, with the reason listed by ``anychip devices``.

    Example::

        @anychip.hookimpl
        def anychip_register_ops():
            return [OpDef("log1p", "unary", "log(1 + x)", ("x",), ("out",), ("float32",),
                          {"float32": (1e-5, 1e-6)}, cases, shape=same,
                          reference_fn=unary_reference(lambda x, a: np.log1p(x)), paddle=("log1p",))]
    """


@hookspec
def anychip_register_kernels(registry):
    """Register kernels for this plugin's devices.

    Args:
        registry: the :class:`anychip.KernelRegistry`. Call
            ``registry.register(op, device, dtypes, forward, backward=None, capabilities=())``
            once per op and device. ``op`` is an op's name (``anychip ops``, or one the plugin defines); ``forward`` and
            ``backward`` are :class:`anychip.kernels.NativeKernel` (a C function following
            ``anychip/kernel.h``, whose op table ``anychip/ops.h`` fixes each kernel's inputs, outputs and attrs)
            or Python callables ``fn(inputs, outputs, attrs)`` over Paddle tensors.

    What anychip guarantees a kernel: its arguments were validated against the op table
    before the launch, outputs are allocated on the device, and the launch is ordered on the
    device's current stream. A host-code kernel (one that reads device memory from the CPU)
    runs through the device's ``launch_host_function`` (``anychip/device.h``) with exactly its
    tensors' memory open. An op or dtype left unregistered runs its reference implementation,
    counted as a fallback (an error under ANYCHIP_STRICT=1); register a forward without a
    backward and the backward falls back alone.

    Returns:
        Nothing. Registering an op twice for one device and dtype raises ``ValueError``; an
        exception disables this plugin's kernels and is listed by ``anychip devices``. Kernels
        for a built-in device (from a plugin not shipped with anychip) are refused, and the
        plugin is disabled, its devices and kernels included.

    Example::

        from anychip.kernels import NativeKernel

        @anychip.hookimpl
        def anychip_register_kernels(registry):
            lib = str(Path(__file__).with_name("libmychip_kernels.so"))
            registry.register("rms_norm", "mychip", ("float32", "bfloat16"),
                              forward=NativeKernel(lib, "mychip_rms_norm"),
                              backward=NativeKernel(lib, "mychip_rms_norm_grad"))
    """


@hookspec
def anychip_register_codegen_backends():
    """Declare code-generation targets this plugin adds.

    Returns:
        A list (or any other iterable) of backend objects, each with a unique ``name`` (e.g. ``"mychip-c"``),
        ``source_suffix`` (".cc", ".cu") and the methods anychip_codegen calls:
        ``render(kernel) -> str`` (one source per kernel, all its dtypes),
        ``compile_command(source_path, output_path) -> list[str]`` (source -> object),
        ``link_command(object_paths, output_path) -> list[str]`` (objects -> shared library) and
        ``load(library_path, kernels) -> dict`` ("<kernel>.<dtype>" -> NativeKernel or callable);
        optionally ``toolchain() -> str`` (part of the cache key), ``schedules(kernel)`` (tuner
        candidates) and ``host_code``. docs/codegen.md has a worked example.

    Example::

        @anychip.hookimpl
        def anychip_register_codegen_backends():
            return [MyChipBackend()]
    """
