"""The host CPU: Paddle's own CPU place, and a real (not simulated) host-memory runtime.

It shares the simulator's code for its runtime (streams on host threads, an allocator over host
memory) but reports ``simulated=0``: the memory and the cores are the machine's own.
"""

import os

import anychip
from anychip_plugins.host import kernel_isa, register_host_kernels


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "host CPU"


def _options():
    traits = anychip.ChipTraits(
        model=f"{_cpu_model()} ({kernel_isa()} kernels)", vendor="host", devices=1,
        memory_bytes=os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"),
        dtypes=tuple(anychip.DTYPE_BITS))
    return anychip.simulator_options("cpu", traits, simulated=False)


@anychip.hookimpl
def anychip_register_devices():
    return [anychip.DeviceSpec(
        name="cpu", description="Host CPU (Paddle's CPU place)",
        library=str(anychip.native.library_path("anychip_sim")), options=_options, paddle_type=None)]


@anychip.hookimpl
def anychip_register_kernels(registry):
    register_host_kernels(registry, "cpu", tuple(anychip.DTYPE_BITS))
