"""anychip's fused kernels as PyTorch ops with autograd: ``torch.ops.anychip.rms_norm``,
``swiglu``, ``rotary_embedding`` (kernel.h's semantics and attribute meanings).

On the anychip device each runs the chip's kernel (its backward kernel for the gradient); on
any other device, the same math in plain PyTorch ops, so a model written with them runs anywhere.
"""

from __future__ import annotations

import torch

from ...ops.dispatch import attrs
from .launch import backward_kernel_for, kernel_for, launch, record_fallback

BACKEND = "anychip"


def _kernel(op: str, t: torch.Tensor, backward: bool = False):
    """The chip's kernel for ``t`` or None (off the device, or none registered: counted)."""
    if t.device.type != BACKEND:
        return None
    found = (backward_kernel_for if backward else kernel_for)(op, t.dtype)
    if found is None:
        record_fallback(f"anychip::{op}{'_grad' if backward else ''}", t.dtype, "no kernel on the device")
    return found


# ---- rms_norm -----------------------------------------------------------------------------------

@torch.library.custom_op("anychip::rms_norm", mutates_args=())
def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """y = x / sqrt(mean(x^2) + eps) * weight over the last dim; also returns inv_rms (float32)."""
    kernel = _kernel("rms_norm", x)
    if kernel is None:
        inv = torch.rsqrt(x.float().pow(2).mean(-1) + eps)
        return (x.float() * inv[..., None] * weight.float()).to(x.dtype), inv.reshape(-1)
    x = x.contiguous()
    y = torch.empty_like(x)
    inv = torch.empty(x.numel() // x.shape[-1], dtype=torch.float32, device=x.device)
    launch(kernel, "rms_norm", [x, weight.contiguous()], [y, inv], attrs("rms_norm", eps=eps))
    return y, inv


@rms_norm.register_fake
def _(x, weight, eps):
    return torch.empty_like(x), x.new_empty(x.numel() // x.shape[-1], dtype=torch.float32)


def _rms_norm_setup(ctx, inputs, output):
    x, weight, _eps = inputs
    ctx.save_for_backward(x, weight, output[1])


def _rms_norm_backward(ctx, dy, _dinv):
    x, weight, inv = ctx.saved_tensors
    kernel = _kernel("rms_norm", x, backward=True)
    if kernel is None:
        xf, inv2 = x.float(), inv.reshape(x.shape[:-1])[..., None]
        n = xf * inv2
        g = dy.float() * weight.float()
        dx = inv2 * (g - n * (g * n).mean(-1, keepdim=True))
        return dx.to(x.dtype), (dy.float() * n).reshape(-1, x.shape[-1]).sum(0).to(weight.dtype), None
    dx, dw = torch.empty_like(x), torch.empty_like(weight)
    launch(kernel, "rms_norm_grad", [dy.contiguous(), x.contiguous(), weight.contiguous(), inv], [dx, dw])
    return dx, dw, None


rms_norm.register_autograd(_rms_norm_backward, setup_context=_rms_norm_setup)


# ---- swiglu -------------------------------------------------------------------------------------

@torch.library.custom_op("anychip::swiglu", mutates_args=())
def swiglu(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """silu(gate) * up."""
    kernel = _kernel("swiglu", gate)
    if kernel is None:
        return torch.nn.functional.silu(gate) * up
    y = torch.empty_like(gate, memory_format=torch.contiguous_format)
    launch(kernel, "swiglu", [gate.contiguous(), up.contiguous()], [y])
    return y


@swiglu.register_fake
def _(gate, up):
    return torch.empty_like(gate)


def _swiglu_setup(ctx, inputs, output):
    ctx.save_for_backward(*inputs)


def _swiglu_backward(ctx, dy):
    gate, up = ctx.saved_tensors
    kernel = _kernel("swiglu", gate, backward=True)
    if kernel is None:
        s = torch.sigmoid(gate)
        return dy * up * s * (1 + gate * (1 - s)), dy * gate * s
    dgate, dup = torch.empty_like(gate), torch.empty_like(up)
    launch(kernel, "swiglu_grad", [dy.contiguous(), gate.contiguous(), up.contiguous()], [dgate, dup])
    return dgate, dup


swiglu.register_autograd(_swiglu_backward, setup_context=_swiglu_setup)


# ---- rotary_embedding ---------------------------------------------------------------------------

def _rotate(x: torch.Tensor, positions: torch.Tensor, theta: float, sign: float) -> torch.Tensor:
    d = x.shape[-1]
    # 1 / theta^(2i/d) as kernel.h, Paddle's reference and transformers write it (theta^(-2i/d)
    # rounds differently: 5e-5 apart at position 300)
    inv_freq = 1.0 / theta ** (torch.arange(0, d, 2, device=x.device).float() / d)
    freqs = positions[..., None].float() * inv_freq
    cos, sin = torch.cos(freqs)[:, :, None, :], sign * torch.sin(freqs)[:, :, None, :]
    a, b = x[..., : d // 2].float(), x[..., d // 2:].float()
    return torch.cat([a * cos - b * sin, b * cos + a * sin], -1).to(x.dtype)


@torch.library.custom_op("anychip::rotary_embedding", mutates_args=())
def rotary_embedding(q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor,
                     theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """RoPE (half-rotation layout) on q[B, S, Hq, D] and k[B, S, Hk, D] at positions int64[B, S]."""
    kernel = _kernel("rotary_embedding", q)
    if kernel is None:
        return _rotate(q, positions, theta, 1.0), _rotate(k, positions, theta, 1.0)
    qo, ko = torch.empty_like(q, memory_format=torch.contiguous_format), torch.empty_like(k, memory_format=torch.contiguous_format)
    launch(kernel, "rotary_embedding", [q.contiguous(), k.contiguous(), positions.contiguous()], [qo, ko],
           attrs("rotary_embedding", theta=theta))
    return qo, ko


@rotary_embedding.register_fake
def _(q, k, positions, theta):
    return torch.empty_like(q), torch.empty_like(k)


def _rotary_setup(ctx, inputs, output):
    ctx.save_for_backward(inputs[2])
    ctx.theta = inputs[3]


def _rotary_backward(ctx, dq, dk):
    (positions,) = ctx.saved_tensors
    kernel = _kernel("rotary_embedding", dq, backward=True)
    if kernel is None:
        return _rotate(dq, positions, ctx.theta, -1.0), _rotate(dk, positions, ctx.theta, -1.0), None, None
    gq, gk = torch.empty_like(dq, memory_format=torch.contiguous_format), torch.empty_like(dk, memory_format=torch.contiguous_format)
    launch(kernel, "rotary_embedding_grad", [dq.contiguous(), dk.contiguous(), positions], [gq, gk],
           attrs("rotary_embedding", grad=True, theta=ctx.theta))
    return gq, gk, None, None


rotary_embedding.register_autograd(_rotary_backward, setup_context=_rotary_setup)


# ---- attention ----------------------------------------------------------------------------------

def _attention_reference(q, k, v, mask, scale, causal):
    """kernel.h's attention in plain PyTorch: [B, S, H, D] layout, bottom-right causal alignment."""
    qh, kh, vh = (t.transpose(1, 2).float() for t in (q, k, v))
    rep = qh.shape[1] // kh.shape[1]
    kh, vh = kh.repeat_interleave(rep, 1), vh.repeat_interleave(rep, 1)
    scores = (qh @ kh.transpose(-1, -2)) * scale
    sq, sk = scores.shape[-2:]
    visible = torch.ones(sq, sk, dtype=torch.bool, device=q.device)
    if causal:
        visible = torch.arange(sk, device=q.device)[None, :] <= torch.arange(sq, device=q.device)[:, None] + sk - sq
    if mask is not None:
        visible = visible & mask
    scores = scores.masked_fill(~visible, float("-inf"))
    lse = torch.logsumexp(scores, -1)
    p = torch.where(visible, torch.exp(scores - lse[..., None].clamp_min(-1e30)), 0.0)
    return (p @ vh).transpose(1, 2).to(q.dtype), lse


def _launch_attention(kernel, op: str, q, k, v, extra: list, scale: float, causal: bool):
    """(o, lse) of kernel.h's attention or flashmask_attention, ``extra`` its mask input(s)."""
    o = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    lse = torch.empty((q.shape[0], q.shape[2], q.shape[1]), dtype=torch.float32, device=q.device)
    launch(kernel, op, [q.contiguous(), k.contiguous(), v.contiguous(), *(t.contiguous() for t in extra)], [o, lse],
           attrs(op, scale=scale, causal=causal))
    return o, lse


def _attention_fake(q, k, v, mask, scale, causal):
    return torch.empty_like(q), q.new_empty((q.shape[0], q.shape[2], q.shape[1]), dtype=torch.float32)


def _attention_setup(ctx, inputs, output):
    q, k, v, mask, scale, causal = inputs  # mask: attention's bool mask or FlashMask's row indices
    ctx.save_for_backward(q, k, v, output[0], output[1], mask)
    ctx.scale, ctx.causal = scale, causal


def _attention_backward_of(op: str, dense_mask):
    """The backward of ``op``: its grad kernel on the device, else autograd through the
    reference with ``dense_mask(mask, q, causal)`` as the bool mask."""
    def backward(ctx, do, _dlse):
        q, k, v, o, lse, mask = ctx.saved_tensors
        kernel = _kernel(op, q, backward=True)
        if kernel is None:
            with torch.enable_grad():
                leaves = [t.detach().requires_grad_() for t in (q, k, v)]
                out, _ = _attention_reference(*leaves, dense_mask(mask, q, ctx.causal), ctx.scale, ctx.causal)
                grads = torch.autograd.grad(out, leaves, do)
            return (*grads, None, None, None)
        dq, dk, dv = (torch.empty(t.shape, dtype=t.dtype, device=t.device) for t in (q, k, v))
        extra = [] if mask is None else [mask.contiguous()]
        launch(kernel, f"{op}_grad", [do.contiguous(), q.contiguous(), k.contiguous(), v.contiguous(), o, lse, *extra],
               [dq, dk, dv], attrs(op, grad=True, scale=ctx.scale, causal=ctx.causal))
        return dq, dk, dv, None, None, None
    return backward


@torch.library.custom_op("anychip::attention", mutates_args=())
def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None, scale: float,
              causal: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """kernel.h's attention: q[B, Sq, Hq, D], k/v[B, Sk, Hk, D], an optional bool mask
    [B|1, Hq|1, Sq, Sk] -> (o[B, Sq, Hq, D], lse float32[B, Hq, Sq])."""
    kernel = _kernel("attention", q)
    if kernel is None:
        return _attention_reference(q, k, v, mask, scale, causal)
    return _launch_attention(kernel, "attention", q, k, v, [] if mask is None else [mask], scale, causal)


attention.register_fake(_attention_fake)
attention.register_autograd(_attention_backward_of("attention", lambda mask, q, causal: mask),
                            setup_context=_attention_setup)


# ---- weight_only_linear -------------------------------------------------------------------------

def _dequantize(qweight, scales, offsets, bits: int, group_size: int) -> torch.Tensor:
    """W[N, K] float32 of kernel.h's weight_only_linear layouts (bits 8: int8 [N, K]; bits 4:
    uint8 [N, K/2] in 32-byte blocks of 64 values, low nibbles first)."""
    if bits == 8:
        q = qweight.float()
    else:
        n = qweight.shape[0]
        blocks = qweight.reshape(n, -1, 32).to(torch.int32)
        q = torch.cat([(blocks & 15) - 8, (blocks >> 4) - 8], -1).reshape(n, -1).float()
    g = q.shape[1] if group_size == -1 else group_size
    w = q * scales.repeat_interleave(g, 1)
    return w + offsets.repeat_interleave(g, 1) if offsets is not None else w


def _wol_inputs(qweight, scales, offsets):
    return [qweight.contiguous(), scales.contiguous(), *([] if offsets is None else [offsets.contiguous()])]


@torch.library.custom_op("anychip::weight_only_linear", mutates_args=())
def weight_only_linear(x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor, offsets: torch.Tensor | None,
                       bias: torch.Tensor | None, bits: int, group_size: int) -> torch.Tensor:
    """y = x W^T + bias, W = q * scales (+ offsets) per group of K (kernel.h's weight_only_linear)."""
    kernel = _kernel("weight_only_linear", x)
    if kernel is None:
        w = _dequantize(qweight, scales, offsets, bits, group_size)
        y = x.float() @ w.t()
        return (y + bias.float() if bias is not None else y).to(x.dtype)
    y = torch.empty((*x.shape[:-1], qweight.shape[0]), dtype=x.dtype, device=x.device)
    launch(kernel, "weight_only_linear", [x.contiguous(), *_wol_inputs(qweight, scales, offsets),
                                          *([] if bias is None else [bias.contiguous()])],
           [y], attrs("weight_only_linear", bits=bits, group_size=group_size, has_offsets=offsets is not None))
    return y


@weight_only_linear.register_fake
def _(x, qweight, scales, offsets, bias, bits, group_size):
    return x.new_empty((*x.shape[:-1], qweight.shape[0]))


def _wol_setup(ctx, inputs, output):
    x, qweight, scales, offsets, _bias, bits, group_size = inputs
    ctx.save_for_backward(x, qweight, scales, offsets)
    ctx.bits, ctx.group_size = bits, group_size


def _wol_backward(ctx, dy):
    """dx only: the quantized weight is frozen (bias's gradient is dy summed over rows)."""
    x, qweight, scales, offsets = ctx.saved_tensors
    dbias = dy.reshape(-1, dy.shape[-1]).sum(0) if ctx.needs_input_grad[4] else None
    kernel = _kernel("weight_only_linear", x, backward=True)
    if kernel is None:
        dx = (dy.float() @ _dequantize(qweight, scales, offsets, ctx.bits, ctx.group_size)).to(x.dtype)
        return dx, None, None, None, dbias, None, None
    dx = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    launch(kernel, "weight_only_linear_grad", [dy.contiguous(), *_wol_inputs(qweight, scales, offsets)], [dx],
           attrs("weight_only_linear", grad=True, bits=ctx.bits, group_size=ctx.group_size,
                 has_offsets=offsets is not None))
    return dx, None, None, None, dbias, None, None


weight_only_linear.register_autograd(_wol_backward, setup_context=_wol_setup)


# ---- w8a8_linear --------------------------------------------------------------------------------

@torch.library.custom_op("anychip::w8a8_linear", mutates_args=())
def w8a8_linear(x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """kernel.h's w8a8_linear (forward only): each row of x quantized to int8 with scale
    absmax(row) / 127, int32 products with qweight int8[N, K], scaled by scales float32[N, 1]."""
    kernel = _kernel("w8a8_linear", x)
    if kernel is None:
        xf = x.float().reshape(-1, x.shape[-1])
        sx = xf.abs().amax(-1, keepdim=True) / 127
        xq = torch.where(sx > 0, torch.round(xf / torch.where(sx > 0, sx, 1)), 0).clamp(-127, 127)
        y = (xq @ qweight.float().t()) * sx * scales.reshape(1, -1)
        y = y + bias.float() if bias is not None else y
        return y.reshape(*x.shape[:-1], -1).to(x.dtype)
    y = torch.empty((*x.shape[:-1], qweight.shape[0]), dtype=x.dtype, device=x.device)
    launch(kernel, "w8a8_linear", [x.contiguous(), qweight.contiguous(), scales.contiguous(),
                                   *([] if bias is None else [bias.contiguous()])], [y])
    return y


@w8a8_linear.register_fake
def _(x, qweight, scales, bias):
    return x.new_empty((*x.shape[:-1], qweight.shape[0]))


# ---- flashmask_attention ------------------------------------------------------------------------

def _flashmask_visible(indices: torch.Tensor, hq: int, sq: int, causal: bool) -> torch.Tensor:
    """The dense bool mask [B, Hq, Sq, Sk] of FlashMask's startend_row_indices (kernel.h)."""
    hm, e = indices.shape[1], indices.shape[3]
    heads = torch.arange(hq, device=indices.device) * hm // hq
    cols = indices.long().index_select(1, heads)[:, :, None, :, :]  # [B, Hq, 1, Sk, E]
    i = torch.arange(sq, device=indices.device)[None, None, :, None]
    part = [cols[..., c] for c in range(e)]
    if e == 1:
        hidden = i >= part[0]
    elif e == 2:
        hidden = (part[0] <= i) & (i < part[1]) if causal else (i >= part[0]) | (i < part[1])
    else:
        hidden = ((part[0] <= i) & (i < part[1])) | ((part[2] <= i) & (i < part[3]))
    return ~hidden


@torch.library.custom_op("anychip::flashmask_attention", mutates_args=())
def flashmask_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, startend_row_indices: torch.Tensor,
                        scale: float, causal: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """kernel.h's flashmask_attention: attention whose mask is FlashMask's per-column row ranges
    startend_row_indices int32[B, Hm, Sk, E] (E 1, 2 or 4) -> (o, lse)."""
    kernel = _kernel("flashmask_attention", q)
    if kernel is None:
        visible = _flashmask_visible(startend_row_indices, q.shape[2], q.shape[1], causal)
        return _attention_reference(q, k, v, visible, scale, causal)
    return _launch_attention(kernel, "flashmask_attention", q, k, v, [startend_row_indices], scale, causal)


flashmask_attention.register_fake(_attention_fake)
flashmask_attention.register_autograd(
    _attention_backward_of("flashmask_attention",
                           lambda indices, q, causal: _flashmask_visible(indices, q.shape[2], q.shape[1], causal)),
    setup_context=_attention_setup)
