"""rotary_embedding: RoPE on q and k, half-rotation layout, per-token positions."""

from __future__ import annotations

import functools

import numpy as np

from ...conformance.case import CPU, Case, normal
from ...dtypes import FLOATS
from ..definition import Attr, OpDef
from ..rotary import _Rotary, rotary_embedding

# The kernel contract (rendered into anychip/ops.h): inputs -> outputs, then the math.
CONTRACT = """\
rotary_embedding: q[B,S,Hq,D], k[B,S,Hk,D], positions int64[B,S] -> q_out, k_out;
                 attrs: theta.  Half-rotation (Llama/NeoX) layout: for i < D/2,
                 f = pos * theta^(-2i/D) (float32), (a, b) = (x[i], x[i + D/2]),
                 out[i] = a cos f - b sin f, out[i + D/2] = b cos f + a sin f
rotary_embedding_grad: dq_out, dk_out, positions -> dq, dk; attrs: theta (rotation by -f)
"""


def _cases(op, dtype, rng):
    out = []
    for label, (b, s, hk, group, d), theta, start in [
        ("one token, head_dim 2", (1, 1, 1, 1, 2), 10000.0, 0),
        ("packed sequences restart at 0, 3 query heads per kv head", (2, 17, 2, 3, 74), 10000.0, 0),
        ("head_dim 128, positions from 300, theta 5e5", (1, 5, 2, 1, 128), 500000.0, 300),
    ]:
        restart = np.concatenate([np.arange(s // 2), np.arange(s - s // 2)]) + start
        inputs = {"q": normal(rng, b, s, hk * group, d), "k": normal(rng, b, s, hk, d),
                  "positions": restart[None].repeat(b, 0).astype(np.int64)}
        out.append(Case(label, inputs, functools.partial(rotary_embedding, theta=theta),
                        _Rotary(theta, CPU).reference, ("q_rotated", "k_rotated"), {"theta": theta},
                        ("q", "k"), (normal(rng, b, s, hk * group, d), normal(rng, b, s, hk, d))))
    return out


_THETA = Attr("theta", "the RoPE base: frequency i is theta^(-2i/D)")
DEFINITIONS = [OpDef(
    "rotary_embedding", "fused", "RoPE, half-rotation layout, per-token positions", ("q", "k", "positions"),
    ("q_out", "k_out"), FLOATS, {"float32": (1e-4, 1e-5), "bfloat16": (2e-2, 2e-2), "float16": (2e-3, 2e-3)},
    _cases, attrs=(_THETA,), grad="rotary_embedding_grad", grad_attrs=(_THETA,))]
