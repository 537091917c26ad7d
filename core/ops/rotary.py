"""Rotary position embedding (RoPE) in the Llama/NeoX half-rotation layout."""

from __future__ import annotations

import numpy as np

from . import checks
from .dispatch import OpImpl, attrs, dtype_name, empty, launch, paddle, run, zeros

OP = "rotary_embedding"


class _Rotary(OpImpl):
    name = OP

    def __init__(self, theta: float, device):
        self.theta, self.device = theta, device

    def _rotate(self, kernel, op, q, k, positions):
        q_out = empty(q.shape, dtype_name(q), self.device)
        k_out = empty(k.shape, dtype_name(k), self.device)
        launch(kernel, op, self.device, [q, k, positions], [q_out, k_out], attrs(OP, grad=op != OP, theta=self.theta))
        return q_out, k_out

    def forward(self, kernel, q, k, positions):
        self.shapes = (q.shape, k.shape, dtype_name(q))
        return self._rotate(kernel, OP, q, k, positions), (positions,), []

    def backward(self, kernel, saved, grads):
        (positions,) = saved
        dq, dk = (g if g is not None else zeros(shape, self.shapes[2], self.device)
                  for g, shape in zip(grads, self.shapes[:2]))
        dq, dk = self._rotate(kernel, OP + "_grad", dq.contiguous(), dk.contiguous(), positions)
        return dq, dk, None

    def reference(self, q, k, positions):
        pd = paddle()
        half = q.shape[-1] // 2
        exponent = np.arange(0, 2 * half, 2, dtype=np.float32) / np.float32(2 * half)
        inv_freq = 1.0 / pd.pow(pd.full([half], self.theta, "float32", device=q.place),
                                pd.to_tensor(exponent, place=q.place))
        angle = positions.astype("float32").unsqueeze(-1) * inv_freq  # [B, S, D/2]
        cos, sin = pd.cos(angle).unsqueeze(2), pd.sin(angle).unsqueeze(2)

        def rotate(x):
            xf = x.astype("float32")
            a, b = xf[..., :half], xf[..., half:]
            return pd.concat([a * cos - b * sin, b * cos + a * sin], axis=-1).astype(x.dtype)

        return rotate(q), rotate(k)


def rotary_embedding(q, k, positions, theta: float = 10000.0):
    """Rotates ``q`` [B, S, Hq, D] and ``k`` [B, S, Hk, D] by their tokens' positions.

    ``positions`` is int64 (or int32) [B, S], one position per token, so packed sequences can
    restart at 0. Pairs element i with i + D/2 (Llama/NeoX layout); frequencies
    ``theta^(-2i/D)``. Returns ``(q_rotated, k_rotated)``.
    """
    q, k = checks.tensor(OP, "q", q), checks.tensor(OP, "k", k)
    positions = checks.tensor(OP, "positions", positions)
    checks.dtype(OP, "q", q, checks.FLOAT_DTYPES)
    checks.same_dtype(OP, "q", q, k=k)
    checks.rank(OP, "q", q, 4, "[batch, seq, heads, head_dim]")
    checks.rank(OP, "k", k, 4, "[batch, seq, kv_heads, head_dim]")
    b, s, _, d = q.shape
    if d % 2:
        raise checks.OpArgumentError(f"{OP}: head_dim must be even, got {d}")
    if k.shape[0] != b or k.shape[1] != s or k.shape[3] != d:
        raise checks.OpArgumentError(
            f"{OP}: k must be [{b}, {s}, kv_heads, {d}] to match q {list(q.shape)}, got {list(k.shape)}")
    checks.dtype(OP, "positions", positions, ("int64", "int32"))
    checks.shape(OP, "positions", positions, [b, s], "[batch, seq] of q")
    if not theta > 0:
        raise checks.OpArgumentError(f"{OP}: theta must be > 0, got {theta}")
    device = checks.same_device(OP, q=q, k=k, positions=positions)
    if dtype_name(positions) == "int32":
        positions = positions.astype("int64")
    q, k, positions = (checks.contiguous(OP, n, t, device) for n, t in (("q", q), ("k", k), ("positions", positions)))
    out = run(_Rotary(float(theta), device), device, dtype_name(q), q, k, positions)
    return out[0], out[1]
