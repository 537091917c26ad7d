"""anychip plugin for the {{name}} device: registers lib{{name}}_runtime.so (built from runtime.c)."""

from pathlib import Path

import anychip


@anychip.hookimpl
def anychip_register_devices():
    return [anychip.DeviceSpec(
        name="{{name}}",
        description="{{name}} accelerator",
        library=str(Path(__file__).with_name("lib{{name}}_runtime.so")),
        paddle_type="anychip_{{name}}",
        # Passed to anychip_device_init as "devices=1;capacity=1073741824" (see runtime.c).
        options={"devices": 1, "capacity": 1 << 30},
        note="template runtime: host memory, synchronous",
    )]
