"""Attention: dense (optionally masked) and FlashMask, both flash-style with grouped-query heads.

Layout ``[batch, seq, heads, head_dim]``. Causal masking is bottom-right aligned, so a query
block at the end of a KV cache sees the whole cache. Both return the log-sum-exp of each
query row on request (``return_lse=True``), which is what the backward needs.
"""

from __future__ import annotations

import math

import numpy as np

from . import checks
from .dispatch import OpImpl, attrs, dtype_name, empty, launch, paddle, run, zeros

MAX_HEAD_DIM = 256


class _Attention(OpImpl):
    """attention and flashmask_attention share everything but the mask input's meaning."""

    def __init__(self, name: str, scale: float, causal: bool, device, has_mask: bool):
        self.name, self.scale, self.causal, self.device, self.has_mask = name, scale, causal, device, has_mask

    def forward(self, kernel, q, k, v, mask=None):
        b, sq, hq, _ = q.shape
        o = empty(q.shape, dtype_name(q), self.device)
        lse = empty([b, hq, sq], "float32", self.device)
        inputs = [q, k, v] + ([mask] if mask is not None else [])
        launch(kernel, self.name, self.device, inputs, [o, lse], attrs(self.name, scale=self.scale, causal=self.causal))
        return (o, lse), (q, k, v, o, lse) + ((mask,) if mask is not None else ()), [lse]

    def backward(self, kernel, saved, grads):
        q, k, v, o, lse = saved[:5]
        mask = saved[5] if self.has_mask else None
        do = grads[0] if grads[0] is not None else zeros(o.shape, dtype_name(o), self.device)
        dq = empty(q.shape, dtype_name(q), self.device)
        dk = empty(k.shape, dtype_name(k), self.device)
        dv = empty(v.shape, dtype_name(v), self.device)
        inputs = [do.contiguous(), q, k, v, o, lse] + ([mask] if mask is not None else [])
        launch(kernel, self.name + "_grad", self.device, inputs, [dq, dk, dv],
               attrs(self.name, grad=True, scale=self.scale, causal=self.causal))
        return (dq, dk, dv) + ((None,) if self.has_mask else ())

    def reference(self, q, k, v, mask=None):
        if mask is not None and self.name == "flashmask_attention":
            mask = paddle().to_tensor(flashmask_dense_mask(mask.numpy(), q.shape[1], q.shape[2], self.causal),
                                      place=q.place)
        return reference_attention(q, k, v, self.scale, self.causal, mask)


def reference_attention(q, k, v, scale: float, causal: bool, mask=None):
    """Dense attention with plain Paddle ops in float32: the oracle and the fallback.
    Returns ``(o, lse)`` like the kernels (o = 0 and lse = -inf for a row that sees no key)."""
    pd = paddle()
    b, sq, hq, d = q.shape
    sk, hk = k.shape[1], k.shape[2]
    qf = q.astype("float32").transpose([0, 2, 1, 3])
    kf = k.astype("float32").transpose([0, 2, 1, 3])
    vf = v.astype("float32").transpose([0, 2, 1, 3])
    if hq != hk:
        kf = pd.repeat_interleave(kf, hq // hk, axis=1)
        vf = pd.repeat_interleave(vf, hq // hk, axis=1)
    s = pd.matmul(qf, kf, transpose_y=True) * scale
    visible = None
    if causal:
        rows = np.arange(sq)[:, None] + (sk - sq)
        visible = pd.to_tensor(np.arange(sk)[None, :] <= rows, place=q.place)
    if mask is not None:
        visible = mask if visible is None else pd.logical_and(mask, visible)
    if visible is not None:
        s = pd.where(visible, s, pd.full([], -math.inf, "float32", device=q.place))
    m = s.max(axis=-1, keepdim=True).detach()
    m = pd.where(pd.isinf(m), pd.zeros_like(m), m)
    p = pd.exp(s - m)
    if visible is not None:  # Paddle's vectorised CPU exp(-inf) is 2.9e-39, not 0
        p = pd.where(visible, p, pd.zeros_like(p))
    denom = p.sum(axis=-1, keepdim=True)
    o = pd.matmul(p / pd.where(denom == 0, pd.ones_like(denom), denom), vf)
    lse = (pd.log(denom) + m).squeeze(-1)
    return o.transpose([0, 2, 1, 3]).astype(q.dtype), lse.detach()


def _check_qkv(op, q, k, v):
    q, k, v = checks.tensor(op, "q", q), checks.tensor(op, "k", k), checks.tensor(op, "v", v)
    checks.dtype(op, "q", q, checks.FLOAT_DTYPES)
    checks.same_dtype(op, "q", q, k=k, v=v)
    checks.rank(op, "q", q, 4, "[batch, seq_q, heads, head_dim]")
    checks.rank(op, "k", k, 4, "[batch, seq_k, kv_heads, head_dim]")
    checks.rank(op, "v", v, 4, "[batch, seq_k, kv_heads, head_dim]")
    b, _, hq, d = q.shape
    if k.shape[0] != b or k.shape[3] != d:
        raise checks.OpArgumentError(f"{op}: k must be [{b}, seq_k, kv_heads, {d}] to match q {list(q.shape)}, got {list(k.shape)}")
    checks.shape(op, "v", v, k.shape, "k's shape")
    if k.shape[2] == 0 or hq % k.shape[2]:
        raise checks.OpArgumentError(f"{op}: q's heads ({hq}) must be a multiple of k's kv_heads ({k.shape[2]})")
    if not 0 < d <= MAX_HEAD_DIM:
        raise checks.OpArgumentError(f"{op}: head_dim must be in 1..{MAX_HEAD_DIM}, got {d}")
    return q, k, v


def attention(q, k, v, causal: bool = False, scale: float | None = None, mask=None, return_lse: bool = False):
    """``softmax(q k^T * scale + mask) v`` per head, flash-style (O(seq) extra memory).

    q [B, Sq, Hq, D]; k, v [B, Sk, Hk, D] with Hq a multiple of Hk (grouped-query attention).
    ``mask``: optional bool [B|1, Hq|1, Sq, Sk], True where a query may attend a key.
    ``causal``: key j visible to query i iff j <= i + Sk - Sq. ``scale`` defaults to 1/sqrt(D).
    Returns o [B, Sq, Hq, D], and with ``return_lse`` also the float32 log-sum-exp [B, Hq, Sq].
    """
    op = "attention"
    q, k, v = _check_qkv(op, q, k, v)
    mask = checks.tensor(op, "mask", mask, optional=True)
    b, sq, hq, d = q.shape
    if mask is not None:
        checks.dtype(op, "mask", mask, ("bool",))
        checks.rank(op, "mask", mask, 4, "[batch|1, heads|1, seq_q, seq_k]")
        mb, mh, ms, mk = mask.shape
        if mb not in (1, b) or mh not in (1, hq) or ms != sq or mk != k.shape[1]:
            raise checks.OpArgumentError(
                f"{op}: mask must be [{b} or 1, {hq} or 1, {sq}, {k.shape[1]}], got {list(mask.shape)}")
    device = checks.same_device(op, q=q, k=k, v=v, mask=mask)
    q, k, v, mask = (checks.contiguous(op, n, t, device) for n, t in (("q", q), ("k", k), ("v", v), ("mask", mask)))
    scale = 1.0 / math.sqrt(d) if scale is None else float(scale)
    impl = _Attention(op, scale, bool(causal), device, mask is not None)
    tensors = (q, k, v) + ((mask,) if mask is not None else ())
    o, lse = run(impl, device, dtype_name(q), *tensors)
    return (o, lse) if return_lse else o


def flashmask_dense_mask(startend: np.ndarray, seq_q: int, num_heads: int, causal: bool) -> np.ndarray:
    """The dense bool mask [B, Hq|1, Sq, Sk] (True = visible) that ``startend_row_indices``
    describes (rules in anychip/kernel.h); Hm is broadcast to the query heads."""
    b, hm, sk, e = startend.shape
    rows = np.arange(seq_q)[None, None, :, None]
    cols = lambda i: startend[..., i].astype(np.int64)[:, :, None, :]  # noqa: E731  [B, Hm, 1, Sk]
    if e == 1:
        hidden = rows >= cols(0)
    elif e == 2 and causal:
        hidden = (rows >= cols(0)) & (rows < cols(1))
    elif e == 2:
        hidden = (rows >= cols(0)) | (rows < cols(1))
    else:
        hidden = ((rows >= cols(0)) & (rows < cols(1))) | ((rows >= cols(2)) & (rows < cols(3)))
    visible = ~hidden
    if causal:
        visible = visible & (np.arange(sk)[None, :] <= np.arange(seq_q)[:, None] + (sk - seq_q))[None, None]
    if hm not in (1, num_heads):
        visible = np.repeat(visible, num_heads // hm, axis=1)
    return visible


def flashmask_attention(q, k, v, startend_row_indices, causal: bool = True, scale: float | None = None,
                        return_lse: bool = False):
    """Attention with a FlashMask column-sparse mask (Paddle's semantics, arXiv 2410.01359).

    ``startend_row_indices``: int32 [B, Hm, Sk, E], Hm in {1, Hk, Hq}; for each key column the
    masked query rows: E=1 (causal) [LTS]; E=2 [LTS, LTE] if causal else [LTS, UTE]; E=4
    (not causal) [LTS, LTE, UTS, UTE] (see ``anychip.ops.masks`` for the usual families).
    Fully masked tiles are skipped, so a document mask costs what its visible part costs.
    """
    op = "flashmask_attention"
    q, k, v = _check_qkv(op, q, k, v)
    se = checks.tensor(op, "startend_row_indices", startend_row_indices)
    b, sq, hq, d = q.shape
    sk, hk = k.shape[1], k.shape[2]
    checks.dtype(op, "startend_row_indices", se, ("int32",))
    checks.rank(op, "startend_row_indices", se, 4, "[batch, 1|kv_heads|heads, seq_k, 1|2|4]")
    sb, sh, ssk, e = se.shape
    if sb != b or sh not in (1, hk, hq) or ssk != sk or e not in (1, 2, 4):
        raise checks.OpArgumentError(
            f"{op}: startend_row_indices must be [{b}, 1|{hk}|{hq}, {sk}, 1|2|4], got {list(se.shape)}")
    if e == 1 and not causal:
        raise checks.OpArgumentError(f"{op}: startend_row_indices with 1 column needs causal=True")
    if e == 4 and causal:
        raise checks.OpArgumentError(f"{op}: startend_row_indices with 4 columns needs causal=False")
    device = checks.same_device(op, q=q, k=k, v=v, startend_row_indices=se)
    values = se.numpy()  # a copy to the host, not a kernel: the check must not launch anything
    if values.size and (values.min() < 0 or values.max() > sq):
        bad = np.argwhere((values < 0) | (values > sq))[0]
        raise checks.OpArgumentError(
            f"{op}: startend_row_indices{list(bad)} = {values[tuple(bad)]} is outside the query rows [0, {sq}]")
    q, k, v, se = (checks.contiguous(op, n, t, device) for n, t in (("q", q), ("k", k), ("v", v), ("startend_row_indices", se)))
    scale = 1.0 / math.sqrt(d) if scale is None else float(scale)
    o, lse = run(_Attention(op, scale, bool(causal), device, True), device, dtype_name(q), q, k, v, se)
    return (o, lse) if return_lse else o
