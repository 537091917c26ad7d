"""ATen's arithmetic on the anychip device, through the chip's base-op kernels (kernel.h):
elementwise ops with broadcasting and PyTorch's type promotion, reductions, softmax, matmuls.

Each ATen op maps onto one base op; broadcasting is done by views (stride 0), as kernel.h's
elementwise convention asks. A dtype the chip has no kernel for runs the op on the CPU, counted
(``launch.on_host``); composite ops (silu_backward, log_softmax) are written with ops that run
here, so they stay on the device.
"""

from __future__ import annotations

import torch

from ...ops.dispatch import attrs
from .launch import FLOATS, device_of, kernel_for, launch, on_host
from .registration import impl

aten = torch.ops.aten


def _is_scalar(v) -> bool:
    return not isinstance(v, torch.Tensor) or (v.device.type == "cpu" and v.dim() == 0)


def _shape(v) -> tuple:
    return () if _is_scalar(v) else tuple(v.shape)


def broadcast_shapes(*shapes) -> tuple:
    """torch.broadcast_shapes of plain shapes, without its symbolic-shape machinery (a tenth of
    a transformers decode step went there)."""
    rank = max(len(s) for s in shapes)
    out = [1] * rank
    for shape in shapes:
        for i, n in enumerate(shape, rank - len(shape)):
            if n != 1:
                if out[i] not in (1, n):
                    raise RuntimeError(f"The size of tensor a ({out[i]}) must match the size of tensor b ({n}) "
                                       f"at non-singleton dimension {i}")
                out[i] = n
    return tuple(out)


def scalar(value, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A 0-dim device tensor holding ``value`` (a number or a CPU 0-dim tensor)."""
    if isinstance(value, torch.Tensor):
        value = value.item()
    return torch.empty((), dtype=dtype, device=device).fill_(value)


def operand(v, dtype: torch.dtype, shape: tuple, device: torch.device) -> torch.Tensor:
    """``v`` as a device tensor of ``dtype`` viewed at ``shape`` (stride 0 where broadcast)."""
    if _is_scalar(v):
        t = scalar(v, dtype, device)
    else:
        if v.device != device:
            raise RuntimeError(f"Expected all tensors to be on the same device, but found {v.device} and {device}")
        t = v if v.dtype == dtype else v.to(dtype)
    return t.expand(shape)


def _elementwise(kernel_name: str, overload, args, compute: torch.dtype, out_dtype: torch.dtype, attr_values=()):
    device = device_of(*args)
    shape = broadcast_shapes(*(_shape(a) for a in args))
    kernel = kernel_for(kernel_name, compute)
    if kernel is None:
        return on_host(overload.__name__, overload, compute, *args)
    out = torch.empty(shape, dtype=out_dtype, device=device)
    launch(kernel, kernel_name, [operand(a, compute, shape, device) for a in args], [out], attr_values)
    return out


def _promoted(a, b) -> torch.dtype:
    return torch.result_type(a, b)


# ---- binary ------------------------------------------------------------------------------------

def _binary(kernel_name, overload, a, b, dtype=None):
    dtype = dtype or _promoted(a, b)
    return _elementwise(kernel_name, overload, (a, b), dtype, dtype)


def _with_alpha(other, alpha):
    if alpha is None or alpha == 1:
        return other
    if _is_scalar(other):
        return (other.item() if isinstance(other, torch.Tensor) else other) * alpha
    return aten.mul.Scalar(other, alpha)


@impl("add.Tensor", "add.Scalar")
def add(self, other, alpha=1):
    return _binary("add", aten.add, self, _with_alpha(other, alpha), _promoted(self, other))


@impl("sub.Tensor", "sub.Scalar")
def sub(self, other, alpha=1):
    return _binary("subtract", aten.sub, self, _with_alpha(other, alpha), _promoted(self, other))


@impl("rsub.Tensor", "rsub.Scalar")
def rsub(self, other, alpha=1):
    """other - alpha * self."""
    return _binary("subtract", aten.rsub, other, _with_alpha(self, alpha), _promoted(self, other))


@impl("mul.Tensor", "mul.Scalar")
def mul(self, other):
    return _binary("multiply", aten.mul, self, other)


def _true_div_dtype(a, b) -> torch.dtype:
    dtype = _promoted(a, b)
    return dtype if dtype.is_floating_point else torch.get_default_dtype()


@impl("div.Tensor", "div.Scalar")
def div(self, other):
    return _binary("divide", aten.div, self, other, _true_div_dtype(self, other))


@impl("maximum")
def maximum(self, other):
    return _binary("maximum", aten.maximum, self, other)


@impl("minimum")
def minimum(self, other):
    return _binary("minimum", aten.minimum, self, other)


@impl("pow.Tensor_Tensor")
def pow_tensor(self, exponent):
    return _binary("elementwise_pow", aten.pow, self, exponent)


@impl("pow.Tensor_Scalar")
def pow_scalar(self, exponent):
    dtype = _promoted(self, exponent)
    if dtype not in FLOATS:
        return on_host("pow.Tensor_Scalar", aten.pow, dtype, self, exponent)
    return _elementwise("pow", aten.pow, (self,), dtype, dtype, attrs("pow", factor=exponent))


# ---- comparisons and selection ---------------------------------------------------------------

_COMPARE = {"eq": "equal", "ne": "not_equal", "lt": "less_than", "le": "less_equal", "gt": "greater_than",
            "ge": "greater_equal"}


def _register_compare(name: str, kernel_name: str) -> None:
    def compare(self, other):
        return _elementwise(kernel_name, getattr(aten, name), (self, other), _promoted(self, other), torch.bool)
    impl(f"{name}.Tensor", f"{name}.Scalar")(compare)


for _name, _kernel in _COMPARE.items():
    _register_compare(_name, _kernel)


@impl("where.self")
def where(condition, self, other):
    dtype = _promoted(self, other)
    device = device_of(condition, self, other)
    shape = broadcast_shapes(_shape(condition), _shape(self), _shape(other))
    kernel = kernel_for("where", dtype)
    if kernel is None:
        return on_host("where.self", aten.where.self, dtype, condition, self, other)
    out = torch.empty(shape, dtype=dtype, device=device)
    launch(kernel, "where", [operand(condition, torch.bool, shape, device), operand(self, dtype, shape, device),
                             operand(other, dtype, shape, device)], [out])
    return out


@impl("masked_fill.Scalar")
def masked_fill(self, mask, value):
    return where(mask, value, self)


@impl("masked_fill.Tensor")
def masked_fill_tensor(self, mask, value):
    return where(mask, value, self)


# ---- unary -----------------------------------------------------------------------------------

def _register_unary(aten_name: str, kernel_name: str) -> None:
    overload = getattr(aten, aten_name)

    def unary(self):
        dtype = self.dtype if self.dtype.is_floating_point else torch.get_default_dtype()
        if kernel_name in ("abs", "neg") and not self.dtype.is_floating_point:
            dtype = self.dtype
        return _elementwise(kernel_name, overload, (self,), dtype, dtype)
    impl(aten_name)(unary)


for _name in ("exp", "log", "sqrt", "rsqrt", "silu", "sigmoid", "tanh", "abs", "neg", "sin", "cos"):
    _register_unary(_name, _name)


@impl("silu_backward")
def silu_backward(grad_output, self):
    s = torch.sigmoid(self)
    return grad_output * s * (1 + self * (1 - s))


@impl("sigmoid_backward")
def sigmoid_backward(grad_output, output):
    return grad_output * output * (1 - output)


@impl("tanh_backward")
def tanh_backward(grad_output, output):
    return grad_output * (1 - output * output)


# ---- in place: the functional op, written back --------------------------------------------------

def _register_inplace(name: str, functional) -> None:
    def inplace(self, *args, **kwargs):
        result = functional(self, *args, **kwargs)
        if result.shape != self.shape:
            raise RuntimeError(f"output with shape {list(self.shape)} doesn't match the broadcast shape "
                               f"{list(result.shape)}")
        return self.copy_(result)
    impl(name)(inplace)


for _name, _fn in [("add_.Tensor", add), ("add_.Scalar", add), ("sub_.Tensor", sub), ("sub_.Scalar", sub), ("mul_.Tensor", mul), ("mul_.Scalar", mul), ("div_.Tensor", div),
                   ("div_.Scalar", div), ("pow_.Scalar", pow_scalar), ("neg_", torch.neg), ("exp_", torch.exp),
                   ("sqrt_", torch.sqrt), ("masked_fill_.Scalar", masked_fill)]:
    _register_inplace(_name, _fn)


# ---- reductions ------------------------------------------------------------------------------

def _axes(dim, rank: int) -> list[int]:
    if dim is None or (isinstance(dim, (list, tuple)) and len(dim) == 0):
        return []
    dims = [dim] if isinstance(dim, int) else list(dim)
    return sorted({d % rank if rank else 0 for d in dims})


def _reduce(kernel_name: str, overload_label: str, overload, self, dim, keepdim, dtype=None):
    compute = dtype or self.dtype
    if compute not in FLOATS or kernel_for(kernel_name, compute) is None:
        return on_host(overload_label, overload, compute, self, dim, keepdim, dtype=dtype) if dtype is not None \
            else on_host(overload_label, overload, compute, self, dim, keepdim)
    x = self if self.dtype == compute else self.to(compute)
    axes = _axes(dim, x.dim())
    reduced = axes or list(range(x.dim()))
    shape = [1 if i in reduced else n for i, n in enumerate(x.shape)] if keepdim else \
        [n for i, n in enumerate(x.shape) if i not in reduced]
    out = torch.empty(shape, dtype=compute, device=x.device)
    launch(kernel_for(kernel_name, compute), kernel_name, [x], [out],
           attrs(kernel_name, keepdim=keepdim, n=len(axes), axes=axes))
    return out


@impl("sum.dim_IntList")
def sum_dim(self, dim, keepdim=False, dtype=None):
    if dtype is None and not self.dtype.is_floating_point:
        return on_host("sum.dim_IntList", aten.sum.dim_IntList, self.dtype, self, dim, keepdim)
    return _reduce("sum", "sum.dim_IntList", aten.sum.dim_IntList, self, dim, keepdim, dtype)


@impl("sum")
def sum_all(self, dtype=None):
    return sum_dim(self, [], False, dtype)


@impl("mean.dim")
def mean_dim(self, dim, keepdim=False, dtype=None):
    return _reduce("mean", "mean.dim", aten.mean.dim, self, dim, keepdim, dtype)


@impl("mean")
def mean_all(self, dtype=None):
    return mean_dim(self, [], False, dtype)


@impl("amax")
def amax(self, dim=(), keepdim=False):
    return _reduce("max", "amax", aten.amax.default, self, dim, keepdim)


@impl("max")
def max_all(self):
    if self.dtype not in FLOATS:
        return on_host("max", aten.max.default, self.dtype, self)
    return _reduce("max", "max", aten.amax.default, self, [], False)


# ---- softmax ---------------------------------------------------------------------------------

@impl("_softmax")
def softmax(self, dim, half_to_float):
    dtype = torch.float32 if half_to_float else self.dtype
    x = self if self.dtype == dtype else self.to(dtype)
    kernel = kernel_for("softmax", dtype)
    if kernel is None:
        return on_host("_softmax", aten._softmax.default, dtype, self, dim, half_to_float)
    out = torch.empty(x.shape, dtype=dtype, device=x.device)
    launch(kernel, "softmax", [x.contiguous()], [out], attrs("softmax", axis=dim))
    return out


@impl("_softmax_backward_data")
def softmax_backward(grad_output, output, dim, input_dtype):
    kernel = kernel_for("softmax_grad", output.dtype)
    if kernel is None:
        return on_host("_softmax_backward_data", aten._softmax_backward_data.default, output.dtype, grad_output,
                       output, dim, input_dtype)
    out = torch.empty(output.shape, dtype=output.dtype, device=output.device)
    launch(kernel, "softmax_grad", [output.contiguous(), grad_output.to(output.dtype).contiguous()], [out],
           attrs("softmax_grad", axis=dim))
    return out if out.dtype == input_dtype else out.to(input_dtype)


@impl("_log_softmax")
def log_softmax(self, dim, half_to_float):
    x = self.float() if half_to_float else self
    shifted = x - torch.amax(x, dim, keepdim=True)
    return shifted - torch.log(torch.sum(torch.exp(shifted), dim, keepdim=True))


@impl("_log_softmax_backward_data")
def log_softmax_backward(grad_output, output, dim, input_dtype):
    grad = grad_output - torch.exp(output) * torch.sum(grad_output, dim, keepdim=True)
    return grad if grad.dtype == input_dtype else grad.to(input_dtype)


# ---- matrix products -------------------------------------------------------------------------

def _matmul_operand(t: torch.Tensor):
    """(tensor, transposed): a transposed dense matrix is passed as its dense self with the
    kernel's transpose flag, which reads it row by row."""
    if t.dim() >= 2 and t.stride(-2) == 1 and t.stride(-1) == t.shape[-2] and t.shape[-1] > 1:
        return t.transpose(-1, -2), 1.0
    return t, 0.0


def _matmul(overload_label, overload, a, b, *extra):
    dtype = _promoted(a, b)
    kernel = kernel_for("matmul", dtype)
    if kernel is None or dtype not in FLOATS:
        return on_host(overload_label, overload, dtype, a, b, *extra)
    a, b = (a if a.dtype == dtype else a.to(dtype)), (b if b.dtype == dtype else b.to(dtype))
    batch = broadcast_shapes(a.shape[:-2], b.shape[:-2])
    a = a.expand(*batch, *a.shape[-2:])
    b = b.expand(*batch, *b.shape[-2:])
    out = torch.empty((*batch, a.shape[-2], b.shape[-1]), dtype=dtype, device=a.device)
    (x, tx), (y, ty) = _matmul_operand(a), _matmul_operand(b)
    launch(kernel, "matmul", [x, y], [out], attrs("matmul", transpose_x=tx, transpose_y=ty))
    return out


def _check_matrices(name, a, b, rank):
    if a.dim() != rank or b.dim() != rank:
        raise RuntimeError(f"{name}: expected {rank}-D tensors, got {a.dim()}-D and {b.dim()}-D")
    if a.shape[-1] != b.shape[-2]:
        raise RuntimeError(f"{name}: shapes cannot be multiplied ({'x'.join(map(str, a.shape))} and "
                           f"{'x'.join(map(str, b.shape))})")


@impl("mm")
def mm(self, mat2):
    _check_matrices("mm", self, mat2, 2)
    return _matmul("mm", aten.mm.default, self, mat2)


@impl("bmm")
def bmm(self, mat2):
    _check_matrices("bmm", self, mat2, 3)
    return _matmul("bmm", aten.bmm.default, self, mat2)


@impl("addmm")
def addmm(self, mat1, mat2, beta=1, alpha=1):
    _check_matrices("addmm", mat1, mat2, 2)
    product = mm(mat1, mat2)
    if alpha != 1:
        product = product * alpha
    return product if beta == 0 else product + (self if beta == 1 else self * beta)


@impl("baddbmm")
def baddbmm(self, batch1, batch2, beta=1, alpha=1):
    product = bmm(batch1, batch2)
    if alpha != 1:
        product = product * alpha
    return product if beta == 0 else product + (self if beta == 1 else self * beta)
