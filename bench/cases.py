"""The kernel cases of ``anychip bench`` and ``bench/bench_ops.py``: per op and shape preset,
the work (bytes moved, useful FLOPs), its inputs, anychip's op, the op's reference (its
``OpImpl.reference``, plain Paddle) and the peers that do the same work on the host (Paddle's
own op where it has a CPU kernel, PyTorch when importable).

Counting follows benchlib: bytes are the minimum the work must move (each input read once,
each output written once), FLOPs the useful ones (attention: 4 * D per visible (query, key) pair
per query head). A memory-bound case whose inputs are small enough to cycle through more than
twice the last-level cache in at most ``MAX_SETS`` copies does so, and is named "(DRAM)"; a
smaller one runs from the cache and is named "(in cache)".
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Callable

import numpy as np

from . import benchlib

SUBJECT, REFERENCE, PEER = "anychip", "reference", "peer"
SIMULATED = "simulated (host speed)"
SHORT = {"float32": "fp32", "bfloat16": "bf16"}
DTYPES = tuple(SHORT)
PEAK = {"float32": "fp32", "bfloat16": "bf16"}  # benchlib.PEAK_UNITS keys
EPS = 1e-5
THETA = 10000.0
MAX_SETS = 256  # beyond this many input copies the case runs from the cache instead


@dataclass(frozen=True)
class Preset:
    """A model's layer shapes and the token counts the cases use."""

    name: str
    model: str
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    tokens: int        # rows of the elementwise ops (a prefill)
    seq: int           # attention's sequence length
    docs: int          # documents packed into ``seq`` for the FlashMask case
    gemm_tokens: int   # rows of the prefill GEMM
    group: int         # int4 group size (must divide hidden)

    def describe(self) -> str:
        return (f"{self.model}: hidden {self.hidden}, heads {self.heads}/{self.kv_heads}, head dim {self.head_dim}, "
                f"intermediate {self.intermediate}; {self.tokens} tokens, attention S{self.seq}")


PRESETS = {p.name: p for p in (
    Preset("tiny", "tiny test shapes", 64, 4, 2, 16, 128, tokens=32, seq=32, docs=4, gemm_tokens=16, group=32),
    Preset("smollm2", "SmolLM2-135M", 576, 9, 3, 64, 1536, tokens=2048, seq=1024, docs=4, gemm_tokens=512,
           group=64),
    Preset("llama-7b", "Llama-2-7B", 4096, 32, 32, 128, 11008, tokens=2048, seq=1024, docs=4, gemm_tokens=512,
           group=128),
)}


class Unavailable(Exception):
    """An implementation that cannot run here (a peer without a kernel for the dtype, torch
    missing, an op that fails on the device); the message says why."""


@dataclass(frozen=True)
class Impl:
    """One implementation of a case. ``build(arrays, dtype, device)`` prepares its inputs on
    ``device`` and returns the call that does the work once. ``bytes``: what it moves itself
    where that differs from the case (a dense fp32 peer of a 4-bit kernel)."""

    name: str
    label: str
    role: str
    build: Callable
    bytes: float | None = None
    library: str = "paddle"


@dataclass(frozen=True)
class KernelCase:
    """One op on one shape in one dtype, with everything that runs it."""

    op: str
    title: str
    dtype: str
    bytes: float
    flops: float
    bound: str                          # "memory" or "compute"
    arrays: Callable[[], dict]          # host inputs; float arrays are cast to dtype unless in keep_f32
    anychip: Callable[[dict], object]   # anychip's op on device tensors
    reference: Callable[[dict, tuple], object]
    peers: tuple[Impl, ...] = ()
    keep_f32: tuple[str, ...] = ()
    pattern: str = "copy"               # memory roofline: "copy" (reads and writes) or "read" (streams its input)
    note: str = ""
    short: str = ""                     # its label on the roofline chart
    sets: int = 1                       # input copies cycled through (see _stream_sets)

    @property
    def name(self) -> str:
        where = "" if self.bound == "compute" else (" (DRAM)" if self.sets > 1 else " (in cache)")
        return f"{self.op} {self.title} {SHORT[self.dtype]}{where}"

    @property
    def intensity(self) -> float:
        return self.flops / self.bytes

    @property
    def inputs_note(self) -> str:
        if self.bound == "compute":
            return "compute-bound: inputs hot in the cache"
        if self.sets > 1:
            return f"streamed from DRAM: each call takes the next of {self.sets} input copies (> 2x the LLC)"
        return f"in cache: {self.bytes / 2**20:.2f} MB a call is too small to stream from DRAM"

    def harness_case(self, suffix: str = "") -> benchlib.Case:
        """The benchlib Case that records and rates this work (``suffix``: which device)."""
        return benchlib.Case(self.name + suffix, self.bound, self.bytes if self.bound == "memory" else self.flops,
                             peak=PEAK[self.dtype] if self.bound == "compute" else None, pattern=self.pattern,
                             note=f"{self.note}; {self.inputs_note}" if self.note else self.inputs_note)

    def implementations(self) -> list[Impl]:
        """anychip's op, its reference, then the peers."""
        subject = Impl(SUBJECT, f"anychip ops.{self.op}", SUBJECT,
                       lambda arrays, dtype, device: _bound(self.anychip, device_tensors(arrays, dtype, device,
                                                                                          self.keep_f32)))
        reference = Impl(REFERENCE, "reference: plain Paddle (OpImpl.reference)", REFERENCE,
                         lambda arrays, dtype, device: _bound(
                             self.reference, device_tensors(arrays, dtype, device, self.keep_f32), device))
        return [subject, reference, *self.peers]

    def sets_for(self, own_bytes: float | None) -> int:
        """Input copies an implementation cycles through: enough to exceed twice the LLC with
        its own bytes when the case streams, else one."""
        return 1 if self.sets == 1 else benchlib.stream_count(own_bytes or self.bytes)

    def prepare(self, impl: Impl, device: tuple[str, int]) -> Callable[[], None]:
        """The call that runs ``impl`` once on ``device`` (the next input copy each time) and
        waits for the device; runs it once, so an implementation that cannot work here raises
        Unavailable now and not while being timed."""
        arrays = self.arrays()
        try:
            calls = [impl.build(arrays, self.dtype, device) for _ in range(self.sets_for(impl.bytes))]
            sync = device_sync(device)
            nxt = benchlib.Cycle(calls)

            def once():
                nxt()()
                sync()

            once()
        except Unavailable:
            raise
        except Exception as exc:  # noqa: BLE001 -- any failure of an implementation is reported, not fatal
            raise Unavailable(f"{type(exc).__name__}: {_first_line(exc)}") from exc
        return once


def _bound(fn, *args):
    return lambda: fn(*args)


def _first_line(exc: Exception) -> str:
    """The gist of an error: its first sentence (Paddle's go on with lists of dtypes)."""
    lines = str(exc).strip().splitlines()
    first = lines[0] if lines else ""
    return first.split(". ", 1)[0][:300]


# ---------------------------------------------------------------------------------------------
# Tensors


def _paddle():
    from anychip.frontends.paddle import import_paddle

    return import_paddle()


def device_tensors(arrays: dict, dtype: str, device: tuple[str, int], keep_f32=()) -> dict:
    """The arrays as Paddle tensors on ``device``, float ones cast to ``dtype`` (on the host)
    except those in ``keep_f32``; a fresh copy each call."""
    from anychip.frontends.paddle import place

    pd = _paddle()
    where = place(*device)
    out = {}
    for name, a in arrays.items():
        t = pd.to_tensor(np.ascontiguousarray(a), place=pd.CPUPlace())
        if a.dtype.kind == "f" and name not in keep_f32 and dtype != "float32":
            t = t.astype(dtype)
        if not where.is_cpu_place():
            t = t._copy_to(where, True)
        t.stop_gradient = True
        out[name] = t
    return out


def device_sync(device: tuple[str, int]) -> Callable[[], None]:
    """Waits for the device's current stream; the host runs its kernels in the calling thread."""
    from anychip.frontends.paddle import paddle_device_string

    target = paddle_device_string(*device)
    if target == "cpu":
        return lambda: None
    pd = _paddle()
    return lambda: pd.device.synchronize(target)


_torch = None


def torch_module():
    """torch, imported after Paddle, with anychip's host thread count; Unavailable if missing."""
    global _torch
    if _torch is None:
        import sys

        from anychip.host_threads import num_threads

        _paddle()  # Paddle first: it must register anychip's devices before anything loads it
        imported_by_caller = "torch" in sys.modules
        try:
            import torch
        except Exception as exc:  # noqa: BLE001 -- a broken install is as good as none
            raise Unavailable(f"torch is not importable: {type(exc).__name__}: {exc}") from None
        if not imported_by_caller:  # the pytest harness sets its own thread count
            torch.set_num_threads(num_threads())
        _torch = torch
    return _torch


def torch_tensors(arrays: dict, dtype: str, keep_f32=()) -> dict:
    torch = torch_module()
    tdt = {"float32": torch.float32, "bfloat16": torch.bfloat16}[dtype]
    return {n: (torch.from_numpy(a.copy()).to(tdt) if a.dtype.kind == "f" and n not in keep_f32
                else torch.from_numpy(a.copy())) for n, a in arrays.items()}


def _host(arrays, dtype, keep_f32=()):
    return device_tensors(arrays, dtype, ("cpu", 0), keep_f32)


def _peer(name, label, build, library="paddle", bytes=None):
    """A host peer: ``build(arrays, dtype)``; the device argument is always the host."""
    return Impl(name, label, PEER, lambda arrays, dtype, _device: build(arrays, dtype), bytes=bytes,
                library=library)


# ---------------------------------------------------------------------------------------------
# The cases, by op


def _rng():
    return np.random.default_rng(0)


def _rms_norm(p: Preset, dtype: str, es: int) -> list[KernelCase]:
    import anychip.ops as ops
    from anychip.ops.norm import _RmsNorm

    t, h = p.tokens, p.hidden

    def arrays():
        rng = _rng()
        return {"x": rng.standard_normal((t, h), dtype=np.float32),
                "weight": (1.0 + 0.1 * rng.standard_normal(h)).astype(np.float32)}

    def paddle_fused(arrays, dtype):
        if benchlib.PADDLE_FUSED_RMS_NORM_NEEDS not in benchlib.cpu_flags():
            raise Unavailable(benchlib.PADDLE_FUSED_RMS_NORM_MISSING)
        x = _host(arrays, dtype)
        fused = _paddle().incubate.nn.functional.fused_rms_norm
        return lambda: fused(x["x"], x["weight"], None, EPS, 1)[0]

    def torch_rms(arrays, dtype):
        x = torch_tensors(arrays, dtype)
        f = torch_module().nn.functional.rms_norm
        return lambda: f(x["x"], (h,), x["weight"], EPS)

    return [KernelCase(
        "rms_norm", f"fwd [{t},{h}]", dtype, bytes=(2 * t * h + h) * es + t * 4, flops=4.0 * t * h, bound="memory",
        arrays=arrays, anychip=lambda x: ops.rms_norm(x["x"], x["weight"], eps=EPS),
        reference=lambda x, dev: _RmsNorm(EPS, dev, False).reference(x["x"], x["weight"]),
        peers=(_peer("paddle_fused", "paddle incubate fused_rms_norm", paddle_fused),
               _peer("torch", "torch F.rms_norm", torch_rms, "torch")),
        note="bytes: read x, weight; write y, inv_rms (fp32); FLOPs: 4 per element", short="rms_norm")]


def _attention_arrays(p: Preset):
    rng = _rng()
    return {"q": rng.standard_normal((1, p.seq, p.heads, p.head_dim), dtype=np.float32),
            "k": rng.standard_normal((1, p.seq, p.kv_heads, p.head_dim), dtype=np.float32),
            "v": rng.standard_normal((1, p.seq, p.kv_heads, p.head_dim), dtype=np.float32)}


def _attention_bytes(p: Preset, es: int) -> float:
    qo = 2 * p.seq * p.heads * p.head_dim
    kv = 2 * p.seq * p.kv_heads * p.head_dim
    return (qo + kv) * es + p.heads * p.seq * 4  # + lse (fp32)


def _torch_sdpa(p: Preset, mask: np.ndarray | None):
    def build(arrays, dtype):
        torch = torch_module()
        x = torch_tensors({n: a.transpose(0, 2, 1, 3) for n, a in arrays.items() if n in ("q", "k", "v")}, dtype)
        sdpa = torch.nn.functional.scaled_dot_product_attention
        if mask is None:
            return lambda: sdpa(x["q"], x["k"], x["v"], is_causal=True, enable_gqa=True)
        m = torch.from_numpy(mask)
        return lambda: sdpa(x["q"], x["k"], x["v"], attn_mask=m, enable_gqa=True)

    return build


def _paddle_sdpa(mask: np.ndarray | None):
    def build(arrays, dtype):
        pd = _paddle()
        x = _host({n: a for n, a in arrays.items() if n in ("q", "k", "v")}, dtype)
        sdpa = pd.nn.functional.scaled_dot_product_attention
        if mask is None:
            return lambda: sdpa(x["q"], x["k"], x["v"], is_causal=True, training=False)
        m = pd.to_tensor(mask, place=pd.CPUPlace())
        return lambda: sdpa(x["q"], x["k"], x["v"], attn_mask=m, training=False)

    return build


def _attention(p: Preset, dtype: str, es: int) -> list[KernelCase]:
    import anychip.ops as ops
    from anychip.ops.attention import _Attention

    s, scale = p.seq, 1.0 / math.sqrt(p.head_dim)
    pairs = s * (s + 1) // 2
    return [KernelCase(
        "attention", f"causal GQA fwd S{s} H{p.heads}/{p.kv_heads} D{p.head_dim}", dtype,
        bytes=_attention_bytes(p, es), flops=4.0 * p.head_dim * p.heads * pairs, bound="compute",
        arrays=lambda: _attention_arrays(p), anychip=lambda x: ops.attention(x["q"], x["k"], x["v"], causal=True),
        reference=lambda x, dev: _Attention("attention", scale, True, dev, False).reference(x["q"], x["k"], x["v"]),
        peers=(_peer("paddle_sdpa", "paddle F.scaled_dot_product_attention", _paddle_sdpa(None)),
               _peer("torch_sdpa", "torch SDPA (enable_gqa)", _torch_sdpa(p, None), "torch")),
        note="FLOPs: 4*D per visible (query, key) pair per query head; bytes: q, k, v, o, lse once",
        short="attention")]


def _flashmask(p: Preset, dtype: str, es: int) -> list[KernelCase]:
    import anychip.ops as ops
    from anychip.ops.attention import _Attention

    s, scale = p.seq, 1.0 / math.sqrt(p.head_dim)
    doc = s // p.docs
    lens = [doc] * (p.docs - 1) + [s - doc * (p.docs - 1)]
    startend = ops.masks.causal_document(lens)
    dense = ops.flashmask_dense_mask(startend, s, p.heads, causal=True)
    pairs = sum(n * (n + 1) // 2 for n in lens)

    def arrays():
        return {**_attention_arrays(p), "startend": startend}

    return [KernelCase(
        "flashmask_attention", f"causal-document {p.docs}x{doc} fwd S{s} H{p.heads}/{p.kv_heads} D{p.head_dim}",
        dtype, bytes=_attention_bytes(p, es) + startend.nbytes, flops=4.0 * p.head_dim * p.heads * pairs,
        bound="compute", arrays=arrays,
        anychip=lambda x: ops.flashmask_attention(x["q"], x["k"], x["v"], x["startend"], causal=True),
        reference=lambda x, dev: _Attention("flashmask_attention", scale, True, dev, True).reference(
            x["q"], x["k"], x["v"], x["startend"]),
        peers=(_peer("paddle_sdpa", "paddle F.scaled_dot_product_attention, dense mask", _paddle_sdpa(dense)),
               _peer("torch_sdpa", "torch SDPA, dense bool mask", _torch_sdpa(p, dense), "torch")),
        note="FLOPs of the visible pairs only (masked tiles are no useful work); peers take the dense mask",
        short="flashmask")]


def _packed_weights(bits: int, group: int, n: int, k: int) -> dict:
    """Random weights in anychip's packed layout (the values do not change the work)."""
    rng = _rng()
    if bits == 4:
        q = rng.integers(0, 256, (n, k // 2), dtype=np.uint8)
    else:
        q = rng.integers(-127, 128, (n, k), dtype=np.int8)
    groups = 1 if group == -1 else k // group
    return {"qweight": q, "scales": (rng.random((n, groups), dtype=np.float32) * 0.01 + 1e-3)}


def _weight_only(p: Preset, dtype: str, es: int) -> list[KernelCase]:
    import anychip.ops as ops
    from anychip.ops.quant import _WeightOnly

    k, n = p.hidden, p.intermediate
    cases = []
    for bits, group, m in ((4, p.group, 1), (8, -1, 1), (4, p.group, p.gemm_tokens)):
        g = "per-channel" if group == -1 else f"g{group}"
        weights = n * k * bits // 8 + n * (1 if group == -1 else k // group) * 4
        io = (m * k + m * n) * es
        dense = n * k * es + io

        def arrays(bits=bits, group=group, m=m):
            return {"x": _rng().standard_normal((m, k), dtype=np.float32), **_packed_weights(bits, group, n, k)}

        def run(x, bits=bits, group=group):
            return ops.weight_only_linear(x["x"], x["qweight"], x["scales"], bits=bits, group_size=group)

        def reference(x, dev, bits=bits, group=group):
            return _WeightOnly(bits, group, dev, False).reference(x["x"], x["qweight"], x["scales"])

        gemv = m == 1
        peers = [_peer("torch_dense", f"torch {SHORT[dtype]} F.linear, dense weights", _torch_dense(n, k), "torch",
                       bytes=dense if gemv else None),
                 _peer("paddle_dense", f"paddle {SHORT[dtype]} matmul, dense weights", _paddle_dense(n, k),
                       bytes=dense if gemv else None)]
        if bits == 8 and gemv:
            peers.append(_peer("torch_int8pack", "torch _weight_int8pack_mm", _torch_int8(n, k), "torch",
                               bytes=n * k + n * 4 + io))
        if bits == 4 and gemv:
            int4pack = n * k // 2 + (k // group) * n * 4 + 2 * (k + n)  # + bf16 scales/zeros, x, y
            peers.append(_peer("torch_int4pack", f"torch _weight_int4pack_mm_for_cpu (g{group}, bf16 x)",
                               _torch_int4(n, k, group), "torch", bytes=int4pack))
        what = f"GEMV M=1 {k}x{n}" if gemv else f"prefill GEMM M={m} {k}x{n}"
        cases.append(KernelCase(
            "weight_only_linear", f"int{bits} {g} {what}", dtype, bytes=weights + io, flops=2.0 * m * n * k,
            bound="memory" if gemv else "compute", pattern="read", arrays=arrays, anychip=run, reference=reference,
            peers=tuple(peers), keep_f32=("scales",),
            note=("bytes: packed weights + scales + x + y (peers: their own formats' bytes); judged against read "
                  "bandwidth, as it streams W" if gemv else "FLOPs: 2*M*N*K; weights hot in the cache"),
            short=f"int{bits} {'GEMV' if gemv else 'GEMM'}"))
    return cases


def _dense_weight(n: int, k: int) -> np.ndarray:
    return _rng().standard_normal((n, k), dtype=np.float32) * 0.05


def _torch_dense(n, k):
    def build(arrays, dtype):
        x = torch_tensors({"x": arrays["x"], "w": _dense_weight(n, k)}, dtype)
        f = torch_module().nn.functional.linear
        return lambda: f(x["x"], x["w"])

    return build


def _paddle_dense(n, k):
    def build(arrays, dtype):
        x = _host({"x": arrays["x"], "w": _dense_weight(n, k)}, dtype)
        matmul = _paddle().matmul
        return lambda: matmul(x["x"], x["w"], transpose_y=True)

    return build


def _torch_int8(n, k):
    def build(arrays, dtype):
        torch = torch_module()
        x = torch_tensors({"x": arrays["x"]}, dtype)["x"]
        w = torch.from_numpy(_rng().integers(-127, 128, (n, k), dtype=np.int8))
        scales = torch.from_numpy(arrays["scales"][:, 0].copy()).to(x.dtype)
        return lambda: torch.ops.aten._weight_int8pack_mm(x, w, scales)

    return build


def _torch_int4(n, k, group):
    def build(arrays, _dtype):
        # bf16 activations and scales whatever the case's dtype: torch's fast path
        # (fp32 x is ~30x slower in torch 2.14)
        torch = torch_module()
        packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(
            torch.from_numpy(_rng().integers(0, 16, (n, k), dtype=np.int32)), 2)
        sz = torch.from_numpy(_rng().random((k // group, n, 2), dtype=np.float32) * 0.01).bfloat16()
        x = torch.from_numpy(arrays["x"].copy()).bfloat16()
        return lambda: torch.ops.aten._weight_int4pack_mm_for_cpu(x, packed, group, sz)

    return build


def _swiglu(p: Preset, dtype: str, es: int) -> list[KernelCase]:
    import anychip.ops as ops
    from anychip.ops.swiglu import _Swiglu

    t, i = p.tokens, p.intermediate

    def arrays():
        rng = _rng()
        return {"gate": rng.standard_normal((t, i), dtype=np.float32) * 3,
                "up": rng.standard_normal((t, i), dtype=np.float32)}

    def paddle_swiglu(arrays, dtype):
        x = _host(arrays, dtype)
        f = _paddle().nn.functional.swiglu
        return lambda: f(x["gate"], x["up"])

    def torch_composed(arrays, dtype):
        x = torch_tensors(arrays, dtype)
        silu = torch_module().nn.functional.silu
        return lambda: silu(x["gate"]) * x["up"]

    return [KernelCase(
        "swiglu", f"fwd [{t},{i}]", dtype, bytes=3 * t * i * es, flops=5.0 * t * i, bound="memory", arrays=arrays,
        anychip=lambda x: ops.swiglu(x["gate"], x["up"]),
        reference=lambda x, dev: _Swiglu(dev).reference(x["gate"], x["up"]),
        peers=(_peer("paddle_swiglu", "paddle F.swiglu", paddle_swiglu),
               _peer("torch", "torch F.silu(gate) * up", torch_composed, "torch")),
        note="bytes: read gate, up; write y; FLOPs: 5 per element (silu as 4)", short="swiglu")]


def _rotary(p: Preset, dtype: str, es: int) -> list[KernelCase]:
    import anychip.ops as ops
    from anychip.ops.rotary import _Rotary

    t, d = p.tokens, p.head_dim
    elems = t * (p.heads + p.kv_heads) * d

    def arrays():
        rng = _rng()
        return {"q": rng.standard_normal((1, t, p.heads, d), dtype=np.float32),
                "k": rng.standard_normal((1, t, p.kv_heads, d), dtype=np.float32),
                "positions": np.arange(t, dtype=np.int64)[None]}

    def cos_sin(positions):
        inv = 1.0 / THETA ** (np.arange(0, d, 2, dtype=np.float32) / d)
        angle = positions[..., None].astype(np.float32) * inv
        angle = np.concatenate([angle, angle], axis=-1)[:, :, None, :]
        return {"cos": np.cos(angle), "sin": np.sin(angle)}

    def rotate(x, cos, sin, cat):
        half = d // 2
        return x * cos + cat([-x[..., half:], x[..., :half]]) * sin

    def paddle_composed(arrays, dtype):
        pd = _paddle()
        x = _host({"q": arrays["q"], "k": arrays["k"], **cos_sin(arrays["positions"])}, dtype)
        cat = lambda parts: pd.concat(parts, axis=-1)  # noqa: E731
        return lambda: (rotate(x["q"], x["cos"], x["sin"], cat), rotate(x["k"], x["cos"], x["sin"], cat))

    def torch_composed(arrays, dtype):
        torch = torch_module()
        x = torch_tensors({"q": arrays["q"], "k": arrays["k"], **cos_sin(arrays["positions"])}, dtype)
        cat = lambda parts: torch.cat(parts, dim=-1)  # noqa: E731
        return lambda: (rotate(x["q"], x["cos"], x["sin"], cat), rotate(x["k"], x["cos"], x["sin"], cat))

    return [KernelCase(
        "rotary_embedding", f"fwd q[1,{t},{p.heads},{d}] k[1,{t},{p.kv_heads},{d}]", dtype,
        bytes=2 * elems * es + t * 8, flops=3.0 * elems, bound="memory", arrays=arrays,
        anychip=lambda x: ops.rotary_embedding(x["q"], x["k"], x["positions"], theta=THETA),
        reference=lambda x, dev: _Rotary(THETA, dev).reference(x["q"], x["k"], x["positions"]),
        peers=(_peer("paddle_composed", "paddle composed (cos/sin precomputed)", paddle_composed),
               _peer("torch_composed", "torch composed (cos/sin precomputed)", torch_composed, "torch")),
        note="bytes: read q, k, positions; write q, k; FLOPs: 3 per element; peers get cos/sin untimed",
        short="rope")]


BUILDERS = {"rms_norm": _rms_norm, "attention": _attention, "flashmask_attention": _flashmask,
            "weight_only_linear": _weight_only, "swiglu": _swiglu, "rotary_embedding": _rotary}
OPS = tuple(BUILDERS)


def build_cases(preset: str, dtype: str, ops=OPS, torch: bool = True) -> list[KernelCase]:
    """The cases of ``ops`` (in the order given) for ``preset`` in ``dtype``; without ``torch``,
    no torch peers."""
    if preset not in PRESETS:
        raise ValueError(f"shapes: unknown preset {preset!r}; choose from {', '.join(PRESETS)}")
    if dtype not in DTYPES:
        raise ValueError(f"dtype: must be one of {', '.join(DTYPES)}, got {dtype!r}")
    unknown = [o for o in ops if o not in BUILDERS]
    if unknown:
        raise ValueError(f"ops: unknown op(s) {', '.join(map(repr, unknown))}; choose from {', '.join(OPS)}")
    es = 4 if dtype == "float32" else 2
    out = []
    for op in ops:
        for case in BUILDERS[op](PRESETS[preset], dtype, es):
            if not torch:
                case = replace(case, peers=tuple(p for p in case.peers if p.library != "torch"))
            out.append(replace(case, sets=_stream_sets(case)))
    return out


def _stream_sets(case: KernelCase) -> int:
    """Input copies that push a memory-bound case's bytes out of the cache between calls; 1
    (from the cache) for compute-bound cases and for those needing over MAX_SETS copies."""
    if case.bound != "memory":
        return 1
    count = benchlib.stream_count(case.bytes)
    return count if count <= MAX_SETS else 1


# ---------------------------------------------------------------------------------------------
# Devices and who runs where


@dataclass(frozen=True)
class Target:
    """A device the cases run on."""

    name: str
    index: int
    status: str   # "hardware" or "simulated"
    model: str
    host: bool    # Paddle's CPU place: the machine whose roofline is measured
    peaks: tuple = ()  # (key, value) pairs the plugin declares (DeviceSpec.peaks): hardware's roofline

    @property
    def device(self) -> tuple[str, int]:
        return self.name, self.index

    @property
    def key(self) -> str:
        return self.name if self.index == 0 else f"{self.name}:{self.index}"

    @property
    def simulated(self) -> bool:
        return self.status == "simulated"

    @property
    def label(self) -> str:
        return f"{self.key}, {SIMULATED}" if self.simulated else self.key


def resolve_devices(text: str) -> list[Target]:
    """``cpu,npu:1`` -> Targets; names the bad entry of ``--devices`` when one is unknown or
    unavailable here."""
    from anychip.devices import describe
    from anychip.plugins import registry
    from anychip.runtime.open import parse_device

    out = []
    for item in [t.strip() for t in text.split(",")]:
        if not item:
            raise ValueError(f"--devices: empty entry in {text!r}; expected a comma-separated list like cpu,npu")
        try:
            name, index = parse_device(item)
            spec = registry().spec(name)
        except ValueError as exc:
            raise ValueError(f"--devices: {exc}") from None
        info = describe(name)
        if info.status == "unavailable":
            raise ValueError(f"--devices: {name} is unavailable here: {info.reason}")
        if index >= info.count:
            raise ValueError(f"--devices: {item}: {name} has {info.count} device(s), indices 0-{info.count - 1}")
        target = Target(name, index, info.status, info.model, spec.paddle_type is None, tuple(dict(spec.peaks).items()))
        if target in out:
            raise ValueError(f"--devices: {item} is listed twice")
        out.append(target)
    return out


@dataclass(frozen=True)
class Measurement:
    """One implementation timed once on ``device``, listed under each of ``targets``."""

    impl: Impl
    device: tuple[str, int]
    targets: tuple[Target, ...]

    @property
    def on_host(self) -> bool:
        return self.device == ("cpu", 0)

    def label(self, target: Target) -> str:
        """The row label under ``target``: host work listed under another device says so."""
        if self.on_host and not target.host:
            return f"{self.impl.label} [host{' peer' if self.impl.role == PEER else ''}]"
        return self.impl.label


def measurements(case: KernelCase, targets: list[Target]) -> list[Measurement]:
    """anychip's op on each device; the reference on each hardware device and, for simulated
    ones, once on the host (a simulated device's Paddle ops are Paddle's CPU kernels anyway,
    plus the simulator's bookkeeping); each peer once on the host, listed under every device."""
    subject, reference, *peers = case.implementations()
    out = [Measurement(subject, t.device, (t,)) for t in targets]
    host_listed = [t for t in targets if t.simulated or t.host]
    out += [Measurement(reference, t.device, (t,)) for t in targets if not (t.simulated or t.host)]
    if host_listed:
        out.append(Measurement(reference, ("cpu", 0), tuple(host_listed)))
    out += [Measurement(p, ("cpu", 0), tuple(targets)) for p in peers]
    return out
