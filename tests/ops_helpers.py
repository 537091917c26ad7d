"""Shared by the op tests: Paddle in this process (with simulated-memory checking off, since
Paddle's own CPU fallbacks write device memory directly), tensors on a device, and the
reference of an op computed with Paddle autograd."""

from __future__ import annotations

import numpy as np

from anychip.conformance.op_checks import paddle  # noqa: F401 - Paddle, imported with the memory guard off


def place(device: str):
    from anychip.frontends.paddle import place as pf_place

    paddle()
    return pf_place(device, 0)


def tensor(array, device: str, dtype: str | None = None, grad: bool = False):
    """``array`` on ``device`` as ``dtype`` (cast on the host, then copied)."""
    pd = paddle()
    t = pd.to_tensor(np.ascontiguousarray(array), place=pd.CPUPlace())
    if dtype is not None and dtype != str(t.dtype).removeprefix("paddle."):
        t = t.astype(dtype)
    if device != "cpu":
        t = t._copy_to(place(device), True)
    t.stop_gradient = not grad
    return t


def host(t) -> np.ndarray:
    """A float64 (or integer) numpy copy of a tensor on any device."""
    pd = paddle()
    if t.place.is_custom_place():
        t = t._copy_to(pd.CPUPlace(), True)
    if str(t.dtype) in ("paddle.bfloat16", "paddle.float16"):
        t = t.astype("float32")
    a = t.numpy()
    return a.astype(np.float64) if a.dtype.kind == "f" else a


def grads(outputs, inputs, seed_grads):
    """d(sum(out * seed))/d(input) for each input, through Paddle autograd."""
    pd = paddle()
    return pd.grad(outputs, inputs, seed_grads, allow_unused=True)


def assert_close(actual, expected, tol, what=""):
    rtol, atol = tol
    np.testing.assert_allclose(host(actual) if not isinstance(actual, np.ndarray) else actual,
                               host(expected) if not isinstance(expected, np.ndarray) else expected,
                               rtol=rtol, atol=atol, err_msg=what)
