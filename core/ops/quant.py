"""Quantized linear layers: weight-only int8/int4 and int8 weights x int8 activations.

anychip's packed format (anychip/kernel.h, weight_quantize): qweight [N, K] int8 for 8 bits,
[N, K/2] uint8 for 4 bits (64-wide nibble blocks), scales float32 [N, G], with G = K /
group_size (1 for group_size -1). Weights come in Paddle's Linear layout [K, N] (in_features,
out_features). weight_quantize is symmetric, W = q * scale; weight_only_linear and dequantize also
take optional per-group offsets float32 [N, G], W = q * scale + offset, which is how asymmetric
formats such as GGUF's Q4_1 (groups of 32, w = d * q + m with q in 0..15) load exactly:
scale d, offset m + 8 d.
"""

from __future__ import annotations

import copy

import numpy as np

from . import checks
from ..host_memory import huge_pages_for
from ..kernels import NativeKernel
from ..plugins import registry
from .dispatch import (OpImpl, attrs, dense_descriptor, descriptor, device_of, dtype_name, empty, launch, launch_described,
                       paddle, run)

GROUP_SIZES = (-1, 32, 64, 128)  # the usual ones; any divisor of K works


def _check_bits_group(op: str, bits: int, group_size: int, k: int) -> None:
    if bits not in (4, 8):
        raise checks.OpArgumentError(f"{op}: bits must be 4 or 8, got {bits}")
    if group_size != -1 and (group_size <= 0 or k % group_size):
        usual = ", ".join(str(g) for g in GROUP_SIZES if g > 0)
        raise checks.OpArgumentError(
            f"{op}: group_size must be -1 or divide K={k} ({usual} are usual), got {group_size}")
    if bits == 4 and k % 64:
        raise checks.OpArgumentError(f"{op}: 4-bit weights need K to be a multiple of 64, got K={k}")


def _groups(k: int, group_size: int) -> int:
    return 1 if group_size == -1 else k // group_size


def _round_half_away(x):
    pd = paddle()
    return pd.sign(x) * pd.floor(pd.abs(x) + 0.5)


def dequantize(qweight, scales, bits: int, group_size: int, k: int, offsets=None):
    """W [N, K] float32 from anychip's packed format (q * scale, plus ``offsets`` [N, G] per group
    when given), with plain Paddle ops."""
    pd = paddle()
    n = qweight.shape[0]
    if bits == 8:
        q = qweight.astype("float32")
    else:
        blocks = qweight.astype("int32").reshape([n, k // 64, 32])
        low, high = blocks % 16, blocks // 16
        q = (pd.concat([low, high], axis=-1) - 8).reshape([n, k]).astype("float32")
    # per group by broadcasting ([N, G, group] against [N, G, 1]), not by repeating the scales:
    # multiply and add are base ops every device has, repeat_interleave is not
    group = k if group_size == -1 else group_size
    w = q.reshape([n, k // group, group]) * scales.unsqueeze(-1)
    if offsets is not None:
        w = w + offsets.unsqueeze(-1)
    return w.reshape([n, k])


class _Quantize(OpImpl):
    name = "weight_quantize"

    def __init__(self, bits, group_size, device):
        self.bits, self.group_size, self.device = bits, group_size, device

    def forward(self, kernel, w):
        k, n = w.shape
        qshape = [n, k] if self.bits == 8 else [n, k // 2]
        qweight = empty(qshape, "int8" if self.bits == 8 else "uint8", self.device)
        scales = empty([n, _groups(k, self.group_size)], "float32", self.device)
        launch(kernel, self.name, self.device, [w], [qweight, scales],
               attrs(self.name, bits=self.bits, group_size=self.group_size))
        return (qweight, scales), (), [qweight, scales]

    def reference(self, w):
        pd = paddle()
        k, n = w.shape
        qmax = 127 if self.bits == 8 else 7
        wt = w.astype("float32").transpose([1, 0])
        grouped = wt.reshape([n, _groups(k, self.group_size), -1])
        scales = grouped.abs().max(axis=-1) / qmax
        safe = pd.where(scales == 0, pd.ones_like(scales), scales).unsqueeze(-1)
        q = pd.clip(_round_half_away(grouped / safe), -qmax, qmax).reshape([n, k])
        if self.bits == 8:
            return q.astype("int8"), scales
        nib = (q + 8).astype("int32").reshape([n, k // 64, 2, 32])
        packed = nib[:, :, 0, :] + nib[:, :, 1, :] * 16
        return packed.reshape([n, k // 2]).astype("uint8"), scales


def weight_quantize(w, bits: int = 8, group_size: int = -1):
    """Quantizes a Linear weight ``w`` [K, N] (float) symmetrically to ``bits`` (8 or 4), one
    scale per output channel (group_size=-1) or per ``group_size`` inputs. Returns
    ``(qweight, scales)`` in anychip's packed format, for weight_only_linear / w8a8_linear."""
    op = "weight_quantize"
    w = checks.tensor(op, "w", w)
    checks.dtype(op, "w", w, checks.FLOAT_DTYPES)
    checks.rank(op, "w", w, 2, "[in_features K, out_features N]")
    _check_bits_group(op, bits, group_size, w.shape[0])
    device = checks.same_device(op, w=w)
    w = checks.contiguous(op, "w", w, device)
    qweight, scales = run(_Quantize(bits, group_size, device), device, dtype_name(w), w, differentiable=False)
    qweight.stop_gradient = scales.stop_gradient = True
    return qweight, scales


def _accept_packed(x, qweight, scales, bias, bits, group_size, offsets):
    """The device of a call that passes every check of :func:`_check_packed` with nothing to
    copy, read in one pass over the tensors; None for anything else, which _check_packed then
    explains or mends. Right after a GEMV has streamed its weights through the caches, every
    helper and Paddle getter runs cache-cold: there the step-by-step checks took 40-60 us a call
    and this pass 25-40 (alternating, K = N = 4096 4-bit GEMVs of ~450 us in between)."""
    tensor = paddle().Tensor
    if not (isinstance(x, tensor) and isinstance(qweight, tensor) and isinstance(scales, tensor)):
        return None
    xs, qs, ss = x.shape, qweight.shape, scales.shape
    if not xs or len(qs) != 2 or bits not in (4, 8):
        return None
    k, n = xs[-1], qs[0]
    if group_size != -1 and (group_size <= 0 or k % group_size) or bits == 4 and k % 64:
        return None
    xd = dtype_name(x)
    groups = _groups(k, group_size)
    if (xd not in checks.FLOAT_DTYPES or dtype_name(qweight) != ("uint8" if bits == 4 else "int8")
            or qs[1] != (k // 2 if bits == 4 else k) or dtype_name(scales) != "float32" or ss != [n, groups]):
        return None
    for t, dtype, shape in ((offsets, "float32", [n, groups]), (bias, xd, [n])):
        if t is not None and not (isinstance(t, tensor) and dtype_name(t) == dtype and t.shape == shape):
            return None
    device = device_of(x)
    for t in (x, qweight, scales, offsets, bias):
        if t is not None and (not t.is_contiguous() or t is not x and device_of(t) != device):
            return None
    return device


def _check_packed(op, x, qweight, scales, bias, bits, group_size, offsets=None):
    device = _accept_packed(x, qweight, scales, bias, bits, group_size, offsets)
    if device is not None:
        return x, qweight, scales, offsets, bias, device
    x = checks.tensor(op, "x", x)
    checks.dtype(op, "x", x, checks.FLOAT_DTYPES)
    if len(x.shape) == 0:
        raise checks.OpArgumentError(f"{op}: x must be [..., K], got a scalar")
    qweight, scales, offsets, bias = _check_weights(op, qweight, scales, bias, bits, group_size, offsets,
                                                    x.shape[-1], x)
    device = checks.same_device(op, x=x, qweight=qweight, scales=scales, offsets=offsets, bias=bias)
    x, qweight, scales, offsets, bias = (
        checks.contiguous(op, name, t, device) for name, t in
        (("x", x), ("qweight", qweight), ("scales", scales), ("offsets", offsets), ("bias", bias)))
    return x, qweight, scales, offsets, bias, device


def _check_weights(op, qweight, scales, bias, bits, group_size, offsets, k, x=None):
    """The weights' part of _check_packed, for inputs of ``k`` features; ``bias`` must have
    ``x``'s dtype, or any float dtype without x."""
    qweight, scales = checks.tensor(op, "qweight", qweight), checks.tensor(op, "scales", scales)
    bias = checks.tensor(op, "bias", bias, optional=True)
    offsets = checks.tensor(op, "offsets", offsets, optional=True)
    _check_bits_group(op, bits, group_size, k)
    checks.rank(op, "qweight", qweight, 2, "[N, K] (8 bits) or [N, K/2] (4 bits)")
    n = qweight.shape[0]
    checks.dtype(op, "qweight", qweight, ("int8",) if bits == 8 else ("uint8",))
    checks.shape(op, "qweight", qweight, [n, k if bits == 8 else k // 2], f"{bits}-bit weights for K={k}")
    checks.dtype(op, "scales", scales, ("float32",))
    checks.shape(op, "scales", scales, [n, _groups(k, group_size)], f"group_size={group_size}")
    if offsets is not None:
        checks.dtype(op, "offsets", offsets, ("float32",))
        checks.shape(op, "offsets", offsets, [n, _groups(k, group_size)], "one per group, like scales")
    if bias is not None:
        if x is None:
            checks.dtype(op, "bias", bias, checks.FLOAT_DTYPES)
        else:
            checks.same_dtype(op, "x", x, bias=bias)
        checks.shape(op, "bias", bias, [n], "[N]")
    return qweight, scales, offsets, bias


def x_int8_fits(k: int, group_size: int) -> bool:
    """Whether x_int8 can quantize x for these weights: K and the group size multiples of 32
    (its shortest run; group_size -1 is one group of K)."""
    return k % 32 == 0 and (group_size == -1 or group_size % 32 == 0)


def _check_x_int8(op: str, k: int, group_size: int) -> None:
    if not x_int8_fits(k, group_size):
        raise checks.OpArgumentError(
            f"{op}: x_int8 quantizes x in runs of 32 or more, so K and group_size must be multiples of 32 "
            f"(or group_size -1), got K={k}, group_size={group_size}")


def x_int8_run(bits: int, k: int, group_size: int) -> int:
    """The run of x that weight_only_linear's x_int8 quantizes with one scale (kernel.h): 32 for
    8-bit weights; for 4-bit ones the largest of 128, 64 and 32 dividing the group size (K for
    group_size -1). A run of 128 takes a quarter of the float work of four runs of 32, and the
    4-bit codes' own rounding costs 7-20x its error (heavy-tailed to Gaussian x)."""
    if bits != 4:
        return 32
    group = k if group_size == -1 else group_size
    return next(run for run in (128, 64, 32) if group % run == 0)


def quantize_x_int8(x, run: int = 32):
    """x [..., K] quantized as weight_only_linear's x_int8 does it, per run of ``run`` along K
    (see :func:`x_int8_run`), in float32 with plain Paddle ops: (xq, sx), xq the int8 codes as
    float32 [..., K / run, run], sx = absmax / 127 [..., K / run, 1]."""
    pd = paddle()
    runs = x.astype("float32").reshape(list(x.shape[:-1]) + [x.shape[-1] // run, run])
    sx = runs.abs().max(axis=-1, keepdim=True) / 127.0
    # the quotient in float32 as the kernels compute it, rounded in float64 (exact)
    quotient = (runs / pd.where(sx == 0, pd.ones_like(sx), sx)).astype("float64")
    return pd.clip(_round_half_away(quotient), -127, 127).astype("float32"), sx


class _WeightOnly(OpImpl):
    """Its tensors: x, qweight, scales, then offsets and bias where the call has them. With
    ``x_int8`` or ``bf16_products`` forward only."""

    name = "weight_only_linear"

    def __init__(self, bits, group_size, device, has_bias, has_offsets=False, x_int8=False, bf16_products=False):
        self.bits, self.group_size, self.device = bits, group_size, device
        self.has_bias, self.has_offsets, self.x_int8 = has_bias, has_offsets, x_int8
        self.bf16_products = bf16_products

    def _split(self, rest):
        """(offsets, bias) from the tensors after scales."""
        return rest[0] if self.has_offsets else None, rest[-1] if self.has_bias else None

    def _attrs(self, grad: bool = False):
        flags = {} if grad else {"x_int8": 1} if self.x_int8 else {"bf16_products": 1} if self.bf16_products else {}
        return attrs(self.name, grad, bits=self.bits, group_size=self.group_size, has_offsets=self.has_offsets,
                     **flags)

    def forward(self, kernel, x, qweight, scales, *rest):
        y = empty(list(x.shape[:-1]) + [qweight.shape[0]], dtype_name(x), self.device)
        launch(kernel, self.name, self.device, [x, qweight, scales, *rest], [y], self._attrs())
        weights = (qweight, scales) + tuple(rest[:1] if self.has_offsets else ())
        return y, weights, []

    def backward(self, kernel, saved, grads):
        qweight = saved[0]
        dy = grads[0].contiguous()
        k = qweight.shape[1] * (1 if self.bits == 8 else 2)
        dx = empty(list(dy.shape[:-1]) + [k], dtype_name(dy), self.device)
        launch(kernel, self.name + "_grad", self.device, [dy, *saved], [dx], self._attrs(grad=True))
        dbias = None
        if self.has_bias:
            dbias = dy.astype("float32").reshape([-1, dy.shape[-1]]).sum(axis=0).astype(dy.dtype)
        # qweight, scales and offsets are not trained
        return (dx,) + (None,) * len(saved) + ((dbias,) if self.has_bias else ())

    def reference(self, x, qweight, scales, *rest, offsets=None, bias=None):
        """Takes offsets and bias positionally as the kernel does, or by name."""
        pd = paddle()
        if rest:
            offsets, bias = self._split(rest)
        k = x.shape[-1]
        if self.x_int8:
            return self._reference_x_int8(x, qweight, scales, offsets, bias)
        w = dequantize(qweight, scales, self.bits, self.group_size, k, offsets)
        if self.bf16_products:  # as on bfloat16 hardware: x and W's values rounded
            x, w = (t.astype("bfloat16").astype("float32") for t in (x, w))
        y = pd.matmul(x.astype("float32"), w, transpose_y=True)
        if bias is not None:
            y = y + bias.astype("float32")
        return y.astype(x.dtype)

    def _reference_x_int8(self, x, qweight, scales, offsets, bias):
        """kernel.h's x_int8 math in float64: sum over runs of scale * sx * (the integer sum of
        q xq), which is (xq sx) (q scale)^T exactly up to float64 rounding; offsets times the
        group sums of float x."""
        pd = paddle()
        k = x.shape[-1]
        xq, sx = quantize_x_int8(x, x_int8_run(self.bits, k, self.group_size))
        xd = (xq.astype("float64") * sx.astype("float64")).reshape(list(x.shape))
        q = dequantize(qweight, pd.ones_like(scales), self.bits, self.group_size, k).astype("float64")
        group = k if self.group_size == -1 else self.group_size
        y = pd.matmul(xd, q * pd.repeat_interleave(scales.astype("float64"), group, axis=1), transpose_y=True)
        if offsets is not None:
            y = y + pd.matmul(x.astype("float64"),
                              pd.repeat_interleave(offsets.astype("float64"), group, axis=1), transpose_y=True)
        if bias is not None:
            y = y + bias.astype("float64")
        return y.astype(x.dtype)


def weight_only_linear(x, qweight, scales, bias=None, bits: int = 8, group_size: int = -1, offsets=None,
                       x_int8: bool = False, compute_dtype: str | None = None):
    """``x @ W^T + bias`` with W stored quantized (from :func:`weight_quantize`, or converted from
    another format), dequantized on the fly: W = q * scales, plus ``offsets`` (float32 [N, G],
    one per group like scales) for asymmetric groups. x [..., K] float -> [..., N].
    Differentiable with respect to x and bias, so LoRA adapters can train on a quantized base.

    ``x_int8``: an approximation for inference (as llama.cpp's quantized dot products): x is
    quantized to int8 per run along K (its own scale absmax / 127 each; runs of 32 for 8-bit
    weights, up to 128 for 4-bit ones: :func:`x_int8_run`) and multiplied with the codes in
    integers; 5e-3 to 7e-3 relative error against the exact product for Gaussian x. K and
    group_size must be multiples of 32. Forward only: x and bias must not require gradients while
    gradients are recorded.

    ``compute_dtype`` "bfloat16": float32 x is rounded to bfloat16 for the products (AMX tiles
    where the CPU has them), y stays float32: the bfloat16 product without converting x and y
    on the way in and out (prefill of a bfloat16 model). Forward only, as x_int8."""
    op = "weight_only_linear"
    x, qweight, scales, offsets, bias, device = _check_packed(op, x, qweight, scales, bias, bits, group_size, offsets)
    if compute_dtype not in (None, "bfloat16"):
        raise checks.OpArgumentError(f"{op}: compute_dtype must be None or 'bfloat16', got {compute_dtype!r}")
    bf16 = compute_dtype == "bfloat16" and dtype_name(x) != "bfloat16"
    if bf16 and dtype_name(x) != "float32":
        raise checks.OpArgumentError(f"{op}: compute_dtype 'bfloat16' takes float32 x, got {dtype_name(x)}")
    if bf16 and x_int8:
        raise checks.OpArgumentError(f"{op}: x_int8 and compute_dtype 'bfloat16' exclude each other")
    tensors = tuple(t for t in (x, qweight, scales, offsets, bias) if t is not None)
    impl = _WeightOnly(bits, group_size, device, bias is not None, offsets is not None, bool(x_int8), bf16)
    if not (x_int8 or bf16):
        return run(impl, device, dtype_name(x), *tensors)
    if x_int8:
        _check_x_int8(op, x.shape[-1], group_size)
    mode = "x_int8" if x_int8 else "compute_dtype 'bfloat16'"
    if paddle().is_grad_enabled() and any(not t.stop_gradient for t in (x, bias) if t is not None):
        raise checks.OpArgumentError(
            f"{op}: {mode} is inference-only (no gradients through its rounding); leave it off to train, "
            "or run under paddle.no_grad() / with stop_gradient inputs")
    y = run(impl, device, dtype_name(x), *tensors, differentiable=False)
    y.stop_gradient = True
    return y


class WeightOnlyLinear:
    """:func:`weight_only_linear` with its weights bound and checked once: ``lin =
    WeightOnlyLinear(qweight, scales, bias, bits=4, group_size=128)``, then ``lin(x)`` is
    ``weight_only_linear(x, qweight, scales, bias, bits=4, group_size=128)`` and ``lin(x,
    x_int8=True)``, ``lin(x, compute_dtype="bfloat16")`` likewise: the same results, errors,
    gradients and counted fallbacks. A call checks x alone and launches with the weights'
    descriptors made here. Between 4096 x 4096 4-bit GEMVs (a decode step's pattern, each
    leaving the interpreter's caches cold) weight_only_linear spent 65-95 us a call beyond the
    kernel's 335-375, this 35-50 (x_int8, measured alternating the three, 2026-12-01). Any call
    that needs more than a launch (gradients, an x to mend or refuse, no kernel for x's dtype)
    goes through weight_only_linear itself.

    The weights are held as given (a non-contiguous host one as a dense copy); as with
    :class:`~anychip.ops.DecoderWeights`, they must not be replaced in place afterwards. Host
    weights of 4 MB or more are moved onto 2 MB pages (:func:`anychip.host_memory.huge_pages_for`;
    ``huge_page_bytes``: how many bytes moved): a 4096 x 4096 4-bit GEMV ran 2-5% faster."""

    def __init__(self, qweight, scales, bias=None, bits: int = 8, group_size: int = -1, offsets=None):
        op = "WeightOnlyLinear"
        checks.rank(op, "qweight", checks.tensor(op, "qweight", qweight), 2, "[N, K] (8 bits) or [N, K/2] (4 bits)")
        k = qweight.shape[1] * (2 if bits == 4 else 1)
        qweight, scales, offsets, bias = _check_weights(op, qweight, scales, bias, bits, group_size, offsets, k)
        device = checks.same_device(op, qweight=qweight, scales=scales, offsets=offsets, bias=bias)
        self.qweight, self.scales, self.offsets, self.bias = (
            checks.contiguous(op, name, t, device) for name, t in
            (("qweight", qweight), ("scales", scales), ("offsets", offsets), ("bias", bias)))
        self.bits, self.group_size, self.device = bits, group_size, device
        self.in_features, self.out_features = k, qweight.shape[0]
        self._weights = [t for t in (self.qweight, self.scales, self.offsets, self.bias) if t is not None]
        self.huge_page_bytes = huge_pages_for(self._weights)
        self._described = tuple(descriptor(t, device[1]) for t in self._weights)
        self._bias_dtype = None if bias is None else dtype_name(bias)
        self._x_int8_fits = x_int8_fits(k, group_size)
        self._attrs = {(x_int8, bf16): [float(a) for a in _WeightOnly(bits, group_size, device, bias is not None,
                                                                      offsets is not None, x_int8, bf16)._attrs()]
                       for x_int8, bf16 in ((False, False), (True, False), (False, True))}

    def __deepcopy__(self, memo):
        """A copy binds its own copies of the weights: the descriptors hold their addresses."""
        qweight, scales, bias, offsets = (copy.deepcopy(t, memo) for t in (self.qweight, self.scales, self.bias,
                                                                            self.offsets))
        return WeightOnlyLinear(qweight, scales, bias, bits=self.bits, group_size=self.group_size, offsets=offsets)

    def __call__(self, x, x_int8: bool = False, compute_dtype: str | None = None):
        ready = self._launchable(x, bool(x_int8), compute_dtype)
        if ready is None:
            return weight_only_linear(x, self.qweight, self.scales, self.bias, bits=self.bits,
                                      group_size=self.group_size, offsets=self.offsets, x_int8=x_int8,
                                      compute_dtype=compute_dtype)
        kernel, dtype, shape, attrs = ready
        out_shape = shape[:-1] + [self.out_features]
        # empty's outputs do not require gradients, which is what x_int8 and bf16 results promise
        y = empty(out_shape, dtype, self.device)
        if not isinstance(kernel, NativeKernel):
            launch(kernel, _WeightOnly.name, self.device, [x, *self._weights], [y], attrs)
            return y
        index = self.device[1]
        launch_described(kernel, _WeightOnly.name, self.device,
                         [dense_descriptor(x, dtype, tuple(shape), index), *self._described],
                         [dense_descriptor(y, dtype, tuple(out_shape), index)], attrs)
        return y

    def _launchable(self, x, x_int8: bool, compute_dtype):
        """(kernel, x's dtype, x's shape, attrs) for a call that weight_only_linear would accept
        and run on a kernel without autograd; None for any other."""
        if not isinstance(x, paddle().Tensor) or compute_dtype not in (None, "bfloat16"):
            return None
        shape, dtype = x.shape, dtype_name(x)
        if not shape or shape[-1] != self.in_features or dtype not in checks.FLOAT_DTYPES:
            return None
        bf16 = compute_dtype == "bfloat16" and dtype != "bfloat16"
        if (self._bias_dtype not in (None, dtype) or bf16 and (x_int8 or dtype != "float32")
                or x_int8 and not self._x_int8_fits):
            return None
        if not x.is_contiguous() or device_of(x) != self.device:
            return None
        if paddle().is_grad_enabled() and (not x.stop_gradient or any(not t.stop_gradient for t in self._weights)):
            return None
        kernel = registry().kernels.find(_WeightOnly.name, self.device[0], dtype)
        if kernel is None:
            return None
        return kernel.forward, dtype, shape, self._attrs[(x_int8, bf16)]


class _W8A8(OpImpl):
    name = "w8a8_linear"

    def __init__(self, device):
        self.device = device

    def forward(self, kernel, x, qweight, scales, bias=None):
        y = empty(list(x.shape[:-1]) + [qweight.shape[0]], dtype_name(x), self.device)
        inputs = [x, qweight, scales] + ([bias] if bias is not None else [])
        launch(kernel, self.name, self.device, inputs, [y])
        return y, (), [y]

    def reference(self, x, qweight, scales, bias=None):
        pd = paddle()
        xf = x.astype("float64")
        xs = xf.abs().max(axis=-1, keepdim=True) / 127.0
        xq = pd.clip(_round_half_away(xf / pd.where(xs == 0, pd.ones_like(xs), xs)), -127, 127)
        acc = pd.matmul(xq, qweight.astype("float64"), transpose_y=True)
        y = acc * xs * scales.astype("float64").reshape([-1])
        if bias is not None:
            y = y + bias.astype("float64")
        return y.astype(x.dtype)


def w8a8_linear(x, qweight, scales, bias=None):
    """``x @ W^T + bias`` with int8 weights (weight_quantize bits=8, group_size=-1) and x
    quantized to int8 per row on the fly (dynamic per-token scales); int32 accumulation.
    Forward only: the result does not carry gradients."""
    x, qweight, scales, _offsets, bias, device = _check_packed("w8a8_linear", x, qweight, scales, bias, 8, -1)
    tensors = (x, qweight, scales) + ((bias,) if bias is not None else ())
    y = run(_W8A8(device), device, dtype_name(x), *tensors, differentiable=False)
    y.stop_gradient = True
    return y


def quantize_numpy(w: np.ndarray, bits: int, group_size: int):
    """weight_quantize in numpy (float64), for tests and offline conversion."""
    k, n = w.shape
    qmax = 127 if bits == 8 else 7
    grouped = w.astype(np.float64).T.reshape(n, _groups(k, group_size), -1)
    scales = np.abs(grouped).max(axis=-1) / qmax
    safe = np.where(scales == 0, 1.0, scales)[..., None]
    q = np.clip(np.sign(grouped / safe) * np.floor(np.abs(grouped / safe) + 0.5), -qmax, qmax).reshape(n, k)
    if bits == 8:
        return q.astype(np.int8), scales.astype(np.float32)
    nib = (q + 8).astype(np.uint8).reshape(n, k // 64, 2, 32)
    return (nib[:, :, 0, :] | (nib[:, :, 1, :] << 4)).reshape(n, k // 2), scales.astype(np.float32)
