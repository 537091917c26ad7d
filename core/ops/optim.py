"""A fused AdamW step: one kernel launch per (device, dtype) group of parameters."""

from __future__ import annotations

from collections import defaultdict

from .. import fallback
from ..plugins import registry
from . import checks
from .dispatch import attrs as attrs_of, dtype_name, launch, paddle

OP = "adamw_step"


def _reference(params, grads, m1, m2, lr, beta1, beta2, eps, weight_decay, step):
    pd = paddle()
    with pd.no_grad():
        for p, g, m, v in zip(params, grads, m1, m2):
            gf, pf = g.astype("float32"), p.astype("float32")
            pf = pf * (1.0 - lr * weight_decay)
            pd.assign(beta1 * m + (1.0 - beta1) * gf, m)  # not set_value: it moves a device tensor to the CPU
            pd.assign(beta2 * v + (1.0 - beta2) * gf * gf, v)
            mhat = m / (1.0 - beta1 ** step)
            vhat = v / (1.0 - beta2 ** step)
            pd.assign((pf - lr * mhat / (pd.sqrt(vhat) + eps)).astype(p.dtype), p)


def adamw_step(params, grads, moments1, moments2, *, lr: float, beta1: float = 0.9, beta2: float = 0.999,
               eps: float = 1e-8, weight_decay: float = 0.01, step: int):
    """Updates ``params`` and their float32 moments in place with one AdamW step (decoupled
    weight decay, bias correction for 1-based ``step``). Parameters are grouped by device and
    dtype; each group is one kernel launch."""
    n = len(params)
    for name, seq in (("grads", grads), ("moments1", moments1), ("moments2", moments2)):
        if len(seq) != n:
            raise checks.OpArgumentError(f"{OP}: {name} has {len(seq)} tensors but params has {n}")
    if step < 1:
        raise checks.OpArgumentError(f"{OP}: step is 1-based, got {step}")
    if not (0 <= beta1 < 1 and 0 <= beta2 < 1):
        raise checks.OpArgumentError(f"{OP}: beta1 and beta2 must be in [0, 1), got {beta1}, {beta2}")
    groups = defaultdict(list)
    for i, (p, g, m, v) in enumerate(zip(params, grads, moments1, moments2)):
        for name, t in ((f"params[{i}]", p), (f"grads[{i}]", g), (f"moments1[{i}]", m), (f"moments2[{i}]", v)):
            checks.tensor(OP, name, t)
            if not t.is_contiguous():
                raise checks.OpArgumentError(f"{OP}: {name} is not contiguous; it is updated in place")
        checks.dtype(OP, f"params[{i}]", p, ("float32", "bfloat16"))
        checks.same_dtype(OP, f"params[{i}]", p, **{f"grads[{i}]": g})
        checks.dtype(OP, f"moments1[{i}]", m, ("float32",))
        checks.dtype(OP, f"moments2[{i}]", v, ("float32",))
        for name, t in ((f"grads[{i}]", g), (f"moments1[{i}]", m), (f"moments2[{i}]", v)):
            checks.shape(OP, name, t, p.shape, f"params[{i}]'s shape")
        device = checks.same_device(OP, **{f"params[{i}]": p, f"grads[{i}]": g, f"moments1[{i}]": m,
                                           f"moments2[{i}]": v})
        groups[(device, dtype_name(p))].append((p, g, m, v))
    attrs = attrs_of(OP, lr=lr, beta1=beta1, beta2=beta2, eps=eps, weight_decay=weight_decay, step=step)
    for (device, dtype), members in groups.items():
        ps, gs, ms, vs = (list(col) for col in zip(*members))
        kernel = registry().kernels.find(OP, device[0], dtype)
        if kernel is None:
            fallback.record_op_fallback(device[0], OP, dtype,
                                        f"no kernel is registered for {device[0]}/{dtype}")
            _reference(ps, gs, ms, vs, lr, beta1, beta2, eps, weight_decay, step)
        else:
            launch(kernel.forward, OP, device, gs, ps + ms + vs, attrs)
