"""anychip's LLM ops. Each validates its arguments, then runs the kernel that the tensors'
device registered for their dtype, or its reference implementation as a counted fallback.
Every op, fused or base, is defined once in ``anychip.ops.defs`` (``definitions()``).

    import anychip.ops as ops
    y = ops.rms_norm(x, w, eps=1e-5)
    o = ops.attention(q, k, v, causal=True)
"""

from . import masks
from .attention import attention, flashmask_attention, flashmask_dense_mask, reference_attention
from .checks import OpArgumentError
from .decoder import DecoderLayer, DecoderWeights, Linear, decoder_step
from .dispatch import KernelError
from .linear import linear
from .norm import rms_norm
from .optim import adamw_step
from .quant import WeightOnlyLinear, dequantize, w8a8_linear, weight_only_linear, weight_quantize
from .rotary import rotary_embedding
from .defs import BASE_OPS, definition, definitions
from .support import OPS, support_table
from .swiglu import swiglu

__all__ = [
    "BASE_OPS", "OPS", "DecoderLayer", "DecoderWeights", "KernelError", "Linear", "OpArgumentError", "WeightOnlyLinear",
    "adamw_step", "attention", "decoder_step", "definition", "definitions", "dequantize", "flashmask_attention", "flashmask_dense_mask", "linear",
    "masks", "reference_attention", "rms_norm", "rotary_embedding", "support_table", "swiglu", "w8a8_linear",
    "weight_only_linear", "weight_quantize",
]
