/*
 * anychip/kernel.h -- the kernel contract: how anychip hands tensors to a plugin's kernel.
 *
 * A kernel is a plain C function over tensor descriptors (AnychipKernelFn). It never sees a
 * framework tensor or header: anychip.ops validates the arguments, allocates the outputs on the
 * device, builds the descriptors and launches the kernel on the current stream. A plugin
 * registers its kernels from Python (hook `anychip_register_kernels`, see anychip.hookspecs).
 *
 * Who checks what
 *   anychip.ops has already checked, before the launch, everything the op table below states:
 *   ranks, shapes, dtypes, the device, attribute ranges. A kernel may therefore assume a valid
 *   call and only check what is specific to it (for example a shape it cannot handle), returning
 *   ANYCHIP_ERROR_UNSUPPORTED with a message in `call->error`.
 *
 * Conventions for every op
 *   - Tensors are dense and row-major (contiguous) unless the op says otherwise; `strides` are
 *     still filled in (in elements) so a kernel can assert it.
 *   - "float" below means the op's compute dtype, one of float32, bfloat16, float16: all float
 *     inputs and outputs of one call share it unless a line names another dtype. Kernels
 *     accumulate in float32 whatever the storage dtype.
 *   - Optional inputs are trailing; `num_inputs` says whether they are present.
 *   - attrs are doubles in the order listed; flags are 0.0 or 1.0.
 *   - Outputs are written completely (no output is assumed zero-filled), except where an op
 *     updates its outputs in place (adamw_step).
 *
 * The ops (kernel name: inputs -> outputs; attrs). B batch, S/Sq/Sk sequence lengths, H heads,
 * D head dim, R rows (all leading dims flattened), N/K output/input features.
 *
 *   rms_norm:        x[..., C], weight[C], residual[..., C]? -> y[..., C], inv_rms f32[R],
 *                    h[..., C] (only with residual; h = x + residual, the normalised input);
 *                    attrs: eps.  y = h * inv_rms * weight, inv_rms = 1/sqrt(mean(h^2) + eps)
 *   rms_norm_grad:   dy[..., C], h[..., C], weight[C], inv_rms f32[R], dh_extra[..., C]?
 *                    -> dh[..., C], dweight[C] (weight's dtype); dh includes dh_extra
 *   rotary_embedding: q[B,S,Hq,D], k[B,S,Hk,D], positions int64[B,S] -> q_out, k_out;
 *                    attrs: theta.  Half-rotation (Llama/NeoX) layout: for i < D/2,
 *                    f = pos * theta^(-2i/D) (float32), (a, b) = (x[i], x[i + D/2]),
 *                    out[i] = a cos f - b sin f, out[i + D/2] = b cos f + a sin f
 *   rotary_embedding_grad: dq_out, dk_out, positions -> dq, dk; attrs: theta (rotation by -f)
 *   swiglu:          gate[...], up[...] -> y = silu(gate) * up
 *   swiglu_grad:     dy, gate, up -> dgate, dup
 *   attention:       q[B,Sq,Hq,D], k[B,Sk,Hk,D], v[B,Sk,Hk,D], mask bool[B|1, Hq|1, Sq, Sk]?
 *                    -> o[B,Sq,Hq,D], lse f32[B,Hq,Sq]; attrs: scale, causal.
 *                    Hq is a multiple of Hk; query head h reads kv head h / (Hq / Hk).
 *                    Key j is visible to query i when mask[i, j] is true (if given) and, if
 *                    causal, j <= i + Sk - Sq (bottom-right aligned, as with a KV cache).
 *                    A query row that sees no key gets o = 0 and lse = -inf.
 *   attention_grad:  do, q, k, v, o, lse, mask? -> dq, dk, dv; attrs: scale, causal
 *   flashmask_attention: q, k, v as attention, startend_row_indices int32[B, Hm, Sk, E]
 *                    with Hm in {1, Hk, Hq} and E in {1, 2, 4} -> o, lse; attrs: scale, causal.
 *                    Column j of the mask for query head h is row (h * Hm / Hq) of dim 1.
 *                    Query row i is hidden from key j when (causal and j > i + Sk - Sq) or
 *                      E=1 (causal only):      i >= LTS[j]
 *                      E=2, causal:            LTS[j] <= i < LTE[j]
 *                      E=2, not causal:        i >= LTS[j] or i < UTE[j]
 *                      E=4 (not causal only):  LTS[j] <= i < LTE[j] or UTS[j] <= i < UTE[j]
 *                    (the columns of dim 3 are, in order, LTS, then LTE or UTE for E=2, and
 *                    LTS, LTE, UTS, UTE for E=4). Every index lies in [0, Sq].
 *                    Must equal `attention` with the equivalent dense mask bit for bit.
 *   flashmask_attention_grad: do, q, k, v, o, lse, startend_row_indices -> dq, dk, dv
 *   linear:          x[..., K], weight[N, K], bias[N]? -> y[..., N]; attrs: compute.
 *                    y = x W^T + bias. compute (an AnychipDtype; absent: the tensors' dtype) is
 *                    the dtype of the products: the tensors' dtype, or bfloat16 for float32
 *                    tensors (mixed precision: x, weight and dy are rounded to bfloat16, nearest
 *                    even, for the products only; sums and every output stay float32).
 *   linear_grad:     dy[..., N], x[..., K], weight[N, K] -> dx[..., K], dweight[N, K], dbias[N]?
 *                    (dbias only where bias needs a gradient); attrs: needs_dx, needs_dweight
 *                    (absent: 1), compute (as linear). dx = dy W, dweight = dy^T x and dbias =
 *                    the sum of dy (unrounded), both over all rows. An output whose flag is 0 is
 *                    not written: the caller may pass a tensor with no elements in its place.
 *   weight_quantize: w[K, N] float -> qweight, scales f32[N, G]; attrs: bits, group_size.
 *                    group_size -1 means one group per output channel (G = 1), else
 *                    G = K / group_size. Symmetric: scale = absmax(group) / qmax with
 *                    qmax = 127 (8 bits) or 7 (4 bits), q = clamp(round(w / scale), -qmax, qmax)
 *                    (a zero group gets scale 0 and q 0).
 *                    bits 8: qweight int8[N, K], qweight[n, k] = q.
 *                    bits 4: qweight uint8[N, K/2], K a multiple of 64; each row is a run of
 *                    32-byte blocks, block b holding k = 64b .. 64b+63: byte i has q(64b+i)+8
 *                    in its low nibble and q(64b+32+i)+8 in its high nibble.
 *   weight_only_linear: x[..., K] float, qweight, scales f32[N, G], offsets f32[N, G]?,
 *                    bias[N]? (float) -> y[..., N] float; attrs: bits, group_size, has_offsets
 *                    (absent: 0; input 3 is offsets only when it is 1).  y = x W^T + bias with
 *                    W[n, k] = q[n, k] * scales[n, g] + offsets[n, g], g = k / group_size.
 *                    Offsets make a group asymmetric (GGUF Q4_1: scale d, offset m + 8 d);
 *                    weight_quantize never writes them. Group sizes: any divisor of K (the
 *                    GGUF formats use 32).
 *                    Optional 4th attr x_int8 (absent: 0), an approximation for decoding as
 *                    llama.cpp's quantized dot products make: with 1, each row of x is first
 *                    quantized per run of R elements, R = 32 for bits 8 and, for bits 4, the
 *                    largest of 128, 64 and 32 that divides the group size (K for group_size
 *                    -1) (K and group_size multiples of 32, or group_size -1, so that each run
 *                    lies in one group): sx = absmax / 127,
 *                    xq = clamp(round_half_away(x / sx), -127, 127) (sx 0: xq 0), and
 *                    y[n] = sum over runs r of scales[n, g(r)] * sx[r] * sum_{k in r} q[n, k] xq[k]
 *                           + sum_g offsets[n, g] * (sum of x over group g) + bias[n]
 *                    (the integer sums exact, the float sums in any order). Forward only; relative
 *                    error against the exact product ~5e-3 (R 32) to ~7e-3 (R 128) for Gaussian x.
 *                    Optional 5th attr bf16_products (absent: 0; excludes x_int8): with 1, float32
 *                    x is rounded to bfloat16 (to nearest even) for the products, as if x were
 *                    bfloat16, and y stays float32 (where the products run on bfloat16 hardware,
 *                    W's values are rounded to bfloat16 too; the sums are float32). Forward only.
 *   weight_only_linear_grad: dy[..., N], qweight, scales, offsets? -> dx[..., K];
 *                    attrs: bits, group_size, has_offsets
 *   w8a8_linear:     x[..., K] float, qweight int8[N, K], scales f32[N, 1], bias[N]?
 *                    -> y[..., N] float.  Each row of x is quantized to int8 on the fly with
 *                    its own scale absmax(row) / 127, the products summed in int32.
 *   decoder_step:    one new token per sequence through L pre-norm decoder layers of the Llama
 *                    family (RMSNorm, RoPE, grouped-query attention over a KV cache, SwiGLU MLP),
 *                    then the final norm and the output projection: the decode step of
 *                    generation in one launch. float32 activations; the KV cache float32,
 *                    bfloat16 or float16 (the dtype the op is registered under).
 *                    inputs: x f32[B, C] (the embedded tokens), positions int64[B] (the position
 *                    of each sequence's token, which is also its cache slot); cache_rows
 *                    int64[B] (only when has_cache_rows is 1: the distinct cache row of each
 *                    sequence; else sequence b uses row b and R = B) or block_tables int64[B, W]
 *                    (only when has_cache_rows is 2: a paged cache, below); per layer, in
 *                    order: attn_norm[C], LIN qkv (N = (Hq + 2 Hk) D, K = C: rows of q, then k,
 *                    then v), qkv_bias[(Hq + 2 Hk) D] (only when has_qkv_bias), LIN o (N = C,
 *                    K = Hq D), ffn_norm[C], LIN gate_up (N = 2 F, K = C: gate rows, then up
 *                    rows), LIN down (N = C, K = F); then final_norm[C] and LIN head (N = V,
 *                    K = C). A LIN is one input, a float32 weight W[N, K] (bits 0) or a
 *                    bfloat16 one (bits 16; K a multiple of 32: the LIN takes its input rounded to
 *                    bfloat16 and sums in float32, and a row's result must not depend on B), or
 *                    the 2 or 3 inputs qweight, scales, offsets? of weight_only_linear.
 *                    outputs: logits f32[B, V]; k_cache, v_cache [L, R, S, Hk, D] of one float
 *                    dtype, updated in place: for every layer, slot positions[b] of sequence b's
 *                    row is written (rounded to the cache's dtype, to nearest even) before the
 *                    attention of that layer reads slots [0, positions[b]] (pos < S); the new
 *                    token's own k and v take part as the cache holds them, rounded.
 *                    attrs: L, Hq, Hk, D, F, eps, theta, has_qkv_bias, then (bits, group_size,
 *                    has_offsets) for each LIN kind in the order qkv, o, gate_up, down, head
 *                    (every layer shares the formats); then optionally x_int8 (absent: 0): the
 *                    quantized LINs take x as weight_only_linear does with x_int8 = 1; then
 *                    optionally has_cache_rows (absent: 0), which lets a batch of B sequences
 *                    decode in any B of R cache rows (continuous batching: rows come and go),
 *                    or with 2 makes the cache paged (vLLM's PagedAttention): its R rows are
 *                    blocks of S slots shared by all sequences, and slot j of sequence b is
 *                    slot j % S of block block_tables[b, j / S] (positions[b] < W S; the blocks
 *                    of slots 0 .. positions[b] must be in [0, R); sequences may share blocks
 *                    they only read, but no two write one slot);
 *                    then optionally part (absent: 0, the whole step) and layer, which run one
 *                    part of it from h = x: part 1, layer `layer`'s attention half (its cache
 *                    slot written as below), output o W_o^T [B, C] in place of the logits,
 *                    without the residual add; part 2, that layer's MLP half, output
 *                    (silu(g) * u) W_down^T [B, C]; part 3, the final norm and head, logits
 *                    [B, V]. Every layer's inputs are passed whatever the part. (A
 *                    tensor-parallel rank decodes so: its weights are its heads' and inner
 *                    features' share, and the ranks' sum of each half joins h between launches.)
 *                    Math per layer (h the residual stream, starting at x): a = rms_norm(h) *
 *                    attn_norm (eps); q, k, v = split(a W_qkv^T + qkv_bias); RoPE on q and k as
 *                    rotary_embedding with theta at positions[b]; cache slot written; o =
 *                    attention(q, cache[0 .. pos], scale 1/sqrt(D)); h += o W_o^T; m =
 *                    rms_norm(h) * ffn_norm; g, u = split(m W_gate_up^T); h += (silu(g) * u)
 *                    W_down^T. logits = (rms_norm(h) * final_norm) W_head^T. Results must not
 *                    depend on the number of threads.
 *   adamw_step:      grads g_0..g_{n-1} -> params p_0..p_{n-1}, m_0..m_{n-1}, v_0..v_{n-1}
 *                    updated in place (m, v float32; p and g share a float dtype);
 *                    attrs: lr, beta1, beta2, eps, weight_decay, step (1-based).
 *                    p -= lr * weight_decay * p; m = b1 m + (1 - b1) g; v = b2 v + (1 - b2) g^2;
 *                    p -= lr * (m / (1 - b1^step)) / (sqrt(v / (1 - b2^step)) + eps)
 *
 * ---- Base ops (anychip.ops.base declares each: signature, dtypes, shape rule, reference) --------
 * The operator set that lets Paddle's own ops run on a chip (the Paddle kernel bridge routes them
 * here). "float" as above; int = int32 or int64; bool is 1 byte (0 or 1). Differences from the
 * conventions above:
 *   - ELEMENTWISE ops (unary, binary, compare, where, cast, fill, copy): the caller broadcasts.
 *     Every input has the OUTPUT's rank and shape, with stride 0 on broadcast dims and any
 *     strides otherwise (inputs may be strided views). Rank 0 and empty tensors are allowed.
 *     Outputs are dense, except copy's, which may be a strided view (write only what it addresses).
 *   - sum/mean/max read x with any strides; matmul/matmul_grad read x, y, dout with any strides.
 *     Every other input is dense.
 *   - The registered dtype is the input's (cast: the INPUT's; fill, arange: the output's;
 *     embedding: weight's; the *_grad ops: their float inputs').
 *   - Results must not depend on the number of threads.
 *
 *   unary:           x -> out (same dtype, float): exp, log, sqrt, rsqrt, silu, sigmoid, tanh, abs,
 *                    neg, sin, cos (radians); scale (attrs: scale, bias, bias_after_scale: out = scale*x + bias, or
 *                    scale*(x + bias) when bias_after_scale is 0); pow (attrs: factor: out = x^factor)
 *   binary:          x, y -> out (same dtype, float): add, subtract, multiply, divide, maximum,
 *                    minimum (NaN propagates), elementwise_pow; add, subtract, multiply, maximum and
 *                    minimum also take int32/int64 (exact, wrapping on overflow)
 *   compare:         x, y (float or int) -> out bool: equal, not_equal, less_than, less_equal,
 *                    greater_than, greater_equal
 *   where:           condition bool, x, y (any dtype) -> out = condition ? x : y
 *   cast:            x -> out, any pair of float32/bfloat16/float16/int32/int64/int8/bool; float -> int
 *                    truncates toward zero (NaN -> 0, saturating), -> bool is x != 0
 *   fill:            -> out (any dtype); attrs: value (cast to out's dtype as cast does)
 *   copy:            x -> out (same dtype, any): out = x, both any strides
 *   sum, mean, max:  x float (any strides) -> out; attrs: keepdim, n, axis_0 .. axis_{n-1}
 *                    (axes >= 0, sorted, distinct; n = 0: all axes). out has x's shape without
 *                    the reduced dims (keepdim 0) or with them as 1 (keepdim 1). Sums accumulate
 *                    in at least float32; mean of nothing is NaN, max of nothing -inf.
 *   softmax:         x -> out; attrs: axis (negative counts from the end)
 *   softmax_grad:    out, dout -> dx = out * (dout - sum(dout * out, axis)); attrs: axis
 *   cross_entropy_with_softmax: logits[..., V], label int64[..., 1] -> softmax[..., V],
 *                    loss[..., 1]; attrs: ignore_index. loss = logsumexp(logits) - logits[label],
 *                    0 where label == ignore_index; any other label outside [0, V) is an error.
 *   cross_entropy_with_softmax_grad: label int64[..., 1], softmax[..., V], dloss[..., 1]
 *                    -> dlogits = (softmax - onehot(label)) * dloss (0 rows at ignore_index)
 *   embedding:       ids int64[...], weight[V, C] -> out[..., C]; attrs: padding_idx (-1: none);
 *                    rows of padding_idx are 0; an id outside [0, V) is an error.
 *   embedding_grad:  ids int64[...], dout[..., C] -> dweight[V, C]: the scatter-add of dout's
 *                    rows by id, 0 where no id, nothing for padding_idx; attrs: padding_idx
 *   index_select:    x (float, int or int8), index int64[n] -> out (x's shape, n along axis); attrs:
 *                    axis. Also serves gather. An index outside [0, x.shape[axis]) is an error.
 *   arange:          -> out[n] (float or int64); attrs: start, step. out[i] = start + i*step
 *                    (computed in double, then converted as cast does)
 *   matmul:          x[..., M, K] ([..., K, M] with transpose_x), y[..., K, N] ([..., N, K] with
 *                    transpose_y) -> out[..., M, N]; attrs: transpose_x, transpose_y. x and y
 *                    have out's batch rank and shape, stride 0 on the batch dims they broadcast.
 *   matmul_grad:     x, y (as matmul), dout[..., M, N] -> dx, dy; attrs: transpose_x,
 *                    transpose_y. dx and dy are dense with x's and y's own (un-broadcast) shapes,
 *                    of any batch rank up to out's, right-aligned: out batches that map onto one
 *                    dx (dy) batch are summed.
 *
 * Versioning: as in device.h, structs grow only at the end and carry their size.
 */
#ifndef ANYCHIP_KERNEL_H_
#define ANYCHIP_KERNEL_H_

#include <stddef.h>
#include <stdint.h>

#include "anychip/device.h"

#ifdef __cplusplus
extern "C" {
#endif

#define ANYCHIP_KERNEL_ABI_VERSION 1
#define ANYCHIP_MAX_RANK 8

/* One tensor as a kernel sees it. Filled by anychip; read-only to the kernel. */
typedef struct AnychipTensor {
  void* data;                        /* first element (a view's offset already applied) */
  int32_t dtype;                     /* AnychipDtype */
  int32_t rank;                      /* 0 .. ANYCHIP_MAX_RANK */
  int64_t shape[ANYCHIP_MAX_RANK];
  int64_t strides[ANYCHIP_MAX_RANK]; /* in elements, not bytes */
  int32_t device;                    /* device index on the op's device type */
  int32_t reserved;
} AnychipTensor;

/* One launch. Filled by anychip; the kernel writes only `error`. */
typedef struct AnychipKernelCall {
  size_t struct_size;                /* sizeof(AnychipKernelCall) of the caller */
  const AnychipTensor* inputs;
  int32_t num_inputs;
  int32_t num_outputs;
  const AnychipTensor* outputs;      /* the data they point to is the kernel's to write */
  const double* attrs;
  int32_t num_attrs;
  int32_t num_threads;               /* host threads the kernel may use; 0: its own default */
  AnychipStream stream;              /* the stream the launch is ordered on (NULL: host-synchronous) */
  char* error;                       /* on failure, a NUL-terminated message (may be NULL) */
  size_t error_size;
  void* reserved[8];
} AnychipKernelCall;

/* A kernel. Returns ANYCHIP_OK, or an error with a message in call->error. It must not keep
 * pointers from `call` after it returns. */
typedef AnychipStatus (*AnychipKernelFn)(const AnychipKernelCall* call);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* ANYCHIP_KERNEL_H_ */
