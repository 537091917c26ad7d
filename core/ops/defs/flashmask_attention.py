"""flashmask_attention: attention under FlashMask's column-sparse mask."""

from __future__ import annotations

import functools

import numpy as np

from ...conformance.case import CPU, Case, normal
from ...dtypes import FLOATS
from .. import masks
from ..attention import _Attention, flashmask_attention
from ..definition import OpDef
from .attention import ATTRS

# The kernel contract (rendered into anychip/ops.h): inputs -> outputs, then the math.
CONTRACT = """\
flashmask_attention: q, k, v as attention, startend_row_indices int32[B, Hm, Sk, E]
                 with Hm in {1, Hk, Hq} and E in {1, 2, 4} -> o, lse; attrs: scale, causal.
                 Column j of the mask for query head h is row (h * Hm / Hq) of dim 1.
                 Query row i is hidden from key j when (causal and j > i + Sk - Sq) or
                   E=1 (causal only):      i >= LTS[j]
                   E=2, causal:            LTS[j] <= i < LTE[j]
                   E=2, not causal:        i >= LTS[j] or i < UTE[j]
                   E=4 (not causal only):  LTS[j] <= i < LTE[j] or UTS[j] <= i < UTE[j]
                 (the columns of dim 3 are, in order, LTS, then LTE or UTE for E=2, and
                 LTS, LTE, UTS, UTE for E=4). Every index lies in [0, Sq].
                 Must equal `attention` with the equivalent dense mask bit for bit.
flashmask_attention_grad: do, q, k, v, o, lse, startend_row_indices -> dq, dk, dv
"""


def _four_column_mask(rng, seq, heads):
    """[LTS, LTE, UTS, UTE] per kv head (causal=False): random hidden bands below and above."""
    lts = rng.integers(0, seq + 1, (1, heads, seq))
    lte = np.minimum(lts + rng.integers(0, seq, (1, heads, seq)), seq)
    uts = rng.integers(0, seq + 1, (1, heads, seq))
    ute = np.minimum(uts + rng.integers(0, 5, (1, heads, seq)), seq)
    return np.stack([lts, lte, uts, ute], -1).astype(np.int32)


def _flashmask_reference(impl, q, k, v, startend_row_indices):
    return impl.reference(q, k, v, startend_row_indices)


def _cases(op, dtype, rng):
    seq, hq, hk, d = 40, 4, 2, 16
    third, quarter = seq // 3, seq // 4
    families = [
        ("causal", masks.causal(seq), True),
        ("sliding window of 7", masks.sliding_window(seq, 7), True),
        ("causal documents 13+13+14", masks.causal_document([third, third, seq - 2 * third]), True),
        ("prefix-LM, 2 documents", masks.prefix_lm([seq // 2, seq - seq // 2], [3, 5]), False),
        ("shared question, 3 answers",
         masks.share_question(quarter, [quarter, quarter, seq - 3 * quarter]), True),
        ("4-column mask per kv head", _four_column_mask(rng, seq, hk), False),
        ("causal documents 50+100: more than two key tiles", masks.causal_document([50, 100]), True),
    ]
    out = []
    for label, startend, causal in families:
        n = startend.shape[2]
        inputs = {"q": normal(rng, 1, n, hq, d), "k": normal(rng, 1, n, hk, d), "v": normal(rng, 1, n, hk, d),
                  "startend_row_indices": startend}
        out.append(Case(label, inputs,
                        functools.partial(flashmask_attention, causal=causal, return_lse=True),
                        functools.partial(_flashmask_reference,
                                          _Attention("flashmask_attention", 1.0 / np.sqrt(d), causal, CPU, True)),
                        ("o", "lse"), {"causal": causal}, ("q", "k", "v"), (normal(rng, 1, n, hq, d), None)))
    return out


DEFINITIONS = [OpDef(
    "flashmask_attention", "fused", "FlashMask column-sparse masked attention",
    ("q", "k", "v", "startend_row_indices"), ("o", "lse"), FLOATS, {"float32": (2e-4, 2e-5), "bfloat16": (3e-2, 3e-2), "float16": (4e-3, 4e-3)}, _cases,
    attrs=ATTRS, grad="flashmask_attention_grad", grad_attrs=ATTRS)]
