"""RMSNorm fp32 [4096, 4096]: forward, and forward + backward.

Memory-bound: judged in GB/s against the copy bandwidth measured in this run. The 64 MB input
(plus its 64 MB output) would stay in the large last-level cache between rounds, so every round
takes the next of enough distinct inputs to exceed twice the cache: the bytes come from DRAM.
"""

import numpy as np
import pytest

import anychip.ops as ops
import benchlib
from benchlib import Case, Cycle, RooflineShare, aligned_empty_like, host_tensor, stream_count

R, C = 4096, 4096
EPS = 1e-5
MB = R * C * 4

FWD = Case(
    f"rms_norm fwd fp32 [{R},{C}] (DRAM)", "memory", amount=2 * MB + C * 4 + R * 4,
    targets=(RooflineShare(0.80),),
    note="bytes: read x, weight; write y, inv_rms. Inputs cycled beyond 2x the LLC.")
FWD_BWD = Case(
    f"rms_norm fwd+bwd fp32 [{R},{C}] (DRAM)", "memory",
    # fwd: read x, write y; bwd: read dy, x (or h), write dx: 5 passes of R x C (weights, stats aside)
    amount=5 * MB + 3 * C * 4 + 2 * R * 4,
    note="bytes: fwd reads x, writes y; bwd reads dy and x, writes dx (+ weight, dweight, stats).")

FWD_IMPLS = ["anychip", "anychip_kernel", "paddle_fused", "paddle_composed", "torch"]
LABELS = {
    "anychip": "anychip ops.rms_norm",
    "anychip_kernel": "(diagnostic) anychip kernel alone, outputs preallocated",
    "paddle_fused": "paddle incubate fused_rms_norm",
    "paddle_composed": "paddle composed (rsqrt/mean)",
    "torch": "torch F.rms_norm",
}


def _inputs(bytes_per_round):
    """The host arrays, and how many copies to cycle through to stream them from DRAM."""
    rng = np.random.default_rng(0)
    base = rng.standard_normal((R, C), dtype=np.float32)
    w = (1.0 + 0.1 * rng.standard_normal(C)).astype(np.float32)
    return base, w, stream_count(bytes_per_round)


def _paddle_composed(pd, x, w):
    return x * pd.rsqrt((x * x).mean(axis=-1, keepdim=True) + EPS) * w


@pytest.mark.parametrize("impl", FWD_IMPLS)
def test_rms_norm_fwd(benchmark, bench, pd, request, impl):
    base, w, n = _inputs(2 * MB)
    if impl == "torch":
        torch = request.getfixturevalue("torch")
        xs = [torch.from_numpy(base.copy()) for _ in range(n)]
        wt = torch.from_numpy(w)
        nxt = Cycle(xs)
        fn = lambda: torch.nn.functional.rms_norm(nxt(), (C,), wt, EPS)  # noqa: E731
        with torch.no_grad():
            bench.run(benchmark, FWD, impl, fn, label=LABELS[impl])
        return
    if impl == "anychip_kernel":
        # The cpu plugin's kernel on numpy arrays, without Paddle: no op checks, no output
        # allocation (whose first-touch page faults every op pays), for comparison only.
        from anychip.ops import OPS
        from anychip_plugins.host import _kernel

        kernel = _kernel("rms_norm")
        attrs = OPS["rms_norm"].attr_values(eps=EPS)
        xs = Cycle([base.copy() for _ in range(n)])
        y, inv = aligned_empty_like(base), np.empty(R, np.float32)  # aligned like Paddle's outputs
        bench.run(benchmark, FWD, impl, lambda: kernel.run_host([xs(), w], [y, inv], attrs), label=LABELS[impl])
        return
    xs = [host_tensor(base) for _ in range(n)]
    wt = host_tensor(w)
    nxt = Cycle(xs)
    if impl == "anychip":
        fn = lambda: ops.rms_norm(nxt(), wt, eps=EPS)  # noqa: E731
    elif impl == "paddle_fused":
        if benchlib.PADDLE_FUSED_RMS_NORM_NEEDS not in benchlib.cpu_flags():
            pytest.skip(benchlib.PADDLE_FUSED_RMS_NORM_MISSING)
        fn = lambda: pd.incubate.nn.functional.fused_rms_norm(nxt(), wt, None, EPS, 1)[0]  # noqa: E731
    else:
        fn = lambda: _paddle_composed(pd, nxt(), wt)  # noqa: E731
    with pd.no_grad():
        bench.run(benchmark, FWD, impl, fn, label=LABELS[impl], min_rounds=5 if impl != "paddle_composed" else 3)


@pytest.mark.parametrize("impl", ["anychip", "paddle_composed", "torch"])
def test_rms_norm_fwd_bwd(benchmark, bench, pd, request, impl):
    base, w, n = _inputs(3 * MB)
    dy_base = np.random.default_rng(1).standard_normal((R, C), dtype=np.float32)
    if impl == "torch":
        torch = request.getfixturevalue("torch")
        pairs = [(torch.from_numpy(base.copy()).requires_grad_(), torch.from_numpy(dy_base.copy()))
                 for _ in range(n)]
        wt = torch.from_numpy(w.copy()).requires_grad_()
        nxt = Cycle(pairs)

        def fn():
            x, dy = nxt()
            y = torch.nn.functional.rms_norm(x, (C,), wt, EPS)
            return torch.autograd.grad(y, (x, wt), dy)

        bench.run(benchmark, FWD_BWD, impl, fn, label=LABELS[impl], min_rounds=5)
        return
    pairs = [(host_tensor(base, grad=True), host_tensor(dy_base)) for _ in range(n)]
    wt = host_tensor(w, grad=True)
    nxt = Cycle(pairs)
    norm = (lambda x: ops.rms_norm(x, wt, eps=EPS)) if impl == "anychip" else (
        lambda x: _paddle_composed(pd, x, wt))

    def fn():
        x, dy = nxt()
        y = norm(x)
        return pd.grad([y], [x, wt], [dy])

    bench.run(benchmark, FWD_BWD, impl, fn, label=LABELS[impl], min_rounds=3 if impl == "paddle_composed" else 5)

