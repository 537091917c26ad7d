/*
 * anychip/ops.h -- GENERATED from the op definitions (anychip/ops/defs/) by
 * `python -m anychip.ops.c_header`: do not edit.
 *
 * Each op's attributes by name: ANYCHIP_ATTR_<OP>_<ATTR> is the attribute's index in
 * AnychipKernelCall.attrs (anychip/kernel.h) and ANYCHIP_NUM_ATTRS_<OP> their number. Trailing
 * attributes with a default may be absent (num_attrs says how many were passed). A fused op's
 * backward kernel has attributes of its own, under its own name.
 */
#ifndef ANYCHIP_OPS_H_
#define ANYCHIP_OPS_H_

/* adamw_step (fused): fused AdamW over a list of parameters (in place)
 *   inputs: grads...; outputs: params..., moments1..., moments2... */
#define ANYCHIP_ATTR_ADAMW_STEP_LR 0  /* the learning rate */
#define ANYCHIP_ATTR_ADAMW_STEP_BETA1 1  /* the first moment's decay */
#define ANYCHIP_ATTR_ADAMW_STEP_BETA2 2  /* the second moment's decay */
#define ANYCHIP_ATTR_ADAMW_STEP_EPS 3  /* added to the denominator */
#define ANYCHIP_ATTR_ADAMW_STEP_WEIGHT_DECAY 4  /* decoupled, times lr */
#define ANYCHIP_ATTR_ADAMW_STEP_STEP 5  /* 1-based, for the bias corrections */
#define ANYCHIP_NUM_ATTRS_ADAMW_STEP 6

/* attention (fused): flash attention, GQA, causal/bool mask, returns LSE
 *   inputs: q, k, v, mask?; outputs: o, lse */
#define ANYCHIP_ATTR_ATTENTION_SCALE 0  /* the logits' factor (usually 1/sqrt(D)) */
#define ANYCHIP_ATTR_ATTENTION_CAUSAL 1  /* 1: key j is hidden from query i when j > i + Sk - Sq */
#define ANYCHIP_NUM_ATTRS_ATTENTION 2
/* attention_grad: the backward of attention */
#define ANYCHIP_ATTR_ATTENTION_GRAD_SCALE 0  /* the logits' factor (usually 1/sqrt(D)) */
#define ANYCHIP_ATTR_ATTENTION_GRAD_CAUSAL 1  /* 1: key j is hidden from query i when j > i + Sk - Sq */
#define ANYCHIP_NUM_ATTRS_ATTENTION_GRAD 2

/* decoder_step (fused): a Llama-family decode step in one launch, KV cache in place (dtype: the cache's)
 *   inputs: x, positions, cache_rows?, weights...; outputs: logits, k_cache, v_cache */
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
#define ANYCHIP_NUM_ATTRS_DECODER_STEP 27

/* flashmask_attention (fused): FlashMask column-sparse masked attention
 *   inputs: q, k, v, startend_row_indices; outputs: o, lse */
#define ANYCHIP_ATTR_FLASHMASK_ATTENTION_SCALE 0  /* the logits' factor (usually 1/sqrt(D)) */
#define ANYCHIP_ATTR_FLASHMASK_ATTENTION_CAUSAL 1  /* 1: key j is hidden from query i when j > i + Sk - Sq */
#define ANYCHIP_NUM_ATTRS_FLASHMASK_ATTENTION 2
/* flashmask_attention_grad: the backward of flashmask_attention */
#define ANYCHIP_ATTR_FLASHMASK_ATTENTION_GRAD_SCALE 0  /* the logits' factor (usually 1/sqrt(D)) */
#define ANYCHIP_ATTR_FLASHMASK_ATTENTION_GRAD_CAUSAL 1  /* 1: key j is hidden from query i when j > i + Sk - Sq */
#define ANYCHIP_NUM_ATTRS_FLASHMASK_ATTENTION_GRAD 2

/* linear (fused): float linear y = x W^T + b, fwd+bwd
 *   inputs: x, weight, bias?; outputs: y */
#define ANYCHIP_ATTR_LINEAR_COMPUTE 0  /* the products' dtype (an AnychipDtype); absent: the tensors' dtype (may be absent) */
#define ANYCHIP_NUM_ATTRS_LINEAR 1
/* linear_grad: the backward of linear */
#define ANYCHIP_ATTR_LINEAR_GRAD_NEEDS_DX 0  /* 0: dx is not written (absent: 1) */
#define ANYCHIP_ATTR_LINEAR_GRAD_NEEDS_DWEIGHT 1  /* 0: dweight is not written (absent: 1) */
#define ANYCHIP_ATTR_LINEAR_GRAD_COMPUTE 2  /* the products' dtype (an AnychipDtype); absent: the tensors' dtype (may be absent) */
#define ANYCHIP_NUM_ATTRS_LINEAR_GRAD 3

/* rms_norm (fused): RMSNorm, optionally fused with the residual add
 *   inputs: x, weight, residual?; outputs: y, inv_rms, h? */
#define ANYCHIP_ATTR_RMS_NORM_EPS 0  /* added to mean(h^2) before the square root */
#define ANYCHIP_NUM_ATTRS_RMS_NORM 1
/* rms_norm_grad: the backward of rms_norm */
#define ANYCHIP_NUM_ATTRS_RMS_NORM_GRAD 0

/* rotary_embedding (fused): RoPE, half-rotation layout, per-token positions
 *   inputs: q, k, positions; outputs: q_out, k_out */
#define ANYCHIP_ATTR_ROTARY_EMBEDDING_THETA 0  /* the RoPE base: frequency i is theta^(-2i/D) */
#define ANYCHIP_NUM_ATTRS_ROTARY_EMBEDDING 1
/* rotary_embedding_grad: the backward of rotary_embedding */
#define ANYCHIP_ATTR_ROTARY_EMBEDDING_GRAD_THETA 0  /* the RoPE base: frequency i is theta^(-2i/D) */
#define ANYCHIP_NUM_ATTRS_ROTARY_EMBEDDING_GRAD 1

/* swiglu (fused): silu(gate) * up
 *   inputs: gate, up; outputs: y */
#define ANYCHIP_NUM_ATTRS_SWIGLU 0
/* swiglu_grad: the backward of swiglu */
#define ANYCHIP_NUM_ATTRS_SWIGLU_GRAD 0

/* w8a8_linear (fused): int8 weights x dynamic per-token int8 activations
 *   inputs: x, qweight, scales, bias?; outputs: y */
#define ANYCHIP_NUM_ATTRS_W8A8_LINEAR 0

/* weight_only_linear (fused): x @ dequant(W)^T, int8/int4 weights (+ group offsets), grad wrt x
 *   inputs: x, qweight, scales, offsets?, bias?; outputs: y */
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

/* weight_quantize (fused): symmetric int8/int4 weight packing, per channel or group
 *   inputs: w; outputs: qweight, scales */
#define ANYCHIP_ATTR_WEIGHT_QUANTIZE_BITS 0  /* 8 or 4 */
#define ANYCHIP_ATTR_WEIGHT_QUANTIZE_GROUP_SIZE 1  /* K's group size; -1: one group per channel */
#define ANYCHIP_NUM_ATTRS_WEIGHT_QUANTIZE 2

/* arange (arange): out[i] = start + i * step; out_shape = [n]
 *   inputs: none; outputs: out */
#define ANYCHIP_ATTR_ARANGE_START 0  /* the first value */
#define ANYCHIP_ATTR_ARANGE_STEP 1  /* the increment */
#define ANYCHIP_NUM_ATTRS_ARANGE 2

/* add (binary): x + y
 *   inputs: x, y; outputs: out */
#define ANYCHIP_NUM_ATTRS_ADD 0

/* subtract (binary): x - y
 *   inputs: x, y; outputs: out */
#define ANYCHIP_NUM_ATTRS_SUBTRACT 0

/* multiply (binary): x * y
 *   inputs: x, y; outputs: out */
#define ANYCHIP_NUM_ATTRS_MULTIPLY 0

/* divide (binary): x / y
 *   inputs: x, y; outputs: out */
#define ANYCHIP_NUM_ATTRS_DIVIDE 0

/* maximum (binary): max(x, y) (NaN propagates)
 *   inputs: x, y; outputs: out */
#define ANYCHIP_NUM_ATTRS_MAXIMUM 0

/* minimum (binary): min(x, y) (NaN propagates)
 *   inputs: x, y; outputs: out */
#define ANYCHIP_NUM_ATTRS_MINIMUM 0

/* elementwise_pow (binary): x^y
 *   inputs: x, y; outputs: out */
#define ANYCHIP_NUM_ATTRS_ELEMENTWISE_POW 0

/* cast (cast): x converted to the output's dtype (float -> int truncates toward zero)
 *   inputs: x; outputs: out */
#define ANYCHIP_NUM_ATTRS_CAST 0

/* equal (compare): x equal y, a bool
 *   inputs: x, y; outputs: out */
#define ANYCHIP_NUM_ATTRS_EQUAL 0

/* not_equal (compare): x not equal y, a bool
 *   inputs: x, y; outputs: out */
#define ANYCHIP_NUM_ATTRS_NOT_EQUAL 0

/* less_than (compare): x less than y, a bool
 *   inputs: x, y; outputs: out */
#define ANYCHIP_NUM_ATTRS_LESS_THAN 0

/* less_equal (compare): x less equal y, a bool
 *   inputs: x, y; outputs: out */
#define ANYCHIP_NUM_ATTRS_LESS_EQUAL 0

/* greater_than (compare): x greater than y, a bool
 *   inputs: x, y; outputs: out */
#define ANYCHIP_NUM_ATTRS_GREATER_THAN 0

/* greater_equal (compare): x greater equal y, a bool
 *   inputs: x, y; outputs: out */
#define ANYCHIP_NUM_ATTRS_GREATER_EQUAL 0

/* copy (copy): out = x, both any strides (contiguous, transpose, slice, concat, split)
 *   inputs: x; outputs: out */
#define ANYCHIP_NUM_ATTRS_COPY 0

/* cross_entropy_with_softmax (loss): softmax of logits over the last axis and loss = logsumexp - logits[label] (0 at ignore_index)
 *   inputs: logits, label; outputs: softmax, loss */
#define ANYCHIP_ATTR_CROSS_ENTROPY_WITH_SOFTMAX_IGNORE_INDEX 0  /* a label value whose rows get loss 0 */
#define ANYCHIP_NUM_ATTRS_CROSS_ENTROPY_WITH_SOFTMAX 1

/* cross_entropy_with_softmax_grad (loss): dlogits = (softmax - onehot(label)) * dloss, 0 rows at ignore_index
 *   inputs: label, softmax, dloss; outputs: dlogits */
#define ANYCHIP_ATTR_CROSS_ENTROPY_WITH_SOFTMAX_GRAD_IGNORE_INDEX 0  /* as the forward */
#define ANYCHIP_NUM_ATTRS_CROSS_ENTROPY_WITH_SOFTMAX_GRAD 1

/* embedding (embedding): rows of weight by id; padding_idx rows are 0
 *   inputs: ids, weight; outputs: out */
#define ANYCHIP_ATTR_EMBEDDING_PADDING_IDX 0  /* an id whose rows are zero; -1: none */
#define ANYCHIP_NUM_ATTRS_EMBEDDING 1

/* embedding_grad (embedding): scatter-add of dout's rows by id (zeros where no id; none for padding_idx); out_shape = weight's
 *   inputs: ids, dout; outputs: dweight */
#define ANYCHIP_ATTR_EMBEDDING_GRAD_PADDING_IDX 0  /* as the forward */
#define ANYCHIP_NUM_ATTRS_EMBEDDING_GRAD 1

/* fill (fill): every element = value (full, full_like, zeros, ones)
 *   inputs: none; outputs: out */
#define ANYCHIP_ATTR_FILL_VALUE 0  /* cast to the output's dtype */
#define ANYCHIP_NUM_ATTRS_FILL 1

/* index_select (index): x's slices at index along axis (also gather)
 *   inputs: x, index; outputs: out */
#define ANYCHIP_ATTR_INDEX_SELECT_AXIS 0  /* the indexed axis */
#define ANYCHIP_NUM_ATTRS_INDEX_SELECT 1

/* matmul (matmul): batched x @ y with transposes and broadcast batch dims
 *   inputs: x, y; outputs: out */
#define ANYCHIP_ATTR_MATMUL_TRANSPOSE_X 0  /* x is [..., K, M] */
#define ANYCHIP_ATTR_MATMUL_TRANSPOSE_Y 1  /* y is [..., N, K] */
#define ANYCHIP_NUM_ATTRS_MATMUL 2

/* matmul_grad (matmul): dx, dy of matmul, summed over the batch dims x and y broadcast along
 *   inputs: x, y, dout; outputs: dx, dy */
#define ANYCHIP_ATTR_MATMUL_GRAD_TRANSPOSE_X 0  /* as matmul */
#define ANYCHIP_ATTR_MATMUL_GRAD_TRANSPOSE_Y 1  /* as matmul */
#define ANYCHIP_NUM_ATTRS_MATMUL_GRAD 2

/* sum (reduction): sum over axes
 *   inputs: x; outputs: out */
#define ANYCHIP_ATTR_SUM_KEEPDIM 0  /* 1: reduced dims kept with size 1 */
#define ANYCHIP_ATTR_SUM_N 1  /* the number of axes; 0: all axes */
#define ANYCHIP_ATTR_SUM_AXES 2  /* n axes, >= 0, sorted and distinct (repeated: the rest) */
#define ANYCHIP_NUM_ATTRS_SUM 3

/* mean (reduction): mean over axes
 *   inputs: x; outputs: out */
#define ANYCHIP_ATTR_MEAN_KEEPDIM 0  /* 1: reduced dims kept with size 1 */
#define ANYCHIP_ATTR_MEAN_N 1  /* the number of axes; 0: all axes */
#define ANYCHIP_ATTR_MEAN_AXES 2  /* n axes, >= 0, sorted and distinct (repeated: the rest) */
#define ANYCHIP_NUM_ATTRS_MEAN 3

/* max (reduction): max over axes
 *   inputs: x; outputs: out */
#define ANYCHIP_ATTR_MAX_KEEPDIM 0  /* 1: reduced dims kept with size 1 */
#define ANYCHIP_ATTR_MAX_N 1  /* the number of axes; 0: all axes */
#define ANYCHIP_ATTR_MAX_AXES 2  /* n axes, >= 0, sorted and distinct (repeated: the rest) */
#define ANYCHIP_NUM_ATTRS_MAX 3

/* softmax (softmax): softmax along an axis
 *   inputs: x; outputs: out */
#define ANYCHIP_ATTR_SOFTMAX_AXIS 0  /* the softmax axis (negative counts from the end) */
#define ANYCHIP_NUM_ATTRS_SOFTMAX 1

/* softmax_grad (softmax): dx = out * (dout - sum(dout * out, axis))
 *   inputs: out, dout; outputs: dx */
#define ANYCHIP_ATTR_SOFTMAX_GRAD_AXIS 0  /* as softmax */
#define ANYCHIP_NUM_ATTRS_SOFTMAX_GRAD 1

/* exp (unary): e^x
 *   inputs: x; outputs: out */
#define ANYCHIP_NUM_ATTRS_EXP 0

/* log (unary): natural log
 *   inputs: x; outputs: out */
#define ANYCHIP_NUM_ATTRS_LOG 0

/* sqrt (unary): square root
 *   inputs: x; outputs: out */
#define ANYCHIP_NUM_ATTRS_SQRT 0

/* rsqrt (unary): 1 / sqrt(x)
 *   inputs: x; outputs: out */
#define ANYCHIP_NUM_ATTRS_RSQRT 0

/* silu (unary): x * sigmoid(x)
 *   inputs: x; outputs: out */
#define ANYCHIP_NUM_ATTRS_SILU 0

/* sigmoid (unary): 1 / (1 + e^-x)
 *   inputs: x; outputs: out */
#define ANYCHIP_NUM_ATTRS_SIGMOID 0

/* tanh (unary): hyperbolic tangent
 *   inputs: x; outputs: out */
#define ANYCHIP_NUM_ATTRS_TANH 0

/* abs (unary): |x|
 *   inputs: x; outputs: out */
#define ANYCHIP_NUM_ATTRS_ABS 0

/* neg (unary): -x
 *   inputs: x; outputs: out */
#define ANYCHIP_NUM_ATTRS_NEG 0

/* sin (unary): sine (radians)
 *   inputs: x; outputs: out */
#define ANYCHIP_NUM_ATTRS_SIN 0

/* cos (unary): cosine (radians)
 *   inputs: x; outputs: out */
#define ANYCHIP_NUM_ATTRS_COS 0

/* scale (unary): scale*x + bias (bias_after_scale) or scale*(x + bias)
 *   inputs: x; outputs: out */
#define ANYCHIP_ATTR_SCALE_SCALE 0  /* the factor */
#define ANYCHIP_ATTR_SCALE_BIAS 1  /* the offset */
#define ANYCHIP_ATTR_SCALE_BIAS_AFTER_SCALE 2  /* 1: scale*x + bias, 0: scale*(x + bias) (absent: 1) */
#define ANYCHIP_NUM_ATTRS_SCALE 3

/* pow (unary): x^factor
 *   inputs: x; outputs: out */
#define ANYCHIP_ATTR_POW_FACTOR 0  /* the exponent */
#define ANYCHIP_NUM_ATTRS_POW 1

/* where (where): x where condition else y
 *   inputs: condition, x, y; outputs: out */
#define ANYCHIP_NUM_ATTRS_WHERE 0

#endif /* ANYCHIP_OPS_H_ */
