"""Float linear layers for training at SmolLM2-135M's shapes, M = 512 tokens: the attention / MLP
projections (K=576 -> N=1536, K=1536 -> N=576) and the vocabulary head (K=576 -> N=49152).

Compute-bound: TFLOP/s (2 M N K per product; the backward is two products, dx and dW) against
the compute roof of the products' format (bf16 for bf16 and for mixed precision: AMX-BF16's
documented peak where the CPU has it, else the FP32 roof; fp32: the FP32 FMA roof measured in
the run), and time against Paddle's fp32 matmul measured in the same run (the CPU wheel has
no bf16 matmul). Three anychip rows: bf16 tensors; fp32 tensors (inference of float models, which
must not be slower than Paddle); and mixed precision, fp32 tensors with compute_dtype bfloat16
(training: the kernels round to bf16 as they pack, no cast passes). Weights and activations stay
hot in cache between rounds, as within a training step.
"""

import numpy as np
import pytest

import anychip.ops as ops
from benchlib import Case, FasterThan, host_tensor

M = 512
SHAPES = [(576, 1536), (1536, 576), (576, 49152)]  # (K, N)
DIRECTIONS = {"fwd": 1, "bwd": 2, "fwd+bwd": 3}  # products of 2 M N K FLOPs each
MIXED = "mixed"  # float32 tensors, bfloat16 products
PEAK = {"float32": "fp32", "bfloat16": "bf16", MIXED: "bf16"}
SHORT = {"float32": "fp32", "bfloat16": "bf16", MIXED: "fp32+bf16 compute"}
# impl -> (tensor dtype, compute_dtype)
IMPLS = {"anychip_fp32": ("float32", None), "anychip_bf16": ("bfloat16", None), "anychip_mixed": ("float32", "bfloat16")}


def case(k, n, direction, dtype):
    if dtype == "bfloat16" and direction == "fwd+bwd":
        targets = (FasterThan("paddle_fp32", 3.0, "paddle fp32 matmul"),)
    elif dtype == "float32":
        targets = (FasterThan("paddle_fp32", 1.0, "paddle fp32 matmul"),)
    else:
        targets = ()
    what = {"fwd": "y = x W^T", "bwd": "dx = dy W and dW = dy^T x", "fwd+bwd": "the forward, then both grads"}
    return Case(f"linear {direction} {SHORT[dtype]} M={M} K={k} N={n}", "compute",
                2.0 * M * n * k * DIRECTIONS[direction], peak=PEAK[dtype], targets=targets,
                note=f"FLOPs: 2*M*N*K per product ({what[direction]}); all of x and W need grads; "
                     "the paddle row is fp32 in every case")


def _arrays(k, n):
    rng = np.random.default_rng(0)
    return (rng.standard_normal((M, k), dtype=np.float32), rng.standard_normal((n, k), dtype=np.float32) * 0.05,
            rng.standard_normal((M, n), dtype=np.float32))


def _timed(pd, direction, forward, x, w, dy):
    """The work of ``direction`` for a differentiable ``forward(x, w)``."""
    if direction == "fwd":
        def fn():
            with pd.no_grad():
                return forward(x, w)
        return fn
    if direction == "bwd":
        y = forward(x, w)
        return lambda: pd.grad([y], [x, w], [dy], retain_graph=True)
    return lambda: pd.grad([forward(x, w)], [x, w], [dy])


@pytest.mark.parametrize("direction", list(DIRECTIONS))
@pytest.mark.parametrize("k,n", SHAPES)
@pytest.mark.parametrize("impl", ["anychip_fp32", "anychip_bf16", "anychip_mixed", "paddle_fp32"])
def test_linear(benchmark, bench, pd, impl, k, n, direction):
    xa, wa, dya = _arrays(k, n)
    if impl == "paddle_fp32":
        x, w, dy = host_tensor(xa, grad=True), host_tensor(wa, grad=True), host_tensor(dya)
        fn = _timed(pd, direction, lambda x, w: pd.matmul(x, w, transpose_y=True), x, w, dy)
        bench.run(benchmark, case(k, n, direction, "bfloat16"), impl, fn, label="paddle fp32 matmul", min_rounds=3,
                  also=[case(k, n, direction, "float32"), case(k, n, direction, MIXED)])
        return
    dtype, compute = IMPLS[impl]
    x, w, dy = host_tensor(xa, dtype, grad=True), host_tensor(wa, dtype, grad=True), host_tensor(dya, dtype)
    fn = _timed(pd, direction, lambda x, w: ops.linear(x, w, compute_dtype=compute), x, w, dy)
    kind = MIXED if compute else dtype
    bench.run(benchmark, case(k, n, direction, kind), "anychip", fn, label=f"anychip ops.linear {SHORT[kind]}",
              min_rounds=3)
