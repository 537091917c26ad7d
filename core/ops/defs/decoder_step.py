"""decoder_step: a Llama-family decode step in one launch, the KV cache updated in place."""

from __future__ import annotations

import functools

import numpy as np

from ...conformance.case import Case, normal, quantized_arrays
from ...dtypes import FLOATS
from ..decoder import DecoderLayer, DecoderWeights, Linear, _DecoderStep, decoder_step
from ..definition import Attr, OpDef

# The kernel contract (rendered into anychip/ops.h): inputs -> outputs, then the math.
CONTRACT = """\
decoder_step:    one new token per sequence through L pre-norm decoder layers of the Llama
                 family (RMSNorm, RoPE, grouped-query attention over a KV cache, SwiGLU MLP),
                 then the final norm and the output projection: the decode step of
                 generation in one launch. float32 activations; the KV cache float32,
                 bfloat16 or float16 (the dtype the op is registered under).
                 inputs: x f32[B, C] (the embedded tokens), positions int64[B] (the position
                 of each sequence's token, which is also its cache slot); cache_rows
                 int64[B] (only when has_cache_rows is 1: the distinct cache row of each
                 sequence; else sequence b uses row b and R = B) or block_tables int64[B, W]
                 (only when has_cache_rows is 2: a paged cache, below); per layer, in
                 order: attn_norm[C], LIN qkv (N = (Hq + 2 Hk) D, K = C: rows of q, then k,
                 then v), qkv_bias[(Hq + 2 Hk) D] (only when has_qkv_bias), LIN o (N = C,
                 K = Hq D), ffn_norm[C], LIN gate_up (N = 2 F, K = C: gate rows, then up
                 rows), LIN down (N = C, K = F); then final_norm[C] and LIN head (N = V,
                 K = C). A LIN is one input, a float32 weight W[N, K] (bits 0) or a
                 bfloat16 one (bits 16; K a multiple of 32: the LIN takes its input rounded to
                 bfloat16 and sums in float32, and a row's result must not depend on B), or
                 the 2 or 3 inputs qweight, scales, offsets? of weight_only_linear.
                 outputs: logits f32[B, V]; k_cache, v_cache [L, R, S, Hk, D] of one float
                 dtype, updated in place: for every layer, slot positions[b] of sequence b's
                 row is written (rounded to the cache's dtype, to nearest even) before the
                 attention of that layer reads slots [0, positions[b]] (pos < S); the new
                 token's own k and v take part as the cache holds them, rounded.
                 attrs: L, Hq, Hk, D, F, eps, theta, has_qkv_bias, then (bits, group_size,
                 has_offsets) for each LIN kind in the order qkv, o, gate_up, down, head
                 (every layer shares the formats); then optionally x_int8 (absent: 0): the
                 quantized LINs take x as weight_only_linear does with x_int8 = 1; then
                 optionally has_cache_rows (absent: 0), which lets a batch of B sequences
                 decode in any B of R cache rows (continuous batching: rows come and go),
                 or with 2 makes the cache paged (vLLM's PagedAttention): its R rows are
                 blocks of S slots shared by all sequences, and slot j of sequence b is
                 slot j % S of block block_tables[b, j / S] (positions[b] < W S; the blocks
                 of slots 0 .. positions[b] must be in [0, R); sequences may share blocks
                 they only read, but no two write one slot);
                 then optionally part (absent: 0, the whole step) and layer, which run one
                 part of it from h = x: part 1, layer `layer`'s attention half (its cache
                 slot written as below), output o W_o^T [B, C] in place of the logits,
                 without the residual add; part 2, that layer's MLP half, output
                 (silu(g) * u) W_down^T [B, C]; part 3, the final norm and head, logits
                 [B, V]. Every layer's inputs are passed whatever the part. (A
                 tensor-parallel rank decodes so: its weights are its heads' and inner
                 features' share, and the ranks' sum of each half joins h between launches.)
                 Math per layer (h the residual stream, starting at x): a = rms_norm(h) *
                 attn_norm (eps); q, k, v = split(a W_qkv^T + qkv_bias); RoPE on q and k as
                 rotary_embedding with theta at positions[b]; cache slot written; o =
                 attention(q, cache[0 .. pos], scale 1/sqrt(D)); h += o W_o^T; m =
                 rms_norm(h) * ffn_norm; g, u = split(m W_gate_up^T); h += (silu(g) * u)
                 W_down^T. logits = (rms_norm(h) * final_norm) W_head^T. Results must not
                 depend on the number of threads.
                 Then optionally panels (absent: 0; 1 needs x_int8 = 1): each 4- or 8-bit LIN
                 has one more input after its offsets (or scales), W's panel form, uint8
                 [ceil(N / 16), 16 Kb + 64 G (1 + has_offsets)] (Kb = W's bytes per row, K/2
                 or K; G groups): panel t holds rows 16t .. 16t + 15 (past N: zeros), first
                 their codes, byte 4c + j of vector v (64 bytes) of unit u being
                 qweight[16t + c, 32u + 4v + j] (u < Kb / 32, v < 8, c < 16, j < 4), then
                 scales[16t + c, g] as float32 at [g][c], then the offsets so. The step may
                 read a LIN's panels instead of qweight, scales and offsets (the same values:
                 results are unchanged), for products of many rows whose tiles would
                 otherwise gather W's rows into this order at every launch.
"""


_DECODER = dict(layers=2, hidden=64, heads=4, kv_heads=2, head_dim=16, intermediate=128, vocab=37, slots=8)


def _decoder_linear_arrays(rng, prefix, n, k, fmt):
    bits, group_size, offsets = fmt
    if bits == 0:
        return {f"{prefix}.weight": normal(rng, n, k, scale=1 / np.sqrt(k)).astype(np.float32)}
    arrays = quantized_arrays(rng, k, n, bits, group_size, offsets)
    return {f"{prefix}.{part}": a for part, a in
            (("weight", arrays["qweight"]), ("scales", arrays["scales"]), ("offsets", arrays.get("offsets")))
            if a is not None}


def _decoder_weights(t, fmt, bias):
    cfg = _DECODER
    bits, group_size, _offsets = fmt

    def lin(prefix):
        return Linear(t[f"{prefix}.weight"], t.get(f"{prefix}.scales"), t.get(f"{prefix}.offsets"), bits,
                          group_size)

    layers = [DecoderLayer(t[f"layers.{i}.attn_norm"], lin(f"layers.{i}.qkv"),
                               t[f"layers.{i}.qkv_bias"] if bias else None, lin(f"layers.{i}.o"),
                               t[f"layers.{i}.ffn_norm"], lin(f"layers.{i}.gate_up"), lin(f"layers.{i}.down"))
              for i in range(cfg["layers"])]
    return DecoderWeights(layers, t["final_norm"], lin("head"), cfg["heads"], cfg["kv_heads"])


def _decoder_call(fmt, bias, part, layer, **t):
    weights = _decoder_weights(t, fmt, bias)
    logits = decoder_step(t["x"], t["positions"], weights, t["k_cache"], t["v_cache"], t.get("cache_rows"),
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


def _cases(op, dtype, rng):
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
        inputs = {"x": normal(rng, len(positions), c).astype(np.float32),
                  "positions": np.array(positions, np.int64)}
        cache_shape = (cfg["layers"], len(rows) + 2 if rows else len(positions), cfg["slots"], hk, d)
        if rows == "paged":
            cache_shape = (cfg["layers"], 7, 4, hk, d)
            inputs["block_tables"] = np.array([[5, 2], [5, 0]], np.int64)
        elif rows:
            inputs["cache_rows"] = np.array(rows, np.int64)
        inputs["k_cache"] = normal(rng, *cache_shape).astype(np.float32)
        inputs["v_cache"] = normal(rng, *cache_shape).astype(np.float32)
        for i in range(cfg["layers"]):
            p = f"layers.{i}."
            inputs[p + "attn_norm"] = rng.uniform(0.5, 1.5, c).astype(np.float32)
            inputs.update(_decoder_linear_arrays(rng, p + "qkv", (hq + 2 * hk) * d, c, fmt))
            if bias:
                inputs[p + "qkv_bias"] = normal(rng, (hq + 2 * hk) * d, scale=0.5).astype(np.float32)
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


DEFINITIONS = [OpDef(
    "decoder_step", "fused", "a Llama-family decode step in one launch, KV cache in place (dtype: the cache's)",
    ("x", "positions", "cache_rows?", "weights..."), ("logits", "k_cache", "v_cache"), FLOATS,
    {"float32": (1e-4, 1e-4), "bfloat16": (1e-2, 1e-2), "float16": (2e-3, 2e-3)}, _cases, attrs=(
        Attr("L", "the number of layers"), Attr("Hq", "query heads"), Attr("Hk", "key/value heads"),
        Attr("D", "the head dim"), Attr("F", "the MLP's inner features"), Attr("eps", "the RMSNorms' eps"),
        Attr("theta", "the RoPE base"), Attr("has_qkv_bias", "1: each layer has a qkv bias input"),
    Attr("qkv_bits", "the qkv LINs' format: 0 float32, 16 bfloat16, or 8 / 4 as weight_only_linear"),
    Attr("qkv_group_size", "as weight_only_linear"), Attr("qkv_has_offsets", "as weight_only_linear"),
    Attr("o_bits", "the o LINs' format: 0 float32, 16 bfloat16, or 8 / 4 as weight_only_linear"),
    Attr("o_group_size", "as weight_only_linear"), Attr("o_has_offsets", "as weight_only_linear"),
    Attr("gate_up_bits", "the gate_up LINs' format: 0 float32, 16 bfloat16, or 8 / 4 as weight_only_linear"),
    Attr("gate_up_group_size", "as weight_only_linear"), Attr("gate_up_has_offsets", "as weight_only_linear"),
    Attr("down_bits", "the down LINs' format: 0 float32, 16 bfloat16, or 8 / 4 as weight_only_linear"),
    Attr("down_group_size", "as weight_only_linear"), Attr("down_has_offsets", "as weight_only_linear"),
    Attr("head_bits", "the head LINs' format: 0 float32, 16 bfloat16, or 8 / 4 as weight_only_linear"),
    Attr("head_group_size", "as weight_only_linear"), Attr("head_has_offsets", "as weight_only_linear"),
        Attr("x_int8", "1: the quantized LINs take x as weight_only_linear does with x_int8", default=0.0),
        Attr("has_cache_rows", "0: row b is sequence b's; 1: cache_rows names them; 2: a paged cache", default=0.0),
        Attr("part", "0 the whole step; 1 a layer's attention half, 2 its MLP half, 3 the final norm and head",
             default=0.0),
        Attr("layer", "the layer of parts 1 and 2", default=0.0),
        Attr("panels", "1: each 4- or 8-bit LIN has one more input, its panel form (x_int8 only)", default=0.0)))]
