"""attention: flash attention with grouped-query heads, causal or a bool mask, returning the LSE."""

from __future__ import annotations

import functools

import numpy as np

from ...conformance.case import CPU, Case, normal
from ...dtypes import FLOATS
from ..attention import _Attention, attention
from ..definition import Attr, OpDef

# The kernel contract (rendered into anychip/ops.h): inputs -> outputs, then the math.
CONTRACT = """\
attention:       q[B,Sq,Hq,D], k[B,Sk,Hk,D], v[B,Sk,Hk,D], mask bool[B|1, Hq|1, Sq, Sk]?
                 -> o[B,Sq,Hq,D], lse f32[B,Hq,Sq]; attrs: scale, causal.
                 Hq is a multiple of Hk; query head h reads kv head h / (Hq / Hk).
                 Key j is visible to query i when mask[i, j] is true (if given) and, if
                 causal, j <= i + Sk - Sq (bottom-right aligned, as with a KV cache).
                 A query row that sees no key gets o = 0 and lse = -inf.
attention_grad:  do, q, k, v, o, lse, mask? -> dq, dk, dv; attrs: scale, causal
"""


def _cases(op, dtype, rng):
    out = []
    for label, (b, sq, sk, hk, group, d), causal, mask, scale in [
        ("decode: 1 query over 17 keys", (1, 1, 17, 2, 2, 64), True, None, None),
        ("3 query heads per kv head, head_dim 17", (2, 13, 13, 2, 3, 17), True, None, None),
        ("not causal, more keys than queries, head_dim 8", (1, 9, 30, 1, 1, 8), False, None, 0.3),
        ("bool mask per batch and head", (2, 7, 11, 1, 2, 16), False, "full", None),
        ("a query row that sees no key (o 0, lse -inf)", (1, 6, 9, 1, 2, 16), False, "empty row", None),
        ("causal and a broadcast mask [1, 1, Sq, Sk]", (1, 33, 40, 2, 1, 32), True, "broadcast", None),
        ("70 queries: more than one tile", (1, 70, 70, 1, 2, 64), True, None, None),
        ("3 queries over 150 cached keys, 4 query heads per kv head", (1, 3, 150, 1, 4, 64), True, None, None),
        ("head_dim 256, the largest", (1, 5, 9, 1, 1, 256), False, None, None),
    ]:
        hq = hk * group
        inputs = {"q": normal(rng, b, sq, hq, d), "k": normal(rng, b, sk, hk, d), "v": normal(rng, b, sk, hk, d)}
        if mask == "full":
            inputs["mask"] = rng.random((b, hq, sq, sk)) < 0.7
        elif mask == "broadcast":
            inputs["mask"] = rng.random((1, 1, sq, sk)) < 0.8
        elif mask == "empty row":
            inputs["mask"] = rng.random((b, hq, sq, sk)) < 0.7
            inputs["mask"][:, :, 2] = False
        used_scale = 1.0 / np.sqrt(d) if scale is None else scale
        attrs = {"causal": causal} | ({"scale": scale} if scale is not None else {})
        out.append(Case(label, inputs, functools.partial(attention, causal=causal, scale=scale, return_lse=True),
                        _Attention("attention", used_scale, causal, CPU, mask is not None).reference, ("o", "lse"),
                        attrs, ("q", "k", "v"), (normal(rng, b, sq, hq, d), None)))
    return out


ATTRS = (Attr("scale", "the logits' factor (usually 1/sqrt(D))"),
         Attr("causal", "1: key j is hidden from query i when j > i + Sk - Sq"))
DEFINITIONS = [OpDef(
    "attention", "fused", "flash attention, GQA, causal/bool mask, returns LSE", ("q", "k", "v", "mask?"),
    ("o", "lse"), FLOATS, {"float32": (2e-4, 2e-5), "bfloat16": (3e-2, 3e-2), "float16": (4e-3, 4e-3)}, _cases, attrs=ATTRS, grad="attention_grad",
    grad_attrs=ATTRS)]
