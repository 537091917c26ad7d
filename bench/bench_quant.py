"""Quantized linear layers, K = N = 4096.

Decode GEMV (M = 1) is memory-bound: every round takes the next of enough distinct weight
matrices to exceed twice the last-level cache, so the weights stream from DRAM as in decoding
a model larger than the cache; judged in GB/s (weights + scales + x + y) against the read
bandwidth. Peers stream their own weights the same way. anychip's row is ops.WeightOnlyLinear,
weights bound once as models.Linear holds them; ops.weight_only_linear, which checks its weights
on every call, has its own (diagnostic) row. Every large weight lies on 2 MB pages, as the
roofline probe's numpy buffer does: WeightOnlyLinear moves its own there, the bench moves the
other rows' (host_memory.huge_pages_for; torch's own with THP_MEM_ALLOC_ENABLE). w8a8 (M = 512,
hot weights) is compute-bound: TOP/s against the documented AMX-INT8 peak.
"""

import numpy as np
import pytest

import anychip.ops as ops
from anychip.host_memory import huge_pages_for
from benchlib import Case, Cycle, RooflineShare, host_tensor, stream_count

K = N = 4096
M_W8A8 = 512


def _gemv_bytes(bits: int, group: int) -> int:
    groups = 1 if group == -1 else K // group
    return N * K * bits // 8 + N * groups * 4 + K * 4 + N * 4


def gemv_case(bits, group):
    g = "per-channel" if group == -1 else f"group {group}"
    return Case(f"int{bits} weight-only GEMV M=1 {K}x{N} {g}, fp32 x (DRAM)", "memory", _gemv_bytes(bits, group),
                targets=(RooflineShare(0.70, paired=True),), pattern="read",
                note="bytes: packed weights + scales + x + y (peers: their own formats' bytes); weights "
                     "cycled beyond 2x the LLC; judged against read bandwidth, as it only streams W: a plain "
                     "read of the same bytes timed before each round (paired), the run's roofline share beside it")


def gemv_x_int8_case(bits, group):
    g = "per-channel" if group == -1 else f"group {group}"
    return Case(f"int{bits} weight-only GEMV M=1 {K}x{N} {g}, int8 x (x_int8, DRAM)", "memory",
                _gemv_bytes(bits, group), targets=(RooflineShare(0.70, paired=True),), pattern="read",
                note="the fp32-x case's work with x quantized to int8 per run (x_int8=True, approximate; runs of 128 for 4 bits, 32 for 8): "
                     "its anychip row is that variant, also listed beside the exact one in the fp32-x case")


W8A8 = Case(f"w8a8 linear M={M_W8A8} {K}x{N}, fp32 x", "compute", 2.0 * M_W8A8 * N * K, peak="int8",
            note="OPs: 2*M*N*K; weights hot in cache (compute-bound)")


def _packed(bits, group, rng):
    """Random packed weights and scales in anychip's layout (the values do not matter here)."""
    groups = 1 if group == -1 else K // group
    if bits == 4:
        q = rng.integers(0, 256, (N, K // 2), dtype=np.uint8)
    else:
        q = rng.integers(-127, 128, (N, K), dtype=np.int8)
    scales = (rng.random((N, groups), dtype=np.float32) * 0.01 + 1e-3).astype(np.float32)
    return q, scales


GEMV_CASES = [(4, 128), (4, -1), (8, -1)]
LABELS = {
    "anychip": "anychip ops.WeightOnlyLinear (weights bound once)",
    "anychip_op": "(diagnostic) anychip ops.weight_only_linear, weights checked every call",
    "anychip_x_int8": "anychip ops.WeightOnlyLinear x_int8 (int8 activations, approx.)",
    "anychip_x_int8_op": "(diagnostic) anychip ops.weight_only_linear x_int8, weights checked every call",
    "anychip_kernel": "(diagnostic) anychip kernel alone, output preallocated",
    "anychip_kernel_x_int8": "(diagnostic) anychip kernel alone, x_int8, output preallocated",
    "torch_int4": "torch _weight_int4pack_mm_for_cpu (g128, bf16 x)",
    "torch_int8": "torch _weight_int8pack_mm",
    "torch_fp32": "torch fp32 F.linear (GEMV)",
    "paddle_fp32": "paddle fp32 matmul (GEMV)",
}
# Which GEMV cases a peer belongs to (the fp32 peers are measured once, listed in every case).
PEER_CASES = {"anychip_kernel": [(4, 128)], "anychip_kernel_x_int8": [(4, 128)], "torch_int4": [(4, 128)],
              "torch_int8": [(8, -1)], "torch_fp32": GEMV_CASES, "paddle_fp32": GEMV_CASES}


def _run_stream(bench, benchmark, cases, impl, fn, count, amount=None, pages=""):
    bench.run(benchmark, cases[0], impl, fn, label=LABELS[impl], min_rounds=max(20, count),
              max_rounds=max(400, 2 * count), warmup=min(count, 50), notes=f"{count} distinct weight sets{pages}",
              also=cases[1:], amount=amount, paired_read=True)


def _pages(moved: int, tensors) -> str:
    """How much of the weights huge_pages_for got onto 2 MB pages (none where THP is off, or
    no 2 MB page was free), for the row's notes."""
    total = sum(t.numel().item() * t.element_size() for t in tensors)
    return f", {min(moved, total) / 2**20:.0f} of their {total / 2**20:.0f} MB on 2 MB pages"


FP32_GEMV_BYTES = N * K * 4 + K * 4 + N * 4


def _gemv_calls(bits, group, count, rng, api, x_int8=False):
    """``count`` weight sets (qweight, scales), a GEMV x -> y with each: through
    ops.WeightOnlyLinear (``api`` "bound") or ops.weight_only_linear ("op"), and _pages."""
    q, s = _packed(bits, group, rng)
    sets = [(host_tensor(q), host_tensor(s)) for _ in range(count)]
    tensors = [t for pair in sets for t in pair]
    if api == "bound":
        bound = [ops.WeightOnlyLinear(qw, sc, bits=bits, group_size=group) for qw, sc in sets]
        pages = _pages(sum(lin.huge_page_bytes for lin in bound), tensors)
        return sets, [lambda x, lin=lin: lin(x, x_int8=x_int8) for lin in bound], pages
    pages = _pages(huge_pages_for(tensors), tensors)
    return sets, [lambda x, qw=qw, sc=sc: ops.weight_only_linear(x, qw, sc, bits=bits, group_size=group,
                                                                 x_int8=x_int8) for qw, sc in sets], pages


@pytest.mark.parametrize("api", ["bound", "op"])
@pytest.mark.parametrize("bits,group", GEMV_CASES)
def test_weight_only_gemv(benchmark, bench, pd, bits, group, api):
    case = gemv_case(bits, group)
    rng = np.random.default_rng(0)
    xt = host_tensor(rng.standard_normal((1, K), dtype=np.float32))
    count = stream_count(case.amount)
    _sets, calls, pages = _gemv_calls(bits, group, count, rng, api)
    nxt = Cycle(calls)
    with pd.no_grad():
        _run_stream(bench, benchmark, [case], "anychip" if api == "bound" else "anychip_op", lambda: nxt()(xt), count,
                    pages=pages)


@pytest.mark.parametrize("api", ["bound", "op"])
@pytest.mark.parametrize("bits,group", GEMV_CASES)
def test_weight_only_gemv_x_int8(benchmark, bench, pd, bits, group, api):
    """The x_int8 variant: the subject of its own case (judged by the same target), and a row of
    the exact case, with its error against the exact op in the notes."""
    case, exact_case = gemv_x_int8_case(bits, group), gemv_case(bits, group)
    rng = np.random.default_rng(0)
    xt = host_tensor(rng.standard_normal((1, K), dtype=np.float32))
    count = stream_count(case.amount)
    sets, calls, pages = _gemv_calls(bits, group, count, rng, api, x_int8=True)
    nxt = Cycle(calls)
    impl = "anychip_x_int8" if api == "bound" else "anychip_x_int8_op"
    with pd.no_grad():
        exact = ops.weight_only_linear(xt, *sets[0], bits=bits, group_size=group).numpy()
        error = np.linalg.norm(calls[0](xt).numpy() - exact) / np.linalg.norm(exact)
        notes = f"{count} distinct weight sets{pages}; relative error vs the exact op {error:.1e} (Gaussian x)"
        row = bench.run(benchmark, case, "anychip" if api == "bound" else "anychip_op", lambda: nxt()(xt),
                        label=LABELS[impl], min_rounds=max(20, count), max_rounds=max(400, 2 * count),
                        warmup=min(count, 50), notes=notes, paired_read=True)
    bench.collector.record(exact_case, impl, list(benchmark.stats.stats.data), label=LABELS[impl], notes=notes,
                           foreign_load=row["foreign_load"], paired=bench.last_probe)


@pytest.mark.parametrize("impl", list(PEER_CASES))
def test_gemv_peer(benchmark, bench, pd, request, impl):
    x_int8 = impl == "anychip_kernel_x_int8"
    cases = [(gemv_x_int8_case if x_int8 else gemv_case)(b, g) for b, g in PEER_CASES[impl]]
    rng = np.random.default_rng(0)
    x = rng.standard_normal((1, K), dtype=np.float32)
    if impl.startswith("anychip_kernel"):
        # The cpu plugin's kernel on numpy arrays, without Paddle: no op checks, no output
        # allocation; what the bound op's row adds to it is the cost of calling from Python.
        from anychip.ops import OPS
        from anychip_plugins.host import _kernel

        kernel = _kernel("weight_only_linear")
        attrs = OPS["weight_only_linear"].attr_values(bits=4, group_size=128, **({"x_int8": 1} if x_int8 else {}))
        q, s = _packed(4, 128, rng)
        count = stream_count(cases[0].amount)
        nxt = Cycle([(q.copy(), s.copy()) for _ in range(count)])
        y = np.empty((1, N), np.float32)

        def fn():
            qw, sc = nxt()
            kernel.run_host([x, qw, sc], [y], attrs)

        _run_stream(bench, benchmark, cases, impl, fn, count)
        return
    if impl == "paddle_fp32":
        w = rng.standard_normal((N, K), dtype=np.float32)
        count = stream_count(w.nbytes)
        xt = host_tensor(x)
        weights = [host_tensor(w) for _ in range(count)]
        pages = _pages(huge_pages_for(weights), weights)
        nxt = Cycle(weights)
        with pd.no_grad():
            _run_stream(bench, benchmark, cases, impl, lambda: pd.matmul(xt, nxt(), transpose_y=True), count,
                        amount=FP32_GEMV_BYTES, pages=pages)
        return
    torch = request.getfixturevalue("torch")
    xt = torch.from_numpy(x)
    if impl == "torch_fp32":
        w = torch.from_numpy(rng.standard_normal((N, K), dtype=np.float32))
        count = stream_count(w.numel() * 4)
        nxt = Cycle([w.clone() for _ in range(count)])
        fn = lambda: torch.nn.functional.linear(xt, nxt())  # noqa: E731
        amount = FP32_GEMV_BYTES
    elif impl == "torch_int4":
        group = 128
        packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(
            torch.from_numpy(rng.integers(0, 16, (N, K), dtype=np.int32)), 2)
        # bf16 activations and scales: torch's fast path (fp32 x is ~30x slower in torch 2.14)
        sz = torch.from_numpy(rng.random((K // group, N, 2), dtype=np.float32) * 0.01).bfloat16()
        xb = xt.bfloat16()
        amount = packed.numel() * packed.element_size() + sz.numel() * 2 + K * 2 + N * 2
        count = stream_count(amount)
        nxt = Cycle([(packed.clone(), sz.clone()) for _ in range(count)])

        def fn():
            p, z = nxt()
            return torch.ops.aten._weight_int4pack_mm_for_cpu(xb, p, group, z)
    else:  # torch_int8
        w8 = torch.from_numpy(rng.integers(-127, 128, (N, K), dtype=np.int8))
        sc = torch.from_numpy(rng.random(N, dtype=np.float32) * 0.01)
        amount = w8.numel() + N * 4 + K * 4 + N * 4
        count = stream_count(amount)
        nxt = Cycle([(w8.clone(), sc.clone()) for _ in range(count)])

        def fn():
            w, s = nxt()
            return torch.ops.aten._weight_int8pack_mm(xt, w, s)
    with torch.no_grad():
        try:
            fn()
        except Exception as e:  # noqa: BLE001 -- a private torch op may change; the peer is optional
            pytest.skip(f"{LABELS[impl]} does not run here: {type(e).__name__}: {str(e)[:200]}")
        _run_stream(bench, benchmark, cases, impl, fn, count, amount=amount)


# (torch's _weight_int8pack_mm is a GEMV kernel: ~8 s at M=512, so it is no peer here)
@pytest.mark.parametrize("impl", ["anychip", "torch_fp32", "torch_bf16", "paddle_fp32"])
def test_w8a8(benchmark, bench, pd, request, impl):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((M_W8A8, K), dtype=np.float32)
    if impl == "anychip":
        q, s = _packed(8, -1, rng)
        xt, qt, st = host_tensor(x), host_tensor(q), host_tensor(s)
        with pd.no_grad():
            bench.run(benchmark, W8A8, impl, lambda: ops.w8a8_linear(xt, qt, st), label="anychip ops.w8a8_linear")
        return
    if impl == "paddle_fp32":
        xt, wt = host_tensor(x), host_tensor(rng.standard_normal((N, K), dtype=np.float32))
        with pd.no_grad():
            bench.run(benchmark, W8A8, impl, lambda: pd.matmul(xt, wt, transpose_y=True),
                      label="paddle fp32 matmul", min_rounds=3)
        return
    torch = request.getfixturevalue("torch")
    xt = torch.from_numpy(x)
    with torch.no_grad():
        if impl == "torch_fp32":
            w = torch.from_numpy(rng.standard_normal((N, K), dtype=np.float32))
            fn, label = (lambda: torch.nn.functional.linear(xt, w)), "torch fp32 F.linear"
        else:
            w = torch.from_numpy(rng.standard_normal((N, K), dtype=np.float32)).bfloat16()
            xb = xt.bfloat16()
            fn, label = (lambda: torch.nn.functional.linear(xb, w)), "torch bf16 F.linear"
        bench.run(benchmark, W8A8, impl, fn, label=label, min_rounds=3)
