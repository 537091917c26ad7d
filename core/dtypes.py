"""The dtypes of anychip's contract, each defined here once: their bits in ``AnychipDtype``
(anychip/device.h) and the groups that ops, kernels and plugins declare by name."""

from __future__ import annotations

# Bit positions of AnychipDtype in anychip/device.h.
DTYPE_BITS = {
    "float32": 0, "float16": 1, "bfloat16": 2, "float64": 3, "int8": 4, "uint8": 5,
    "int16": 6, "int32": 7, "int64": 8, "bool": 9,
}

# The floating dtypes kernels compute in (the fused ops' and the KV cache's dtypes).
FLOATS = ("float32", "bfloat16", "float16")
# The base ops' integer dtypes (indices, positions, counts).
INTS = ("int32", "int64")
# Every dtype a base op takes.
BASE = FLOATS + INTS + ("bool",)
# What cast converts between: int8 storage too, since quantized tables (a Q8_0 embedding) are
# gathered and converted on the device.
CASTABLE = BASE + ("int8",)
