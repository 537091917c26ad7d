"""Sample inputs for every registered op: what the conformance kit feeds a device's kernels
(in the spirit of PyTorch's OpInfo ``sample_inputs``).

``cases(op, dtype, seed)`` returns a short list of :class:`Case`: input arrays covering normal
and odd shapes (size 1, primes, widths that are not multiples of a vector, grouped-query heads,
causal and not, residual and not, 8 and 4 bits, per-channel and grouped scales, the FlashMask
mask families), the gradients compared, and how to call the op and its reference. Every case is
small: a whole device runs in seconds.

Every op in ``anychip.ops.support.OPS`` must have a generator here: importing this module
fails otherwise, so a newly added op cannot escape conformance.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from .. import ops
from ..ops.attention import _Attention
from ..ops.decoder import _DecoderStep
from ..ops.dispatch import paddle
from ..ops.linear import _Linear
from ..ops.norm import _RmsNorm
from ..ops.optim import _reference as _adamw_reference
from ..ops.quant import _W8A8, _Quantize, _WeightOnly, quantize_numpy
from ..ops.rotary import _Rotary
from ..ops.support import OPS
from ..ops.swiglu import _Swiglu

CPU = ("cpu", 0)  # where the references run


@dataclass(frozen=True)
class Case:
    """One call of an op.

    ``inputs``: numpy arrays by argument name; float ones are cast to the dtype under test (and
    the reference gets the same dtype-rounded values in float32), except ``float32_inputs``,
    which stay float32 whatever the dtype (quantization scales); integer and bool arrays pass
    as they are. ``call(**tensors)`` runs the op on the tensors' device, ``reference(**tensors)``
    its oracle; both return the outputs named by ``outputs`` (an op that works in place returns
    the tensors it updated). ``grads``: the inputs whose gradients are compared (the "bwd"
    direction), of ``sum(output_i * output_grads[i])`` (None: that output is not differentiated).
    ``host_outputs`` maps the outputs' host copies before comparing (4-bit codes are unpacked)."""

    label: str
    inputs: dict[str, np.ndarray]
    call: Callable
    reference: Callable
    outputs: tuple[str, ...]
    attrs: dict = field(default_factory=dict)
    grads: tuple[str, ...] = ()
    output_grads: tuple = ()
    float32_inputs: tuple[str, ...] = ()
    host_outputs: Callable | None = None
    summary: str = ""  # replaces the list of input shapes where that would be too long

    def describe(self) -> str:
        """The inputs' shapes (and dtypes when not float) and the op's other arguments."""
        if self.summary:
            shapes = self.summary
        else:
            shapes = ", ".join(f"{n}{list(a.shape)}" + ("" if a.dtype.kind == "f" else f" {a.dtype}")
                               for n, a in self.inputs.items())
        attrs = ", ".join(f"{k}={v}" for k, v in self.attrs.items())
        return f"{shapes}; {attrs}" if attrs else shapes


def _normal(rng, *shape, scale=1.0):
    return rng.standard_normal(shape) * scale


# ---- rms_norm ----------------------------------------------------------------------------------

def _rms_norm(dtype, rng):
    out = []
    for label, shape, residual, eps in [
        ("one element", (1, 1), False, 1e-6),
        ("prime width, residual", (3, 17), True, 1e-5),
        ("width 257 (not a multiple of a vector)", (5, 257), False, 1e-5),
        ("3-d input, residual", (2, 3, 100), True, 1e-6),
        ("wide rows", (2, 4099), False, 1e-5),
    ]:
        inputs = {"x": _normal(rng, *shape), "weight": rng.uniform(0.5, 1.5, shape[-1])}
        seeds = [_normal(rng, *shape)]
        if residual:
            inputs["residual"] = _normal(rng, *shape)
            seeds.append(_normal(rng, *shape))
        out.append(Case(label, inputs, functools.partial(ops.rms_norm, eps=eps),
                        _RmsNorm(eps, CPU, residual).reference, ("y", "h") if residual else ("y",),
                        {"eps": eps}, tuple(inputs), tuple(seeds)))
    return out


# ---- rotary_embedding --------------------------------------------------------------------------

def _rotary_embedding(dtype, rng):
    out = []
    for label, (b, s, hk, group, d), theta, start in [
        ("one token, head_dim 2", (1, 1, 1, 1, 2), 10000.0, 0),
        ("packed sequences restart at 0, 3 query heads per kv head", (2, 17, 2, 3, 74), 10000.0, 0),
        ("head_dim 128, positions from 300, theta 5e5", (1, 5, 2, 1, 128), 500000.0, 300),
    ]:
        restart = np.concatenate([np.arange(s // 2), np.arange(s - s // 2)]) + start
        inputs = {"q": _normal(rng, b, s, hk * group, d), "k": _normal(rng, b, s, hk, d),
                  "positions": restart[None].repeat(b, 0).astype(np.int64)}
        out.append(Case(label, inputs, functools.partial(ops.rotary_embedding, theta=theta),
                        _Rotary(theta, CPU).reference, ("q_rotated", "k_rotated"), {"theta": theta},
                        ("q", "k"), (_normal(rng, b, s, hk * group, d), _normal(rng, b, s, hk, d))))
    return out


# ---- swiglu ------------------------------------------------------------------------------------

def _swiglu_packed_reference(impl, gate):
    return impl.reference(*paddle().split(gate, 2, axis=-1))


def _swiglu(dtype, rng):
    impl = _Swiglu(CPU)
    out = [Case(label, {"gate": _normal(rng, *shape, scale=3), "up": _normal(rng, *shape)}, ops.swiglu,
                impl.reference, ("y",), grads=("gate", "up"), output_grads=(_normal(rng, *shape),))
           for label, shape in [("one element", (1, 1)), ("prime width", (3, 257)), ("3-d input", (2, 3, 64))]]
    out.append(Case("gate and up packed in one tensor (up=None)", {"gate": _normal(rng, 4, 90, scale=3)}, ops.swiglu,
                    functools.partial(_swiglu_packed_reference, impl), ("y",), grads=("gate",),
                    output_grads=(_normal(rng, 4, 45),)))
    return out


# ---- attention ---------------------------------------------------------------------------------

def _attention(dtype, rng):
    out = []
    for label, (b, sq, sk, hk, group, d), causal, mask, scale in [
        ("decode: 1 query over 17 keys", (1, 1, 17, 2, 2, 64), True, None, None),
        ("3 query heads per kv head, head_dim 17", (2, 13, 13, 2, 3, 17), True, None, None),
        ("not causal, more keys than queries, head_dim 8", (1, 9, 30, 1, 1, 8), False, None, 0.3),
        ("bool mask per batch and head", (2, 7, 11, 1, 2, 16), False, "full", None),
        ("a query row that sees no key (o 0, lse -inf)", (1, 6, 9, 1, 2, 16), False, "empty row", None),
        ("causal and a broadcast mask [1, 1, Sq, Sk]", (1, 33, 40, 2, 1, 32), True, "broadcast", None),
        ("70 queries: more than one tile", (1, 70, 70, 1, 2, 64), True, None, None),
        ("3 queries over 150 cached keys, 4 query heads per kv head", (1, 3, 150, 1, 4, 64), True, None, None),
        ("head_dim 256, the largest", (1, 5, 9, 1, 1, 256), False, None, None),
    ]:
        hq = hk * group
        inputs = {"q": _normal(rng, b, sq, hq, d), "k": _normal(rng, b, sk, hk, d), "v": _normal(rng, b, sk, hk, d)}
        if mask == "full":
            inputs["mask"] = rng.random((b, hq, sq, sk)) < 0.7
        elif mask == "broadcast":
            inputs["mask"] = rng.random((1, 1, sq, sk)) < 0.8
        elif mask == "empty row":
            inputs["mask"] = rng.random((b, hq, sq, sk)) < 0.7
            inputs["mask"][:, :, 2] = False
        used_scale = 1.0 / np.sqrt(d) if scale is None else scale
        attrs = {"causal": causal} | ({"scale": scale} if scale is not None else {})
        out.append(Case(label, inputs, functools.partial(ops.attention, causal=causal, scale=scale, return_lse=True),
                        _Attention("attention", used_scale, causal, CPU, mask is not None).reference, ("o", "lse"),
                        attrs, ("q", "k", "v"), (_normal(rng, b, sq, hq, d), None)))
    return out


def _four_column_mask(rng, seq, heads):
    """[LTS, LTE, UTS, UTE] per kv head (causal=False): random hidden bands below and above."""
    lts = rng.integers(0, seq + 1, (1, heads, seq))
    lte = np.minimum(lts + rng.integers(0, seq, (1, heads, seq)), seq)
    uts = rng.integers(0, seq + 1, (1, heads, seq))
    ute = np.minimum(uts + rng.integers(0, 5, (1, heads, seq)), seq)
    return np.stack([lts, lte, uts, ute], -1).astype(np.int32)


def _flashmask_reference(impl, q, k, v, startend_row_indices):
    return impl.reference(q, k, v, startend_row_indices)


def _flashmask_attention(dtype, rng):
    seq, hq, hk, d = 40, 4, 2, 16
    third, quarter = seq // 3, seq // 4
    families = [
        ("causal", ops.masks.causal(seq), True),
        ("sliding window of 7", ops.masks.sliding_window(seq, 7), True),
        ("causal documents 13+13+14", ops.masks.causal_document([third, third, seq - 2 * third]), True),
        ("prefix-LM, 2 documents", ops.masks.prefix_lm([seq // 2, seq - seq // 2], [3, 5]), False),
        ("shared question, 3 answers",
         ops.masks.share_question(quarter, [quarter, quarter, seq - 3 * quarter]), True),
        ("4-column mask per kv head", _four_column_mask(rng, seq, hk), False),
        ("causal documents 50+100: more than two key tiles", ops.masks.causal_document([50, 100]), True),
    ]
    out = []
    for label, startend, causal in families:
        n = startend.shape[2]
        inputs = {"q": _normal(rng, 1, n, hq, d), "k": _normal(rng, 1, n, hk, d), "v": _normal(rng, 1, n, hk, d),
                  "startend_row_indices": startend}
        out.append(Case(label, inputs,
                        functools.partial(ops.flashmask_attention, causal=causal, return_lse=True),
                        functools.partial(_flashmask_reference,
                                          _Attention("flashmask_attention", 1.0 / np.sqrt(d), causal, CPU, True)),
                        ("o", "lse"), {"causal": causal}, ("q", "k", "v"), (_normal(rng, 1, n, hq, d), None)))
    return out


# ---- linear ------------------------------------------------------------------------------------

def _linear(dtype, rng):
    out = []
    shapes = [
        ("1 x 1", (1,), 1, 1, False, ("x", "weight"), None),
        ("3-d x, prime sizes, bias", (2, 7), 45, 19, True, ("x", "weight", "bias"), None),
        ("K=129, N=67, bias", (5,), 129, 67, True, ("x", "weight", "bias"), None),
        ("130 x 97 x 300: past a block in every dim", (130,), 300, 97, True, ("x", "weight", "bias"), None),
        ("frozen weight and bias (LoRA base): only dx", (4,), 64, 33, True, ("x",), None),
    ]
    if dtype == "float32":
        # forward only: the kernel also rounds dy to bfloat16 for its products, the reference's
        # autograd does not, so the gradients differ by design
        shapes.append(("mixed precision, products in bfloat16", (3,), 80, 24, True, (), "bfloat16"))
    for label, lead, k, n, bias, grads, compute in shapes:
        inputs = {"x": _normal(rng, *lead, k), "weight": _normal(rng, n, k, scale=1 / np.sqrt(k))}
        if bias:
            inputs["bias"] = _normal(rng, n)
        attrs = {"compute_dtype": compute} if compute else {}
        out.append(Case(label, inputs, functools.partial(ops.linear, compute_dtype=compute),
                        _Linear(CPU, bias, compute or "float32").reference, ("y",), attrs, grads,
                        (_normal(rng, *lead, n),) if grads else ()))
    return out


# ---- quantization ------------------------------------------------------------------------------

def _unpack_nibbles(outputs):
    """4-bit qweight [N, K/2] -> its codes [N, K] (anychip/kernel.h's layout), so that a
    difference reads as a difference of codes."""
    packed, *rest = outputs
    n, half = packed.shape
    blocks = packed.astype(np.int16).reshape(n, half // 32, 32)
    codes = np.concatenate([blocks & 15, blocks >> 4], axis=-1).reshape(n, 2 * half) - 8
    return [codes, *rest]


def _weight_quantize(dtype, rng):
    out = []
    for label, (k, n), bits, group_size in [
        ("int8 per channel, a zero column", (64, 37), 8, -1),
        ("int8 groups of 64", (128, 5), 8, 64),
        ("int8 groups of 128", (256, 3), 8, 128),
        ("int4 per channel, one column", (64, 1), 4, -1),
        ("int4 groups of 64", (192, 13), 4, 64),
        ("int4 groups of 128", (256, 7), 4, 128),
    ]:
        w = _normal(rng, k, n, scale=0.1)
        if label.endswith("a zero column"):
            w[:, 0] = 0.0  # its scale is 0: the kernel must not divide by it
        out.append(Case(label, {"w": w}, functools.partial(ops.weight_quantize, bits=bits, group_size=group_size),
                        _Quantize(bits, group_size, CPU).reference, ("qweight", "scales"),
                        {"bits": bits, "group_size": group_size},
                        host_outputs=_unpack_nibbles if bits == 4 else None))
    return out


def _quantized(rng, k, n, bits, group_size, offsets):
    """qweight and float32 scales (and offsets: W = q * scale + offset, as GGUF's Q4_1 loads)."""
    qweight, scales = quantize_numpy(_normal(rng, k, n, scale=0.1), bits, group_size)
    arrays = {"qweight": qweight, "scales": scales.astype(np.float32)}
    if offsets:
        arrays["offsets"] = (rng.uniform(-0.1, 0.05, scales.shape) + 8 * scales).astype(np.float32)
    return arrays


def _weight_only_linear(dtype, rng):
    out = []
    for label, lead, k, n, bits, group_size, offsets, bias, x_int8 in [
        ("int8 per channel, one row (GEMV), bias", (1,), 64, 37, 8, -1, False, True, False),
        ("int8 groups of 64, 3-d x", (2, 3), 128, 19, 8, 64, False, False, False),
        ("int4 per channel", (5,), 64, 7, 4, -1, False, False, False),
        ("int4 groups of 128, bias", (3,), 256, 33, 4, 128, False, True, False),
        ("int4 groups of 32 with offsets (GGUF Q4_1), bias", (4,), 128, 13, 4, 32, True, True, False),
        ("int4 groups of 64, 70 rows (a GEMM, not a GEMV)", (70,), 256, 65, 4, 64, False, False, False),
        ("x_int8 (inference only): int8 groups of 32", (3,), 96, 11, 8, 32, False, False, True),
        ("x_int8 (inference only): int4 groups of 64 with offsets, bias", (2,), 128, 9, 4, 64, True, True, True),
    ]:
        inputs = {"x": _normal(rng, *lead, k), **_quantized(rng, k, n, bits, group_size, offsets)}
        if bias:
            inputs["bias"] = _normal(rng, n)
        grads = () if x_int8 else ("x",) + (("bias",) if bias else ())
        attrs = {"bits": bits, "group_size": group_size} | ({"x_int8": True} if x_int8 else {})
        impl = _WeightOnly(bits, group_size, CPU, bias, offsets, x_int8)
        out.append(Case(label, inputs, functools.partial(ops.weight_only_linear, **attrs), impl.reference, ("y",),
                        attrs, grads, (_normal(rng, *lead, n),) if grads else (),
                        float32_inputs=("scales", "offsets")))
    return out


def _w8a8_linear(dtype, rng):
    out = []
    for label, lead, k, n, bias in [
        ("1 x 1", (1,), 1, 1, False),
        ("prime K, bias", (5,), 131, 37, True),
        ("3-d x", (2, 3), 64, 64, False),
    ]:
        inputs = {"x": _normal(rng, *lead, k), **_quantized(rng, k, n, 8, -1, False)}
        if bias:
            inputs["bias"] = _normal(rng, n)
        out.append(Case(label, inputs, ops.w8a8_linear, _W8A8(CPU).reference, ("y",), float32_inputs=("scales",)))
    return out


# ---- adamw_step --------------------------------------------------------------------------------

def _adamw_call(update, count, hyper, **t):
    """Runs ``update`` (the op or its reference) on the ``count`` parameters in ``t``; returns
    the updated parameters, then the first and second moments."""
    params, grads, m1, m2 = ([t[f"{kind}{i}"] for i in range(count)] for kind in ("param", "grad", "m1_", "m2_"))
    update(params, grads, m1, m2, **hyper)
    return (*params, *m1, *m2)


def _adamw_step(dtype, rng):
    out = []
    for label, shapes, step, weight_decay in [
        ("one element, first step", [(1,)], 1, 0.1),
        ("three odd-sized parameters, step 3", [(33, 7), (1000,), (5,)], 3, 0.1),
        ("no weight decay, step 100", [(257,)], 100, 0.0),
    ]:
        inputs = {}
        for i, shape in enumerate(shapes):
            inputs[f"param{i}"] = _normal(rng, *shape)
            inputs[f"grad{i}"] = _normal(rng, *shape)
            inputs[f"m1_{i}"] = _normal(rng, *shape, scale=0.1).astype(np.float32)
            inputs[f"m2_{i}"] = rng.uniform(0.0, 0.05, shape).astype(np.float32)
        hyper = dict(lr=1e-2, beta1=0.9, beta2=0.99, eps=1e-8, weight_decay=weight_decay, step=step)
        count = len(shapes)
        names = tuple(f"{kind}{i}" for kind in ("param", "moment1_", "moment2_") for i in range(count))
        out.append(Case(label, inputs, functools.partial(_adamw_call, ops.adamw_step, count, hyper),
                        functools.partial(_adamw_call, _adamw_reference, count, hyper), names, hyper,
                        float32_inputs=tuple(n for n in inputs if n.startswith("m"))))
    return out


# ---- decoder_step ------------------------------------------------------------------------------

_DECODER = dict(layers=2, hidden=64, heads=4, kv_heads=2, head_dim=16, intermediate=128, vocab=37, slots=8)


def _decoder_linear_arrays(rng, prefix, n, k, fmt):
    bits, group_size, offsets = fmt
    if bits == 0:
        return {f"{prefix}.weight": _normal(rng, n, k, scale=1 / np.sqrt(k)).astype(np.float32)}
    arrays = _quantized(rng, k, n, bits, group_size, offsets)
    return {f"{prefix}.{part}": a for part, a in
            (("weight", arrays["qweight"]), ("scales", arrays["scales"]), ("offsets", arrays.get("offsets")))
            if a is not None}


def _decoder_weights(t, fmt, bias):
    cfg = _DECODER
    bits, group_size, _offsets = fmt

    def lin(prefix):
        return ops.Linear(t[f"{prefix}.weight"], t.get(f"{prefix}.scales"), t.get(f"{prefix}.offsets"), bits,
                          group_size)

    layers = [ops.DecoderLayer(t[f"layers.{i}.attn_norm"], lin(f"layers.{i}.qkv"),
                               t[f"layers.{i}.qkv_bias"] if bias else None, lin(f"layers.{i}.o"),
                               t[f"layers.{i}.ffn_norm"], lin(f"layers.{i}.gate_up"), lin(f"layers.{i}.down"))
              for i in range(cfg["layers"])]
    return ops.DecoderWeights(layers, t["final_norm"], lin("head"), cfg["heads"], cfg["kv_heads"])


def _decoder_call(fmt, bias, part, layer, **t):
    weights = _decoder_weights(t, fmt, bias)
    logits = ops.decoder_step(t["x"], t["positions"], weights, t["k_cache"], t["v_cache"], t.get("cache_rows"),
                              part=part, layer=layer, block_tables=t.get("block_tables"))
    return logits, t["k_cache"], t["v_cache"]


def _decoder_reference(fmt, bias, part, layer, **t):
    weights = _decoder_weights(t, fmt, bias)
    rows = t["cache_rows"].numpy().tolist() if "cache_rows" in t else None
    tables = t["block_tables"].numpy().tolist() if "block_tables" in t else None
    step = _DecoderStep(weights, t["positions"].numpy().tolist(), rows, part, layer, tables)
    logits = step.reference(t["x"], t["positions"], t["k_cache"], t["v_cache"],
                            t["block_tables"] if tables else t.get("cache_rows"))
    return logits, t["k_cache"], t["v_cache"]


def _decoder_step(dtype, rng):
    cfg = _DECODER
    c, d, f = cfg["hidden"], cfg["head_dim"], cfg["intermediate"]
    hq, hk = cfg["heads"], cfg["kv_heads"]
    out = []
    # No x_int8 here (weight_only_linear checks it): inside a whole step the activations differ
    # from the reference's in the last bit, and one of them near a .5 boundary rounds to another
    # int8 code, which moves the logits by far more than float32's tolerance.
    # The parts are what a tensor-parallel rank launches: a kernel that ignored `part` would
    # return logits where a half layer's partial sum belongs.
    for label, fmt, bias, positions, rows, part, layer in [
        ("float32 weights", (0, -1, False), False, [3, 0, 7], None, "all", 0),
        ("int8 per channel, qkv bias", (8, -1, False), True, [5, 1], None, "all", 0),
        ("int4 groups of 32 with offsets", (4, 32, True), False, [2, 6, 0], None, "all", 0),
        ("int8 groups of 32, qkv bias, one sequence", (8, 32, False), True, [4], None, "all", 0),
        ("2 sequences in rows 3 and 1 of a 4-row cache", (4, 64, False), False, [1, 6], [3, 1], "all", 0),
        ("part attention of layer 1 (tensor parallel), qkv bias", (0, -1, False), True, [3, 0, 7], None,
         "attention", 1),
        ("part mlp of layer 0, int8 groups of 32, rows 2 and 0", (8, 32, False), False, [5, 2], [2, 0], "mlp", 0),
        ("part head, int4 groups of 32 with offsets", (4, 32, True), False, [2, 6], None, "head", 0),
        # rows "paged": a pool of 7 blocks of 4 slots, each sequence's 2 blocks shuffled in it,
        # the first block shared by both (a common prompt prefix they only read)
        ("paged cache: 2 sequences in blocks of 4, one block shared", (8, -1, False), True, [6, 5], "paged",
         "all", 0),
    ]:
        inputs = {"x": _normal(rng, len(positions), c).astype(np.float32),
                  "positions": np.array(positions, np.int64)}
        cache_shape = (cfg["layers"], len(rows) + 2 if rows else len(positions), cfg["slots"], hk, d)
        if rows == "paged":
            cache_shape = (cfg["layers"], 7, 4, hk, d)
            inputs["block_tables"] = np.array([[5, 2], [5, 0]], np.int64)
        elif rows:
            inputs["cache_rows"] = np.array(rows, np.int64)
        inputs["k_cache"] = _normal(rng, *cache_shape).astype(np.float32)
        inputs["v_cache"] = _normal(rng, *cache_shape).astype(np.float32)
        for i in range(cfg["layers"]):
            p = f"layers.{i}."
            inputs[p + "attn_norm"] = rng.uniform(0.5, 1.5, c).astype(np.float32)
            inputs.update(_decoder_linear_arrays(rng, p + "qkv", (hq + 2 * hk) * d, c, fmt))
            if bias:
                inputs[p + "qkv_bias"] = _normal(rng, (hq + 2 * hk) * d, scale=0.5).astype(np.float32)
            inputs.update(_decoder_linear_arrays(rng, p + "o", c, hq * d, fmt))
            inputs[p + "ffn_norm"] = rng.uniform(0.5, 1.5, c).astype(np.float32)
            inputs.update(_decoder_linear_arrays(rng, p + "gate_up", 2 * f, c, fmt))
            inputs.update(_decoder_linear_arrays(rng, p + "down", c, f, fmt))
        inputs["final_norm"] = rng.uniform(0.5, 1.5, c).astype(np.float32)
        inputs.update(_decoder_linear_arrays(rng, "head", cfg["vocab"], c, fmt))
        bits, group_size, offsets = fmt
        attrs = {"bits": bits, "group_size": group_size, "offsets": offsets, "qkv_bias": bias,
                 "positions": positions} | (
                     {"block_tables": inputs["block_tables"].tolist()} if rows == "paged" else
                     {"cache_rows": rows} if rows else {}) | (
                     {} if part == "all" else {"part": part, "layer": layer})
        summary = (f"x[{len(positions)}, {c}], caches{list(cache_shape)}, "
                   + ", ".join(f"{k}={v}" for k, v in cfg.items()))
        # The dtype under test is the caches'; activations and weights are float32 whatever it is.
        out.append(Case(label, inputs, functools.partial(_decoder_call, fmt, bias, part, layer),
                        functools.partial(_decoder_reference, fmt, bias, part, layer),
                        ("logits" if part in ("all", "head") else "partial sum", "k_cache", "v_cache"),
                        attrs, summary=summary,
                        float32_inputs=tuple(n for n in inputs if n not in ("k_cache", "v_cache"))))
    return out


GENERATORS: dict[str, Callable] = {
    "rms_norm": _rms_norm,
    "rotary_embedding": _rotary_embedding,
    "swiglu": _swiglu,
    "attention": _attention,
    "flashmask_attention": _flashmask_attention,
    "linear": _linear,
    "weight_quantize": _weight_quantize,
    "weight_only_linear": _weight_only_linear,
    "w8a8_linear": _w8a8_linear,
    "adamw_step": _adamw_step,
    "decoder_step": _decoder_step,
}

if set(GENERATORS) != set(OPS):
    raise ImportError(
        "anychip.conformance.cases must have one generator per registered op: "
        f"missing {sorted(set(OPS) - set(GENERATORS))}, unknown {sorted(set(GENERATORS) - set(OPS))}; "
        "add the op's sample inputs to core/conformance/cases.py")


def cases(op: str, dtype: str, seed: int = 0) -> list[Case]:
    """The sample cases of ``op`` for ``dtype``; the same ``seed`` gives the same arrays."""
    if op not in GENERATORS:
        raise ValueError(f"op must be one of {', '.join(OPS)}, got {op!r}")
    if dtype not in OPS[op].dtypes:
        raise ValueError(f"{op} declares dtypes {', '.join(OPS[op].dtypes)}, got {dtype!r}")
    return GENERATORS[op](dtype, np.random.default_rng(seed))


# ---- the base operator set (anychip.ops.base), through anychip.ops.base_call --------------------
# Each base op (its grad ops included) is a forward-only check: the device's kernel, called with
# the broadcast descriptors base_call builds, against the declaration's numpy reference. Ops
# without inputs (fill, arange) take a `like` tensor for their device, shape and dtype.

def _base_names(op):
    from ..ops.base import BASE_OPS

    decl = BASE_OPS[op]
    return decl.inputs or ("like",)


def _base_call(op, attrs, out_dtype, out_shape, **tensors):
    from ..ops import base_call
    from ..ops.dispatch import device_of, dtype_name

    names = _base_names(op)
    if names == ("like",):
        like = tensors["like"]
        return tuple(base_call.run(op, [], attrs, out_dtype=dtype_name(like), out_shape=list(like.shape),
                                   device=device_of(like)))
    return tuple(base_call.run(op, [tensors[n] for n in names], attrs, out_dtype=out_dtype, out_shape=out_shape))


def _base_reference(op, attrs, out_dtype, out_shape, **tensors):
    from ..ops.base import BASE_OPS
    from ..ops.base_call import device_tensor, host_array
    from ..ops.dispatch import dtype_name

    names = _base_names(op)
    if names == ("like",):
        like = tensors["like"]
        out_dtype, out_shape, arrays = dtype_name(like), list(like.shape), []
    else:
        arrays = [host_array(tensors[n]) for n in names]
    results = BASE_OPS[op].reference(arrays, attrs, out_dtype=out_dtype, out_shape=out_shape)
    decl = BASE_OPS[op]
    key = out_dtype if decl.dtype_of not in decl.inputs else dtype_name(tensors[decl.dtype_of])
    dtypes = decl.resolve_output_dtypes(key, out_dtype)
    return tuple(device_tensor(np.asarray(r), d if d != "bfloat16" else "float32", CPU) for r, d in zip(results, dtypes))


def _base_case(op, label, inputs, attrs=(), out_dtype=None, out_shape=None):
    from ..ops.base import BASE_OPS

    attrs = [float(a) for a in attrs]
    extra = {"out_dtype": out_dtype} if out_dtype else {}
    if out_shape:
        extra["out_shape"] = list(out_shape)
    return Case(label, inputs, functools.partial(_base_call, op, attrs, out_dtype, out_shape),
                functools.partial(_base_reference, op, attrs, out_dtype, out_shape), BASE_OPS[op].outputs,
                dict({"attrs": attrs} if attrs else {}, **extra))


def _values(rng, shape, dtype, low=-3.0, high=3.0):
    """Random values of ``dtype`` (floats as float64, to be rounded by the kit)."""
    if dtype == "bool":
        return rng.random(shape) < 0.5
    if dtype in ("int32", "int64"):
        return rng.integers(int(low), int(high) + 1, shape).astype(dtype)
    return rng.uniform(low, high, shape)


def _base_op_cases(op, dtype, rng):
    from ..ops.base import BASE_OPS, reduction_attrs

    decl = BASE_OPS[op]
    cat = decl.category
    if cat == "unary":
        low = 0.1 if op in ("log", "sqrt", "rsqrt", "pow") else -3.0
        attrs = {"scale": [1.5, -0.25, 1.0], "pow": [2.5]}.get(op, [])
        return [_base_case(op, f"shape {list(s)}", {"x": _values(rng, s, dtype, low)}, attrs)
                for s in [(), (3, 257)]]
    if cat in ("binary", "compare"):
        low = 0.5 if op in ("elementwise_pow", "divide") else -2.0
        return [_base_case(op, f"{list(a)} with {list(b)} (broadcast)",
                           {"x": _values(rng, a, dtype, low, 2.0), "y": _values(rng, b, dtype, low, 2.0)})
                for a, b in [((3, 1, 5), (4, 5)), ((), (2, 3)), ((7,), (7,))]]
    if cat == "where":
        return [_base_case(op, "broadcast condition", {"condition": rng.random((4, 1)) < 0.5,
                                                        "x": _values(rng, (1, 5), dtype), "y": _values(rng, (4, 5), dtype)})]
    if cat == "cast":
        x = _values(rng, (3, 17), dtype, -40.0, 40.0)
        return [_base_case(op, f"to {target}", {"x": x}, out_dtype=target) for target in decl.dtypes]
    if cat in ("fill", "arange"):
        n = 17
        attrs = [2.5] if cat == "fill" else [-3.0, 2.0]
        like = np.zeros(n, dtype) if dtype in ("int32", "int64", "bool") else np.zeros(n)
        return [_base_case(op, f"{n} elements", {"like": like}, attrs)]
    if cat == "copy":
        return [_base_case(op, "3-d", {"x": _values(rng, (3, 4, 5), dtype)})]
    if cat == "reduction":
        x = _values(rng, (3, 5, 7), dtype)
        return [_base_case(op, f"axes {axes}, keepdim {keep}", {"x": x}, reduction_attrs(axes, 3, keep))
                for axes, keep in [(None, False), ((1,), True), ((0, 2), False)]]
    if op == "softmax":
        return [_base_case(op, f"axis {a}", {"x": _values(rng, (3, 4, 33), dtype)}, [a]) for a in (-1, 1)]
    if op == "softmax_grad":
        out = np.exp(rng.standard_normal((3, 33)))
        return [_base_case(op, "axis -1", {"out": out / out.sum(-1, keepdims=True), "dout": _values(rng, (3, 33), dtype)},
                           [-1])]
    label = rng.integers(0, 29, (2, 3, 1)).astype(np.int64)
    label[0, 0, 0] = -100
    if op == "cross_entropy_with_softmax":
        return [_base_case(op, "V 29, an ignored row", {"logits": _values(rng, (2, 3, 29), dtype), "label": label},
                           [-100])]
    if op == "cross_entropy_with_softmax_grad":
        sm = np.exp(rng.standard_normal((2, 3, 29)))
        return [_base_case(op, "V 29, an ignored row", {"label": label, "softmax": sm / sm.sum(-1, keepdims=True),
                                                        "dloss": _values(rng, (2, 3, 1), dtype)}, [-100])]
    ids = rng.integers(0, 11, (3, 7)).astype(np.int64)
    if op == "embedding":
        return [_base_case(op, f"padding_idx {p}", {"ids": ids, "weight": _values(rng, (11, 19), dtype)}, [p])
                for p in (-1, 2)]
    if op == "embedding_grad":
        return [_base_case(op, "repeated ids", {"ids": ids, "dout": _values(rng, (3, 7, 19), dtype)}, [2],
                           out_shape=[11, 19])]
    if op == "index_select":
        return [_base_case(op, f"axis {a}", {"x": _values(rng, (4, 5, 6), dtype), "index": np.array(i, np.int64)}, [a])
                for a, i in [(0, [3, 0, 3]), (2, [5, 1])]]
    shapes = [((5, 7), (7, 3), 0, 0), ((2, 3, 9, 6), (9, 4), 1, 0), ((4, 9, 6), (1, 10, 9), 1, 1)]
    if op == "matmul":
        return [_base_case(op, f"{list(a)} @ {list(b)}, transpose {tx}/{ty}",
                           {"x": _values(rng, a, dtype), "y": _values(rng, b, dtype)}, [tx, ty])
                for a, b, tx, ty in shapes]
    out = []
    for a, b, tx, ty in shapes:  # matmul_grad
        shape = BASE_OPS["matmul"].output_shapes([a, b], [tx, ty])[0]
        out.append(_base_case(op, f"{list(a)} @ {list(b)}, transpose {tx}/{ty}",
                              {"x": _values(rng, a, dtype), "y": _values(rng, b, dtype),
                               "dout": _values(rng, shape, dtype)}, [tx, ty]))
    return out


def base_cases(op: str, dtype: str, seed: int = 0) -> list[Case]:
    """The sample cases of base op ``op`` (anychip.ops.base) for ``dtype``."""
    from ..ops.base import BASE_OPS

    if op not in BASE_OPS:
        raise ValueError(f"op must be a base op ({', '.join(BASE_OPS)}), got {op!r}")
    if dtype not in BASE_OPS[op].dtypes:
        raise ValueError(f"{op} declares dtypes {', '.join(BASE_OPS[op].dtypes)}, got {dtype!r}")
    return _base_op_cases(op, dtype, np.random.default_rng(seed))
