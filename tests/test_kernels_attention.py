"""The cpu plugin's attention kernels (attention, flashmask_attention and their grads) against a
float64 numpy oracle of the formulas in anychip/kernel.h, for float32, bfloat16 and float16:
odd shapes, Sq != Sk, decode (Sq = 1, split keys), grouped-query heads, causal and dense masks,
forward and backward; and FlashMask's promise that it returns exactly the bits of `attention`
with the equivalent dense mask, for the usual mask families. test_every_isa_path reruns this
file with ANYCHIP_CPU_ISA capped; in-process the best path runs (AMX for bfloat16 here)."""

import os
import subprocess
import sys

import numpy as np
import pytest

from isa_paths import isa_params
from kernel_helpers import empty, run, store, value

DTYPES = ["float32", "bfloat16", "float16"]
# |actual - expected| <= TOL * (|expected| + rms(expected)). The oracle starts from the stored
# (rounded) inputs, so this covers the kernels' fp32 arithmetic, bf16 probabilities in the PV
# product (bfloat16) and the final rounding of the outputs.
TOL = {"float32": 1e-4, "bfloat16": 2e-2, "float16": 4e-3}
LSE_TOL = 1e-5  # lse is float32 for every dtype: |error| <= LSE_TOL * (|lse| + 1)
# A grad may also be off by this much of the sum of the absolute values of its terms: float32
# rounding of sums that cancel, and (bfloat16) P and dS rounded to bf16 for the products.
GRAD_SLACK = {"float32": 2.0 ** -20, "bfloat16": 2.0 ** -8, "float16": 2.0 ** -20}


def assert_grads(grads, expected, dtype):
    for got, (want, magnitude), what in zip(grads, expected, ("dq", "dk", "dv")):
        assert_close(value(got), want, TOL[dtype], what, GRAD_SLACK[dtype] * magnitude)


def assert_close(actual, expected, tol, what, slack=0.0):
    actual, expected = np.asarray(actual, np.float64), np.asarray(expected, np.float64)
    assert actual.shape == expected.shape, what
    scale = np.sqrt(np.mean(expected ** 2)) if expected.size else 0.0
    err = np.abs(actual - expected)
    bad = ~(err <= tol * (np.abs(expected) + scale) + slack)  # NaN counts as bad
    assert not bad.any(), (f"{what}: {bad.sum()} of {bad.size} off, worst at "
                           f"{np.unravel_index(np.argmax(np.where(bad, err, -1)), bad.shape)}: "
                           f"{actual[bad][0]} vs {expected[bad][0]}")


def assert_lse(actual, expected, what):
    """Rows that see no key have lse = -inf; the others are finite and close."""
    hidden = np.isneginf(expected)
    np.testing.assert_array_equal(np.isneginf(actual), hidden, err_msg=f"{what}: rows with lse = -inf")
    err = np.abs(actual[~hidden] - expected[~hidden])
    assert (err <= LSE_TOL * (np.abs(expected[~hidden]) + 1)).all(), f"{what}: worst {err.max()}"


# ---- the oracle -------------------------------------------------------------------------------

def visibility(b, sq, sk, hq, causal, mask):
    """bool [B, Hq, Sq, Sk]: key j visible to query i (kernel.h)."""
    vis = np.ones((b, hq, sq, sk), bool)
    if causal:
        vis &= np.arange(sk)[None, :] <= np.arange(sq)[:, None] + (sk - sq)
    if mask is not None:
        vis &= np.broadcast_to(mask, vis.shape)
    return vis


def mm(a, b):
    """Batched matrix product without BLAS: its threads, woken for each small product, would
    cost more than the products on this 2-core machine."""
    return np.einsum("...ij,...jk->...ik", a, b)


def oracle(q, k, v, scale, vis, dout=None, o_given=None):
    """o, lse in float64 from float64 inputs [B, S, H, D]. With dout, the grads instead, each as
    (dq|dk|dv, the same products over absolute values), using o_given (the o the backward
    kernel is handed, rounded to its dtype) in rowsum(dO * O)."""
    group = q.shape[2] // k.shape[2]
    qh = q.transpose(0, 2, 1, 3)
    kh = np.repeat(k.transpose(0, 2, 1, 3), group, axis=1)
    vh = np.repeat(v.transpose(0, 2, 1, 3), group, axis=1)
    s = np.where(vis, mm(qh, kh.transpose(0, 1, 3, 2)) * scale, -np.inf)
    m = s.max(-1, keepdims=True, initial=-np.inf)
    m = np.where(np.isinf(m), 0.0, m)
    p = np.exp(s - m)
    total = p.sum(-1, keepdims=True)
    p = p / np.where(total == 0, 1.0, total)
    o = mm(p, vh)
    with np.errstate(divide="ignore"):
        lse = (np.log(total) + m)[..., 0]
    if dout is None:
        return o.transpose(0, 2, 1, 3), lse
    doh = dout.transpose(0, 2, 1, 3)
    oh = o_given.transpose(0, 2, 1, 3)
    ds = p * (mm(doh, vh.transpose(0, 1, 3, 2)) - (doh * oh).sum(-1, keepdims=True))
    b, hk, sk, d = k.shape[0], k.shape[2], k.shape[1], k.shape[3]
    # The magnitudes: every product over absolute values, dS's from its two terms before they
    # cancel (a row that sees one key has dS = 0 exactly, in rounding noise in float32).
    ds_abs = p * (mm(np.abs(doh), np.abs(vh).transpose(0, 1, 3, 2)) + np.abs(doh * oh).sum(-1, keepdims=True))
    grads = []
    for ds_, p_, f in ((ds, p, lambda x: x), (ds_abs, p, np.abs)):
        dq = mm(ds_, f(kh)) * scale
        dk = (mm(ds_.transpose(0, 1, 3, 2), f(qh)) * scale).reshape(b, hk, group, sk, d).sum(2)
        dv = mm(p_.transpose(0, 1, 3, 2), f(doh)).reshape(b, hk, group, sk, d).sum(2)
        grads.append([x.transpose(0, 2, 1, 3) for x in (dq, dk, dv)])
    return list(zip(*grads))


# ---- running the kernels ------------------------------------------------------------------------

def forward(name, q, k, v, extra, scale, causal, num_threads=0):
    b, sq, hq, _ = q.shape
    o, lse = empty(q.shape, "bfloat16" if q.dtype == np.uint16 else q.dtype), np.full((b, hq, sq), np.nan, np.float32)
    run(name, [q, k, v] + ([extra] if extra is not None else []), [o, lse], [scale, float(causal)], num_threads)
    return o, lse


def backward(name, dout, q, k, v, o, lse, extra, scale, causal, num_threads=0):
    dtype = "bfloat16" if q.dtype == np.uint16 else q.dtype
    grads = [empty(q.shape, dtype), empty(k.shape, dtype), empty(v.shape, dtype)]
    run(name + "_grad", [dout, q, k, v, o, lse] + ([extra] if extra is not None else []), grads,
        [scale, float(causal)], num_threads)
    return grads


def inputs(rng, b, sq, sk, hq, hk, d, dtype, spread=1.0):
    arrays = [store(rng.standard_normal(shape) * spread, dtype)
              for shape in ((b, sq, hq, d), (b, sk, hk, d), (b, sk, hk, d), (b, sq, hq, d))]
    return arrays, [value(a) for a in arrays]


# B, Sq, Sk, Hq, Hk, D, causal, mask shape (None: no mask; dims of the bool mask [B|1, H|1])
CASES = [
    (1, 64, 64, 1, 1, 64, False, None),
    (2, 37, 91, 4, 2, 48, True, None),       # Sq < Sk: bottom-right causal
    (1, 90, 50, 3, 1, 33, True, None),       # Sq > Sk: the first 40 rows see no key
    (2, 1, 300, 8, 2, 128, True, None),      # decode
    (1, 1, 700, 4, 4, 64, False, None),      # decode with the keys split across items
    (1, 5, 260, 8, 1, 80, True, None),       # short queries, all heads of the group in one tile
    (1, 70, 70, 2, 2, 256, False, None),
    (1, 20, 130, 6, 3, 7, True, None),
    (1, 40, 102, 2, 1, 16, True, None),      # Sk - Sq = 62: the causal edge 2 keys before a tile's end
    (2, 45, 77, 4, 2, 24, True, (2, 4)),     # dense mask per batch and head
    (2, 66, 66, 2, 1, 16, False, (1, 1)),    # broadcast mask
    (1, 9, 200, 4, 2, 40, False, (1, 4)),
]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", CASES, ids=lambda c: "x".join(str(int(x)) for x in c[:7]) + ("-mask" if c[7] else ""))
def test_attention_against_oracle(case, dtype):
    b, sq, sk, hq, hk, d, causal, mask_dims = case
    rng = np.random.default_rng(sum(case[:6]))
    (q, k, v, dout), (qf, kf, vf, dof) = inputs(rng, b, sq, sk, hq, hk, d, dtype)
    mask = None
    if mask_dims is not None:
        mask = rng.random(mask_dims + (sq, sk)) < 0.6
        mask[..., 1, :] = False  # a row that sees nothing
    scale = 1.0 / np.sqrt(d)
    vis = visibility(b, sq, sk, hq, causal, mask)
    o, lse = forward("attention", q, k, v, mask, scale, causal)
    o_ref, lse_ref = oracle(qf, kf, vf, scale, vis)
    assert_close(value(o), o_ref, TOL[dtype], "o")
    assert_lse(lse, lse_ref, "lse")
    grads = backward("attention", dout, q, k, v, o, lse, mask, scale, causal)
    assert_grads(grads, oracle(qf, kf, vf, scale, vis, dof, value(o)), dtype)


def test_large_scores_stay_stable():
    """Scores far from 0 (and rows whose maximum moves late) must not overflow the online softmax."""
    rng = np.random.default_rng(3)
    (q, k, v, dout), (qf, kf, vf, dof) = inputs(rng, 1, 40, 300, 2, 1, 32, "float32", spread=4.0)
    vis = visibility(1, 40, 300, 2, True, None)
    o, lse = forward("attention", q, k, v, None, 1.0, True)
    o_ref, lse_ref = oracle(qf, kf, vf, 1.0, vis)
    assert_close(o, o_ref, 1e-4, "o")
    assert_lse(lse, lse_ref, "lse")


def test_deterministic_across_thread_counts():
    rng = np.random.default_rng(4)
    for sq, sk in ((150, 150), (1, 2000)):
        (q, k, v, dout), _ = inputs(rng, 2, sq, sk, 6, 2, 64, "float32")
        runs = []
        for threads in (1, 2, 3):
            o, lse = forward("attention", q, k, v, None, 0.125, True, threads)
            runs.append([o, lse] + backward("attention", dout, q, k, v, o, lse, None, 0.125, True, threads))
        for other in runs[1:]:
            for a, b in zip(runs[0], other):
                np.testing.assert_array_equal(a, b)


def test_empty_tensors():
    q = np.ones((1, 3, 2, 8), np.float32)
    k = np.ones((1, 0, 2, 8), np.float32)
    o, lse = forward("attention", q, k, k, None, 1.0, False)
    np.testing.assert_array_equal(o, 0.0)
    assert np.isneginf(lse).all()
    dq, dk, dv = backward("attention", q, q, k, k, o, lse, None, 1.0, False)
    np.testing.assert_array_equal(dq, 0.0)
    q0 = np.ones((1, 0, 2, 8), np.float32)
    k1 = np.ones((1, 5, 2, 8), np.float32)
    forward("attention", q0, k1, k1, None, 1.0, True)
    _, dk, dv = backward("attention", q0, q0, k1, k1, q0, np.ones((1, 2, 0), np.float32), None, 1.0, True)
    np.testing.assert_array_equal(dk, 0.0)
    np.testing.assert_array_equal(dv, 0.0)


def test_refusals():
    q = np.ones((1, 4, 2, 8), np.float32)
    with pytest.raises(RuntimeError, match="contiguous"):
        forward("attention", np.ones((1, 4, 2, 16), np.float32)[..., ::2], q, q, None, 1.0, False)
    with pytest.raises(RuntimeError, match="dtype"):
        forward("attention", q.astype(np.float64), q.astype(np.float64), q.astype(np.float64), None, 1.0, False)
    with pytest.raises(RuntimeError, match="mask"):
        forward("attention", q, q, q, np.ones((1, 1, 4, 4), np.int32), 1.0, False)
    with pytest.raises(RuntimeError, match="startend_row_indices"):
        forward("flashmask_attention", q, q, q, np.ones((1, 1, 4, 3), np.int32), 1.0, False)


# ---- FlashMask -----------------------------------------------------------------------------------

def flash_dense(startend, sq, hq, causal):
    """The dense bool mask [B, Hq, Sq, Sk] that startend_row_indices [B, Hm, Sk, E] describes,
    written from the rules in kernel.h (causal folded in as well)."""
    b, hm, sk, e = startend.shape
    i = np.arange(sq)[:, None]
    col = [np.repeat(startend[..., c], hq // hm, axis=1)[:, :, None, :] for c in range(e)]  # [B, Hq, 1, Sk]
    if e == 1:
        hidden = i >= col[0]
    elif e == 2 and causal:
        hidden = (col[0] <= i) & (i < col[1])
    elif e == 2:
        hidden = (i >= col[0]) | (i < col[1])
    else:
        hidden = ((col[0] <= i) & (i < col[1])) | ((col[2] <= i) & (i < col[3]))
    return visibility(b, sq, sk, hq, causal, ~hidden)


def columns(*cols):
    return np.stack(cols, axis=-1).astype(np.int32)[None, None]


def causal_document(lens):
    return columns(np.repeat(np.cumsum(lens), lens))


def sliding_window(seq, window):
    return columns(np.minimum(np.arange(seq) + window, seq))


def prefix_lm(lens, prefixes):
    lts, ute, start = [], [], 0
    for length, prefix in zip(lens, prefixes):
        for j in range(start, start + length):
            lts.append(start + length)
            ute.append(start if j < start + prefix else j)
        start += length
    return columns(lts, ute)


def share_question(question, answers):
    seq = question + sum(answers)
    lts, start = np.full(seq, seq), question
    for length in answers:
        lts[start:start + length] = start + length
        start += length
    return columns(lts, np.full(seq, seq))


def random_bands(rng, b, hm, sq, sk, kind, whole_tiles=0.5):
    """Random hidden row bands [start, end), each empty, all rows or random (its ends mostly on or
    next to a 64-row tile edge), constant over runs of key columns that are either whole
    64-key tiles or 8..40 columns: so tiles come out hidden, visible or mixed, and bounds sit
    on the classification's edges. "band" (E=2, causal): one hidden band; "outside" (E=2):
    all hidden but one band; "two" (E=4): two hidden bands."""
    edges = [x for t in range(0, sq + 64, 64) for x in (t - 1, t, t + 1) if 0 <= x <= sq]

    def bound():
        return int(rng.choice(edges)) if rng.random() < 0.85 else int(rng.integers(0, sq + 1))

    def band():
        kind_, start = rng.integers(4), bound()
        if kind_ < 2:
            return ((sq, sq), (0, sq))[kind_]
        if kind_ == 2:
            return start, min(sq, start + int(rng.choice([1, 2, 64, 65, 128])))
        return tuple(sorted((start, bound())))

    out = np.empty((b, hm, sk, 4 if kind == "two" else 2), np.int32)
    for plane in np.ndindex(b, hm):
        j = 0
        while j < sk:
            width = 64 - j % 64 if rng.random() < whole_tiles else int(rng.integers(8, 41))
            start, end = band()
            cols = {"band": (start, end), "outside": (end, start), "two": (start, end) + band()}[kind]
            out[plane][j:j + width] = cols
            j += width
    return out


def flash_cases():
    """(name, startend [B, Hm, Sk, E], Sq, Hq, Hk, causal)."""
    rng = np.random.default_rng(7)
    docs = causal_document([50, 3, 97, 64, 1, 85])  # 300 keys
    return [
        ("causal", columns(np.full(200, 200)), 200, 4, 2, True),
        ("sliding_window", sliding_window(200, 37), 200, 4, 2, True),
        ("causal_document", docs, 300, 4, 2, True),
        ("causal_document_per_batch", np.concatenate([docs, causal_document([150, 150])]), 300, 2, 1, True),
        ("prefix_lm", prefix_lm([120, 80, 100], [30, 80, 1]), 300, 4, 4, False),
        ("share_question", share_question(70, [40, 90, 3, 60]), 263, 6, 3, True),
        ("band_per_kv_head", random_bands(rng, 2, 2, 200, 300, "band"), 200, 4, 2, True),
        ("outside_band_per_head", random_bands(rng, 2, 4, 200, 260, "outside"), 200, 4, 2, False),
        ("two_bands", random_bands(rng, 2, 1, 200, 300, "two"), 200, 3, 1, False),
        ("two_bands_per_head", random_bands(rng, 1, 2, 130, 500, "two"), 130, 2, 2, False),
        ("tile_aligned_band", random_bands(rng, 4, 1, 256, 256, "band", 1.0), 256, 1, 1, True),
        ("tile_aligned_two_bands", random_bands(rng, 4, 1, 256, 256, "two", 1.0), 256, 1, 1, False),
        ("short_queries_per_head", random_bands(rng, 1, 8, 5, 150, "band"), 5, 8, 2, True),
        ("decode_split_keys", columns(np.array([1] * 300 + [0] * 250 + [1] * 50)), 1, 8, 2, True),
    ]


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("case", flash_cases(), ids=lambda c: c[0])
def test_flashmask_equals_dense_mask_bit_for_bit(case, dtype):
    name, startend, sq, hq, hk, causal = case
    b, _, sk, _ = startend.shape
    rng = np.random.default_rng(sq + sk)
    (q, k, v, dout), (qf, kf, vf, dof) = inputs(rng, b, sq, sk, hq, hk, 32, dtype)
    dense = flash_dense(startend, sq, hq, causal)
    scale = 0.2
    o, lse = forward("flashmask_attention", q, k, v, startend, scale, causal)
    o_dense, lse_dense = forward("attention", q, k, v, dense, scale, causal)
    np.testing.assert_array_equal(o, o_dense)
    np.testing.assert_array_equal(lse, lse_dense)
    o_ref, lse_ref = oracle(qf, kf, vf, scale, dense)
    assert_close(value(o), o_ref, TOL[dtype], "o")
    assert_lse(lse, lse_ref, "lse")
    grads = backward("flashmask_attention", dout, q, k, v, o, lse, startend, scale, causal)
    grads_dense = backward("attention", dout, q, k, v, o, lse, dense, scale, causal)
    for got, want, what in zip(grads, grads_dense, ("dq", "dk", "dv")):
        np.testing.assert_array_equal(got, want, err_msg=what)
    assert_grads(grads, oracle(qf, kf, vf, scale, dense, dof, value(o)), dtype)


@pytest.mark.skipif(bool(os.environ.get("ANYCHIP_CPU_ISA")), reason="this run is already capped")
@pytest.mark.parametrize("isa", isa_params("scalar", "avx2", "avx512"))
def test_every_isa_path(isa):
    """Reruns this file with the kernels capped to `isa` (each picks its path per call)."""
    result = subprocess.run([sys.executable, "-m", "pytest", __file__, "-q", "-x", "-p", "no:cacheprovider"],
                            env={**os.environ, "ANYCHIP_CPU_ISA": isa}, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
