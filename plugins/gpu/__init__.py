"""NVIDIA GPU over the CUDA runtime, loaded at run time (libcudart), so machines without CUDA
still import and list it: ``anychip devices`` then shows it unavailable with the reason."""

from pathlib import Path

import anychip


@anychip.hookimpl
def anychip_register_devices():
    return [anychip.DeviceSpec(
        name="gpu", description="NVIDIA GPU (CUDA)",
        library=str(Path(__file__).with_name("libanychip_cuda.so")),
        paddle_type="anychip_nvidia", vendor_runtime="CUDA runtime (libcudart)")]
