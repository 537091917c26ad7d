"""The decode step of a Llama-family model in one kernel launch: every layer (RMSNorm, RoPE,
grouped-query attention over a KV cache, SwiGLU MLP), the final norm and the output projection,
for one new token per sequence (anychip/kernel.h, decoder_step).

Generating with one op per layer piece pays the per-op overhead hundreds of times per token;
this op pays it once. The weights are checked and described once, in :class:`DecoderWeights`:

    weights = DecoderWeights([DecoderLayer(attn_norm, Linear(qkv), None, Linear(o), ffn_norm,
                                           Linear(gate_up), Linear(down)), ...],
                             final_norm, Linear(head), num_heads=9, num_kv_heads=3)
    logits = decoder_step(x, positions, weights, k_cache, v_cache)
"""

from __future__ import annotations

import copy
import dataclasses
import math
from dataclasses import dataclass

import numpy as np

from ..dtypes import FLOATS
from . import checks
from .attention import reference_attention
from .dispatch import OpImpl, attrs, descriptor, device_label, device_of, empty, launch, paddle, place, run
from .quant import dequantize, quantize_x_int8, x_int8_fits, x_int8_run
from .rotary import _Rotary

OP = "decoder_step"
# What one launch runs (kernel.h's `part` attribute): the whole step, or one piece of it for a
# tensor-parallel rank, whose ranks sum each half layer's output between launches.
PARTS = {"all": 0, "attention": 1, "mlp": 2, "head": 3}
# The KV cache's dtypes, which pick the kernel (x and the logits are float32 whatever they are).
CACHE_DTYPES = FLOATS


@dataclass(frozen=True, eq=False)
class Linear:
    """A weight W [N, K] (out_features, in_features): float32 with ``bits`` 0, bfloat16 with
    ``bits`` 16, else ``weight`` is the qweight of :func:`anychip.ops.weight_quantize` (int8
    [N, K] or uint8 [N, K/2]) with its ``scales`` float32 [N, G], and optional per-group
    ``offsets`` [N, G] (W = q * scale + offset, as GGUF Q4_1); ``group_size`` is the K of one
    group, -1 for one group per row.

    A bfloat16 W takes its input rounded to bfloat16 and sums in float32: on CPUs with AMX the
    step then multiplies 16 sequences for little more than the cost of one (for serving many
    at once; see :meth:`bfloat16`)."""

    weight: object
    scales: object = None
    offsets: object = None
    bits: int = 0
    group_size: int = -1

    @property
    def in_features(self) -> int:
        return self.weight.shape[1] * (2 if self.bits == 4 else 1)

    def dense(self):
        """W [N, K] float32, with plain Paddle ops."""
        if self.bits in (0, 16):
            return self.weight.astype("float32")
        return dequantize(self.weight, self.scales, bits=self.bits, group_size=self.group_size, k=self.in_features,
                          offsets=self.offsets)

    def bfloat16(self) -> "Linear":
        """This weight as a bfloat16 Linear (``bits`` 16): W dequantized, then rounded to the
        nearest bfloat16. Twice the memory of int8, four times that of int4."""
        if self.bits == 16:
            return self
        return Linear(self.dense().astype("bfloat16"), bits=16)


@dataclass(frozen=True, eq=False)
class DecoderLayer:
    """One pre-norm decoder layer. ``qkv`` stacks the q, k and v rows ((Hq + 2 Hk) D of them),
    ``gate_up`` the gate rows then the up rows (2 F); ``qkv_bias`` may be None."""

    attn_norm: object
    qkv: Linear
    qkv_bias: object
    o: Linear
    ffn_norm: object
    gate_up: Linear
    down: Linear


_KINDS = ("qkv", "o", "gate_up", "down", "head")


def _fail(message: str):
    raise checks.OpArgumentError(f"{OP}: {message}")


class DecoderWeights:
    """The weights of a decoder, checked once and kept described for launching: every tensor on
    one device, float32 norms and biases, and each kind of Linear in one format across layers.
    ``eps`` is the RMSNorms' epsilon, ``theta`` the RoPE base. ``x_int8``: the quantized Linears
    take their input quantized to int8 per run (as weight_only_linear's x_int8; faster,
    ~5e-3 relative error per product; their K and group_size must be multiples of 32).
    ``panels`` (x_int8 only): each 4- or 8-bit Linear also gets its panel form (:func:`panel_form`,
    a second copy of its bytes, ``panel_bytes`` in all), which the step reads for many sequences
    at a time instead of gathering W's rows into that order at every launch (same results). The
    tensors must not be replaced or resized while this object is in use."""

    def __init__(self, layers, final_norm, head: Linear, num_heads: int, num_kv_heads: int, eps: float = 1e-5,
                 theta: float = 10000.0, x_int8: bool = False, panels: bool = False):
        layers = list(layers)
        if not layers:
            _fail("layers is empty")
        for i, layer in enumerate(layers):
            if not isinstance(layer, DecoderLayer):
                _fail(f"layers[{i}] must be a DecoderLayer, got {type(layer).__name__}")
        if num_heads < 1 or num_kv_heads < 1 or num_heads % num_kv_heads:
            _fail(f"num_heads ({num_heads}) must be a positive multiple of num_kv_heads ({num_kv_heads})")
        if not eps > 0 or not theta > 0:
            _fail(f"eps and theta must be > 0, got {eps}, {theta}")
        self.x_int8, self.panels = bool(x_int8), bool(panels)
        if self.panels and not self.x_int8:
            _fail("panels needs x_int8: only the int8 products read them")
        self.panel_bytes = 0
        self._named = []  # (name, tensor) in launch order, after x and positions
        self._formats = {}
        self.num_layers, self.num_heads, self.num_kv_heads = len(layers), num_heads, num_kv_heads
        self.eps, self.theta = float(eps), float(theta)
        checks.tensor(OP, "final_norm", final_norm)
        if len(final_norm.shape) != 1:
            _fail(f"final_norm must be 1-D [hidden], got shape {list(final_norm.shape)}")
        self.hidden = final_norm.shape[0]
        self.has_qkv_bias = layers[0].qkv_bias is not None
        first = layers[0]
        for name, lin in (("layers[0].qkv", first.qkv), ("layers[0].gate_up", first.gate_up), ("head", head)):
            if not isinstance(lin, Linear):
                _fail(f"{name} must be a Linear, got {type(lin).__name__}")
            checks.tensor(OP, f"{name}.weight", lin.weight)
            if len(lin.weight.shape) != 2:
                _fail(f"{name}.weight must be 2-D, got shape {list(lin.weight.shape)}")
        heads = num_heads + 2 * num_kv_heads
        if first.qkv.weight.shape[0] % heads or (first.qkv.weight.shape[0] // heads) % 2:
            _fail(f"layers[0].qkv has {first.qkv.weight.shape[0]} rows, not (num_heads + 2 num_kv_heads) = {heads} "
                  "times an even head_dim")
        self.head_dim = first.qkv.weight.shape[0] // heads
        if first.gate_up.weight.shape[0] % 2:
            _fail(f"layers[0].gate_up has {first.gate_up.weight.shape[0]} rows, not 2 * intermediate size")
        self.intermediate = first.gate_up.weight.shape[0] // 2
        self.vocab = head.weight.shape[0]
        c, d, f = self.hidden, self.head_dim, self.intermediate
        for i, layer in enumerate(layers):
            p = f"layers[{i}]."
            self._vector(p + "attn_norm", layer.attn_norm, c)
            self._linear(p + "qkv", "qkv", layer.qkv, heads * d, c)
            if (layer.qkv_bias is not None) != self.has_qkv_bias:
                _fail(f"{p}qkv_bias is {'missing' if self.has_qkv_bias else 'given'} but layers[0].qkv_bias is "
                      f"{'given' if self.has_qkv_bias else 'missing'}; all layers or none have one")
            if self.has_qkv_bias:
                self._vector(p + "qkv_bias", layer.qkv_bias, heads * d)
            self._linear(p + "o", "o", layer.o, c, num_heads * d)
            self._vector(p + "ffn_norm", layer.ffn_norm, c)
            self._linear(p + "gate_up", "gate_up", layer.gate_up, 2 * f, c)
            self._linear(p + "down", "down", layer.down, c, f)
        self._vector("final_norm", final_norm, c)
        self._linear("head", "head", head, self.vocab, c)
        self.device = device_of(self._named[0][1])
        for name, t in self._named:
            if device_of(t) != self.device:
                _fail(f"{name} is on {device_label(device_of(t))} but {self._named[0][0]} on "
                      f"{device_label(self.device)}; all weights must be on one device")
        self.tensors = [t for _, t in self._named]
        self.descriptors = tuple(descriptor(t, self.device[1]) for t in self.tensors)
        # the launch's attrs by name (anychip/ops/defs/decoder_step.py); a step adds its own
        self.named_attrs = dict(L=self.num_layers, Hq=num_heads, Hk=num_kv_heads, D=d, F=f, eps=eps, theta=theta,
                                has_qkv_bias=self.has_qkv_bias)
        for kind in _KINDS:
            bits, group_size, offsets = self._formats[kind]
            self.named_attrs.update({f"{kind}_bits": bits, f"{kind}_group_size": group_size,
                                     f"{kind}_has_offsets": offsets})
        if self.x_int8:
            self.named_attrs["x_int8"] = 1
        if self.panels:
            self.named_attrs["panels"] = 1
        self.attrs = attrs(OP, **self.named_attrs)
        self.layers, self.final_norm, self.head = layers, final_norm, head

    def __deepcopy__(self, memo):
        """A copy checks and describes its own copies of the weights: the descriptors hold their
        addresses."""
        layers, final_norm, head = (copy.deepcopy(v, memo) for v in (self.layers, self.final_norm, self.head))
        return DecoderWeights(layers, final_norm, head, self.num_heads, self.num_kv_heads, self.eps, self.theta,
                              self.x_int8, self.panels)

    def _vector(self, name, t, size):
        checks.tensor(OP, name, t)
        checks.dtype(OP, name, t, ("float32",))
        checks.shape(OP, name, t, [size])
        self._add(name, t)

    def _add(self, name, t):
        if not t.is_contiguous():
            _fail(f"{name} is not contiguous; pass a dense tensor")
        self._named.append((name, t))

    def _linear(self, name, kind, lin, n, k):
        if not isinstance(lin, Linear):
            _fail(f"{name} must be a Linear, got {type(lin).__name__}")
        fmt = (lin.bits, lin.group_size if lin.bits not in (0, 16) else -1, lin.offsets is not None)
        seen = self._formats.setdefault(kind, fmt)
        if fmt != seen:
            _fail(f"{name} has format (bits {fmt[0]}, group_size {fmt[1]}, offsets {fmt[2]}) but the first {kind} "
                  f"has (bits {seen[0]}, group_size {seen[1]}, offsets {seen[2]}); every layer must share it")
        if lin.bits in (0, 16):
            dtype = "float32" if lin.bits == 0 else "bfloat16"
            if lin.scales is not None or lin.offsets is not None:
                _fail(f"{name} is {dtype} (bits {lin.bits}) and takes no scales or offsets")
            if lin.bits == 16 and k % 32:
                _fail(f"{name}: bfloat16 weights need K to be a multiple of 32, got K={k}")
            checks.tensor(OP, f"{name}.weight", lin.weight)
            checks.dtype(OP, f"{name}.weight", lin.weight, (dtype,))
            checks.shape(OP, f"{name}.weight", lin.weight, [n, k], "[N, K]")
            self._add(f"{name}.weight", lin.weight)
            return
        if lin.bits not in (4, 8):
            _fail(f"{name}.bits must be 0 (float32), 4, 8 or 16 (bfloat16), got {lin.bits}")
        if lin.group_size != -1 and (lin.group_size <= 0 or k % lin.group_size):
            _fail(f"{name}.group_size must be -1 or divide K={k}, got {lin.group_size}")
        if lin.bits == 4 and k % 64:
            _fail(f"{name}: 4-bit weights need K to be a multiple of 64, got K={k}")
        if self.x_int8 and not x_int8_fits(k, lin.group_size):
            _fail(f"{name}: x_int8 needs K and group_size to be multiples of 32 (or group_size -1), got K={k}, "
                  f"group_size={lin.group_size}")
        groups = 1 if lin.group_size == -1 else k // lin.group_size
        checks.tensor(OP, f"{name}.weight", lin.weight)
        checks.dtype(OP, f"{name}.weight", lin.weight, ("int8",) if lin.bits == 8 else ("uint8",))
        checks.shape(OP, f"{name}.weight", lin.weight, [n, k if lin.bits == 8 else k // 2],
                     f"{lin.bits}-bit weights for N={n}, K={k}")
        self._add(f"{name}.weight", lin.weight)
        for part in ("scales", "offsets"):
            t = getattr(lin, part)
            if t is None and part == "offsets":
                continue
            checks.tensor(OP, f"{name}.{part}", t)
            checks.dtype(OP, f"{name}.{part}", t, ("float32",))
            checks.shape(OP, f"{name}.{part}", t, [n, groups], f"group_size={lin.group_size}")
            self._add(f"{name}.{part}", t)
        if self.panels:
            panels = panel_form(lin)
            self.panel_bytes += panels.shape[0] * panels.shape[1]
            self._add(f"{name}.panels", panels)


def panel_form(lin: Linear):
    """A 4- or 8-bit Linear's panel form (kernel.h's decoder_step, attr ``panels``) on its
    weight's device: :func:`panel_array` of its tensors."""
    if lin.bits not in (4, 8):
        _fail(f"panel_form takes a 4- or 8-bit Linear, got bits {lin.bits}")
    arrays = [None if t is None else t.numpy() for t in (lin.weight, lin.scales, lin.offsets)]
    return paddle().to_tensor(panel_array(*arrays), place=place(device_of(lin.weight)))


def panel_array(qweight: np.ndarray, scales: np.ndarray, offsets: np.ndarray | None = None) -> np.ndarray:
    """uint8 [ceil(N / 16), 16 Kb + 64 G (1 + has offsets)] from weight_quantize's qweight
    [N, Kb] (Kb bytes a row, a multiple of 32) and its scales (and offsets) [N, G]: each panel
    16 rows' codes, 4 bytes of a row in each dword lane, then their scales and offsets by group
    (kernel.h's decoder_step says it byte by byte). Rows past N are zeros."""
    q = np.ascontiguousarray(qweight).view(np.uint8)
    n, row_bytes = q.shape
    if row_bytes % 32:
        _fail(f"a panel form needs W's rows in whole 32-byte units, got {row_bytes} bytes")
    tiles = -(-n // 16)
    padded = np.zeros((tiles * 16, row_bytes), np.uint8)
    padded[:n] = q
    # [tile, row c, unit u, vector v, byte j] -> [tile, u, v, c, j]
    parts = [padded.reshape(tiles, 16, row_bytes // 32, 8, 4).transpose(0, 2, 3, 1, 4).reshape(tiles, -1)]
    for t in (scales, offsets):
        if t is not None:
            groups = np.zeros((tiles * 16, t.shape[1]), np.float32)
            groups[:n] = t
            by_group = np.ascontiguousarray(groups.reshape(tiles, 16, -1).transpose(0, 2, 1)).reshape(tiles, -1)
            parts.append(by_group.view(np.uint8))
    return np.ascontiguousarray(np.concatenate(parts, axis=1))


class _DecoderStep(OpImpl):
    name = OP

    def __init__(self, weights: DecoderWeights, positions: list[int], rows: list[int] | None = None,
                 part: str = "all", layer: int = 0, tables: list[list[int]] | None = None):
        self.weights, self.positions, self.rows, self.tables = weights, positions, rows, tables
        self.part, self.layer = part, layer

    def forward(self, kernel, x, positions, k_cache, v_cache, cache_rows=None):
        """``cache_rows``: the rows tensor, or with ``tables`` the block tables tensor."""
        w = self.weights
        half = self.part in ("attention", "mlp")
        out = empty([x.shape[0], w.hidden if half else w.vocab], "float32", w.device)
        inputs, step = [x, positions], {}
        if cache_rows is not None:
            inputs.append(cache_rows)
            step["has_cache_rows"] = 2 if self.tables is not None else 1
        if self.part != "all":
            step.update(part=PARTS[self.part], layer=self.layer)
        launch(kernel, OP, w.device, inputs + w.tensors, [out, k_cache, v_cache],
               attrs(OP, **w.named_attrs, **step) if step else w.attrs, described=w.descriptors)
        return out, (), [out]

    def reference(self, x, positions, k_cache, v_cache, cache_rows=None):
        pd, w = paddle(), self.weights
        b, d = x.shape[0], w.head_dim
        hq, hk = w.num_heads, w.num_kv_heads
        rows = self.rows if self.rows is not None else list(range(b))
        block = k_cache.shape[2]
        if self.tables is not None:  # paged: a sequence's slots are those of its blocks in order
            tables = np.array(self.tables, np.int64)
            needed = np.arange(tables.shape[1])[None, :] <= np.array(self.positions)[:, None] // block
            index = pd.to_tensor(np.where(needed, tables, 0).reshape(-1), place=x.place)
            capacity = tables.shape[1] * block
        else:
            index, capacity = pd.to_tensor(np.array(rows, np.int64), place=x.place), block
        rope = _Rotary(w.theta, w.device)
        slots = np.arange(capacity)[None, :] <= np.array(self.positions)[:, None]
        visible = pd.to_tensor(slots.reshape(b, 1, 1, -1), place=x.place)

        def norm(h, weight):
            return h * pd.rsqrt((h * h).mean(axis=-1, keepdim=True) + w.eps) * weight

        def linear(a, lin, k):
            if lin.bits == 16:
                return pd.matmul(a.astype("bfloat16").astype("float32"), lin.dense(), transpose_y=True)
            if not (w.x_int8 and lin.bits):
                return pd.matmul(a, lin.dense(), transpose_y=True)
            # the symmetric part from x quantized per run, the offsets' share from float x
            xq, sx = quantize_x_int8(a, x_int8_run(lin.bits, k, lin.group_size))
            symmetric = dataclasses.replace(lin, offsets=None)
            y = pd.matmul((xq * sx).reshape(a.shape), symmetric.dense(), transpose_y=True)
            if lin.offsets is not None:
                group = k if lin.group_size == -1 else lin.group_size
                y = y + pd.matmul(a, pd.repeat_interleave(lin.offsets, group, axis=1), transpose_y=True)
            return y

        h = x
        part, layers = self.part, list(enumerate(w.layers))
        if part != "all":
            layers = [] if part == "head" else [layers[self.layer]]
        with pd.no_grad():
            for i, layer in layers:
                if part == "mlp":
                    g, u = pd.split(linear(norm(h, layer.ffn_norm), layer.gate_up, w.hidden), 2, axis=-1)
                    return linear(pd.nn.functional.silu(g) * u, layer.down, w.intermediate)
                qkv = linear(norm(h, layer.attn_norm), layer.qkv, w.hidden)
                if layer.qkv_bias is not None:
                    qkv = qkv + layer.qkv_bias
                q, k, v = pd.split(qkv.reshape([b, 1, hq + 2 * hk, d]), [hq, hk, hk], axis=2)
                q, k = rope.reference(q, k, positions.reshape([b, 1]))
                for s, pos in enumerate(self.positions):
                    at = (rows[s], pos) if self.tables is None else (self.tables[s][pos // block], pos % block)
                    k_cache[i, at[0], at[1]] = k[s, 0].astype(k_cache.dtype)
                    v_cache[i, at[0], at[1]] = v[s, 0].astype(v_cache.dtype)
                keys, values = (pd.index_select(c[i].astype("float32"), index).reshape([b, capacity, hk, d])
                                for c in (k_cache, v_cache))
                o, _lse = reference_attention(q, keys, values, 1.0 / math.sqrt(d), False, visible)
                if part == "attention":
                    return linear(o.reshape([b, hq * d]), layer.o, hq * d)
                h = h + linear(o.reshape([b, hq * d]), layer.o, hq * d)
                g, u = pd.split(linear(norm(h, layer.ffn_norm), layer.gate_up, w.hidden), 2, axis=-1)
                h = h + linear(pd.nn.functional.silu(g) * u, layer.down, w.intermediate)
            return linear(norm(h, w.final_norm), w.head, w.hidden)


def decoder_step(x, positions, weights: DecoderWeights, k_cache, v_cache, cache_rows=None, part: str = "all",
                 layer: int = 0, block_tables=None):
    """One decode step: ``x`` float32 [B, C] (the new tokens' embeddings) at ``positions`` int64
    [B] (each sequence's position, also its cache slot) through every layer of ``weights`` ->
    logits float32 [B, V].

    ``k_cache`` and ``v_cache`` [L, R, S, Hk, D], float32, bfloat16 or float16 (both the same; a
    16-bit cache holds half the bytes, which long contexts read every step), are updated in
    place: each layer writes slot ``positions[b]`` (k after RoPE, rounded to the cache's dtype)
    of sequence b's cache row before attending over slots 0 .. positions[b], its own included
    as the cache holds it. The kernel is chosen by the cache's dtype. Sequence b's row is
    ``cache_rows[b]`` (int64 [B], distinct rows in [0, R)), or b when ``cache_rows`` is None
    (then R = B): with rows, any B sequences of a cache with room for R decode together, as
    continuous batching needs. Forward only.

    ``block_tables`` (int64 [B, W], instead of ``cache_rows``) makes the cache paged, as vLLM's
    PagedAttention: its R rows are blocks of S slots that sequences share out, and slot j of
    sequence b is slot j % S of block ``block_tables[b, j // S]``, so a sequence holds up to W S
    tokens in whichever blocks it was given. Sequences may share the blocks of a common prompt
    prefix, which they only read; the slots written must differ.

    ``part`` runs one piece of the step from h = ``x`` instead of the whole: ``"attention"``,
    layer ``layer``'s attention half (writing its cache slots), returns its output projection
    [B, C] without the residual add; ``"mlp"``, that layer's MLP half [B, C], likewise;
    ``"head"``, the final norm and head [B, V]. A tensor-parallel rank decodes so, summing each
    half's output with its peers' and adding it to h between launches::

        for i in range(weights.num_layers):
            for half in ("attention", "mlp"):
                h = h + all_reduce(decoder_step(h, positions, weights, k, v, part=half, layer=i))
        logits = all_gather(decoder_step(h, positions, weights, k, v, part="head"))
    """
    if not isinstance(weights, DecoderWeights):
        _fail(f"weights must be a DecoderWeights, got {type(weights).__name__}")
    if part not in PARTS:
        _fail(f"part must be one of {', '.join(PARTS)}, got {part!r}")
    if isinstance(layer, bool) or not isinstance(layer, int) or not 0 <= layer < weights.num_layers:
        _fail(f"layer must be an int in [0, {weights.num_layers}), got {layer!r}")
    x = checks.tensor(OP, "x", x)
    positions = checks.tensor(OP, "positions", positions)
    k_cache, v_cache = checks.tensor(OP, "k_cache", k_cache), checks.tensor(OP, "v_cache", v_cache)
    checks.dtype(OP, "x", x, ("float32",))
    checks.rank(OP, "x", x, 2, "[batch, hidden]")
    b = x.shape[0]
    checks.shape(OP, "x", x, [b, weights.hidden], "[batch, hidden]")
    checks.dtype(OP, "positions", positions, ("int64",))
    checks.shape(OP, "positions", positions, [b], "[batch]")
    checks.rank(OP, "k_cache", k_cache, 5, "[layers, batch, slots, kv_heads, head_dim]")
    kv_dtype = checks.dtype(OP, "k_cache", k_cache, CACHE_DTYPES)
    s = k_cache.shape[2]
    rows = tables = None
    if cache_rows is not None and block_tables is not None:
        _fail("pass cache_rows or block_tables, not both")
    if block_tables is not None:
        block_tables = checks.tensor(OP, "block_tables", block_tables)
        checks.dtype(OP, "block_tables", block_tables, ("int64",))
        checks.rank(OP, "block_tables", block_tables, 2, "[batch, blocks per sequence]")
        checks.shape(OP, "block_tables", block_tables, [b, block_tables.shape[1]], "[batch, blocks per sequence]")
        tables = block_tables.numpy().tolist()
    elif cache_rows is not None:
        cache_rows = checks.tensor(OP, "cache_rows", cache_rows)
        checks.dtype(OP, "cache_rows", cache_rows, ("int64",))
        checks.shape(OP, "cache_rows", cache_rows, [b], "[batch]")
        rows = cache_rows.numpy().tolist()
        r = k_cache.shape[1]
        if len(set(rows)) != len(rows) or any(not 0 <= row < r for row in rows):
            _fail(f"cache_rows {rows} must be distinct rows of the cache's [0, {r})")
    cache = [weights.num_layers, b if rows is None and tables is None else k_cache.shape[1], s,
             weights.num_kv_heads, weights.head_dim]
    for name, t in (("k_cache", k_cache), ("v_cache", v_cache)):
        checks.dtype(OP, name, t, (kv_dtype,))
        checks.shape(OP, name, t, cache, "[layers, batch, slots, kv_heads, head_dim]")
        if not t.is_contiguous():
            _fail(f"{name} is not contiguous; it is updated in place")
    named = [("x", x), ("positions", positions), ("k_cache", k_cache), ("v_cache", v_cache)]
    named += [("cache_rows", cache_rows)] if rows is not None else []
    for name, t in named + ([("block_tables", block_tables)] if tables is not None else []):
        if device_of(t) != weights.device:
            _fail(f"{name} is on {device_label(device_of(t))} but the weights are on {device_label(weights.device)}")
    x = checks.contiguous(OP, "x", x, weights.device)
    pos = positions.numpy().tolist()
    capacity = s if tables is None else s * block_tables.shape[1]
    for i, p in enumerate(pos):
        if not 0 <= p < capacity:
            _fail(f"positions[{i}] = {p} is outside the cache's slots [0, {capacity})")
    if tables is not None:
        _check_tables(tables, pos, s, k_cache.shape[1])
    extra = [cache_rows] if rows is not None else [block_tables] if tables is not None else []
    return run(_DecoderStep(weights, pos, rows, part, layer, tables), weights.device, kv_dtype, x, positions, k_cache, v_cache, *extra,
               differentiable=False)


def _check_tables(tables: list[list[int]], positions: list[int], block: int, blocks: int) -> None:
    """Every block a sequence reads exists, and no two sequences write one slot."""
    written = set()
    for i, (table, p) in enumerate(zip(tables, positions)):
        for j in range(p // block + 1):
            if not 0 <= table[j] < blocks:
                _fail(f"block_tables[{i}, {j}] = {table[j]} is outside the cache's {blocks} blocks")
        slot = (table[p // block], p % block)
        if slot in written:
            _fail(f"block_tables: sequence {i} writes slot {slot[1]} of block {slot[0]}, which another sequence "
                  "writes too")
        written.add(slot)
