/*
 * anychip/ops.h -- GENERATED from the op definitions (anychip/ops/defs/) by
 * `python -m anychip.ops.c_header`: do not edit.
 *
 * The op table of the kernel contract: per op (fused ops, then the base ops), its tensors
 * and math in words ("inputs -> outputs", under the conventions of anychip/kernel.h: B
 * batch, S/Sq/Sk sequence lengths, H heads, D head dim, R rows (all leading dims flattened),
 * N/K output/input features, "float" the call's compute dtype, "?" an optional trailing
 * input), then its attributes by name: ANYCHIP_ATTR_<OP>_<ATTR> is the attribute's index in
 * AnychipKernelCall.attrs and ANYCHIP_NUM_ATTRS_<OP> their number. Trailing attributes with
 * a default may be absent (num_attrs says how many were passed); flags are 0.0 or 1.0. A
 * fused op's backward kernel has attributes of its own, under its own name.
 */
#ifndef ANYCHIP_OPS_H_
#define ANYCHIP_OPS_H_

/*
 * adamw_step:      grads g_0..g_{n-1} -> params p_0..p_{n-1}, m_0..m_{n-1}, v_0..v_{n-1}
 *                  updated in place (m, v float32; p and g share a float dtype);
 *                  attrs: lr, beta1, beta2, eps, weight_decay, step (1-based).
 *                  p -= lr * weight_decay * p; m = b1 m + (1 - b1) g; v = b2 v + (1 - b2) g^2;
 *                  p -= lr * (m / (1 - b1^step)) / (sqrt(v / (1 - b2^step)) + eps)
 */
/* adamw_step (fused): fused AdamW over a list of parameters (in place); inputs grads..., outputs params..., moments1..., moments2... */
#define ANYCHIP_ATTR_ADAMW_STEP_LR 0  /* the learning rate */
#define ANYCHIP_ATTR_ADAMW_STEP_BETA1 1  /* the first moment's decay */
#define ANYCHIP_ATTR_ADAMW_STEP_BETA2 2  /* the second moment's decay */
#define ANYCHIP_ATTR_ADAMW_STEP_EPS 3  /* added to the denominator */
#define ANYCHIP_ATTR_ADAMW_STEP_WEIGHT_DECAY 4  /* decoupled, times lr */
#define ANYCHIP_ATTR_ADAMW_STEP_STEP 5  /* 1-based, for the bias corrections */
#define ANYCHIP_NUM_ATTRS_ADAMW_STEP 6

/*
 * attention:       q[B,Sq,Hq,D], k[B,Sk,Hk,D], v[B,Sk,Hk,D], mask bool[B|1, Hq|1, Sq, Sk]?
 *                  -> o[B,Sq,Hq,D], lse f32[B,Hq,Sq]; attrs: scale, causal.
 *                  Hq is a multiple of Hk; query head h reads kv head h / (Hq / Hk).
 *                  Key j is visible to query i when mask[i, j] is true (if given) and, if
 *                  causal, j <= i + Sk - Sq (bottom-right aligned, as with a KV cache).
 *                  A query row that sees no key gets o = 0 and lse = -inf.
 * attention_grad:  do, q, k, v, o, lse, mask? -> dq, dk, dv; attrs: scale, causal
 */
/* attention (fused): flash attention, GQA, causal/bool mask, returns LSE; inputs q, k, v, mask?, outputs o, lse */
#define ANYCHIP_ATTR_ATTENTION_SCALE 0  /* the logits' factor (usually 1/sqrt(D)) */
#define ANYCHIP_ATTR_ATTENTION_CAUSAL 1  /* 1: key j is hidden from query i when j > i + Sk - Sq */
#define ANYCHIP_NUM_ATTRS_ATTENTION 2
/* attention_grad: the backward of attention */
#define ANYCHIP_ATTR_ATTENTION_GRAD_SCALE 0  /* the logits' factor (usually 1/sqrt(D)) */
#define ANYCHIP_ATTR_ATTENTION_GRAD_CAUSAL 1  /* 1: key j is hidden from query i when j > i + Sk - Sq */
#define ANYCHIP_NUM_ATTRS_ATTENTION_GRAD 2

/*
 * decoder_step:    one new token per sequence through L pre-norm decoder layers of the Llama
 *                  family (RMSNorm, RoPE, grouped-query attention over a KV cache, SwiGLU MLP),
 *                  then the final norm and the output projection: the decode step of
 *                  generation in one launch. float32 activations; the KV cache float32,
 *                  bfloat16 or float16 (the dtype the op is registered under).
 *                  inputs: x f32[B, C] (the embedded tokens), positions int64[B] (the position
 *                  of each sequence's token, which is also its cache slot); cache_rows
 *                  int64[B] (only when has_cache_rows is 1: the distinct cache row of each
 *                  sequence; else sequence b uses row b and R = B) or block_tables int64[B, W]
 *                  (only when has_cache_rows is 2: a paged cache, below); per layer, in
 *                  order: attn_norm[C], LIN qkv (N = (Hq + 2 Hk) D, K = C: rows of q, then k,
 *                  then v), qkv_bias[(Hq + 2 Hk) D] (only when has_qkv_bias), LIN o (N = C,
 *                  K = Hq D), ffn_norm[C], LIN gate_up (N = 2 F, K = C: gate rows, then up
 *                  rows), LIN down (N = C, K = F); then final_norm[C] and LIN head (N = V,
 *                  K = C). A LIN is one input, a float32 weight W[N, K] (bits 0) or a
 *                  bfloat16 one (bits 16; K a multiple of 32: the LIN takes its input rounded to
 *                  bfloat16 and sums in float32, and a row's result must not depend on B), or
 *                  the 2 or 3 inputs qweight, scales, offsets? of weight_only_linear.
 *                  outputs: logits f32[B, V]; k_cache, v_cache [L, R, S, Hk, D] of one float
 *                  dtype, updated in place: for every layer, slot positions[b] of sequence b's
 *                  row is written (rounded to the cache's dtype, to nearest even) before the
 *                  attention of that layer reads slots [0, positions[b]] (pos < S); the new
 *                  token's own k and v take part as the cache holds them, rounded.
 *                  attrs: L, Hq, Hk, D, F, eps, theta, has_qkv_bias, then (bits, group_size,
 *                  has_offsets) for each LIN kind in the order qkv, o, gate_up, down, head
 *                  (every layer shares the formats); then optionally x_int8 (absent: 0): the
 *                  quantized LINs take x as weight_only_linear does with x_int8 = 1; then
 *                  optionally has_cache_rows (absent: 0), which lets a batch of B sequences
 *                  decode in any B of R cache rows (continuous batching: rows come and go),
 *                  or with 2 makes the cache paged (vLLM's PagedAttention): its R rows are
 *                  blocks of S slots shared by all sequences, and slot j of sequence b is
 *                  slot j % S of block block_tables[b, j / S] (positions[b] < W S; the blocks
 *                  of slots 0 .. positions[b] must be in [0, R); sequences may share blocks
 *                  they only read, but no two write one slot);
 *                  then optionally part (absent: 0, the whole step) and layer, which run one
 *                  part of it from h = x: part 1, layer `layer`'s attention half (its cache
 *                  slot written as below), output o W_o^T [B, C] in place of the logits,
 *                  without the residual add; part 2, that layer's MLP half, output
 *                  (silu(g) * u) W_down^T [B, C]; part 3, the final norm and head, logits
 *                  [B, V]. Every layer's inputs are passed whatever the part. (A
 *                  tensor-parallel rank decodes so: its weights are its heads' and inner
 *                  features' share, and the ranks' sum of each half joins h between launches.)
 *                  Math per layer (h the residual stream, starting at x): a = rms_norm(h) *
 *                  attn_norm (eps); q, k, v = split(a W_qkv^T + qkv_bias); RoPE on q and k as
 *                  rotary_embedding with theta at positions[b]; cache slot written; o =
 *                  attention(q, cache[0 .. pos], scale 1/sqrt(D)); h += o W_o^T; m =
 *                  rms_norm(h) * ffn_norm; g, u = split(m W_gate_up^T); h += (silu(g) * u)
 *                  W_down^T. logits = (rms_norm(h) * final_norm) W_head^T. Results must not
 *                  depend on the number of threads.
 *                  Then optionally panels (absent: 0; 1 needs x_int8 = 1): each 4- or 8-bit LIN
 *                  has one more input after its offsets (or scales), W's panel form, uint8
 *                  [ceil(N / 16), 16 Kb + 64 G (1 + has_offsets)] (Kb = W's bytes per row, K/2
 *                  or K; G groups): panel t holds rows 16t .. 16t + 15 (past N: zeros), first
 *                  their codes, byte 4c + j of vector v (64 bytes) of unit u being
 *                  qweight[16t + c, 32u + 4v + j] (u < Kb / 32, v < 8, c < 16, j < 4), then
 *                  scales[16t + c, g] as float32 at [g][c], then the offsets so. The step may
 *                  read a LIN's panels instead of qweight, scales and offsets (the same values:
 *                  results are unchanged), for products of many rows whose tiles would
 *                  otherwise gather W's rows into this order at every launch.
 */
/* decoder_step (fused): a Llama-family decode step in one launch, KV cache in place (dtype: the cache's); inputs x, positions, cache_rows?, weights..., outputs logits, k_cache, v_cache */
#define ANYCHIP_ATTR_DECODER_STEP_L 0  /* the number of layers */
#define ANYCHIP_ATTR_DECODER_STEP_HQ 1  /* query heads */
#define ANYCHIP_ATTR_DECODER_STEP_HK 2  /* key/value heads */
#define ANYCHIP_ATTR_DECODER_STEP_D 3  /* the head dim */
#define ANYCHIP_ATTR_DECODER_STEP_F 4  /* the MLP's inner features */
#define ANYCHIP_ATTR_DECODER_STEP_EPS 5  /* the RMSNorms' eps */
#define ANYCHIP_ATTR_DECODER_STEP_THETA 6  /* the RoPE base */
#define ANYCHIP_ATTR_DECODER_STEP_HAS_QKV_BIAS 7  /* 1: each layer has a qkv bias input */
#define ANYCHIP_ATTR_DECODER_STEP_QKV_BITS 8  /* the qkv LINs' format: 0 float32, 16 bfloat16, or 8 / 4 as weight_only_linear */
#define ANYCHIP_ATTR_DECODER_STEP_QKV_GROUP_SIZE 9  /* as weight_only_linear */
#define ANYCHIP_ATTR_DECODER_STEP_QKV_HAS_OFFSETS 10  /* as weight_only_linear */
#define ANYCHIP_ATTR_DECODER_STEP_O_BITS 11  /* the o LINs' format: 0 float32, 16 bfloat16, or 8 / 4 as weight_only_linear */
#define ANYCHIP_ATTR_DECODER_STEP_O_GROUP_SIZE 12  /* as weight_only_linear */
#define ANYCHIP_ATTR_DECODER_STEP_O_HAS_OFFSETS 13  /* as weight_only_linear */
#define ANYCHIP_ATTR_DECODER_STEP_GATE_UP_BITS 14  /* the gate_up LINs' format: 0 float32, 16 bfloat16, or 8 / 4 as weight_only_linear */
#define ANYCHIP_ATTR_DECODER_STEP_GATE_UP_GROUP_SIZE 15  /* as weight_only_linear */
#define ANYCHIP_ATTR_DECODER_STEP_GATE_UP_HAS_OFFSETS 16  /* as weight_only_linear */
#define ANYCHIP_ATTR_DECODER_STEP_DOWN_BITS 17  /* the down LINs' format: 0 float32, 16 bfloat16, or 8 / 4 as weight_only_linear */
#define ANYCHIP_ATTR_DECODER_STEP_DOWN_GROUP_SIZE 18  /* as weight_only_linear */
#define ANYCHIP_ATTR_DECODER_STEP_DOWN_HAS_OFFSETS 19  /* as weight_only_linear */
#define ANYCHIP_ATTR_DECODER_STEP_HEAD_BITS 20  /* the head LINs' format: 0 float32, 16 bfloat16, or 8 / 4 as weight_only_linear */
#define ANYCHIP_ATTR_DECODER_STEP_HEAD_GROUP_SIZE 21  /* as weight_only_linear */
#define ANYCHIP_ATTR_DECODER_STEP_HEAD_HAS_OFFSETS 22  /* as weight_only_linear */
#define ANYCHIP_ATTR_DECODER_STEP_X_INT8 23  /* 1: the quantized LINs take x as weight_only_linear does with x_int8 (absent: 0) */
#define ANYCHIP_ATTR_DECODER_STEP_HAS_CACHE_ROWS 24  /* 0: row b is sequence b's; 1: cache_rows names them; 2: a paged cache (absent: 0) */
#define ANYCHIP_ATTR_DECODER_STEP_PART 25  /* 0 the whole step; 1 a layer's attention half, 2 its MLP half, 3 the final norm and head (absent: 0) */
#define ANYCHIP_ATTR_DECODER_STEP_LAYER 26  /* the layer of parts 1 and 2 (absent: 0) */
#define ANYCHIP_ATTR_DECODER_STEP_PANELS 27  /* 1: each 4- or 8-bit LIN has one more input, its panel form (x_int8 only) (absent: 0) */
#define ANYCHIP_NUM_ATTRS_DECODER_STEP 28

/*
 * flashmask_attention: q, k, v as attention, startend_row_indices int32[B, Hm, Sk, E]
 *                  with Hm in {1, Hk, Hq} and E in {1, 2, 4} -> o, lse; attrs: scale, causal.
 *                  Column j of the mask for query head h is row (h * Hm / Hq) of dim 1.
 *                  Query row i is hidden from key j when (causal and j > i + Sk - Sq) or
 *                    E=1 (causal only):      i >= LTS[j]
 *                    E=2, causal:            LTS[j] <= i < LTE[j]
 *                    E=2, not causal:        i >= LTS[j] or i < UTE[j]
 *                    E=4 (not causal only):  LTS[j] <= i < LTE[j] or UTS[j] <= i < UTE[j]
 *                  (the columns of dim 3 are, in order, LTS, then LTE or UTE for E=2, and
 *                  LTS, LTE, UTS, UTE for E=4). Every index lies in [0, Sq].
 *                  Must equal `attention` with the equivalent dense mask bit for bit.
 * flashmask_attention_grad: do, q, k, v, o, lse, startend_row_indices -> dq, dk, dv
 */
/* flashmask_attention (fused): FlashMask column-sparse masked attention; inputs q, k, v, startend_row_indices, outputs o, lse */
#define ANYCHIP_ATTR_FLASHMASK_ATTENTION_SCALE 0  /* the logits' factor (usually 1/sqrt(D)) */
#define ANYCHIP_ATTR_FLASHMASK_ATTENTION_CAUSAL 1  /* 1: key j is hidden from query i when j > i + Sk - Sq */
#define ANYCHIP_NUM_ATTRS_FLASHMASK_ATTENTION 2
/* flashmask_attention_grad: the backward of flashmask_attention */
#define ANYCHIP_ATTR_FLASHMASK_ATTENTION_GRAD_SCALE 0  /* the logits' factor (usually 1/sqrt(D)) */
#define ANYCHIP_ATTR_FLASHMASK_ATTENTION_GRAD_CAUSAL 1  /* 1: key j is hidden from query i when j > i + Sk - Sq */
#define ANYCHIP_NUM_ATTRS_FLASHMASK_ATTENTION_GRAD 2

/*
 * linear:          x[..., K], weight[N, K], bias[N]? -> y[..., N]; attrs: compute.
 *                  y = x W^T + bias. compute (an AnychipDtype; absent: the tensors' dtype) is
 *                  the dtype of the products: the tensors' dtype, or bfloat16 for float32
 *                  tensors (mixed precision: x, weight and dy are rounded to bfloat16, nearest
 *                  even, for the products only; sums and every output stay float32).
 * linear_grad:     dy[..., N], x[..., K], weight[N, K] -> dx[..., K], dweight[N, K], dbias[N]?
 *                  (dbias only where bias needs a gradient); attrs: needs_dx, needs_dweight
 *                  (absent: 1), compute (as linear). dx = dy W, dweight = dy^T x and dbias =
 *                  the sum of dy (unrounded), both over all rows. An output whose flag is 0 is
 *                  not written: the caller may pass a tensor with no elements in its place.
 */
/* linear (fused): float linear y = x W^T + b, fwd+bwd; inputs x, weight, bias?, outputs y */
#define ANYCHIP_ATTR_LINEAR_COMPUTE 0  /* the products' dtype (an AnychipDtype); absent: the tensors' dtype (may be absent) */
#define ANYCHIP_NUM_ATTRS_LINEAR 1
/* linear_grad: the backward of linear */
#define ANYCHIP_ATTR_LINEAR_GRAD_NEEDS_DX 0  /* 0: dx is not written (absent: 1) */
#define ANYCHIP_ATTR_LINEAR_GRAD_NEEDS_DWEIGHT 1  /* 0: dweight is not written (absent: 1) */
#define ANYCHIP_ATTR_LINEAR_GRAD_COMPUTE 2  /* the products' dtype (an AnychipDtype); absent: the tensors' dtype (may be absent) */
#define ANYCHIP_NUM_ATTRS_LINEAR_GRAD 3

/*
 * rms_norm:        x[..., C], weight[C], residual[..., C]? -> y[..., C], inv_rms f32[R],
 *                  h[..., C] (only with residual; h = x + residual, the normalised input);
 *                  attrs: eps.  y = h * inv_rms * weight, inv_rms = 1/sqrt(mean(h^2) + eps)
 * rms_norm_grad:   dy[..., C], h[..., C], weight[C], inv_rms f32[R], dh_extra[..., C]?
 *                  -> dh[..., C], dweight[C] (weight's dtype); dh includes dh_extra
 */
/* rms_norm (fused): RMSNorm, optionally fused with the residual add; inputs x, weight, residual?, outputs y, inv_rms, h? */
#define ANYCHIP_ATTR_RMS_NORM_EPS 0  /* added to mean(h^2) before the square root */
#define ANYCHIP_NUM_ATTRS_RMS_NORM 1
/* rms_norm_grad: the backward of rms_norm */
#define ANYCHIP_NUM_ATTRS_RMS_NORM_GRAD 0

/*
 * rotary_embedding: q[B,S,Hq,D], k[B,S,Hk,D], positions int64[B,S] -> q_out, k_out;
 *                  attrs: theta.  Half-rotation (Llama/NeoX) layout: for i < D/2,
 *                  f = pos * theta^(-2i/D) (float32), (a, b) = (x[i], x[i + D/2]),
 *                  out[i] = a cos f - b sin f, out[i + D/2] = b cos f + a sin f
 * rotary_embedding_grad: dq_out, dk_out, positions -> dq, dk; attrs: theta (rotation by -f)
 */
/* rotary_embedding (fused): RoPE, half-rotation layout, per-token positions; inputs q, k, positions, outputs q_out, k_out */
#define ANYCHIP_ATTR_ROTARY_EMBEDDING_THETA 0  /* the RoPE base: frequency i is theta^(-2i/D) */
#define ANYCHIP_NUM_ATTRS_ROTARY_EMBEDDING 1
/* rotary_embedding_grad: the backward of rotary_embedding */
#define ANYCHIP_ATTR_ROTARY_EMBEDDING_GRAD_THETA 0  /* the RoPE base: frequency i is theta^(-2i/D) */
#define ANYCHIP_NUM_ATTRS_ROTARY_EMBEDDING_GRAD 1

/*
 * swiglu:          gate[...], up[...] -> y = silu(gate) * up
 * swiglu_grad:     dy, gate, up -> dgate, dup
 */
/* swiglu (fused): silu(gate) * up; inputs gate, up, outputs y */
#define ANYCHIP_NUM_ATTRS_SWIGLU 0
/* swiglu_grad: the backward of swiglu */
#define ANYCHIP_NUM_ATTRS_SWIGLU_GRAD 0

/*
 * w8a8_linear:     x[..., K] float, qweight int8[N, K], scales f32[N, 1], bias[N]?
 *                  -> y[..., N] float.  Each row of x is quantized to int8 on the fly with
 *                  its own scale absmax(row) / 127, the products summed in int32.
 */
/* w8a8_linear (fused): int8 weights x dynamic per-token int8 activations; inputs x, qweight, scales, bias?, outputs y */
#define ANYCHIP_NUM_ATTRS_W8A8_LINEAR 0

/*
 * weight_only_linear: x[..., K] float, qweight, scales f32[N, G], offsets f32[N, G]?,
 *                  bias[N]? (float) -> y[..., N] float; attrs: bits, group_size, has_offsets
 *                  (absent: 0; input 3 is offsets only when it is 1).  y = x W^T + bias with
 *                  W[n, k] = q[n, k] * scales[n, g] + offsets[n, g], g = k / group_size.
 *                  Offsets make a group asymmetric (GGUF Q4_1: scale d, offset m + 8 d);
 *                  weight_quantize never writes them. Group sizes: any divisor of K (the
 *                  GGUF formats use 32).
 *                  Optional 4th attr x_int8 (absent: 0), an approximation for decoding as
 *                  llama.cpp's quantized dot products make: with 1, each row of x is first
 *                  quantized per run of R elements, R = 32 for bits 8 and, for bits 4, the
 *                  largest of 128, 64 and 32 that divides the group size (K for group_size
 *                  -1) (K and group_size multiples of 32, or group_size -1, so that each run
 *                  lies in one group): sx = absmax / 127,
 *                  xq = clamp(round_half_away(x / sx), -127, 127) (sx 0: xq 0), and
 *                  y[n] = sum over runs r of scales[n, g(r)] * sx[r] * sum_{k in r} q[n, k] xq[k]
 *                         + sum_g offsets[n, g] * (sum of x over group g) + bias[n]
 *                  (the integer sums exact, the float sums in any order). Forward only; relative
 *                  error against the exact product ~5e-3 (R 32) to ~7e-3 (R 128) for Gaussian x.
 *                  Optional 5th attr bf16_products (absent: 0; excludes x_int8): with 1, float32
 *                  x is rounded to bfloat16 (to nearest even) for the products, as if x were
 *                  bfloat16, and y stays float32 (where the products run on bfloat16 hardware,
 *                  W's values are rounded to bfloat16 too; the sums are float32). Forward only.
 * weight_only_linear_grad: dy[..., N], qweight, scales, offsets? -> dx[..., K];
 *                  attrs: bits, group_size, has_offsets
 */
/* weight_only_linear (fused): x @ dequant(W)^T, int8/int4 weights (+ group offsets), grad wrt x; inputs x, qweight, scales, offsets?, bias?, outputs y */
#define ANYCHIP_ATTR_WEIGHT_ONLY_LINEAR_BITS 0  /* 8 or 4 */
#define ANYCHIP_ATTR_WEIGHT_ONLY_LINEAR_GROUP_SIZE 1  /* K's group size; -1: one group per channel */
#define ANYCHIP_ATTR_WEIGHT_ONLY_LINEAR_HAS_OFFSETS 2  /* 1: input 3 is offsets (absent: 0) */
#define ANYCHIP_ATTR_WEIGHT_ONLY_LINEAR_X_INT8 3  /* 1: x quantized to int8 per run for the products (inference only) (absent: 0) */
#define ANYCHIP_ATTR_WEIGHT_ONLY_LINEAR_BF16_PRODUCTS 4  /* 1: float32 x rounded to bfloat16 for the products (absent: 0) */
#define ANYCHIP_NUM_ATTRS_WEIGHT_ONLY_LINEAR 5
/* weight_only_linear_grad: the backward of weight_only_linear */
#define ANYCHIP_ATTR_WEIGHT_ONLY_LINEAR_GRAD_BITS 0  /* 8 or 4 */
#define ANYCHIP_ATTR_WEIGHT_ONLY_LINEAR_GRAD_GROUP_SIZE 1  /* K's group size; -1: one group per channel */
#define ANYCHIP_ATTR_WEIGHT_ONLY_LINEAR_GRAD_HAS_OFFSETS 2  /* 1: input 3 is offsets (absent: 0) */
#define ANYCHIP_NUM_ATTRS_WEIGHT_ONLY_LINEAR_GRAD 3

/*
 * weight_quantize: w[K, N] float -> qweight, scales f32[N, G]; attrs: bits, group_size.
 *                  group_size -1 means one group per output channel (G = 1), else
 *                  G = K / group_size. Symmetric: scale = absmax(group) / qmax with
 *                  qmax = 127 (8 bits) or 7 (4 bits), q = clamp(round(w / scale), -qmax, qmax)
 *                  (a zero group gets scale 0 and q 0).
 *                  bits 8: qweight int8[N, K], qweight[n, k] = q.
 *                  bits 4: qweight uint8[N, K/2], K a multiple of 64; each row is a run of
 *                  32-byte blocks, block b holding k = 64b .. 64b+63: byte i has q(64b+i)+8
 *                  in its low nibble and q(64b+32+i)+8 in its high nibble.
 */
/* weight_quantize (fused): symmetric int8/int4 weight packing, per channel or group; inputs w, outputs qweight, scales */
#define ANYCHIP_ATTR_WEIGHT_QUANTIZE_BITS 0  /* 8 or 4 */
#define ANYCHIP_ATTR_WEIGHT_QUANTIZE_GROUP_SIZE 1  /* K's group size; -1: one group per channel */
#define ANYCHIP_NUM_ATTRS_WEIGHT_QUANTIZE 2

/*
 * arange:          -> out[n] (float or int64); attrs: start, step. out[i] = start + i*step
 *                  (computed in double, then converted as cast does)
 */
/* arange (arange): out[i] = start + i * step; out_shape = [n]; inputs none, outputs out */
#define ANYCHIP_ATTR_ARANGE_START 0  /* the first value */
#define ANYCHIP_ATTR_ARANGE_STEP 1  /* the increment */
#define ANYCHIP_NUM_ATTRS_ARANGE 2

/*
 * binary:          x, y -> out (same dtype, float): add, subtract, multiply, divide, maximum,
 *                  minimum (NaN propagates), elementwise_pow; add, subtract, multiply, maximum and
 *                  minimum also take int32/int64 (exact, wrapping on overflow)
 */
/* add (binary): x + y; inputs x, y, outputs out */
#define ANYCHIP_NUM_ATTRS_ADD 0

/* subtract (binary): x - y; inputs x, y, outputs out */
#define ANYCHIP_NUM_ATTRS_SUBTRACT 0

/* multiply (binary): x * y; inputs x, y, outputs out */
#define ANYCHIP_NUM_ATTRS_MULTIPLY 0

/* divide (binary): x / y; inputs x, y, outputs out */
#define ANYCHIP_NUM_ATTRS_DIVIDE 0

/* maximum (binary): max(x, y) (NaN propagates); inputs x, y, outputs out */
#define ANYCHIP_NUM_ATTRS_MAXIMUM 0

/* minimum (binary): min(x, y) (NaN propagates); inputs x, y, outputs out */
#define ANYCHIP_NUM_ATTRS_MINIMUM 0

/* elementwise_pow (binary): x^y; inputs x, y, outputs out */
#define ANYCHIP_NUM_ATTRS_ELEMENTWISE_POW 0

/*
 * cast:            x -> out, any pair of float32/bfloat16/float16/int32/int64/int8/bool; float -> int
 *                  truncates toward zero (NaN -> 0, saturating), -> bool is x != 0
 */
/* cast (cast): x converted to the output's dtype (float -> int truncates toward zero); inputs x, outputs out */
#define ANYCHIP_NUM_ATTRS_CAST 0

/*
 * compare:         x, y (float or int) -> out bool: equal, not_equal, less_than, less_equal,
 *                  greater_than, greater_equal
 */
/* equal (compare): x equal y, a bool; inputs x, y, outputs out */
#define ANYCHIP_NUM_ATTRS_EQUAL 0

/* not_equal (compare): x not equal y, a bool; inputs x, y, outputs out */
#define ANYCHIP_NUM_ATTRS_NOT_EQUAL 0

/* less_than (compare): x less than y, a bool; inputs x, y, outputs out */
#define ANYCHIP_NUM_ATTRS_LESS_THAN 0

/* less_equal (compare): x less equal y, a bool; inputs x, y, outputs out */
#define ANYCHIP_NUM_ATTRS_LESS_EQUAL 0

/* greater_than (compare): x greater than y, a bool; inputs x, y, outputs out */
#define ANYCHIP_NUM_ATTRS_GREATER_THAN 0

/* greater_equal (compare): x greater equal y, a bool; inputs x, y, outputs out */
#define ANYCHIP_NUM_ATTRS_GREATER_EQUAL 0

/*
 * copy:            x -> out (same dtype, any): out = x, both any strides
 */
/* copy (copy): out = x, both any strides (contiguous, transpose, slice, concat, split); inputs x, outputs out */
#define ANYCHIP_NUM_ATTRS_COPY 0

/*
 * cross_entropy_with_softmax: logits[..., V], label int64[..., 1] -> softmax[..., V],
 *                  loss[..., 1]; attrs: ignore_index. loss = logsumexp(logits) - logits[label],
 *                  0 where label == ignore_index; any other label outside [0, V) is an error.
 * cross_entropy_with_softmax_grad: label int64[..., 1], softmax[..., V], dloss[..., 1]
 *                  -> dlogits = (softmax - onehot(label)) * dloss (0 rows at ignore_index)
 */
/* cross_entropy_with_softmax (loss): softmax of logits over the last axis and loss = logsumexp - logits[label] (0 at ignore_index); inputs logits, label, outputs softmax, loss */
#define ANYCHIP_ATTR_CROSS_ENTROPY_WITH_SOFTMAX_IGNORE_INDEX 0  /* a label value whose rows get loss 0 */
#define ANYCHIP_NUM_ATTRS_CROSS_ENTROPY_WITH_SOFTMAX 1

/* cross_entropy_with_softmax_grad (loss): dlogits = (softmax - onehot(label)) * dloss, 0 rows at ignore_index; inputs label, softmax, dloss, outputs dlogits */
#define ANYCHIP_ATTR_CROSS_ENTROPY_WITH_SOFTMAX_GRAD_IGNORE_INDEX 0  /* as the forward */
#define ANYCHIP_NUM_ATTRS_CROSS_ENTROPY_WITH_SOFTMAX_GRAD 1

/*
 * embedding:       ids int64[...], weight[V, C] -> out[..., C]; attrs: padding_idx (-1: none);
 *                  rows of padding_idx are 0; an id outside [0, V) is an error.
 * embedding_grad:  ids int64[...], dout[..., C] -> dweight[V, C]: the scatter-add of dout's
 *                  rows by id, 0 where no id, nothing for padding_idx; attrs: padding_idx
 */
/* embedding (embedding): rows of weight by id; padding_idx rows are 0; inputs ids, weight, outputs out */
#define ANYCHIP_ATTR_EMBEDDING_PADDING_IDX 0  /* an id whose rows are zero; -1: none */
#define ANYCHIP_NUM_ATTRS_EMBEDDING 1

/* embedding_grad (embedding): scatter-add of dout's rows by id (zeros where no id; none for padding_idx); out_shape = weight's; inputs ids, dout, outputs dweight */
#define ANYCHIP_ATTR_EMBEDDING_GRAD_PADDING_IDX 0  /* as the forward */
#define ANYCHIP_NUM_ATTRS_EMBEDDING_GRAD 1

/*
 * fill:            -> out (any dtype); attrs: value (cast to out's dtype as cast does)
 */
/* fill (fill): every element = value (full, full_like, zeros, ones); inputs none, outputs out */
#define ANYCHIP_ATTR_FILL_VALUE 0  /* cast to the output's dtype */
#define ANYCHIP_NUM_ATTRS_FILL 1

/*
 * index_select:    x (float, int or int8), index int64[n] -> out (x's shape, n along axis); attrs:
 *                  axis. Also serves gather. An index outside [0, x.shape[axis]) is an error.
 */
/* index_select (index): x's slices at index along axis (also gather); inputs x, index, outputs out */
#define ANYCHIP_ATTR_INDEX_SELECT_AXIS 0  /* the indexed axis */
#define ANYCHIP_NUM_ATTRS_INDEX_SELECT 1

/*
 * matmul:          x[..., M, K] ([..., K, M] with transpose_x), y[..., K, N] ([..., N, K] with
 *                  transpose_y) -> out[..., M, N]; attrs: transpose_x, transpose_y. x and y
 *                  have out's batch rank and shape, stride 0 on the batch dims they broadcast.
 * matmul_grad:     x, y (as matmul), dout[..., M, N] -> dx, dy; attrs: transpose_x,
 *                  transpose_y. dx and dy are dense with x's and y's own (un-broadcast) shapes,
 *                  of any batch rank up to out's, right-aligned: out batches that map onto one
 *                  dx (dy) batch are summed.
 */
/* matmul (matmul): batched x @ y with transposes and broadcast batch dims; inputs x, y, outputs out */
#define ANYCHIP_ATTR_MATMUL_TRANSPOSE_X 0  /* x is [..., K, M] */
#define ANYCHIP_ATTR_MATMUL_TRANSPOSE_Y 1  /* y is [..., N, K] */
#define ANYCHIP_NUM_ATTRS_MATMUL 2

/* matmul_grad (matmul): dx, dy of matmul, summed over the batch dims x and y broadcast along; inputs x, y, dout, outputs dx, dy */
#define ANYCHIP_ATTR_MATMUL_GRAD_TRANSPOSE_X 0  /* as matmul */
#define ANYCHIP_ATTR_MATMUL_GRAD_TRANSPOSE_Y 1  /* as matmul */
#define ANYCHIP_NUM_ATTRS_MATMUL_GRAD 2

/*
 * sum, mean, max:  x float (any strides) -> out; attrs: keepdim, n, axis_0 .. axis_{n-1}
 *                  (axes >= 0, sorted, distinct; n = 0: all axes). out has x's shape without
 *                  the reduced dims (keepdim 0) or with them as 1 (keepdim 1). Sums accumulate
 *                  in at least float32; mean of nothing is NaN, max of nothing -inf.
 */
/* sum (reduction): sum over axes; inputs x, outputs out */
#define ANYCHIP_ATTR_SUM_KEEPDIM 0  /* 1: reduced dims kept with size 1 */
#define ANYCHIP_ATTR_SUM_N 1  /* the number of axes; 0: all axes */
#define ANYCHIP_ATTR_SUM_AXES 2  /* n axes, >= 0, sorted and distinct (repeated: the rest) */
#define ANYCHIP_NUM_ATTRS_SUM 3

/* mean (reduction): mean over axes; inputs x, outputs out */
#define ANYCHIP_ATTR_MEAN_KEEPDIM 0  /* 1: reduced dims kept with size 1 */
#define ANYCHIP_ATTR_MEAN_N 1  /* the number of axes; 0: all axes */
#define ANYCHIP_ATTR_MEAN_AXES 2  /* n axes, >= 0, sorted and distinct (repeated: the rest) */
#define ANYCHIP_NUM_ATTRS_MEAN 3

/* max (reduction): max over axes; inputs x, outputs out */
#define ANYCHIP_ATTR_MAX_KEEPDIM 0  /* 1: reduced dims kept with size 1 */
#define ANYCHIP_ATTR_MAX_N 1  /* the number of axes; 0: all axes */
#define ANYCHIP_ATTR_MAX_AXES 2  /* n axes, >= 0, sorted and distinct (repeated: the rest) */
#define ANYCHIP_NUM_ATTRS_MAX 3

/*
 * softmax:         x -> out; attrs: axis (negative counts from the end)
 * softmax_grad:    out, dout -> dx = out * (dout - sum(dout * out, axis)); attrs: axis
 */
/* softmax (softmax): softmax along an axis; inputs x, outputs out */
#define ANYCHIP_ATTR_SOFTMAX_AXIS 0  /* the softmax axis (negative counts from the end) */
#define ANYCHIP_NUM_ATTRS_SOFTMAX 1

/* softmax_grad (softmax): dx = out * (dout - sum(dout * out, axis)); inputs out, dout, outputs dx */
#define ANYCHIP_ATTR_SOFTMAX_GRAD_AXIS 0  /* as softmax */
#define ANYCHIP_NUM_ATTRS_SOFTMAX_GRAD 1

/*
 * unary:           x -> out (same dtype, float): exp, log, sqrt, rsqrt, silu, sigmoid, tanh, abs,
 *                  neg, sin, cos (radians); scale (attrs: scale, bias, bias_after_scale: out = scale*x + bias, or
 *                  scale*(x + bias) when bias_after_scale is 0); pow (attrs: factor: out = x^factor)
 */
/* exp (unary): e^x; inputs x, outputs out */
#define ANYCHIP_NUM_ATTRS_EXP 0

/* log (unary): natural log; inputs x, outputs out */
#define ANYCHIP_NUM_ATTRS_LOG 0

/* sqrt (unary): square root; inputs x, outputs out */
#define ANYCHIP_NUM_ATTRS_SQRT 0

/* rsqrt (unary): 1 / sqrt(x); inputs x, outputs out */
#define ANYCHIP_NUM_ATTRS_RSQRT 0

/* silu (unary): x * sigmoid(x); inputs x, outputs out */
#define ANYCHIP_NUM_ATTRS_SILU 0

/* sigmoid (unary): 1 / (1 + e^-x); inputs x, outputs out */
#define ANYCHIP_NUM_ATTRS_SIGMOID 0

/* tanh (unary): hyperbolic tangent; inputs x, outputs out */
#define ANYCHIP_NUM_ATTRS_TANH 0

/* abs (unary): |x|; inputs x, outputs out */
#define ANYCHIP_NUM_ATTRS_ABS 0

/* neg (unary): -x; inputs x, outputs out */
#define ANYCHIP_NUM_ATTRS_NEG 0

/* sin (unary): sine (radians); inputs x, outputs out */
#define ANYCHIP_NUM_ATTRS_SIN 0

/* cos (unary): cosine (radians); inputs x, outputs out */
#define ANYCHIP_NUM_ATTRS_COS 0

/* scale (unary): scale*x + bias (bias_after_scale) or scale*(x + bias); inputs x, outputs out */
#define ANYCHIP_ATTR_SCALE_SCALE 0  /* the factor */
#define ANYCHIP_ATTR_SCALE_BIAS 1  /* the offset */
#define ANYCHIP_ATTR_SCALE_BIAS_AFTER_SCALE 2  /* 1: scale*x + bias, 0: scale*(x + bias) (absent: 1) */
#define ANYCHIP_NUM_ATTRS_SCALE 3

/* pow (unary): x^factor; inputs x, outputs out */
#define ANYCHIP_ATTR_POW_FACTOR 0  /* the exponent */
#define ANYCHIP_NUM_ATTRS_POW 1

/*
 * where:           condition bool, x, y (any dtype) -> out = condition ? x : y
 */
/* where (where): x where condition else y; inputs condition, x, y, outputs out */
#define ANYCHIP_NUM_ATTRS_WHERE 0

#endif /* ANYCHIP_OPS_H_ */
