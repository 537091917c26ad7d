"""ATen's indexing, concatenation, ranges and attention on the anychip device, through the chip's
base-op and fused kernels (kernel.h: embedding, index_select, copy, arange, attention)."""

from __future__ import annotations

import math

import torch

from ...ops.dispatch import attrs
from .launch import backward_kernel_for, kernel_for, launch, on_host
from .registration import impl

aten = torch.ops.aten


@impl("embedding")
def embedding(weight, indices, padding_idx=-1, scale_grad_by_freq=False, sparse=False):
    kernel = kernel_for("embedding", weight.dtype)
    if kernel is None or sparse:
        return on_host("embedding", aten.embedding.default, weight.dtype, weight, indices, padding_idx,
                       scale_grad_by_freq, sparse)
    ids = (indices if indices.dtype == torch.int64 else indices.long()).contiguous()
    out = torch.empty((*ids.shape, weight.shape[1]), dtype=weight.dtype, device=weight.device)
    # PyTorch's padding_idx only stops the row's gradient; its forward reads the row as it is
    launch(kernel, "embedding", [ids, weight.contiguous()], [out], attrs("embedding", padding_idx=-1))
    return out


@impl("embedding_dense_backward")
def embedding_dense_backward(grad_output, indices, num_weights, padding_idx, scale_grad_by_freq):
    kernel = kernel_for("embedding_grad", grad_output.dtype)
    if kernel is None or scale_grad_by_freq:
        return on_host("embedding_dense_backward", aten.embedding_dense_backward.default, grad_output.dtype,
                       grad_output, indices, num_weights, padding_idx, scale_grad_by_freq)
    out = torch.empty((num_weights, grad_output.shape[-1]), dtype=grad_output.dtype, device=grad_output.device)
    launch(kernel, "embedding_grad", [indices.long().contiguous(), grad_output.contiguous()], [out],
           attrs("embedding_grad", padding_idx=padding_idx if padding_idx is not None else -1))
    return out


@impl("index_select")
def index_select(self, dim, index):
    kernel = kernel_for("index_select", self.dtype)
    if kernel is None:
        return on_host("index_select", aten.index_select.default, self.dtype, self, dim, index)
    dim = dim % max(self.dim(), 1)
    idx = (index if index.dtype == torch.int64 else index.long()).reshape(-1).contiguous()
    shape = list(self.shape)
    shape[dim] = idx.numel()
    out = torch.empty(shape, dtype=self.dtype, device=self.device)
    launch(kernel, "index_select", [self.contiguous(), idx], [out], attrs("index_select", axis=dim))
    return out


@impl("cat")
def cat(tensors, dim=0):
    tensors = [t for t in tensors if not (t.dim() == 1 and t.numel() == 0)] or list(tensors)[:1]
    dtype = tensors[0].dtype
    for t in tensors[1:]:
        dtype = torch.promote_types(dtype, t.dtype)
    first = tensors[0]
    dim = dim % first.dim()
    for t in tensors:
        if t.dim() != first.dim() or any(a != b for i, (a, b) in enumerate(zip(t.shape, first.shape)) if i != dim):
            raise RuntimeError(f"Sizes of tensors must match except in dimension {dim}: got "
                               f"{list(first.shape)} and {list(t.shape)}")
    shape = list(first.shape)
    shape[dim] = sum(t.shape[dim] for t in tensors)
    out = torch.empty(shape, dtype=dtype, device=first.device)
    offset = 0
    for t in tensors:
        n = t.shape[dim]
        if n:
            out.narrow(dim, offset, n).copy_(t)
        offset += n
    return out


@impl("arange.start_out")
def arange_out(start, end, step=1, *, out):
    n = max(0, math.ceil((float(end) - float(start)) / float(step)))
    out.resize_(n)
    kernel = kernel_for("arange", out.dtype)
    if kernel is None:
        return out.copy_(torch.arange(start, end, step, dtype=out.dtype))
    if n:
        launch(kernel, "arange", [], [out], attrs("arange", start=start, step=step))
    return out


# ---- scaled_dot_product_attention: kernel.h's attention ---------------------------------------
# PyTorch lays q, k, v out as [B, H, S, D]; the kernel reads [B, S, H, D] (dense), so they are
# transposed in and out. The bridge's backend choice (aten.cc: choose_sdp) sends here only what
# the kernel computes: no dropout, a boolean mask or none, causal only with Sq == Sk (PyTorch's
# causal mask is top-left aligned, the kernel's bottom-right: the same when square).

def _bshd(t: torch.Tensor) -> torch.Tensor:
    return t.transpose(1, 2).contiguous()


def _mask(attn_bias):
    return [] if attn_bias is None else [attn_bias.contiguous()]


@impl("_scaled_dot_product_fused_attention_overrideable")
def sdpa(query, key, value, attn_bias=None, dropout_p=0.0, is_causal=False, return_debug_mask=False, *, scale=None):
    kernel = kernel_for("attention", query.dtype)
    if kernel is None:
        raise RuntimeError(f"anychip: no attention kernel for {query.dtype} (the backend choice should have "
                           "picked PyTorch's math)")
    B, H, Sq, D = query.shape
    scale = 1.0 / math.sqrt(D) if scale is None else scale
    out = torch.empty((B, Sq, H, D), dtype=query.dtype, device=query.device)
    lse = torch.empty((B, H, Sq), dtype=torch.float32, device=query.device)
    launch(kernel, "attention", [_bshd(query), _bshd(key), _bshd(value), *_mask(attn_bias)], [out, lse],
           attrs("attention", scale=scale, causal=is_causal))
    empty = torch.empty(0, dtype=torch.int64, device=query.device)
    return out.transpose(1, 2), lse, empty, empty, Sq, key.shape[2], empty, empty, empty


@impl("_scaled_dot_product_fused_attention_overrideable_backward")
def sdpa_backward(grad_out, query, key, value, attn_bias, grad_input_mask, out, logsumexp, cum_seq_q, cum_seq_k,
                  max_q, max_k, dropout_p, is_causal, philox_seed, philox_offset, *, scale=None):
    kernel = backward_kernel_for("attention", query.dtype)
    if kernel is None:
        raise RuntimeError(f"anychip: no attention backward kernel for {query.dtype}")
    D = query.shape[-1]
    scale = 1.0 / math.sqrt(D) if scale is None else scale
    q, k, v = _bshd(query), _bshd(key), _bshd(value)
    dq, dk, dv = (torch.empty_like(t) for t in (q, k, v))
    launch(kernel, "attention_grad", [_bshd(grad_out), q, k, v, _bshd(out), logsumexp.contiguous(),
                                      *_mask(attn_bias)], [dq, dk, dv],
           attrs("attention", grad=True, scale=scale, causal=is_causal))
    bias_grad = torch.empty(0, dtype=query.dtype, device=query.device)
    return dq.transpose(1, 2), dk.transpose(1, 2), dv.transpose(1, 2), bias_grad
