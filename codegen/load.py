"""Registering generated kernels as a device's kernels, through the same registry as
hand-written ones."""

from __future__ import annotations

from anychip.ops.defs import BUILTIN

# op -> the kernel computing its input gradients (its definition's grad, for anychip's own ops:
# this runs while the plugins load), registered as the op's backward. A base op's grad is also an op of its own (the Paddle bridge calls a grad by
# name); a fused op's is not, so it is registered only as the backward.
BACKWARD_OF = {op.name: op.grad for op in BUILTIN.values() if op.grad}
BACKWARD_ONLY = frozenset(op.grad for op in BUILTIN.values() if op.fused and op.grad)


def register(registry, device: str, library, backward_of=BACKWARD_OF, backward_only=BACKWARD_ONLY) -> list[str]:
    """Registers every kernel of ``library`` (a :class:`anychip_codegen.Library`) for ``device``,
    one registration per op and dtype, the backward paired per ``backward_of``. Returns the
    ops registered."""
    found = library.load()
    ops = []
    for kernel in library.kernels:
        if kernel.name in backward_only:
            continue
        grad = backward_of.get(kernel.name)
        for dtype in kernel.dtypes:
            backward = found.get(f"{grad}.{dtype}") if grad else None
            registry.register(kernel.name, device, (dtype,), forward=found[f"{kernel.name}.{dtype}"],
                              backward=backward)
        ops.append(kernel.name)
    return ops
