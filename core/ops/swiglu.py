"""SwiGLU, the gated activation of Llama's MLP: ``silu(gate) * up``."""

from __future__ import annotations

from . import checks
from .dispatch import OpImpl, dtype_name, empty, launch, paddle, run

OP = "swiglu"


class _Swiglu(OpImpl):
    name = OP

    def __init__(self, device):
        self.device = device

    def forward(self, kernel, gate, up):
        y = empty(gate.shape, dtype_name(gate), self.device)
        launch(kernel, OP, self.device, [gate, up], [y])
        return y, (gate, up), []

    def backward(self, kernel, saved, grads):
        gate, up = saved
        dgate = empty(gate.shape, dtype_name(gate), self.device)
        dup = empty(up.shape, dtype_name(up), self.device)
        launch(kernel, OP + "_grad", self.device, [grads[0].contiguous(), gate, up], [dgate, dup])
        return dgate, dup

    def reference(self, gate, up):
        g = gate.astype("float32")
        return (paddle().nn.functional.silu(g) * up.astype("float32")).astype(gate.dtype)


def swiglu(gate, up=None):
    """``silu(gate) * up``, elementwise. With ``up=None``, ``gate``'s last dim holds [gate, up]
    halves (Paddle's ``swiglu(x)`` convention)."""
    gate = checks.tensor(OP, "gate", gate)
    up = checks.tensor(OP, "up", up, optional=True)
    checks.dtype(OP, "gate", gate, checks.FLOAT_DTYPES)
    if up is None:
        if len(gate.shape) == 0 or gate.shape[-1] % 2:
            raise checks.OpArgumentError(
                f"{OP}: with up=None, gate's last dim must be even (gate and up halves), got shape {list(gate.shape)}")
        gate, up = paddle().split(gate, 2, axis=-1)
    checks.same_dtype(OP, "gate", gate, up=up)
    checks.shape(OP, "up", up, gate.shape, "gate's shape")
    device = checks.same_device(OP, gate=gate, up=up)
    gate, up = checks.contiguous(OP, "gate", gate, device), checks.contiguous(OP, "up", up, device)
    return run(_Swiglu(device), device, dtype_name(gate), gate, up)
