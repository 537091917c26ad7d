"""anychip.ops against their Paddle references, forward and backward, on the host CPU and on a
simulated chip; random shapes (hypothesis) including odd sizes.

Inputs are drawn in float32, rounded to the dtype under test, and the reference runs on the CPU
in float32 from the same rounded values, so only the kernel's own error is measured.
"""

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from anychip.ops import support
from ops_helpers import host, paddle, tensor

paddle()  # through anychip, so its devices are registered with Paddle

import anychip.ops as ops  # noqa: E402
from anychip.ops.attention import _Attention  # noqa: E402
from anychip.ops.quant import _W8A8, _WeightOnly, quantize_numpy  # noqa: E402
from anychip.ops.swiglu import _Swiglu  # noqa: E402

DEVICES = ["cpu", "npu"]
FLOATS = ["float32", "bfloat16", "float16"]
SETTINGS = settings(max_examples=8, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])


def rounded(array: np.ndarray, dtype: str) -> np.ndarray:
    """``array`` as float32 after a round trip through ``dtype``."""
    return host(tensor(array.astype(np.float32), "cpu", dtype)).astype(np.float32)


def tol(op: str, dtype: str, scale: float = 1.0):
    rtol, atol = support.OPS[op].tolerance[dtype]
    return dict(rtol=rtol * scale, atol=atol * scale)


def run_with_grads(fn, arrays, device, dtype, grad_names, seeds):
    """Calls ``fn(**tensors)`` on ``device``; returns (outputs, {name: grad}) with the grads of
    sum(output_i * seed_i)."""
    pd = paddle()
    tensors = {}
    for name, a in arrays.items():
        kind = dtype if a.dtype.kind == "f" else None
        tensors[name] = tensor(a, device, kind, grad=name in grad_names)
    outs = fn(**tensors)
    outs = outs if isinstance(outs, (tuple, list)) else (outs,)
    grads = {}
    if grad_names:
        seeded = [o for o, s in zip(outs, seeds) if s is not None]
        seed_tensors = [tensor(s, device, dtype) for s in seeds if s is not None]
        found = pd.grad(seeded, [tensors[n] for n in grad_names], seed_tensors, allow_unused=True)
        grads = dict(zip(grad_names, found))
    return [host(o) for o in outs], {n: host(g) for n, g in grads.items()}


def compare(fn, ref, arrays, device, dtype, grad_names, seeds, op, scale=1.0):
    rounded_arrays = {n: rounded(a, dtype) if a.dtype.kind == "f" else a for n, a in arrays.items()}
    got, got_grads = run_with_grads(fn, rounded_arrays, device, dtype, grad_names, seeds)
    want, want_grads = run_with_grads(ref, rounded_arrays, "cpu", "float32", grad_names,
                                      [None if s is None else rounded(s, dtype) for s in seeds])
    for i, (g, w) in enumerate(zip(got, want)):
        np.testing.assert_allclose(g, w, **tol(op, dtype, scale), err_msg=f"{op} output {i} on {device}/{dtype}")
    for n in grad_names:
        np.testing.assert_allclose(got_grads[n], want_grads[n], **tol(op, dtype, 4 * scale),
                                   err_msg=f"{op} grad of {n} on {device}/{dtype}")


def no_fallbacks(op):
    import anychip

    return {k: v for k, v in anychip.fallback_counts().items() if k[1] in (f"anychip.{op}", f"anychip.{op}_grad")}


@pytest.fixture(autouse=True)
def _reset():
    import anychip

    paddle()
    anychip.reset_fallbacks()
    yield


# ---- rms_norm -------------------------------------------------------------------------------


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", FLOATS)
@SETTINGS
@given(rows=st.integers(1, 9), cols=st.integers(1, 300), residual=st.booleans(), seed=st.integers(0, 99))
def test_rms_norm(device, dtype, rows, cols, residual, seed):
    rng = np.random.default_rng(seed)
    arrays = {"x": rng.standard_normal((rows, cols)), "weight": rng.uniform(0.5, 1.5, cols)}
    seeds = [rng.standard_normal((rows, cols))]
    if residual:
        arrays["residual"] = rng.standard_normal((rows, cols))
        seeds.append(rng.standard_normal((rows, cols)))
    impl = ops.norm._RmsNorm(1e-5, ("cpu", 0), residual)
    compare(lambda **t: ops.rms_norm(eps=1e-5, **t), lambda **t: impl.reference(**t), arrays, device, dtype,
            list(arrays), seeds, "rms_norm")
    assert not no_fallbacks("rms_norm")


# ---- rotary_embedding -----------------------------------------------------------------------


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", FLOATS)
@SETTINGS
@given(b=st.integers(1, 2), s=st.integers(1, 17), hk=st.integers(1, 3), group=st.integers(1, 3),
       half=st.integers(1, 40), seed=st.integers(0, 99))
def test_rotary_embedding(device, dtype, b, s, hk, group, half, seed):
    rng = np.random.default_rng(seed)
    d = 2 * half
    arrays = {"q": rng.standard_normal((b, s, hk * group, d)), "k": rng.standard_normal((b, s, hk, d)),
              # packed sequences restart at 0
              "positions": np.concatenate([np.arange(s // 2), np.arange(s - s // 2)])[None].repeat(b, 0).astype(np.int64)}
    seeds = [rng.standard_normal((b, s, hk * group, d)), rng.standard_normal((b, s, hk, d))]
    impl = ops.rotary._Rotary(10000.0, ("cpu", 0))
    compare(lambda **t: ops.rotary_embedding(theta=10000.0, **t), lambda **t: impl.reference(**t),
            arrays, device, dtype, ["q", "k"], seeds, "rotary_embedding")
    assert not no_fallbacks("rotary_embedding")


def test_rotary_embedding_large_positions():
    """Llama-sized positions: the angle must be computed like the reference (float32)."""
    rng = np.random.default_rng(0)
    q, k = rng.standard_normal((1, 64, 2, 64)), rng.standard_normal((1, 64, 1, 64))
    positions = np.arange(8000, 8064, dtype=np.int64)[None]
    impl = ops.rotary._Rotary(100000.0, ("cpu", 0))
    got = ops.rotary_embedding(tensor(q, "cpu", "float32"), tensor(k, "cpu", "float32"),
                               tensor(positions, "cpu"), theta=100000.0)
    want = impl.reference(tensor(q, "cpu", "float32"), tensor(k, "cpu", "float32"), tensor(positions, "cpu"))
    for g, w in zip(got, want):
        np.testing.assert_allclose(host(g), host(w), rtol=1e-3, atol=1e-3)


# ---- swiglu ---------------------------------------------------------------------------------


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", FLOATS)
@SETTINGS
@given(rows=st.integers(1, 7), cols=st.integers(1, 333), seed=st.integers(0, 99))
def test_swiglu(device, dtype, rows, cols, seed):
    rng = np.random.default_rng(seed)
    arrays = {"gate": rng.standard_normal((rows, cols)) * 3, "up": rng.standard_normal((rows, cols))}
    impl = _Swiglu(("cpu", 0))
    compare(lambda **t: ops.swiglu(**t), lambda **t: impl.reference(**t), arrays, device, dtype,
            ["gate", "up"], [rng.standard_normal((rows, cols))], "swiglu")
    assert not no_fallbacks("swiglu")


def test_swiglu_packed_halves_match_two_inputs():
    rng = np.random.default_rng(1)
    x = tensor(rng.standard_normal((3, 10)), "cpu", "float32")
    gate, up = paddle().split(x, 2, axis=-1)
    np.testing.assert_array_equal(host(ops.swiglu(x)), host(ops.swiglu(gate.contiguous(), up.contiguous())))


# ---- attention ------------------------------------------------------------------------------


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", FLOATS)
@SETTINGS
@given(b=st.integers(1, 2), sq=st.integers(1, 70), extra_k=st.integers(0, 40), hk=st.integers(1, 2),
       group=st.integers(1, 3), d=st.sampled_from([8, 17, 64]), causal=st.booleans(), masked=st.booleans(),
       seed=st.integers(0, 99))
def test_attention(device, dtype, b, sq, extra_k, hk, group, d, causal, masked, seed):
    rng = np.random.default_rng(seed)
    sk, hq = sq + extra_k, hk * group
    arrays = {"q": rng.standard_normal((b, sq, hq, d)), "k": rng.standard_normal((b, sk, hk, d)),
              "v": rng.standard_normal((b, sk, hk, d))}
    if masked:
        arrays["mask"] = rng.random((b, 1, sq, sk)) < 0.7
    impl = _Attention("attention", 0.3, causal, ("cpu", 0), masked)
    compare(lambda **t: ops.attention(causal=causal, scale=0.3, return_lse=True, **t),
            lambda **t: impl.reference(**t), arrays, device, dtype, ["q", "k", "v"],
            [rng.standard_normal((b, sq, hq, d)), None], "attention")
    assert not no_fallbacks("attention")


def test_attention_rows_that_see_nothing_are_zero():
    q = tensor(np.ones((1, 2, 1, 4)), "cpu", "float32")
    kv = tensor(np.ones((1, 3, 1, 4)), "cpu", "float32")
    mask = tensor(np.array([[[[False, False, False], [True, False, True]]]]), "cpu")
    o, lse = ops.attention(q, kv, kv, mask=mask, return_lse=True)
    assert np.all(host(o)[0, 0] == 0) and host(lse)[0, 0, 0] == -np.inf
    assert np.allclose(host(o)[0, 1], 1.0)


MASKS = {  # family -> (startend builder over seq, causal)
    "causal": (lambda s: ops.masks.causal(s), True),
    "sliding_window": (lambda s: ops.masks.sliding_window(s, 7), True),
    "causal_document": (lambda s: ops.masks.causal_document([s // 3, s // 3, s - 2 * (s // 3)]), True),
    "prefix_lm": (lambda s: ops.masks.prefix_lm([s // 2, s - s // 2], [3, 5]), False),
    "share_question": (lambda s: ops.masks.share_question(s // 4, [s // 4, s // 4, s - 3 * (s // 4)]), True),
}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("family", sorted(MASKS))
def test_flashmask_equals_dense_masked_attention_bit_for_bit(device, dtype, family):
    rng = np.random.default_rng(7)
    seq, hq, hk, d = 150, 4, 2, 32
    build, causal = MASKS[family]
    startend = build(seq)
    dense = ops.flashmask_dense_mask(startend, seq, hq, causal)
    q, k, v = (tensor(rng.standard_normal((1, seq, h, d)), device, dtype, grad=True) for h in (hq, hk, hk))
    seed = tensor(rng.standard_normal((1, seq, hq, d)), device, dtype)
    o1, lse1 = ops.flashmask_attention(q, k, v, tensor(startend, device), causal=causal, return_lse=True)
    g1 = paddle().grad([o1], [q, k, v], [seed])
    o2, lse2 = ops.attention(q, k, v, causal=causal, mask=tensor(dense, device), return_lse=True)
    g2 = paddle().grad([o2], [q, k, v], [seed])
    np.testing.assert_array_equal(host(o1), host(o2))
    np.testing.assert_array_equal(host(lse1), host(lse2))
    for a, b_ in zip(g1, g2):
        np.testing.assert_array_equal(host(a), host(b_))
    # and both agree with the plain reference
    want = ops.reference_attention(*(tensor(host(t), "cpu", "float32") for t in (q, k, v)), 1 / np.sqrt(d), causal,
                                   tensor(dense, "cpu"))
    np.testing.assert_allclose(host(o1), host(want[0]), **tol("flashmask_attention", dtype))
    assert not no_fallbacks("flashmask_attention") and not no_fallbacks("attention")


def test_flashmask_heads_and_four_column_masks():
    """Per-kv-head masks (Hm = Hk) and the 4-column [LTS, LTE, UTS, UTE] form (not causal)."""
    rng = np.random.default_rng(3)
    seq, hq, hk, d = 40, 4, 2, 16
    lts = rng.integers(0, seq + 1, (1, hk, seq))
    lte = np.minimum(lts + rng.integers(0, seq, (1, hk, seq)), seq)
    uts = rng.integers(0, seq + 1, (1, hk, seq))
    ute = np.minimum(uts + rng.integers(0, 5, (1, hk, seq)), seq)
    startend = np.stack([lts, lte, uts, ute], -1).astype(np.int32)
    q, k, v = (tensor(rng.standard_normal((1, seq, h, d)), "cpu", "float32") for h in (hq, hk, hk))
    got = ops.flashmask_attention(q, k, v, tensor(startend, "cpu"), causal=False)
    dense = ops.flashmask_dense_mask(startend, seq, hq, False)
    want = ops.reference_attention(q, k, v, 1 / np.sqrt(d), False, tensor(dense, "cpu"))[0]
    np.testing.assert_allclose(host(got), host(want), **tol("flashmask_attention", "float32"))


# ---- quantized linear -----------------------------------------------------------------------


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("bits,group_size", [(8, -1), (8, 64), (4, -1), (4, 64), (4, 128)])
def test_weight_quantize_matches_numpy(device, bits, group_size):
    rng = np.random.default_rng(bits + group_size)
    w = rng.standard_normal((256, 37)).astype(np.float32)
    qweight, scales = ops.weight_quantize(tensor(w, device), bits=bits, group_size=group_size)
    want_q, want_s = quantize_numpy(w, bits, group_size)
    np.testing.assert_allclose(host(scales), want_s, rtol=1e-6)
    got_q = host(qweight)
    # a value within float error of a .5 boundary may round either way
    assert (got_q != want_q).mean() < 1e-3
    assert qweight.dtype == paddle().int8 if bits == 8 else qweight.dtype == paddle().uint8


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", FLOATS)
@SETTINGS
@given(m=st.integers(1, 9), n=st.integers(1, 70), k_blocks=st.integers(1, 4), bits=st.sampled_from([4, 8]),
       group_size=st.sampled_from([-1, 64]), bias=st.booleans(), seed=st.integers(0, 99))
def test_weight_only_linear(device, dtype, m, n, k_blocks, bits, group_size, bias, seed):
    rng = np.random.default_rng(seed)
    k = 64 * k_blocks
    qweight, scales = quantize_numpy(rng.standard_normal((k, n)) * 0.1, bits, group_size)
    arrays = {"x": rng.standard_normal((m, k)), "qweight": qweight, "scales": scales}
    if bias:
        arrays["bias"] = rng.standard_normal(n)
    impl = _WeightOnly(bits, group_size, ("cpu", 0), bias)

    def call(scales, **t):
        return ops.weight_only_linear(scales=scales, bits=bits, group_size=group_size, **t)

    def ref(scales, **t):
        return impl.reference(scales=scales, **t)

    # scales stay float32 whatever x's dtype
    arrays["scales"] = arrays["scales"].astype(np.float32)
    _compare_keep_f32(call, ref, arrays, device, dtype, ["x"] + (["bias"] if bias else []),
                      [rng.standard_normal((m, n))], "weight_only_linear", keep=("scales",))
    assert not no_fallbacks("weight_only_linear")


def _compare_keep_f32(fn, ref, arrays, device, dtype, grad_names, seeds, op, keep):
    """compare() with some float inputs kept float32 (quantization scales)."""
    kept = {n: arrays.pop(n) for n in keep}

    def with_kept(f, dev):
        return lambda **t: f(**{n: tensor(a, dev) for n, a in kept.items()}, **t)

    rounded_arrays = {n: rounded(a, dtype) if a.dtype.kind == "f" else a for n, a in arrays.items()}
    got, got_grads = run_with_grads(with_kept(fn, device), rounded_arrays, device, dtype, grad_names, seeds)
    want, want_grads = run_with_grads(with_kept(ref, "cpu"), rounded_arrays, "cpu", "float32", grad_names,
                                      [rounded(s, dtype) for s in seeds])
    np.testing.assert_allclose(got[0], want[0], **tol(op, dtype), err_msg=f"{op} on {device}/{dtype}")
    for n in grad_names:
        np.testing.assert_allclose(got_grads[n], want_grads[n], **tol(op, dtype, 4), err_msg=f"grad {n}")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", FLOATS)
@SETTINGS
@given(m=st.integers(1, 9), n=st.integers(1, 50), k=st.integers(1, 200), bias=st.booleans(), seed=st.integers(0, 99))
def test_w8a8_linear(device, dtype, m, n, k, bias, seed):
    rng = np.random.default_rng(seed)
    qweight, scales = quantize_numpy(rng.standard_normal((k, n)) * 0.1, 8, -1)
    arrays = {"x": rng.standard_normal((m, k)), "qweight": qweight, "scales": scales.astype(np.float32)}
    if bias:
        arrays["bias"] = rng.standard_normal(n)
    impl = _W8A8(("cpu", 0))
    _compare_keep_f32(lambda scales, **t: ops.w8a8_linear(scales=scales, **t),
                      lambda scales, **t: impl.reference(scales=scales, **t), arrays, device, dtype, [], [],
                      "w8a8_linear", keep=("scales",))
    assert not no_fallbacks("w8a8_linear")


# ---- adamw_step -----------------------------------------------------------------------------


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_adamw_step_matches_reference(device, dtype):
    rng = np.random.default_rng(0)
    shapes = [(1,), (33, 7), (1000,)]
    start = [rng.standard_normal(s) for s in shapes]
    grads = [rng.standard_normal(s) for s in shapes]
    results = {}
    for mode in ("kernel", "reference"):
        dev = device if mode == "kernel" else "cpu"
        params = [tensor(rounded(p, dtype), dev, dtype) for p in start]
        gs = [tensor(rounded(g, dtype), dev, dtype) for g in grads]
        m1 = [tensor(np.zeros(s, np.float32), dev) for s in shapes]
        m2 = [tensor(np.zeros(s, np.float32), dev) for s in shapes]
        for step in (1, 2, 3):
            kw = dict(lr=1e-2, beta1=0.9, beta2=0.99, eps=1e-8, weight_decay=0.1, step=step)
            if mode == "kernel":
                ops.adamw_step(params, gs, m1, m2, **kw)
            else:
                ops.optim._reference(params, gs, m1, m2, **{k: v for k, v in kw.items()})
        results[mode] = [host(p) for p in params] + [host(m) for m in m1 + m2]
    for got, want in zip(results["kernel"], results["reference"]):
        np.testing.assert_allclose(got, want, **tol("adamw_step", dtype))
    assert not no_fallbacks("adamw_step")


@pytest.mark.parametrize("device", DEVICES)
def test_frozen_inputs_get_no_gradient(device):
    """A frozen weight (LoRA-style) and a frozen key/value cache."""
    rng = np.random.default_rng(5)
    x = tensor(rng.standard_normal((4, 16)), device, "float32", grad=True)
    w = tensor(rng.uniform(0.5, 1.5, 16), device, "float32")  # stop_gradient: frozen
    ops.rms_norm(x, w).sum().backward()
    assert x.grad is not None and w.grad is None
    q = tensor(rng.standard_normal((1, 8, 2, 16)), device, "float32", grad=True)
    k = tensor(rng.standard_normal((1, 8, 1, 16)), device, "float32")
    ops.attention(q, k, k, causal=True).sum().backward()
    assert list(q.grad.shape) == [1, 8, 2, 16] and k.grad is None


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", FLOATS)
@SETTINGS
@given(m=st.integers(1, 20), n=st.integers(1, 70), k_blocks=st.integers(1, 4), bits=st.sampled_from([4, 8]),
       group_size=st.sampled_from([-1, 32, 64]), bias=st.booleans(), seed=st.integers(0, 99))
def test_weight_only_linear_with_offsets(device, dtype, m, n, k_blocks, bits, group_size, bias, seed):
    """Asymmetric groups, W = q * scale + offset (GGUF's Q4_1 as loaded: offset = min + 8 * scale),
    forward and the grads wrt x and bias."""
    rng = np.random.default_rng(seed)
    k = 64 * k_blocks
    qweight, scales = quantize_numpy(rng.standard_normal((k, n)) * 0.1, bits, group_size)
    offsets = (rng.uniform(-0.1, 0.05, scales.shape) + 8 * scales).astype(np.float32)
    arrays = {"x": rng.standard_normal((m, k)), "qweight": qweight, "scales": scales, "offsets": offsets}
    if bias:
        arrays["bias"] = rng.standard_normal(n)
    impl = _WeightOnly(bits, group_size, ("cpu", 0), bias, has_offsets=True)

    def call(scales, offsets, **t):
        return ops.weight_only_linear(scales=scales, offsets=offsets, bits=bits, group_size=group_size, **t)

    def ref(scales, offsets, **t):
        return impl.reference(scales=scales, offsets=offsets, **t)

    _compare_keep_f32(call, ref, arrays, device, dtype, ["x"] + (["bias"] if bias else []),
                      [rng.standard_normal((m, n))], "weight_only_linear", keep=("scales", "offsets"))
    assert not no_fallbacks("weight_only_linear")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", FLOATS)
@SETTINGS
@given(m=st.integers(1, 12), n=st.integers(1, 70), k_blocks=st.integers(1, 6), bits=st.sampled_from([4, 8]),
       group_size=st.sampled_from([-1, 32, 64, 128]), offsets=st.booleans(), bias=st.booleans(),
       seed=st.integers(0, 99))
def test_weight_only_linear_x_int8(device, dtype, m, n, k_blocks, bits, group_size, offsets, bias, seed):
    """x quantized to int8 per run (forward only), against the reference's float64 math."""
    rng = np.random.default_rng(seed)
    k = (64 if bits == 4 else 32) * k_blocks
    if group_size != -1 and k % group_size:
        group_size = 32
    qweight, scales = quantize_numpy(rng.standard_normal((k, n)) * 0.1, bits, group_size)
    arrays = {"x": rng.standard_normal((m, k)), "qweight": qweight, "scales": scales}
    keep = ["scales"]
    if offsets:
        arrays["offsets"] = (rng.uniform(-0.1, 0.05, scales.shape) + 8 * scales).astype(np.float32)
        keep.append("offsets")
    if bias:
        arrays["bias"] = rng.standard_normal(n)
    impl = _WeightOnly(bits, group_size, ("cpu", 0), bias, offsets, x_int8=True)

    def call(**t):
        y = ops.weight_only_linear(bits=bits, group_size=group_size, x_int8=True, **t)
        assert y.stop_gradient
        return y

    _compare_keep_f32(call, lambda **t: impl.reference(**t), arrays, device, dtype, [], [], "weight_only_linear",
                      keep=tuple(keep))
    assert not no_fallbacks("weight_only_linear")


@pytest.mark.parametrize("device", DEVICES)
def test_weight_only_linear_x_int8_is_inference_only(device):
    from anychip.ops import OpArgumentError

    rng = np.random.default_rng(0)
    qweight, scales = (tensor(a, device) for a in quantize_numpy(rng.standard_normal((96, 8)), 8, 32))
    x = tensor(rng.standard_normal((2, 96)), device, "float32", grad=True)
    with pytest.raises(OpArgumentError, match="x_int8 is inference-only"):
        ops.weight_only_linear(x, qweight, scales, bits=8, group_size=32, x_int8=True)
    with paddle().no_grad():
        assert ops.weight_only_linear(x, qweight, scales, bits=8, group_size=32, x_int8=True).shape == [2, 8]
    x = tensor(rng.standard_normal((2, 80)), device, "float32")
    qweight, scales = (tensor(a, device) for a in quantize_numpy(rng.standard_normal((80, 8)), 8, -1))
    with pytest.raises(OpArgumentError, match="K and group_size must be multiples of 32"):
        ops.weight_only_linear(x, qweight, scales, bits=8, x_int8=True)
    qweight, scales = (tensor(a, device) for a in quantize_numpy(rng.standard_normal((80, 8)), 8, 16))
    with pytest.raises(OpArgumentError, match="got K=80, group_size=16"):
        ops.weight_only_linear(x, qweight, scales, bits=8, group_size=16, x_int8=True)


@pytest.mark.parametrize("device", DEVICES)
def test_weight_only_linear_bf16_compute(device):
    """compute_dtype 'bfloat16' on float32 x: the sums of the bfloat16 call on x rounded, before
    that call rounds y (the bf16 call's y is this y rounded, bit for bit); inference only."""
    from anychip.ops import OpArgumentError

    rng = np.random.default_rng(7)
    qweight, scales = (tensor(a, device) for a in quantize_numpy(rng.standard_normal((576, 40)) * 0.1, 4, 32))
    offsets = tensor(rng.uniform(-0.1, 0.05, (40, 18)), device, "float32")
    x = tensor(rng.standard_normal((5, 576)), device, "float32")
    bias = tensor(rng.standard_normal(40), device, "bfloat16").astype("float32")
    args = dict(bits=4, group_size=32, offsets=offsets)
    y = ops.weight_only_linear(x, qweight, scales, bias, compute_dtype="bfloat16", **args)
    assert str(y.dtype).endswith("float32") and y.stop_gradient
    y_bf16 = ops.weight_only_linear(x.astype("bfloat16"), qweight, scales, bias.astype("bfloat16"), **args)
    np.testing.assert_array_equal(host(y.astype("bfloat16")), host(y_bf16))
    exact = host(ops.weight_only_linear(x, qweight, scales, bias, **args))
    np.testing.assert_allclose(host(y), exact, rtol=0, atol=1e-2 * np.abs(exact).max())
    with pytest.raises(OpArgumentError, match="compute_dtype must be None or 'bfloat16'"):
        ops.weight_only_linear(x, qweight, scales, compute_dtype="float16", **args)
    with pytest.raises(OpArgumentError, match="x_int8 and compute_dtype 'bfloat16' exclude each other"):
        ops.weight_only_linear(x, qweight, scales, x_int8=True, compute_dtype="bfloat16", **args)
    x.stop_gradient = False
    with pytest.raises(OpArgumentError, match="compute_dtype 'bfloat16' is inference-only"):
        ops.weight_only_linear(x, qweight, scales, compute_dtype="bfloat16", **args)


@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("x_int8", [False, True])
@pytest.mark.parametrize("group_size", [64, 128])
def test_weight_only_linear_rows_do_not_depend_on_the_batch(bits, x_int8, group_size):
    """Decode-sized products give each row of x the bits it gets alone, whatever the batch
    (K = 1536 spans several of the kernels' k chunks): continuous batching relies on it. Groups
    of 128 take the 4-bit x_int8 kernel's one-scale-per-chunk path, groups of 64 the other.
    x_int8 from 4 rows (gemm_int8x, the serving batches' kernel) sums in another float order
    than below: there a row gets the same bits in any batch of 4 or more."""
    rng = np.random.default_rng(bits)
    k, n = 1536, 48
    qweight, scales = ops.weight_quantize(tensor(rng.standard_normal((k, n)), "cpu", "float32"), bits, group_size)
    x = rng.standard_normal((16, k)).astype(np.float32)

    def run(rows):
        return host(ops.weight_only_linear(tensor(rows, "cpu"), qweight, scales, bits=bits, group_size=group_size,
                                           x_int8=x_int8))

    alone = np.concatenate([run(x[i:i + 1]) for i in range(8)])
    for m in (2, 3) if x_int8 else (2, 5, 8):
        np.testing.assert_array_equal(run(x[:m]), alone[:m])
    if x_int8:
        batched = run(x)
        np.testing.assert_allclose(batched[:8], alone, rtol=1e-5, atol=1e-5)
        for m in (4, 5, 9):
            np.testing.assert_array_equal(run(x[:m]), batched[:m])
            np.testing.assert_array_equal(run(x[16 - m:]), batched[16 - m:])
