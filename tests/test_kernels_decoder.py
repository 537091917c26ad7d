"""The decoder_step kernel and op against a float64 numpy decoder written here.

A tiny random model (two layers, grouped-query heads) steps three sequences at different
positions over caches pre-filled with random history (float32, or bfloat16 / float16, whose
written slots the oracle rounds as the kernel must). Weights are float32 or quantized with
random codes, scales and offsets, or bfloat16, whose exact float64 values the oracle uses, so
only the kernel's float32 arithmetic is measured (a bfloat16 LIN also rounds its input to
bfloat16, as the oracle does). The caches must change in exactly the written slots.
The ISA paths and thread counts run in subprocesses.
"""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

from anychip.kernels import NativeKernel
from anychip_plugins.host import LIBRARY
from isa_paths import isa_params

CFG = dict(L=2, C=128, Hq=4, Hk=2, D=32, F=192, V=100, S=16, eps=1e-5, theta=10000.0)
POSITIONS = (3, 0, 15)
KINDS = ("qkv", "o", "gate_up", "down", "head")
# (bits, group_size, offsets) of every LIN
FORMATS = {
    "f32": (0, -1, False),
    "int8-g32": (8, 32, False),
    "int8-channel": (8, -1, False),
    "int4-g32-offsets": (4, 32, True),
    "int4-g64": (4, 64, False),
    "bf16": (16, -1, False),
}


def kernel() -> NativeKernel:
    return NativeKernel(str(LIBRARY), "anychip_cpu_decoder_step")


# ---- a random model ----------------------------------------------------------------------------

def pack4(q: np.ndarray) -> np.ndarray:
    """kernel.h's 4-bit layout: per 64 k a 32-byte block, byte i = (q[i] + 8) | (q[32 + i] + 8) << 4."""
    n, k = q.shape
    u = (q + 8).astype(np.uint8).reshape(n, k // 64, 2, 32)
    return (u[:, :, 0, :] | (u[:, :, 1, :] << 4)).reshape(n, k // 2)


def to_bf16_bits(a: np.ndarray) -> np.ndarray:
    """float32 -> bfloat16 bits, round to nearest even."""
    u = np.ascontiguousarray(a, dtype=np.float32).view(np.uint32).astype(np.uint64)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def bf16_values(bits: np.ndarray) -> np.ndarray:
    return (bits.astype(np.uint32) << 16).view(np.float32).astype(np.float64)


def make_lin(rng, n: int, k: int, fmt) -> dict:
    """A LIN W[n, k]: its kernel inputs ('arrays', bfloat16 as uint16 bits) and exact values ('w',
    float64; 'sym' without the offsets)."""
    bits, group_size, offsets = fmt
    if bits in (0, 16):
        w = (rng.standard_normal((n, k)) / np.sqrt(k)).astype(np.float32)
        if bits == 16:
            w = to_bf16_bits(w)
            return dict(arrays=[w], w=bf16_values(w), fmt=fmt)
        return dict(arrays=[w], w=w.astype(np.float64), fmt=fmt)
    qmax = 127 if bits == 8 else 8
    q = rng.integers(-qmax, qmax if bits == 4 else qmax + 1, (n, k))
    groups = 1 if group_size == -1 else k // group_size
    scales = (rng.uniform(0.5, 1.5, (n, groups)) / (qmax * np.sqrt(k / 3))).astype(np.float32)
    sym = q * np.repeat(scales.astype(np.float64), k // groups, axis=1)
    arrays, w = [q.astype(np.int8) if bits == 8 else pack4(q), scales], sym
    if offsets:
        off = (rng.standard_normal((n, groups)) * 0.3 / np.sqrt(k)).astype(np.float32)
        w = sym + np.repeat(off.astype(np.float64), k // groups, axis=1)
        arrays.append(off)
    return dict(arrays=arrays, w=w, sym=sym, fmt=fmt)


def make_model(seed: int, formats: dict, bias: bool, cfg=CFG) -> dict:
    rng = np.random.default_rng(seed)
    c, d, f = cfg["C"], cfg["D"], cfg["F"]
    nqkv = (cfg["Hq"] + 2 * cfg["Hk"]) * d

    def norm():
        return rng.uniform(0.5, 1.5, c).astype(np.float32)

    layers = [dict(attn_norm=norm(), qkv=make_lin(rng, nqkv, c, formats["qkv"]),
                   qkv_bias=(rng.standard_normal(nqkv) * 0.5).astype(np.float32) if bias else None,
                   o=make_lin(rng, c, cfg["Hq"] * d, formats["o"]), ffn_norm=norm(),
                   gate_up=make_lin(rng, 2 * f, c, formats["gate_up"]), down=make_lin(rng, c, f, formats["down"]))
              for _ in range(cfg["L"])]
    return dict(cfg=cfg, layers=layers, final_norm=norm(), head=make_lin(rng, cfg["V"], c, formats["head"]),
                formats=formats, bias=bias)


def kernel_inputs(model) -> tuple[list, list]:
    """The weights in kernel.h's input order, and the attrs (with ``panels``, the quantized
    LINs' panel forms after their arrays)."""
    from anychip.ops.decoder import panel_array

    cfg, arrays = model["cfg"], []

    def lin(spec):
        if not (model.get("panels") and spec["fmt"][0] in (4, 8)):
            return spec["arrays"]
        return spec["arrays"] + [panel_array(*spec["arrays"])]

    for layer in model["layers"]:
        arrays.append(layer["attn_norm"])
        arrays += lin(layer["qkv"])
        if layer["qkv_bias"] is not None:
            arrays.append(layer["qkv_bias"])
        arrays += lin(layer["o"]) + [layer["ffn_norm"]] + lin(layer["gate_up"]) + lin(layer["down"])
    arrays += [model["final_norm"]] + lin(model["head"])
    attrs = [cfg["L"], cfg["Hq"], cfg["Hk"], cfg["D"], cfg["F"], cfg["eps"], cfg["theta"], float(model["bias"])]
    for kind in KINDS:
        attrs += [float(v) for v in model["formats"][kind]]
    if model.get("x_int8"):
        attrs.append(1.0)
    if model.get("panels"):
        attrs += [0.0, 0.0, 0.0, 1.0]  # has_cache_rows, part, layer, then panels
    return arrays, attrs


def make_state(seed: int, positions=POSITIONS, cfg=CFG, kv: str = "float32"):
    """x [B, C] and caches [L, B, S, Hk, D] of dtype ``kv`` holding random history (bfloat16 as
    uint16 bits)."""
    rng = np.random.default_rng(seed + 1)
    b = len(positions)
    x = rng.standard_normal((b, cfg["C"])).astype(np.float32)
    shape = (cfg["L"], b, cfg["S"], cfg["Hk"], cfg["D"])
    caches = [kv_store(rng.standard_normal(shape), kv) for _ in range(2)]
    return (x, np.array(positions, np.int64), *caches)


def kv_dtype(cache: np.ndarray) -> str:
    return {np.dtype(np.uint16): "bfloat16", np.dtype(np.float16): "float16"}.get(cache.dtype, "float32")


def kv_store(a: np.ndarray, kv: str) -> np.ndarray:
    """float64 ``a`` as a cache of dtype ``kv`` holds it: through float32, then rounded to nearest
    even (bfloat16 as uint16 bits)."""
    a = a.astype(np.float32)
    return to_bf16_bits(a) if kv == "bfloat16" else a.astype(np.float16) if kv == "float16" else a


def kv_values(cache: np.ndarray) -> np.ndarray:
    return bf16_values(cache) if cache.dtype == np.uint16 else cache.astype(np.float64)


# ---- the oracle --------------------------------------------------------------------------------

def rms_norm(h, w, eps):
    return h / np.sqrt((h * h).mean(axis=-1, keepdims=True) + eps) * w


def rope(x, positions, theta):
    """x [B, H, D] rotated by each sequence's position (half-rotation layout)."""
    half = x.shape[-1] // 2
    angle = positions[:, None].astype(np.float64) * theta ** (-np.arange(half) * 2.0 / x.shape[-1])
    cos, sin = np.cos(angle)[:, None, :], np.sin(angle)[:, None, :]
    a, b = x[..., :half], x[..., half:]
    return np.concatenate([a * cos - b * sin, b * cos + a * sin], axis=-1)


def round_half_away(v):
    return np.sign(v) * np.floor(np.abs(v) + 0.5)


def x_run(bits, k, group_size):
    """kernel.h's x_int8 run: 32 for 8-bit W, for 4-bit W the largest of 128, 64, 32 dividing the
    group (K for group_size -1)."""
    group = k if group_size == -1 else group_size
    return 32 if bits == 8 else next(r for r in (128, 64, 32) if group % r == 0)


def int8_runs(a, run):
    """a [B, K] as x_int8 quantizes it per run of ``run``: xq * sx (float64)."""
    runs = a.reshape(len(a), -1, run)
    sx = np.abs(runs).max(axis=-1, keepdims=True) / 127
    return (np.clip(round_half_away(runs / np.where(sx > 0, sx, 1)), -127, 127) * sx).reshape(a.shape)


def product(model, a, lin):
    """a W^T; with x_int8 and W quantized, the symmetric part from a quantized per run (x_run);
    with W bfloat16, a rounded to bfloat16 first."""
    if lin["fmt"][0] == 16:
        return bf16_values(to_bf16_bits(a.astype(np.float32))) @ lin["w"].T
    if not (model.get("x_int8") and lin["fmt"][0]):
        return a @ lin["w"].T
    bits, group_size, _ = lin["fmt"]
    return int8_runs(a, x_run(bits, a.shape[1], group_size)) @ lin["sym"].T + a @ (lin["w"] - lin["sym"]).T


def oracle(model, x, positions, k_cache, v_cache):
    """(logits, k_cache, v_cache) in float64, caches updated; a 16-bit cache's new slots rounded
    to its dtype before the attention reads them."""
    cfg = model["cfg"]
    hq, hk, d, f, eps = cfg["Hq"], cfg["Hk"], cfg["D"], cfg["F"], cfg["eps"]
    kv = kv_dtype(k_cache)
    kc, vc = kv_values(k_cache), kv_values(v_cache)
    h = x.astype(np.float64)
    b = len(h)
    for i, layer in enumerate(model["layers"]):
        qkv = product(model, rms_norm(h, layer["attn_norm"], eps), layer["qkv"])
        if layer["qkv_bias"] is not None:
            qkv = qkv + layer["qkv_bias"]
        q = rope(qkv[:, :hq * d].reshape(b, hq, d), positions, cfg["theta"])
        k = rope(qkv[:, hq * d:(hq + hk) * d].reshape(b, hk, d), positions, cfg["theta"])
        v = qkv[:, (hq + hk) * d:].reshape(b, hk, d)
        o = np.zeros((b, hq, d))
        for s, pos in enumerate(positions):
            kc[i, s, pos], vc[i, s, pos] = kv_values(kv_store(k[s], kv)), kv_values(kv_store(v[s], kv))
            for head in range(hq):
                keys, values = kc[i, s, :pos + 1, head // (hq // hk)], vc[i, s, :pos + 1, head // (hq // hk)]
                scores = keys @ q[s, head] / np.sqrt(d)
                p = np.exp(scores - scores.max())
                o[s, head] = p @ values / p.sum()
        h = h + product(model, o.reshape(b, hq * d), layer["o"])
        gu = product(model, rms_norm(h, layer["ffn_norm"], eps), layer["gate_up"])
        g, u = gu[:, :f], gu[:, f:]
        h = h + product(model, g / (1 + np.exp(-g)) * u, layer["down"])
    return product(model, rms_norm(h, model["final_norm"], eps), model["head"]), kc, vc


# ---- running the kernel ------------------------------------------------------------------------

def step(model, state, num_threads: int = 0):
    """The kernel's (logits, k_cache, v_cache) for copies of `state`."""
    x, positions, k_cache, v_cache = (a.copy() for a in state)
    weights, attrs = kernel_inputs(model)
    logits = np.full((len(x), model["cfg"]["V"]), np.nan, np.float32)
    run_kernel([x, positions] + weights, [logits, k_cache, v_cache], attrs, num_threads=num_threads)
    return logits, k_cache, v_cache


def run_kernel(inputs, outputs, attrs, num_threads: int = 0) -> None:
    """decoder_step on numpy arrays, uint16 ones being bfloat16 weights."""
    dtypes = ["bfloat16" if a.dtype == np.uint16 else None for a in list(inputs) + list(outputs)]
    kernel().run_host(inputs, outputs, attrs, num_threads=num_threads, dtypes=dtypes)


def uses_bf16(model) -> bool:
    return any(fmt[0] == 16 for fmt in model["formats"].values())


def step_tolerance(model, state) -> tuple[float, float]:
    """The relative tolerance of a step's logits, and of the values it writes to the caches."""
    # A 16-bit cache: the kernel rounds its float32 k and v, the oracle float64 ones made float32;
    # now and then a value close to half a step rounds the other way (one step of the dtype).
    kv_tol = {"float32": 0.0, "bfloat16": 2**-7, "float16": 2**-10}[kv_dtype(state[2])]
    return max(5e-3 if uses_bf16(model) else 1e-4, kv_tol / 4), kv_tol


def check_step(model, state, got) -> None:
    logits, k_cache, v_cache = got
    want, kc, vc = oracle(model, *state)
    scale = np.abs(want).max()
    # The kernel rounds float32 activations to bfloat16, the oracle float64 ones: now and then one
    # rounds the other way (one bfloat16 step), and the layers after it see slightly different
    # inputs, which round differently in turn.
    tol, kv_tol = step_tolerance(model, state)
    np.testing.assert_allclose(logits, want, rtol=tol, atol=tol * scale)
    written = np.zeros(k_cache.shape[:3], bool)
    written[:, np.arange(len(state[1])), state[1]] = True
    for got_cache, want_cache, before in ((k_cache, kc, state[2]), (v_cache, vc, state[3])):
        np.testing.assert_array_equal(kv_values(got_cache[~written]), kv_values(before[~written]))
        np.testing.assert_allclose(kv_values(got_cache[written]), want_cache[written], rtol=max(tol, kv_tol),
                                   atol=max(tol, kv_tol))


def isa_cases() -> None:
    """Every format, with and without bias, against the oracle (for one ISA); the quantized ones
    also with x_int8."""
    for i, (name, fmt) in enumerate(FORMATS.items()):
        for bias in (False, True):
            model = make_model(i, dict.fromkeys(KINDS, fmt), bias)
            state = make_state(i)
            check_step(model, state, step(model, state))
            if fmt[0] in (4, 8):
                check_step(dict(model, x_int8=True), state, step(dict(model, x_int8=True), state))
    bf16_batch_invariance_case()
    for kv in ("bfloat16", "float16"):
        kv_cache_case(kv)
    panels_case()


def panels_case() -> None:
    """Panels (one ISA): a batch of 6 gets the same step bit for bit with them, and on AVX2 and
    up, whose GEMMs read them instead of qweight, panels with their first unit's codes zeroed
    change the logits (so the two runs took different paths)."""
    from anychip.ops import decoder
    from anychip_plugins.host import kernel_isa

    for name in ("int4-g32-offsets", "int8-channel", "mixed"):
        model = dict(make_model(19, X_INT8_CASES[name], True), x_int8=True)
        state = make_state(19, positions=(15, 1, 7, 0, 3, 9))
        plain = step(model, state)
        for a, b in zip(plain, step(dict(model, panels=True), state)):
            np.testing.assert_array_equal(a, b)
        real = decoder.panel_array

        def corrupt(*arrays):
            panels = real(*arrays)
            panels[:, :512] = 0
            return panels

        decoder.panel_array = corrupt
        try:
            changed = np.abs(step(dict(model, panels=True), state)[0] - plain[0]).max()
        finally:
            decoder.panel_array = real
        assert (changed > 1e-2 * np.abs(plain[0]).max()) == (kernel_isa() != "scalar"), (name, kernel_isa(), changed)


# ---- tests: the kernel -------------------------------------------------------------------------

@pytest.mark.parametrize("name", list(FORMATS))
@pytest.mark.parametrize("bias", [False, True])
def test_matches_oracle(name, bias):
    model = make_model(7, dict.fromkeys(KINDS, FORMATS[name]), bias)
    state = make_state(7)
    check_step(model, state, step(model, state))


def kv_cache_case(kv: str) -> None:
    """16-bit caches: long enough to span several key blocks, and a step after a step, whose
    attention reads the slot the first wrote, rounded."""
    cfg = dict(CFG, S=700)
    model = make_model(14, dict.fromkeys(KINDS, FORMATS["int4-g32-offsets"]), True, cfg)
    state = make_state(14, positions=(0, 255, 699, 31), cfg=cfg, kv=kv)
    first = step(model, state)
    check_step(model, state, first)
    again = (state[0][::-1].copy(), state[1] + np.array([1, 1, -1, 1]), first[1], first[2])
    check_step(model, again, step(model, again))


@pytest.mark.parametrize("kv", ["bfloat16", "float16"])
def test_16bit_kv_caches_match_oracle(kv):
    kv_cache_case(kv)


@pytest.mark.parametrize("kv", ["bfloat16", "float16"])
def test_16bit_kv_cache_thread_counts_agree_bit_for_bit(kv):
    cfg = dict(CFG, S=600)
    model = make_model(15, dict.fromkeys(KINDS, FORMATS["int8-g32"]), False, cfg)
    state = make_state(15, (599, 130, 7), cfg, kv=kv)
    results = [step(model, state, n) for n in (1, 2, 3, 5)]
    for other in results[1:]:
        for a, b in zip(results[0], other):
            np.testing.assert_array_equal(a, b)


def test_16bit_kv_cache_is_read_as_stored():
    """The same step over the same history stored in float32 and in bfloat16 differs by more
    than the float32 tolerance: the kernel reads the 16-bit values, it does not ignore them."""
    model = make_model(16, dict.fromkeys(KINDS, FORMATS["f32"]), False)
    x, positions, k_cache, v_cache = make_state(16)
    wide = step(model, (x, positions, k_cache, v_cache))[0]
    narrow = step(model, (x, positions, to_bf16_bits(k_cache), to_bf16_bits(v_cache)))[0]
    assert np.abs(wide - narrow).max() > 1e-3 * np.abs(wide).max()


def test_formats_differ_by_kind():
    formats = dict(qkv=FORMATS["int8-g32"], o=FORMATS["f32"], gate_up=FORMATS["int4-g32-offsets"],
                   down=(8, 64, True), head=FORMATS["int4-g64"])
    model = make_model(3, formats, True)
    state = make_state(3, positions=(15, 1, 7, 0))
    check_step(model, state, step(model, state))


def test_batch_larger_than_a_gemv_tile():
    positions = tuple(range(1, 16)) + (0, 5)  # B = 17: quantized products take 8 rows at a time, bf16 16
    for name in ("f32", "int4-g32-offsets", "bf16"):
        model = make_model(4, dict.fromkeys(KINDS, FORMATS[name]), False)
        state = make_state(4, positions)
        check_step(model, state, step(model, state))


@pytest.mark.parametrize("isa", isa_params("scalar", "avx2", "avx512"))
def test_long_caches_span_key_blocks(isa):
    """Attention goes by blocks of cache slots (about eight per sequence, at most 256 slots
    each), merged afterwards: positions at and around block edges, and a cache of many blocks."""
    code = (f"import sys; sys.path.insert(0, {os.path.dirname(__file__)!r}); import test_kernels_decoder as t; "
            "t.long_cache_case()")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                            env=dict(os.environ, ANYCHIP_CPU_ISA=isa))
    assert result.returncode == 0, result.stdout + result.stderr


def long_cache_case() -> None:
    cfg = dict(CFG, S=2200)
    model = make_model(8, dict.fromkeys(KINDS, FORMATS["int8-g32"]), False, cfg)
    state = make_state(8, positions=(127, 128, 2199, 255, 300), cfg=cfg)
    check_step(model, state, step(model, state))


def test_consecutive_steps_see_earlier_slots():
    """Two steps of one sequence: the second attends over the slot the first wrote."""
    model = make_model(5, dict.fromkeys(KINDS, FORMATS["int4-g32-offsets"]), False)
    x, _, k_cache, v_cache = make_state(5, positions=(0,))
    _, k1, v1 = step(model, (x, np.array([0]), k_cache, v_cache))
    state = (x[::-1].copy(), np.array([1]), k1, v1)
    check_step(model, state, step(model, state))


@pytest.mark.parametrize("slots,positions", [(16, (9, 2)), (600, (599, 130, 7))])
def test_thread_counts_agree_bit_for_bit_in_process(slots, positions):
    cfg = dict(CFG, S=slots)
    model = make_model(6, dict.fromkeys(KINDS, FORMATS["int4-g32-offsets"]), True, cfg)
    state = make_state(6, positions, cfg)
    results = [step(model, state, n) for n in (1, 2, 3, 5)]
    for other in results[1:]:
        for a, b in zip(results[0], other):
            np.testing.assert_array_equal(a, b)


def bf16_batch_invariance_case() -> None:
    """A sequence's logits from bfloat16 LINs are the same bit for bit alone, among 3, and among
    17 (two groups of tile rows): serving relies on it. The step also differs from one over the
    same weights without rounding the input, by more than check_step's tolerance allows."""
    model = make_model(12, dict(dict.fromkeys(KINDS, FORMATS["bf16"]), o=FORMATS["f32"]), True)
    positions = tuple(range(1, 16)) + (0, 5)
    state = make_state(12, positions)
    full = step(model, state)
    check_step(model, state, full)
    for rows in ([16], [0, 7, 16], list(range(17))):
        x, pos, k_cache, v_cache = state
        part = step(model, (x[rows], pos[rows], k_cache[:, rows], v_cache[:, rows]))
        np.testing.assert_array_equal(part[0], full[0][rows])
    def unrounded(lin):
        return dict(lin, fmt=FORMATS["f32"]) if isinstance(lin, dict) and "fmt" in lin else lin

    plain = dict(model, layers=[{k: unrounded(v) for k, v in y.items()} for y in model["layers"]],
                 head=unrounded(model["head"]))
    exact = oracle(plain, *state)[0]
    assert np.abs(full[0] - exact).max() > 2e-3 * np.abs(exact).max()


def test_bf16_rows_agree_bit_for_bit_across_batches():
    bf16_batch_invariance_case()


def test_bf16_thread_counts_agree_bit_for_bit():
    model = make_model(13, dict.fromkeys(KINDS, FORMATS["bf16"]), False, dict(CFG, V=200))  # a partial 64-row block
    state = make_state(13, tuple(range(1, 16)) + (0, 5))
    results = [step(model, state, n) for n in (1, 2, 3, 5)]
    check_step(model, state, results[0])
    for other in results[1:]:
        for a, b in zip(results[0], other):
            np.testing.assert_array_equal(a, b)


def test_bf16_rejects_k_off_the_tile_depth():
    cfg = dict(CFG, F=176)  # down: K = 176, not a multiple of 32
    model = make_model(0, dict.fromkeys(KINDS, FORMATS["bf16"]), False, cfg)
    x, positions, k_cache, v_cache = make_state(0, cfg=cfg)
    weights, attrs = kernel_inputs(model)
    logits = np.zeros((len(x), CFG["V"]), np.float32)
    with pytest.raises(RuntimeError, match=r"layers\[0\]\.down: bfloat16 weights need K = 176 to be a multiple of 32"):
        run_kernel([x, positions] + weights, [logits, k_cache, v_cache], attrs)


X_INT8_CASES = {
    "int4-g32-offsets": dict.fromkeys(KINDS, FORMATS["int4-g32-offsets"]),
    "int8-channel": dict.fromkeys(KINDS, FORMATS["int8-channel"]),
    "mixed": dict(qkv=FORMATS["int8-g32"], o=FORMATS["f32"], gate_up=FORMATS["int4-g32-offsets"],
                  down=(8, 64, True), head=FORMATS["int4-g64"]),
    # groups of 128 and per-channel with K = 128: runs of 128 k, one scale per 128-k chunk on AVX-512
    # (down, per-channel with K = 192: runs of 64, not)
    "int4-g128": dict(qkv=(4, 128, False), o=(4, 128, False), gate_up=(4, 128, True), down=(4, -1, False),
                      head=(4, -1, False)),
}


@pytest.mark.parametrize("name", list(X_INT8_CASES))
def test_x_int8_matches_its_oracle(name):
    """x_int8: the quantized LINs take their input quantized per run (the oracle does the
    same); the float LINs are unchanged. The result differs from the float-x step by far more
    than the tolerance, so the attr cannot be ignored unnoticed."""
    model = dict(make_model(9, X_INT8_CASES[name], True), x_int8=True)
    state = make_state(9, positions=(15, 1, 7, 0))
    got = step(model, state)
    check_step(model, state, got)
    plain = step(dict(model, x_int8=False), state)[0]
    assert np.abs(got[0] - plain).max() > 1e-3 * np.abs(plain).max()


@pytest.mark.parametrize("positions", [(9, 2), tuple(range(1, 16)) + (0, 5)])
def test_x_int8_thread_counts_agree_bit_for_bit(positions):
    model = dict(make_model(10, X_INT8_CASES["int4-g32-offsets"], True), x_int8=True)
    state = make_state(10, positions)
    results = [step(model, state, n) for n in (1, 2, 3, 5)]
    for other in results[1:]:
        for a, b in zip(results[0], other):
            np.testing.assert_array_equal(a, b)


def test_x_int8_rejects_runs_it_cannot_make():
    cfg = dict(CFG, F=160)  # down: K = 160, groups of 32 would do, 160 per channel too; 80 would not
    model = dict(make_model(0, dict(dict.fromkeys(KINDS, FORMATS["int8-g32"]), down=(8, 80, False)), False, cfg),
                 x_int8=True)
    x, positions, k_cache, v_cache = make_state(0, cfg=cfg)
    weights, attrs = kernel_inputs(model)
    logits = np.zeros((len(x), CFG["V"]), np.float32)
    with pytest.raises(RuntimeError, match=r"layers\[0\]\.down: x_int8 needs K = 160 and the group size 80"):
        run_kernel([x, positions] + weights, [logits, k_cache, v_cache], attrs)
    with pytest.raises(RuntimeError, match="x_int8 must be 0 or 1"):
        kernel().run_host([x, positions] + weights, [logits, k_cache, v_cache], attrs[:-1] + [2.0])


def test_rejects_what_it_cannot_do():
    model = make_model(0, dict.fromkeys(KINDS, FORMATS["int4-g64"]), False)
    x, positions, k_cache, v_cache = make_state(0)
    weights, attrs = kernel_inputs(model)
    logits = np.zeros((len(x), CFG["V"]), np.float32)

    def run(inputs=None, outputs=None, attrs=attrs):
        kernel().run_host(inputs or [x, positions] + weights, outputs or [logits, k_cache, v_cache], attrs)

    with pytest.raises(RuntimeError, match=r"positions\[2\] = 16 is outside the cache's \[0, 16\)"):
        run(inputs=[x, np.array([0, 1, 16])] + weights)
    with pytest.raises(RuntimeError, match=r"layers\[1\]\.o\.scales must be float32 \[128, 2\]"):
        scales = model["layers"][1]["o"]["arrays"][1]
        run(inputs=[x, positions] + [np.zeros((128, 3), np.float32) if a is scales else a for a in weights])
    with pytest.raises(RuntimeError, match=r"k_cache must be contiguous \[2, 3, 16, 2, 32\]"):
        run(outputs=[logits, k_cache[:, :, :, :1].copy(), v_cache])
    with pytest.raises(RuntimeError, match=r"v_cache must be contiguous \[2, 3, 16, 2, 32\] of k_cache's dtype"):
        run(outputs=[logits, k_cache, v_cache.astype(np.float16)])
    with pytest.raises(RuntimeError, match="k_cache: dtype .* is not float32, bfloat16 or float16"):
        run(outputs=[logits, k_cache.astype(np.float64), v_cache.astype(np.float64)])
    with pytest.raises(RuntimeError, match="inputs given"):
        run(inputs=[x, positions] + weights + [x])
    with pytest.raises(RuntimeError, match="head has bits 3"):
        run(attrs=attrs[:-3] + [3, -1, 0])
    with pytest.raises(RuntimeError, match="layers\\[0\\].qkv: K = 128 does not take 4-bit weights in groups of 48"):
        run(attrs=attrs[:8] + [4, 48, 0] + attrs[11:])
    with pytest.raises(RuntimeError, match="positions is not contiguous"):
        run(inputs=[x, np.arange(6, dtype=np.int64)[::2]] + weights)
    assert not np.isnan(k_cache).any()


@pytest.mark.parametrize("isa", isa_params("scalar", "avx2", "avx512"))
def test_isa_path(isa):
    code = f"import sys; sys.path.insert(0, {os.path.dirname(__file__)!r}); import test_kernels_decoder as t; t.isa_cases()"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                            env=dict(os.environ, ANYCHIP_CPU_ISA=isa))
    assert result.returncode == 0, result.stdout + result.stderr


# ---- tests: the op -----------------------------------------------------------------------------

def op_weights(model, device):
    import anychip.ops as ops
    from ops_helpers import tensor

    def lin(spec):
        bits, group_size, offsets = spec["fmt"]
        if bits == 16:
            return ops.Linear(tensor(spec["w"].astype(np.float32), device, "bfloat16"), bits=16)
        parts = [tensor(a, device) for a in spec["arrays"]]
        return ops.Linear(parts[0], parts[1] if bits else None, parts[2] if offsets else None, bits, group_size)

    def vec(a):
        return None if a is None else tensor(a, device)

    cfg = model["cfg"]
    layers = [ops.DecoderLayer(vec(y["attn_norm"]), lin(y["qkv"]), vec(y["qkv_bias"]), lin(y["o"]), vec(y["ffn_norm"]),
                               lin(y["gate_up"]), lin(y["down"])) for y in model["layers"]]
    return ops.DecoderWeights(layers, vec(model["final_norm"]), lin(model["head"]), cfg["Hq"], cfg["Hk"], cfg["eps"],
                              cfg["theta"], x_int8=bool(model.get("x_int8")), panels=bool(model.get("panels")))


def op_step(model, state, device, reference=False):
    """(logits, k_cache, v_cache) of the op (or its reference) on `device`, as float64 numpy."""
    import anychip.ops as ops
    from anychip.ops.decoder import _DecoderStep
    from ops_helpers import host, tensor

    weights = op_weights(model, device)
    x, positions, k_cache, v_cache = (tensor(kv_values(a).astype(np.float32), device, kv_dtype(a))
                                      if a is state[2] or a is state[3] else tensor(a, device) for a in state)
    if reference:
        logits = _DecoderStep(weights, state[1].tolist()).reference(x, positions, k_cache, v_cache)
    else:
        logits = ops.decoder_step(x, positions, weights, k_cache, v_cache)
    assert logits.stop_gradient
    return host(logits), host(k_cache), host(v_cache)


def decoder_fallbacks():
    import anychip

    return {k: v for k, v in anychip.fallback_counts().items() if k[1] == "anychip.decoder_step"}


@pytest.mark.parametrize("device", ["cpu", "npu"])
@pytest.mark.parametrize("name", ["f32", "int4-g32-offsets", "int8-channel", "bf16"])
def test_op_equals_its_reference(device, name):
    assert_op_matches_reference(make_model(11, dict.fromkeys(KINDS, FORMATS[name]), name != "f32"), make_state(11),
                                device)


def test_a_deep_copy_of_the_weights_describes_its_own_tensors():
    import copy

    weights = op_weights(make_model(11, dict.fromkeys(KINDS, FORMATS["int4-g32-offsets"]), True), "cpu")
    twin = copy.deepcopy(weights)
    assert twin.layers[0].qkv.weight is not weights.layers[0].qkv.weight
    assert [d[0] for d in twin.descriptors] == [t.data_ptr() for t in twin.tensors]
    assert not set(d[0] for d in twin.descriptors) & set(d[0] for d in weights.descriptors)


def assert_op_matches_reference(model, state, device):
    """The op's kernel on ``device`` (no fallback) and its Paddle reference both fit the oracle
    and agree with each other."""
    import anychip

    anychip.reset_fallbacks()
    got = op_step(model, state, device)
    assert not decoder_fallbacks()
    want = op_step(model, state, "cpu", reference=True)
    check_step(model, state, got)
    check_step(model, state, want)
    tol = step_tolerance(model, state)[0]
    np.testing.assert_allclose(got[0], want[0], rtol=tol, atol=tol * np.abs(want[0]).max())


@pytest.mark.parametrize("device", ["cpu", "npu"])
@pytest.mark.parametrize("kv", ["bfloat16", "float16"])
def test_op_with_16bit_kv_caches_equals_its_reference(device, kv):
    assert_op_matches_reference(make_model(17, dict.fromkeys(KINDS, FORMATS["int4-g32-offsets"]), True),
                                make_state(17, kv=kv), device)


def test_op_picks_the_kernel_by_the_caches_dtype(monkeypatch):
    """A device with a float32 decoder_step kernel but no bfloat16 one runs the reference for a
    bfloat16 cache, counted under bfloat16, and its kernel for a float32 cache."""
    import anychip
    from anychip.plugins import registry

    kernels = registry().kernels
    monkeypatch.setattr(kernels, "_kernels", dict(kernels._kernels))
    kernels._kernels.pop(("decoder_step", "cpu", "bfloat16"))
    model = make_model(18, dict.fromkeys(KINDS, FORMATS["int8-g32"]), False)
    anychip.reset_fallbacks()
    state = make_state(18, kv="bfloat16")
    check_step(model, state, op_step(model, state, "cpu"))
    assert decoder_fallbacks() == {("cpu", "anychip.decoder_step", "bfloat16"): 1}
    op_step(model, make_state(18), "cpu")
    assert decoder_fallbacks() == {("cpu", "anychip.decoder_step", "bfloat16"): 1}


@pytest.mark.parametrize("device", ["cpu", "npu"])
def test_op_x_int8_equals_its_reference(device):
    assert_op_matches_reference(dict(make_model(14, X_INT8_CASES["mixed"], True), x_int8=True), make_state(14),
                                device)


@pytest.mark.parametrize("device", ["cpu", "npu"])
@pytest.mark.parametrize("name", list(X_INT8_CASES))
def test_panels_give_the_same_step_bit_for_bit(device, name):
    """The panel form of the quantized LINs (attr panels) holds W's values in another order: a
    batch of 9 (past the GEMM's row blocks of 8; V = 100, a last panel of 4 rows) gets the same
    logits and caches as from qweight, scales and offsets, in 1 thread and 2."""
    model = dict(make_model(15, X_INT8_CASES[name], True), x_int8=True)
    state = make_state(15, positions=(15, 1, 7, 0, 3, 9, 12, 5, 2))
    plain = op_step(model, state, device)
    weights = op_weights(dict(model, panels=True), device)
    assert weights.panel_bytes > 0 and weights.named_attrs["panels"] == 1
    for a, b in zip(plain, op_step(dict(model, panels=True), state, device)):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("name", ["int4-g32-offsets", "mixed"])
def test_panels_thread_counts_agree_bit_for_bit(name):
    model = dict(make_model(17, X_INT8_CASES[name], True), x_int8=True)
    state = make_state(17, positions=tuple(range(1, 16)) + (0, 5))
    plain = step(model, state)
    for n in (1, 2, 3):
        for a, b in zip(plain, step(dict(model, panels=True), state, n)):
            np.testing.assert_array_equal(a, b)


def test_panel_form_is_the_documented_layout():
    """panel_form against kernel.h's words: byte 4c + j of vector v of unit u of panel t is
    qweight[16t + c, 32u + 4v + j]; then scales[16t + c, g] at [g][c], then the offsets."""
    import anychip.ops as ops
    from anychip.ops import OpArgumentError
    from anychip.ops.decoder import panel_form
    from ops_helpers import host, tensor

    rng = np.random.default_rng(3)
    n, k, groups = 21, 128, 4  # 4 bits: 64 bytes a row, two units; a second panel of 5 rows
    q = rng.integers(0, 256, (n, k // 2), dtype=np.uint8)
    scales, offsets = (rng.standard_normal((n, groups)).astype(np.float32) for _ in range(2))
    panels = host(panel_form(ops.Linear(tensor(q, "cpu"), tensor(scales, "cpu"), tensor(offsets, "cpu"), 4, 32)))
    assert panels.dtype == np.uint8 and panels.shape == (2, 16 * 64 + 64 * groups * 2)
    for t, c, u, v, j in [(0, 0, 0, 0, 0), (0, 5, 1, 7, 3), (1, 4, 1, 2, 1), (1, 3, 0, 6, 2)]:
        assert panels[t, u * 512 + v * 64 + 4 * c + j] == q[16 * t + c, 32 * u + 4 * v + j]
    assert not panels[1, 4 * 4 + 5 * 4: 4 * 4 + 5 * 4 + 4].any()  # row 21 of unit 0, vector 0: past N, zero
    by_group = panels[:, 16 * 64:].copy().view(np.float32).reshape(2, 2, groups, 16)  # [t][scales, offsets][g][c]
    np.testing.assert_array_equal(by_group[0, 0, 2, 7], scales[7, 2])
    np.testing.assert_array_equal(by_group[1, 1, 3, 4], offsets[20, 3])
    with pytest.raises(OpArgumentError, match="panel_form takes a 4- or 8-bit Linear"):
        panel_form(ops.Linear(tensor(rng.standard_normal((4, 32)).astype(np.float32), "cpu")))


def test_panels_are_checked():
    """panels needs x_int8 (only the int8 products read them); the kernel names a panel input
    of the wrong shape."""
    from anychip.ops import OpArgumentError

    model = make_model(16, dict.fromkeys(KINDS, FORMATS["int4-g32-offsets"]), False)
    with pytest.raises(OpArgumentError, match="panels needs x_int8"):
        op_weights(dict(model, panels=True), "cpu")
    x, positions, k_cache, v_cache = make_state(16)
    weights, attrs = kernel_inputs(dict(model, x_int8=True))
    attrs += [0.0, 0.0, 0.0, 1.0]  # panels, none given: the first panel input is then layer 0's o weight
    logits = np.zeros((len(x), CFG["V"]), np.float32)
    with pytest.raises(RuntimeError, match=r"layers\[0\]\.qkv\.panels must be uint8 \[16, 1536\]"):
        run_kernel([x, positions] + weights, [logits, k_cache, v_cache], attrs)
    attrs[23] = 0.0  # x_int8
    with pytest.raises(RuntimeError, match="panels must be 0 or 1, and 1 only with x_int8 = 1"):
        run_kernel([x, positions] + weights, [logits, k_cache, v_cache], attrs)


def test_op_without_a_kernel_runs_its_reference_counted(monkeypatch):
    import anychip
    from anychip.plugins import registry

    kernels = registry().kernels
    monkeypatch.setattr(kernels, "_kernels", dict(kernels._kernels))
    kernels._kernels.pop(("decoder_step", "cpu", "float32"))
    anychip.reset_fallbacks()
    model = make_model(12, dict.fromkeys(KINDS, FORMATS["int4-g64"]), True)
    state = make_state(12)
    check_step(model, state, op_step(model, state, "cpu"))
    assert decoder_fallbacks() == {("cpu", "anychip.decoder_step", "float32"): 1}


def test_op_thread_counts_agree_bit_for_bit():
    """ANYCHIP_NUM_THREADS=1 and 2 give the same logits, on the host and on a simulated chip."""
    code = f"""
import sys, numpy as np
sys.path.insert(0, {os.path.dirname(__file__)!r})
import test_kernels_decoder as t
from ops_helpers import paddle
paddle()
for device in ("cpu", "npu"):
    for i, name in enumerate(("int4-g32-offsets", "f32")):
        model = t.make_model(i, dict.fromkeys(t.KINDS, t.FORMATS[name]), True)
        print(t.op_step(model, t.make_state(i), device)[0].tobytes().hex())
"""
    outputs = []
    for threads in ("1", "2"):
        result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                                env=dict(os.environ, ANYCHIP_NUM_THREADS=threads, ANYCHIP_SIM_CHECK="0"))
        assert result.returncode == 0, result.stderr[-3000:]
        outputs.append(result.stdout.split())
    assert len(outputs[0]) == 4 and outputs[0] == outputs[1]


def test_op_rejects_bad_input_naming_it():
    import dataclasses

    import anychip.ops as ops
    from anychip.ops import OpArgumentError
    from ops_helpers import tensor

    model = make_model(13, dict.fromkeys(KINDS, FORMATS["int4-g32-offsets"]), True)
    weights = op_weights(model, "cpu")
    x, positions, k_cache, v_cache = (tensor(a, "cpu") for a in make_state(13))
    layers, cfg = weights.layers, model["cfg"]

    def rebuilt(**changes):
        args = dict(layers=layers, final_norm=weights.final_norm, head=weights.head, num_heads=cfg["Hq"],
                    num_kv_heads=cfg["Hk"])
        args.update(changes)
        return ops.DecoderWeights(**args)

    def with_layer(i, **changes):
        return [dataclasses.replace(y, **changes) if j == i else y for j, y in enumerate(layers)]

    o = layers[1].o
    cases = [
        (lambda: ops.decoder_step(x, positions, weights, k_cache[:, :, :, :1].contiguous(), v_cache),
         "k_cache must have shape"),
        (lambda: ops.decoder_step(x, positions, weights, k_cache, v_cache[:1].contiguous()), "v_cache must have shape"),
        (lambda: ops.decoder_step(x, positions, weights, k_cache.astype("float64"), v_cache.astype("float64")),
         "k_cache has dtype float64, expected one of float32, bfloat16, float16"),
        (lambda: ops.decoder_step(x, positions, weights, k_cache.astype("bfloat16"), v_cache.astype("float16")),
         "v_cache has dtype float16, expected one of bfloat16"),
        (lambda: ops.decoder_step(x, tensor(np.array([0, 16, 2]), "cpu"), weights, k_cache, v_cache),
         "positions[1] = 16 is outside the cache's slots [0, 16)"),
        (lambda: ops.decoder_step(x, tensor(np.array([0, 1, 2], np.int32), "cpu"), weights, k_cache, v_cache),
         "positions has dtype int32"),
        (lambda: ops.decoder_step(x[:, :64].contiguous(), positions, weights, k_cache, v_cache), "x must have shape [3, 128]"),
        (lambda: ops.decoder_step(tensor(make_state(13)[0], "npu"), positions, weights, k_cache, v_cache),
         "x is on npu:0 but the weights are on cpu:0"),
        (lambda: ops.decoder_step(*(tensor(a, "npu") for a in make_state(13)[:2]), weights,
                                  *(tensor(a, "npu") for a in make_state(13)[2:])),
         "x is on npu:0 but the weights are on cpu:0"),
        (lambda: rebuilt(layers=with_layer(1, o=dataclasses.replace(o, scales=tensor(np.ones((128, 2), np.float32), "cpu")))),
         "layers[1].o.scales must have shape [128, 4]"),
        (lambda: rebuilt(layers=with_layer(1, o=dataclasses.replace(o, offsets=None))),
         "layers[1].o has format (bits 4, group_size 32, offsets False) but the first o has (bits 4, group_size 32, "
         "offsets True)"),
        (lambda: rebuilt(layers=with_layer(1, qkv_bias=None)), "layers[1].qkv_bias is missing"),
        (lambda: rebuilt(layers=with_layer(0, ffn_norm=tensor(np.ones(128, np.float32), "npu"))),
         "layers[0].ffn_norm is on npu:0 but layers[0].attn_norm on cpu:0"),
        (lambda: rebuilt(num_kv_heads=3), "num_heads (4) must be a positive multiple of num_kv_heads (3)"),
        (lambda: rebuilt(head=dataclasses.replace(weights.head, bits=3)),
         "head.bits must be 0 (float32), 4, 8 or 16 (bfloat16), got 3"),
        (lambda: rebuilt(head=ops.Linear(weights.head.dense().astype("bfloat16"), weights.head.scales, bits=16)),
         "head is bfloat16 (bits 16) and takes no scales or offsets"),
        (lambda: rebuilt(head=ops.Linear(weights.head.dense(), bits=16)), "head.weight has dtype float32"),
        (lambda: rebuilt(layers=with_layer(0, o=ops.Linear(tensor(np.ones((128, 128), np.float32), "cpu", "bfloat16"),
                                                            bits=16))),
         "layers[1].o has format (bits 4, group_size 32, offsets True) but the first o has (bits 16, group_size -1"),
    ]
    for call, message in cases:
        with pytest.raises(OpArgumentError) as info:
            call()
        assert message in str(info.value)


def test_op_x_int8_rejects_groups_not_of_32():
    from anychip.ops import OpArgumentError

    model = dict(make_model(15, dict(dict.fromkeys(KINDS, FORMATS["int8-g32"]), down=(8, 16, False)), False),
                 x_int8=True)
    with pytest.raises(OpArgumentError, match=r"layers\[0\]\.down: x_int8 needs K and group_size to be multiples"):
        op_weights(model, "cpu")
    op_weights(dict(model, x_int8=False), "cpu")


@pytest.mark.parametrize("device, reference", [("cpu", False), ("npu", False), ("cpu", True)])
def test_cache_rows_pick_each_sequences_row(device, reference):
    """B sequences decoding in rows B+1 .. 2 (reversed) of a cache of B+2 rows get the logits and
    cache updates they get in a cache of their own, and rows 0 and 1 are left alone."""
    import anychip.ops as ops
    from anychip.ops.decoder import _DecoderStep
    from ops_helpers import host, tensor

    model = make_model(15, dict.fromkeys(KINDS, FORMATS["int4-g32-offsets"]), True)
    x, positions, k, v = make_state(15)
    b = len(positions)
    rows = list(range(b + 1, 1, -1))
    wide = [np.random.default_rng(3).standard_normal((k.shape[0], b + 2) + k.shape[2:]).astype(np.float32)
            for _ in range(2)]
    for cache, own in zip(wide, (k, v)):
        cache[:, rows] = own
    untouched = [c[:, :2].copy() for c in wide]
    want = op_step(model, (x, positions, k, v), device)
    weights = op_weights(model, device)
    kt, vt = tensor(wide[0], device), tensor(wide[1], device)
    args = [tensor(x, device), tensor(positions, device), kt, vt, tensor(np.array(rows, np.int64), device)]
    if reference:
        logits = _DecoderStep(weights, positions.tolist(), rows).reference(*args)
        np.testing.assert_allclose(host(logits), want[0], rtol=1e-4, atol=1e-4 * np.abs(want[0]).max())
    else:
        logits = ops.decoder_step(args[0], args[1], weights, kt, vt, cache_rows=args[4])
        np.testing.assert_array_equal(host(logits), want[0])
    for got, own, kept in zip((host(kt), host(vt)), want[1:], untouched):
        np.testing.assert_allclose(got[:, rows], own, rtol=1e-5, atol=1e-5)
        np.testing.assert_array_equal(got[:, :2], kept)


def test_cache_rows_must_be_distinct_rows_of_the_cache():
    import anychip.ops as ops
    from anychip.ops import OpArgumentError
    from ops_helpers import tensor

    model = make_model(16, dict.fromkeys(KINDS, FORMATS["f32"]), False)
    x, positions, k, v = (tensor(a, "cpu") for a in make_state(16))
    weights = op_weights(model, "cpu")
    b = x.shape[0]
    for rows, message in (([0] * b, "distinct"), ([5] + list(range(1, b)), "distinct rows"), ([0], r"\[batch\]")):
        with pytest.raises(OpArgumentError, match=message):
            ops.decoder_step(x, positions, weights, k, v, cache_rows=tensor(np.array(rows, np.int64), "cpu"))


# ---- one part at a time: how a tensor-parallel rank decodes -------------------------------------

def step_by_parts(model, state, device, reference=False, rows=None):
    """The op's (logits, k_cache, v_cache) from its parts: each layer's attention half, then its
    MLP half, each added to h here, then the head (what a tensor-parallel rank launches)."""
    import anychip.ops as ops
    from anychip.ops.decoder import _DecoderStep
    from ops_helpers import host, tensor

    weights = op_weights(model, device)
    x, positions, k_cache, v_cache = (tensor(a, device) for a in state)
    extra = [] if rows is None else [tensor(np.array(rows, np.int64), device)]

    def part(h, name, layer=0):
        if reference:
            return _DecoderStep(weights, state[1].tolist(), rows, name, layer).reference(h, positions, k_cache,
                                                                                          v_cache, *extra)
        return ops.decoder_step(h, positions, weights, k_cache, v_cache, *extra, part=name, layer=layer)

    h = x
    for i in range(model["cfg"]["L"]):
        for half in ("attention", "mlp"):
            out = part(h, half, i)
            assert out.shape == [len(state[1]), model["cfg"]["C"]]
            h = h + out
    return host(part(h, "head")), host(k_cache), host(v_cache)


@pytest.mark.parametrize("device", ["cpu", "npu"])
@pytest.mark.parametrize("name", ["f32", "int4-g32-offsets", "bf16"])
def test_parts_chained_equal_the_whole_step_bit_for_bit(device, name):
    """The kernel adds a half layer's product to h as a float32 add, as the caller does between
    parts: the chained parts give the whole step's logits and caches exactly."""
    model = make_model(21, dict.fromkeys(KINDS, FORMATS[name]), name != "f32")
    state = make_state(21)
    whole = op_step(model, state, device)
    parts = step_by_parts(model, state, device)
    for got, want in zip(parts, whole):
        np.testing.assert_array_equal(got, want)


def test_parts_with_cache_rows_and_their_reference():
    """Parts decode sequences in chosen cache rows, and the reference's parts agree."""
    model = make_model(22, dict.fromkeys(KINDS, FORMATS["int8-g32"]), True)
    x, positions, k, v = make_state(22)
    rows = list(range(len(positions) - 1, -1, -1))
    k, v = k[:, rows], v[:, rows]  # sequence b's history now in row rows[b]
    got = step_by_parts(model, (x, positions, k, v), "cpu", rows=rows)
    want = step_by_parts(model, (x, positions, k, v), "cpu", reference=True, rows=rows)
    whole = oracle(model, x, positions, *(c[:, rows] for c in (k, v)))
    tol = 1e-4 * np.abs(whole[0]).max()
    np.testing.assert_allclose(got[0], whole[0], rtol=1e-4, atol=tol)
    np.testing.assert_allclose(want[0], whole[0], rtol=1e-4, atol=tol)
    np.testing.assert_allclose(got[1][:, rows], whole[1], rtol=1e-5, atol=1e-5)


def test_parts_reject_an_unknown_part_or_layer():
    import anychip.ops as ops
    from anychip.ops import OpArgumentError
    from ops_helpers import tensor

    model = make_model(16, dict.fromkeys(KINDS, FORMATS["f32"]), False)
    x, positions, k, v = (tensor(a, "cpu") for a in make_state(16))
    weights = op_weights(model, "cpu")
    with pytest.raises(OpArgumentError, match=r"decoder_step: part must be one of all, attention, mlp, head, got 'ffn'"):
        ops.decoder_step(x, positions, weights, k, v, part="ffn")
    for layer in (2, -1, 1.0, True):
        with pytest.raises(OpArgumentError, match=r"layer must be an int in \[0, 2\)"):
            ops.decoder_step(x, positions, weights, k, v, part="mlp", layer=layer)


def test_kernel_rejects_a_part_it_does_not_know():
    model = make_model(16, dict.fromkeys(KINDS, FORMATS["f32"]), False)
    x, positions, k, v = make_state(16)
    weights, attrs = kernel_inputs(model)
    out = np.zeros((len(x), model["cfg"]["C"]), np.float32)
    for extra, message in (([0.0, 0.0, 4.0, 0.0], "part must be 0"), ([0.0, 0.0, 1.0, 2.0], "layer must be one of"),
                           ([0.0, 0.0, 1.0], None)):
        if message is None:  # part 1 without a layer: layer 0; a [B, V] output is the wrong shape
            with pytest.raises(RuntimeError, match=r"the output must be contiguous float32 \[3, 128\]"):
                run_kernel([x, positions] + weights, [np.zeros((3, 100), np.float32), k, v], attrs + extra)
            continue
        with pytest.raises(RuntimeError, match=message):
            run_kernel([x, positions] + weights, [out, k, v], attrs + extra)


# ---- a paged cache: blocks of slots shared out by block tables --------------------------------

def paged(state, block: int, seed: int = 0):
    """``state``'s caches [L, B, S, Hk, D] as a shuffled pool of blocks [L, NB, block, Hk, D] (3
    spare blocks of noise) and each sequence's block table [B, S / block]."""
    x, positions, k, v = state
    layers, b, s = k.shape[:3]
    width = s // block
    rng = np.random.default_rng(seed)
    order = rng.permutation(b * width + 3)
    tables = order[:b * width].reshape(b, width).astype(np.int64)
    pools = []
    for cache in (k, v):
        pool = rng.standard_normal((layers, len(order), block) + cache.shape[3:]).astype(cache.dtype)
        for i in range(b):
            for j in range(width):
                pool[:, tables[i, j]] = cache[:, i, j * block:(j + 1) * block]
        pools.append(pool)
    return tables, pools


def unpage(pool, tables, block):
    """The [L, B, S, Hk, D] cache that ``pool`` holds through ``tables``."""
    return np.stack([np.concatenate([pool[:, t] for t in row], axis=1) for row in tables], axis=1)


@pytest.mark.parametrize("device", ["cpu", "npu"])
@pytest.mark.parametrize("reference", [False, True], ids=["kernel", "reference"])
def test_a_paged_cache_gives_the_contiguous_steps_logits(device, reference):
    """Sequences whose slots lie in shuffled blocks of a pool decode as from rows of their own:
    the kernel bit for bit, its reference within float32; only each written slot changes."""
    import anychip.ops as ops
    from anychip.ops.decoder import _DecoderStep
    from ops_helpers import host, tensor

    model = make_model(31, dict.fromkeys(KINDS, FORMATS["int8-g32"]), True)
    state = make_state(31)
    want = op_step(model, state, device)
    block = 4
    tables, (kp, vp) = paged(state, block)
    weights = op_weights(model, device)
    kt, vt = tensor(kp, device), tensor(vp, device)
    x, positions, bt = tensor(state[0], device), tensor(state[1], device), tensor(tables, device)
    if reference:
        logits = _DecoderStep(weights, state[1].tolist(), tables=tables.tolist()).reference(x, positions, kt, vt, bt)
        np.testing.assert_allclose(host(logits), want[0], rtol=1e-4, atol=1e-4 * np.abs(want[0]).max())
    else:
        logits = ops.decoder_step(x, positions, weights, kt, vt, block_tables=bt)
        np.testing.assert_array_equal(host(logits), want[0])
    got_k, got_v = host(kt), host(vt)
    np.testing.assert_allclose(unpage(got_k, tables, block), want[1], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(unpage(got_v, tables, block), want[2], rtol=1e-5, atol=1e-5)
    spare = sorted(set(range(kp.shape[1])) - set(tables.reshape(-1).tolist()))
    np.testing.assert_array_equal(got_k[:, spare], kp[:, spare])


def test_sequences_share_the_blocks_of_a_common_prefix():
    """Two sequences reading one block (a shared prompt prefix) and writing their own get what
    each gets with a private copy of it."""
    import anychip.ops as ops
    from ops_helpers import host, tensor

    model = make_model(32, dict.fromkeys(KINDS, FORMATS["f32"]), False)
    x, positions, k, v = make_state(32, positions=(9, 13))
    k[:, 1, :4], v[:, 1, :4] = k[:, 0, :4], v[:, 0, :4]  # the first block's slots alike
    want = op_step(model, (x, positions, k, v), "cpu")
    block = 4
    tables, (kp, vp) = paged((x, positions, k, v), block)
    tables[1, 0] = tables[0, 0]  # sequence 1 reads sequence 0's first block
    weights = op_weights(model, "cpu")
    logits = ops.decoder_step(tensor(x, "cpu"), tensor(positions, "cpu"), weights, tensor(kp, "cpu"),
                              tensor(vp, "cpu"), block_tables=tensor(tables, "cpu"))
    np.testing.assert_array_equal(host(logits), want[0])


def test_block_tables_are_checked_before_the_kernel_runs():
    import anychip.ops as ops
    from anychip.ops import OpArgumentError
    from ops_helpers import tensor

    model = make_model(16, dict.fromkeys(KINDS, FORMATS["f32"]), False)
    state = make_state(16, positions=(3, 11))
    tables, (kp, vp) = paged(state, 4)
    weights = op_weights(model, "cpu")
    x, positions, kt, vt = (tensor(a, "cpu") for a in (state[0], state[1], kp, vp))

    def step(t, **kw):
        return ops.decoder_step(x, positions, weights, kt, vt, block_tables=tensor(np.array(t, np.int64), "cpu"), **kw)

    bad = tables.copy()
    bad[1, 2] = kp.shape[1]
    with pytest.raises(OpArgumentError, match=r"block_tables\[1, 2\] = 11 is outside the cache's 11 blocks"):
        step(bad)
    same = tables.copy()
    same[1, 2] = same[0, 0]  # both write slot 3 of one block
    with pytest.raises(OpArgumentError, match="sequence 1 writes slot 3 of block .*, which another sequence writes"):
        step(same)
    with pytest.raises(OpArgumentError, match=r"positions\[1\] = 11 is outside the cache's slots \[0, 8\)"):
        step(tables[:, :2])
    with pytest.raises(OpArgumentError, match="cache_rows or block_tables, not both"):
        step(tables, cache_rows=tensor(np.array([0, 1], np.int64), "cpu"))
    unused = tables.copy()
    unused[0, 3] = -1  # past sequence 0's position: never read
    step(unused)
