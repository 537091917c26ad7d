"""The conformance kit's op checks through PyTorch (``anychip conformance --framework torch``).

The sample cases are the Paddle run's (:mod:`anychip.conformance.cases`: the same arrays,
attributes and tolerances). Each goes through what a PyTorch user calls: a fused op as
``torch.ops.anychip.<op>``, a base op as the ATen call that runs its kernel on the device
(``torch.add`` runs ``add``, ``x.to(torch.int8)`` runs ``cast``, ``x @ y`` runs ``matmul``).
The oracle is the same call on torch's CPU, in float32 from the same dtype-rounded values, so
only the kernel's error is measured; gradients come from ``torch.autograd.grad`` on both sides.
A CPU fallback counted while the device ran (an ATen op or a fused op without a kernel) makes
the cell "fallback". A case PyTorch cannot state (an argument its op does not take) is skipped
with that reason; an op no PyTorch call reaches is not planned (:data:`UNREACHED` says why).
"""

from __future__ import annotations

import math

import numpy as np
import torch

from ... import fallback
from ...conformance.op_checks import error_text, outcomes, tally
from ...ops.defs import BUILTIN, definitions
from ...conformance.result import NOT_DECLARED, SKIPPED, Result
from ...kernels import NativeKernel
from ...plugins import registry
from .launch import DTYPE_NAMES

DTYPES = {name: dtype for dtype, name in DTYPE_NAMES.items()}

# The anychip ops that no PyTorch call runs on the device, and what runs instead.
UNREACHED = {
    "linear": "F.linear runs ATen's addmm and mm (checked as matmul)",
    "weight_quantize": "no torch.ops.anychip op: PyTorch front end quantizes nothing",
    "adamw_step": "torch.optim.AdamW runs its own elementwise ATen ops (checked as the base ops)",
    "decoder_step": "a transformers model runs its layers op by op, not anychip's whole-step kernel",
    "scale": "x * scale + bias runs ATen's mul and add (checked as multiply and add)",
    "cross_entropy_with_softmax": "F.cross_entropy runs _log_softmax, then nll_loss",
    "cross_entropy_with_softmax_grad": "F.cross_entropy's backward runs nll_loss_backward and "
                                       "_log_softmax_backward_data",
    "matmul_grad": "autograd differentiates mm and bmm with mm and bmm (checked as matmul)",
}


class NotStated(Exception):
    """This case has an argument the PyTorch call does not take (the message says which)."""


# ---- the PyTorch call of each op, from a case's tensors (device or CPU alike) -------------------

def _rms_norm(case, t):
    if "residual" in t:
        raise NotStated("torch.ops.anychip.rms_norm takes no residual")
    return torch.ops.anychip.rms_norm(t["x"], t["weight"], case.attrs["eps"])[:1]


def _rotary_embedding(case, t):
    return torch.ops.anychip.rotary_embedding(t["q"], t["k"], t["positions"], case.attrs["theta"])


def _swiglu(case, t):
    gate, up = (t["gate"], t["up"]) if "up" in t else t["gate"].chunk(2, -1)  # packed: [gate | up]
    return (torch.ops.anychip.swiglu(gate, up),)


def _scale(case, t) -> float:
    return case.attrs.get("scale") or 1.0 / math.sqrt(t["q"].shape[-1])


def _attention(case, t):
    return torch.ops.anychip.attention(t["q"], t["k"], t["v"], t.get("mask"), _scale(case, t), case.attrs["causal"])


def _flashmask_attention(case, t):
    return torch.ops.anychip.flashmask_attention(t["q"], t["k"], t["v"], t["startend_row_indices"],
                                                 _scale(case, t), case.attrs["causal"])


def _weight_only_linear(case, t):
    if case.attrs.get("x_int8"):
        raise NotStated("torch.ops.anychip.weight_only_linear takes no x_int8 (an inference-only mode)")
    return (torch.ops.anychip.weight_only_linear(t["x"], t["qweight"], t["scales"], t.get("offsets"), t.get("bias"),
                                                 case.attrs["bits"], case.attrs["group_size"]),)


def _w8a8_linear(case, t):
    return (torch.ops.anychip.w8a8_linear(t["x"], t["qweight"], t["scales"], t.get("bias")),)


def _attrs(case) -> list[float]:
    return case.attrs.get("attrs", [])


def _unary(fn):
    return lambda case, t: (fn(t["x"]),)


def _binary(fn):
    return lambda case, t: (fn(t["x"], t["y"]),)


def _reduction(fn):
    def call(case, t):
        keep, count, *axes = (int(a) for a in _attrs(case))
        return (fn(t["x"], axes[:count], keepdim=bool(keep)) if count else fn(t["x"]),)
    return call


def _arange(case, t):
    start, step = _attrs(case)
    like = t["like"]
    return (torch.arange(start, start + step * like.numel(), step, dtype=like.dtype, device=like.device),)


def _embedding(case, t):
    padding_idx = int(_attrs(case)[0])
    if padding_idx != -1:
        raise NotStated(f"PyTorch's padding_idx ({padding_idx}) only stops the gradient: F.embedding still "
                        "reads the row that Paddle's embedding zeroes")
    return (torch.nn.functional.embedding(t["ids"], t["weight"]),)


def _embedding_grad(case, t):
    rows = case.attrs["out_shape"][0]
    return (torch.ops.aten.embedding_dense_backward(t["dout"], t["ids"], rows, int(_attrs(case)[0]), False),)


def _matmul(case, t):
    tx, ty = (bool(a) for a in _attrs(case))
    return ((t["x"].mT if tx else t["x"]) @ (t["y"].mT if ty else t["y"]),)


CALLS = {
    "rms_norm": _rms_norm, "rotary_embedding": _rotary_embedding, "swiglu": _swiglu, "attention": _attention,
    "flashmask_attention": _flashmask_attention, "weight_only_linear": _weight_only_linear,
    "w8a8_linear": _w8a8_linear,
    **{op: _unary(getattr(torch, op)) for op in ("exp", "log", "sqrt", "rsqrt", "sigmoid", "tanh", "abs", "neg",
                                                "sin", "cos")},
    "silu": _unary(torch.nn.functional.silu),
    "pow": lambda case, t: (torch.pow(t["x"], _attrs(case)[0]),),
    "add": _binary(torch.add), "subtract": _binary(torch.sub), "multiply": _binary(torch.mul),
    "divide": _binary(torch.div), "maximum": _binary(torch.maximum), "minimum": _binary(torch.minimum),
    "elementwise_pow": _binary(torch.pow),
    "equal": _binary(torch.eq), "not_equal": _binary(torch.ne), "less_than": _binary(torch.lt),
    "less_equal": _binary(torch.le), "greater_than": _binary(torch.gt), "greater_equal": _binary(torch.ge),
    "where": lambda case, t: (torch.where(t["condition"], t["x"], t["y"]),),
    "cast": lambda case, t: (t["x"].to(DTYPES[case.attrs["out_dtype"]]),),
    "fill": lambda case, t: (torch.full_like(t["like"], _attrs(case)[0]),),
    "arange": _arange,
    "copy": lambda case, t: (t["x"].clone(),),
    "sum": _reduction(torch.sum), "mean": _reduction(torch.mean), "max": _reduction(torch.amax),
    "softmax": lambda case, t: (torch.softmax(t["x"], int(_attrs(case)[0])),),
    "softmax_grad": lambda case, t: (torch.ops.aten._softmax_backward_data(t["dout"], t["out"], int(_attrs(case)[0]),
                                                                           t["out"].dtype),),
    "embedding": _embedding, "embedding_grad": _embedding_grad,
    "index_select": lambda case, t: (torch.index_select(t["x"], int(_attrs(case)[0]), t["index"]),),
    "matmul": _matmul,
}

# A plugin's own op has no PyTorch call: PyTorch never reaches it, as the plan says.
if set(CALLS) | set(UNREACHED) != set(BUILTIN) or set(CALLS) & set(UNREACHED):
    raise ImportError("anychip.frontends.torch.conformance must give every op a PyTorch call or a reason in "
                      f"UNREACHED: missing {sorted(set(BUILTIN) - set(CALLS) - set(UNREACHED))}")


def plan(ops=None, dtypes=None) -> list[tuple[str, str]]:
    """The conformance kit's (op, dtype) pairs less the ops PyTorch does not reach."""
    from ...conformance.op_checks import plan as all_pairs

    return [(op, dtype) for op, dtype in all_pairs(ops, dtypes) if op in CALLS]


# ---- running a case --------------------------------------------------------------------------

def _rounded(array: np.ndarray, dtype: str) -> np.ndarray:
    return torch.from_numpy(array.astype(np.float32)).to(DTYPES[dtype]).float().numpy()


def _tensor(array: np.ndarray, device: torch.device, dtype: str | None, grad: bool) -> torch.Tensor:
    t = torch.from_numpy(np.ascontiguousarray(array))
    if dtype is not None:
        t = t.to(DTYPES[dtype])
    return t.to(device).requires_grad_(grad)


def _host(t) -> np.ndarray | None:
    if t is None:
        return None
    a = t.detach().cpu()
    a = a.float() if a.dtype in (torch.bfloat16, torch.float16) else a
    a = a.numpy()
    return a.astype(np.float64) if a.dtype.kind == "f" else a


def _fallbacks(what: str) -> str:
    """What ran on the CPU since the last reset, as a fallback detail ('' when nothing did)."""
    counts = fallback.fallback_counts()
    if not counts:
        return ""
    ops = ", ".join(f"{op} {dtype} x{n}" for (_device, op, dtype), n in sorted(counts.items()))
    return f"{what} ran ops on the CPU instead of the device: {ops}"


def _evaluate(case, op, inputs, seeds, device, dtype, backward):
    """(outputs, {input: grad}, forward error, backward error, forward fallbacks, backward
    fallbacks) of ``op``'s PyTorch call on ``device``, as host arrays."""
    def kind(name, array):
        return None if array.dtype.kind != "f" else "float32" if name in case.float32_inputs else dtype

    fallback.reset_fallbacks()
    try:
        tensors = {n: _tensor(a, device, kind(n, a), backward and n in case.grads) for n, a in inputs.items()}
        outs = CALLS[op](case, tensors)
        host_outs = [_host(o) for o in outs]
    except NotStated:
        raise
    except Exception as exc:  # noqa: BLE001 - a broken kernel must not stop the run
        return None, None, error_text(exc), "", "", ""
    forward_fallbacks = _fallbacks("the forward")
    if case.host_outputs is not None:
        host_outs = case.host_outputs(host_outs)
    if not backward:
        return host_outs, {}, "", "", forward_fallbacks, ""
    fallback.reset_fallbacks()
    try:
        seeded = [(o, _tensor(s, device, dtype, False)) for o, s in zip(outs, seeds) if s is not None]
        found = torch.autograd.grad([o for o, _ in seeded], [tensors[n] for n in case.grads], [s for _, s in seeded],
                                    allow_unused=True)
        grads = {n: _host(g) for n, g in zip(case.grads, found)}
    except Exception as exc:  # noqa: BLE001
        return host_outs, None, "", error_text(exc), forward_fallbacks, ""
    return host_outs, grads, "", "", forward_fallbacks, _fallbacks("the backward")


def _run_case(case, device: torch.device, op: str, dtype: str):
    spec = definitions()[op]
    backward = spec.backward and bool(case.grads)
    inputs = {n: _rounded(a, dtype) if a.dtype.kind == "f" and n not in case.float32_inputs else a
              for n, a in case.inputs.items()}
    seeds = [None if s is None else _rounded(s, dtype) for s in case.output_grads]
    try:
        got, got_grads, fwd_error, bwd_error, fwd_fallback, bwd_fallback = _evaluate(
            case, op, inputs, seeds, device, dtype, backward)
        want, want_grads, ref_error, ref_grad_error, _, _ = _evaluate(case, op, inputs, seeds, torch.device("cpu"),
                                                                      "float32", backward)
    except NotStated as reason:
        return {d: (SKIPPED, None, f"not stated in PyTorch: {reason}") for d in ("fwd", "bwd")[:1 + spec.backward]}
    return outcomes(case, spec, dtype, backward, (got, want, fwd_error, ref_error, fwd_fallback),
                    (got_grads, want_grads, bwd_error, ref_error or ref_grad_error,
                     bwd_fallback or (fwd_fallback and "the forward (and so the backward) ran ops on the CPU")))


def check_op(device: str, op: str, dtype: str) -> list[Result]:
    """One Result per direction of ``op`` in ``dtype`` through PyTorch on anychip ``device``
    ("npu:1" is ``anychip:1`` with PyTorch bound to npu)."""
    from ...runtime.open import parse_device
    from . import device as torch_device, enable

    name, index = parse_device(device)
    enable(name)
    found = registry().kernels.find(op, name, dtype)
    if found is None or not isinstance(found.forward, NativeKernel):
        detail = (f"{name} registers no native {op} kernel for {dtype}, so PyTorch runs it on the CPU there "
                  "(a counted fallback)")
        return [Result("op", op, NOT_DECLARED, dtype, d, detail=detail)
                for d in ("fwd", "bwd")[:1 + definitions()[op].backward]]
    return tally(op, dtype, lambda case: _run_case(case, torch_device(index), op, dtype))
