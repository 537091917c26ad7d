"""Post-training quantization math in numpy (float64 inside): round-to-nearest, GPTQ,
SmoothQuant scales and A8W8 weights, all producing anychip's symmetric layouts.

Weights come as [N out, K in] (Hugging Face layout, as in a Checkpoint); the results are
:class:`~anychip_models.checkpoint.QuantWeight` (weight-only int8 / int4, W = q * scales[n, k //
group_size]) or, for A8W8, the (qweight, scales) pair ``anychip.ops.w8a8_linear`` takes. The grid
is the one ``weight_quantize`` uses: scale = absmax / qmax (qmax 127 or 7), q = round half away
from zero of w / scale, clipped to [-qmax, qmax]; a group whose weights are all 0 has scale 0 and
q 0. ``group_size`` -1 means one scale per output channel (scales [N, 1]).

    rtn(w, 4, 64)                       # QuantWeight, same as weight_quantize(w.T, 4, 64)
    h = Hessian(k); h.add(x_rows)       # over the calibration activations entering the layer
    gptq(w, h.matrix, 4, 64)            # QuantWeight with error feedback (Frantar et al. 2022)
    s = smooth_scales(x_absmax, [wq, wk, wv]); wq * s ...   # SmoothQuant (Xiao et al. 2022)
    qw, ws = w8a8(w * s); fake_w8a8(x / s, qw, ws)          # A8W8, emulated as the kernel does it
"""

from __future__ import annotations

import numpy as np

from ..checkpoint import QuantWeight

from anychip.ops.quant import quantize_numpy

BITS = (4, 8)


def _qmax(bits: int) -> int:
    return 127 if bits == 8 else 7


def _check(w: np.ndarray, bits: int, group_size: int, what: str) -> tuple[int, int]:
    if w.ndim != 2:
        raise ValueError(f"{what}: w must be [N, K], got shape {w.shape}")
    n, k = w.shape
    if bits not in BITS:
        raise ValueError(f"{what}: bits must be 4 or 8, got {bits}")
    if group_size != -1 and (group_size <= 0 or k % group_size):
        raise ValueError(f"{what}: group_size must be -1 or divide K={k}, got {group_size}")
    if bits == 4 and k % 64:
        raise ValueError(f"{what}: 4-bit weights need K to be a multiple of 64, got K={k}")
    return n, k


def _round_half_away(v: np.ndarray) -> np.ndarray:
    return np.sign(v) * np.floor(np.abs(v) + 0.5)


def pack_int4(q: np.ndarray) -> np.ndarray:
    """q [N, K] integers in [-8, 7] -> uint8 [N, K/2] in anychip's nibble layout (per 64 k a
    32-byte block, byte i = (q[64b+i]+8) | (q[64b+32+i]+8) << 4)."""
    n, k = q.shape
    if k % 64:
        raise ValueError(f"pack_int4: K must be a multiple of 64, got K={k}")
    nib = (np.asarray(q).astype(np.int16) + 8).astype(np.uint8).reshape(n, k // 64, 2, 32)
    return np.ascontiguousarray((nib[:, :, 0, :] | (nib[:, :, 1, :] << 4)).reshape(n, k // 2))


def unpack_int4(packed: np.ndarray) -> np.ndarray:
    """The inverse of :func:`pack_int4`: int8 q [N, K]."""
    n, half = packed.shape
    blocks = packed.reshape(n, half // 32, 1, 32)
    nib = np.concatenate([blocks & 0x0F, blocks >> 4], axis=2)
    return (nib.reshape(n, half * 2).astype(np.int16) - 8).astype(np.int8)


def quant_codes(qw: QuantWeight) -> np.ndarray:
    """The integer codes q [N, K] (int8) of a QuantWeight, whatever its bit width."""
    return qw.qweight.astype(np.int8) if qw.bits == 8 else unpack_int4(qw.qweight)


def _pack(q: np.ndarray, scales: np.ndarray, bits: int, group_size: int) -> QuantWeight:
    packed = q.astype(np.int8) if bits == 8 else pack_int4(q)
    return QuantWeight(np.ascontiguousarray(packed), np.ascontiguousarray(scales, dtype=np.float32), bits, group_size)


# ---- round to nearest --------------------------------------------------------------------------

def rtn(w: np.ndarray, bits: int, group_size: int) -> QuantWeight:
    """Round-to-nearest with symmetric abs-max scales per output channel (group_size -1) or per
    ``group_size`` inputs: exactly ``weight_quantize(w.T, bits, group_size)``."""
    _check(np.asarray(w), bits, group_size, "rtn")
    qweight, scales = quantize_numpy(np.asarray(w).T, bits, group_size)
    return QuantWeight(np.ascontiguousarray(qweight), scales, bits, group_size)


# ---- GPTQ --------------------------------------------------------------------------------------

class Hessian:
    """H = 2/n * sum over calibration rows of x x^T (float64), the layer-wise proxy Hessian of
    ||X W^T - X Q^T||^2; rows may come in any number of ``add`` calls."""

    def __init__(self, k: int):
        self.k = int(k)
        self._sum = np.zeros((self.k, self.k), np.float64)
        self.count = 0

    def add(self, x: np.ndarray) -> None:
        """x [..., K]: each row one calibration input of the layer."""
        x = np.asarray(x, dtype=np.float64)
        if x.shape[-1] != self.k:
            raise ValueError(f"Hessian.add: expected rows of {self.k} features, got shape {x.shape}")
        x = x.reshape(-1, self.k)
        self._sum += x.T @ x
        self.count += x.shape[0]

    @property
    def matrix(self) -> np.ndarray:
        if self.count == 0:
            raise ValueError("Hessian.matrix: no calibration rows added")
        return self._sum * (2.0 / self.count)


def _group_scales(cols: np.ndarray, qmax: int) -> np.ndarray:
    """float32-representable float64 scales [N] of the weights cols [N, g]."""
    return (np.abs(cols).max(axis=1) / qmax).astype(np.float32).astype(np.float64)


def _searched_scales(cols: np.ndarray, qmax: int, weight: np.ndarray, shrink: float = 0.75,
                     steps: int = 26) -> np.ndarray:
    """Scales [N] for the weights cols [N, g]: of abs-max / qmax shrunk by each factor in
    [shrink, 1], the one whose rounding error, each input weighted by ``weight`` [g] (the diagonal
    of the Hessian: how much that input's error costs), is least per row."""
    absmax = np.abs(cols).max(axis=1)
    best = _group_scales(cols, qmax)
    best_err = np.full(cols.shape[0], np.inf)
    for factor in np.linspace(1.0, shrink, steps):
        scale = (absmax * factor / qmax).astype(np.float32).astype(np.float64)
        err = ((cols - _quantize_column(cols, scale[:, None], qmax) * scale[:, None]) ** 2) @ weight
        better = err < best_err
        best[better], best_err[better] = scale[better], err[better]
    return best


def _quantize_column(w: np.ndarray, scale: np.ndarray, qmax: int) -> np.ndarray:
    safe = np.where(scale == 0, 1.0, scale)
    return np.clip(_round_half_away(w / safe), -qmax, qmax)


def gptq(w: np.ndarray, hessian: np.ndarray, bits: int, group_size: int, damp: float = 0.01,
         block: int = 128, act_order: bool = False) -> QuantWeight:
    """GPTQ (Frantar et al. 2022, arXiv 2210.17323): quantizes W [N, K] column by column,
    spreading each column's rounding error over the columns not yet quantized through the upper
    Cholesky factor of H^-1, in blocks of ``block`` columns with lazy updates of the rest.

    ``hessian`` [K, K] is :class:`Hessian`'s matrix. Inputs never active (H_ii = 0) get W[:, i] = 0;
    ``damp * mean(diag H)`` is added to the diagonal. Scales are symmetric, searched per row and
    group (:func:`_searched_scales`, the ``mse`` grid of the GPTQ authors' code, weighted by
    diag(H)): per output channel from the original W (group_size -1), else per group from the
    weights as updated when the group's first column comes up. ``act_order``: columns in
    decreasing diag(H) order; the group scales are then all computed up front from the original W
    (after zeroing dead inputs), so each still covers its own contiguous k-range."""
    w = np.asarray(w)
    n, k = _check(w, bits, group_size, "gptq")
    if block <= 0:
        raise ValueError(f"gptq: block must be positive, got {block}")
    h = np.array(hessian, dtype=np.float64)
    if h.shape != (k, k):
        raise ValueError(f"gptq: hessian must be [K, K] = [{k}, {k}], got {h.shape}")
    qmax = _qmax(bits)
    gs = k if group_size == -1 else group_size
    groups = k // gs

    W = w.astype(np.float64).copy()
    dead = np.diag(h) == 0
    h[dead, dead] = 1.0
    W[:, dead] = 0.0

    # scales known before the loop: per-channel always, every group with act_order
    scales = np.zeros((n, groups), np.float64)
    fixed = group_size == -1 or act_order
    if fixed:
        for g in range(groups):
            scales[:, g] = _searched_scales(W[:, g * gs:(g + 1) * gs], qmax, np.diag(h)[g * gs:(g + 1) * gs])

    perm = np.argsort(-np.diag(h), kind="stable") if act_order else np.arange(k)
    W = W[:, perm]
    h = h[np.ix_(perm, perm)]
    h[np.diag_indices(k)] += damp * np.mean(np.diag(h))
    try:
        hinv = np.linalg.inv(np.linalg.cholesky(h))  # L^-1, H^-1 = L^-T L^-1
        U = np.linalg.cholesky(hinv.T @ hinv).T      # upper: H^-1 = U^T U
    except np.linalg.LinAlgError as e:
        raise ValueError(f"gptq: the Hessian is not positive definite even with damp={damp}; "
                         "use more calibration rows or a larger damp") from e

    Q = np.zeros((n, k), np.float64)
    for i1 in range(0, k, block):
        i2 = min(i1 + block, k)
        W1 = W[:, i1:i2].copy()
        E1 = np.zeros_like(W1)
        U1 = U[i1:i2, i1:i2]
        for i in range(i2 - i1):
            col = i1 + i
            g = perm[col] // gs
            if not fixed and col % gs == 0:
                # the group's weights as they stand now: updated within this block, and with the
                # pending updates of this block applied to any columns past it
                end = col + gs
                cur = W1[:, i:min(end, i2) - i1]
                if end > i2:
                    rest = W[:, i2:end] - E1[:, :i] @ U[i1:i1 + i, i2:end]
                    cur = np.concatenate([cur, rest], axis=1)
                scales[:, g] = _searched_scales(cur, qmax, np.diag(h)[col:end])
            wcol = W1[:, i]
            q = _quantize_column(wcol, scales[:, g], qmax)
            Q[:, col] = q
            err = (wcol - q * scales[:, g]) / U1[i, i]
            W1[:, i:] -= np.outer(err, U1[i, i:])
            E1[:, i] = err
        W[:, i2:] -= E1 @ U[i1:i2, i2:]

    q = np.empty_like(Q)
    q[:, perm] = Q
    return _pack(q, scales, bits, group_size)


# ---- SmoothQuant -------------------------------------------------------------------------------

def smooth_scales(act_absmax: np.ndarray, weights: list[np.ndarray], alpha: float = 0.5) -> np.ndarray:
    """SmoothQuant (Xiao et al. 2022) per-input-channel factors s [K] for the linears ``weights``
    ([N_i, K] each) that read the same activations: s_j = max|X_j|^alpha / max_i max_n
    |W_i[n, j]|^(1 - alpha), at least 1e-5 (the weight max itself floored at 1e-5 as the
    reference does, so a dead weight column gives no infinity), and 1 where max|X_j| is 0.
    Use: X / s (fold 1/s into the RMSNorm weight before) and each W_i * s (columns)."""
    a = np.asarray(act_absmax, dtype=np.float64).reshape(-1)
    if not weights:
        raise ValueError("smooth_scales: needs at least one weight")
    if not 0.0 <= alpha <= 1.0:
        raise ValueError(f"smooth_scales: alpha must be in [0, 1], got {alpha}")
    for wi in weights:
        if wi.ndim != 2 or wi.shape[1] != a.size:
            raise ValueError(f"smooth_scales: weights must be [N, K={a.size}], got {wi.shape}")
    wmax = np.max([np.abs(np.asarray(wi, dtype=np.float64)).max(axis=0) for wi in weights], axis=0)
    wmax = np.maximum(wmax, 1e-5)
    a = np.abs(a)
    s = np.maximum(a ** alpha / wmax ** (1.0 - alpha), 1e-5)
    return np.where(a == 0, 1.0, s)


# ---- A8W8 --------------------------------------------------------------------------------------

def w8a8(w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """W [N, K] -> (qweight int8 [N, K], scales float32 [N, 1]): per-output-channel symmetric
    int8, i.e. weight_quantize(w.T, 8, -1), the layout ``anychip.ops.w8a8_linear`` checks."""
    _check(np.asarray(w), 8, -1, "w8a8")
    qweight, scales = quantize_numpy(np.asarray(w).T, 8, -1)
    return np.ascontiguousarray(qweight), scales


def fake_w8a8(x: np.ndarray, qweight: np.ndarray, scales: np.ndarray) -> np.ndarray:
    """``w8a8_linear`` in numpy: x [..., K] -> y float64 [..., N]. x is taken as float32 (what the
    kernel reads) and quantized per row as the host kernel does it, in float32: sx = absmax / 127,
    q = round half away from zero of x / sx clipped to +-127 (0 for an all-zero row); integer
    products summed exactly, then y = acc * sx * scales[n] (in float64 here: the kernel rounds
    that product to float32, ~1e-7 relative)."""
    x32 = np.asarray(x, dtype=np.float32)
    k = x32.shape[-1]
    lead = x32.shape[:-1]
    x32 = x32.reshape(-1, k)
    n = qweight.shape[0]
    if qweight.shape != (n, k):
        raise ValueError(f"fake_w8a8: qweight must be [N, K={k}], got {qweight.shape}")
    ws = np.asarray(scales, dtype=np.float32).reshape(-1)
    if ws.size != n:
        raise ValueError(f"fake_w8a8: scales must be [N] or [N, 1] with N={n}, got {np.shape(scales)}")
    sx = (np.abs(x32).max(axis=1) if k else np.zeros(len(x32), np.float32)) / np.float32(127)
    safe = np.where(sx > 0, sx, np.float32(1))
    v = np.clip(x32 / safe[:, None], np.float32(-127), np.float32(127)).astype(np.float64)
    xq = np.where(sx[:, None] > 0, _round_half_away(v), 0.0)
    acc = xq @ qweight.astype(np.float64).T  # integers below 2^53: exact
    y = acc * sx.astype(np.float64)[:, None] * ws.astype(np.float64)[None, :]
    return y.reshape(*lead, n)
