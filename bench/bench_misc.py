"""Elementwise LLM ops, fp32, memory-bound (GB/s against the copy bandwidth): RoPE, SwiGLU,
and a fused AdamW step over a SmolLM2-135M-like parameter list. Inputs are cycled beyond twice
the last-level cache, so the bytes come from DRAM; the AdamW state (2.2 GB) does so anyway.
"""

import numpy as np
import pytest

import anychip.ops as ops
from benchlib import Case, Cycle, host_tensor, stream_count

# RoPE: a prefill of 4 x 2048 tokens, SmolLM2-135M's heads
B, S, HQ, HK, D = 4, 2048, 9, 3, 64
THETA = 100000.0
ROPE_IO = (B * S * (HQ + HK) * D * 4) * 2 + B * S * 8
ROPE = Case(f"rotary_embedding fwd fp32 q[{B},{S},{HQ},{D}] k[{B},{S},{HK},{D}] (DRAM)", "memory", ROPE_IO,
            note="bytes: read q, k, positions; write q, k. torch/paddle peers get cos/sin precomputed (untimed)")

# SwiGLU: [4096 tokens, 4096 features]
T, F = 4096, 4096
SWIGLU = Case(f"swiglu fwd fp32 [{T},{F}] (DRAM)", "memory", 3 * T * F * 4,
              note="bytes: read gate, up; write y")

# AdamW: SmolLM2-135M's parameter shapes (tied embeddings)
HIDDEN, FFN, LAYERS, VOCAB, KV = 576, 1536, 30, 49152, 192


def smollm2_shapes():
    shapes = [(VOCAB, HIDDEN)]
    for _ in range(LAYERS):
        shapes += [(HIDDEN, HIDDEN), (KV, HIDDEN), (KV, HIDDEN), (HIDDEN, HIDDEN),
                   (FFN, HIDDEN), (FFN, HIDDEN), (HIDDEN, FFN), (HIDDEN,), (HIDDEN,)]
    return shapes + [(HIDDEN,)]


SHAPES = smollm2_shapes()
NPARAM = sum(int(np.prod(s)) for s in SHAPES)
ADAMW = Case(f"adamw_step fp32, {len(SHAPES)} tensors, {NPARAM / 1e6:.1f}M params", "memory", 28 * NPARAM,
             note="bytes: read p, g, m, v; write p, m, v (28 B a parameter)")


# ---------------------------------------------------------------------------------------------


def _rope_arrays():
    rng = np.random.default_rng(0)
    q = rng.standard_normal((B, S, HQ, D), dtype=np.float32)
    k = rng.standard_normal((B, S, HK, D), dtype=np.float32)
    pos = np.tile(np.arange(S, dtype=np.int64), (B, 1))
    return q, k, pos


def _cos_sin(pos):
    """cos, sin [B, S, 1, D] for the half-rotation layout, as numpy arrays."""
    inv = 1.0 / THETA ** (np.arange(0, D, 2, dtype=np.float32) / D)
    ang = pos[..., None].astype(np.float32) * inv
    ang = np.concatenate([ang, ang], axis=-1)[:, :, None, :]
    return np.cos(ang).astype(np.float32), np.sin(ang).astype(np.float32)


@pytest.mark.parametrize("impl", ["anychip", "paddle_composed", "torch_composed"])
def test_rotary(benchmark, bench, pd, request, impl):
    q, k, pos = _rope_arrays()
    count = stream_count(ROPE_IO)
    if impl == "anychip":
        pt = host_tensor(pos)
        sets = Cycle([(host_tensor(q), host_tensor(k)) for _ in range(count)])

        def fn():
            qq, kk = sets()
            return ops.rotary_embedding(qq, kk, pt, theta=THETA)

        with pd.no_grad():
            bench.run(benchmark, ROPE, impl, fn, label="anychip ops.rotary_embedding")
        return
    cos, sin = _cos_sin(pos)
    half = D // 2
    if impl == "paddle_composed":
        c, s_ = host_tensor(cos), host_tensor(sin)
        sets = Cycle([(host_tensor(q), host_tensor(k)) for _ in range(count)])

        def rot_pd(x):
            return x * c + pd.concat([-x[..., half:], x[..., :half]], axis=-1) * s_

        def fn():
            qq, kk = sets()
            return rot_pd(qq), rot_pd(kk)

        with pd.no_grad():
            bench.run(benchmark, ROPE, impl, fn, label="paddle composed (rotate_half)", min_rounds=3)
        return
    torch = request.getfixturevalue("torch")
    c, s_ = torch.from_numpy(cos), torch.from_numpy(sin)
    sets = Cycle([(torch.from_numpy(q.copy()), torch.from_numpy(k.copy())) for _ in range(count)])

    def rot(x):
        return x * c + torch.cat((-x[..., half:], x[..., :half]), dim=-1) * s_

    def fn():
        qq, kk = sets()
        return rot(qq), rot(kk)

    with torch.no_grad():
        bench.run(benchmark, ROPE, impl, fn, label="torch composed (HF rotate_half)", min_rounds=3)


@pytest.mark.parametrize("impl", ["anychip", "paddle_swiglu", "paddle_composed", "torch_composed"])
def test_swiglu(benchmark, bench, pd, request, impl):
    rng = np.random.default_rng(0)
    g = rng.standard_normal((T, F), dtype=np.float32)
    u = rng.standard_normal((T, F), dtype=np.float32)
    count = stream_count(2 * g.nbytes)
    labels = {"anychip": "anychip ops.swiglu", "paddle_swiglu": "paddle F.swiglu",
              "paddle_composed": "paddle F.silu(g) * u", "torch_composed": "torch F.silu(g) * u"}
    if impl == "torch_composed":
        torch = request.getfixturevalue("torch")
        sets = Cycle([(torch.from_numpy(g.copy()), torch.from_numpy(u.copy())) for _ in range(count)])

        def fn():
            gg, uu = sets()
            return torch.nn.functional.silu(gg) * uu

        with torch.no_grad():
            bench.run(benchmark, SWIGLU, impl, fn, label=labels[impl])
        return
    sets = Cycle([(host_tensor(g), host_tensor(u)) for _ in range(count)])
    op = {"anychip": ops.swiglu, "paddle_swiglu": pd.nn.functional.swiglu,
          "paddle_composed": lambda a, b: pd.nn.functional.silu(a) * b}[impl]

    def fn():
        gg, uu = sets()
        return op(gg, uu)

    with pd.no_grad():
        bench.run(benchmark, SWIGLU, impl, fn, label=labels[impl])


def _adam_arrays(rng, shape):
    p = rng.standard_normal(shape, dtype=np.float32) * 0.02
    g = rng.standard_normal(shape, dtype=np.float32) * 1e-3
    return p, g


@pytest.mark.parametrize("impl", ["anychip", "torch_fused", "torch_foreach", "paddle"])
def test_adamw(benchmark, bench, pd, request, impl):
    rng = np.random.default_rng(0)
    arrays = [_adam_arrays(rng, s) for s in SHAPES]
    step = {"t": 0}
    if impl == "anychip":
        params = [host_tensor(p) for p, _ in arrays]
        grads = [host_tensor(g) for _, g in arrays]
        m1 = [host_tensor(np.zeros_like(p)) for p, _ in arrays]
        m2 = [host_tensor(np.zeros_like(p)) for p, _ in arrays]

        def fn():
            step["t"] += 1
            ops.adamw_step(params, grads, m1, m2, lr=1e-3, weight_decay=0.01, step=step["t"])

        bench.run(benchmark, ADAMW, impl, fn, label="anychip ops.adamw_step (one launch)", min_rounds=5,
                  warmup=1)
        return
    if impl == "paddle":
        params = []
        for p, _ in arrays:
            t = pd.create_parameter(list(p.shape), "float32")
            t.set_value(p)
            params.append(t)
        # grads = g through one backward of sum(p * g)
        loss = sum((p * host_tensor(g)).sum() for p, (_, g) in zip(params, arrays))
        loss.backward()
        del loss
        opt = pd.optimizer.AdamW(learning_rate=1e-3, parameters=params, weight_decay=0.01)
        bench.run(benchmark, ADAMW, impl, opt.step, label="paddle optimizer.AdamW.step", min_rounds=3, warmup=1)
        return
    torch = request.getfixturevalue("torch")
    params = []
    for p, g in arrays:
        t = torch.nn.Parameter(torch.from_numpy(p))
        t.grad = torch.from_numpy(g)
        params.append(t)
    kw = {"fused": True} if impl == "torch_fused" else {"foreach": True}
    opt = torch.optim.AdamW(params, lr=1e-3, weight_decay=0.01, **kw)
    bench.run(benchmark, ADAMW, impl, opt.step, label=f"torch optim.AdamW({next(iter(kw))}=True)",
              min_rounds=3, warmup=1)
