"""Attention forward, B=1, S=2048, 9 query heads / 3 KV heads, head dim 64 (SmolLM2-135M's).

Compute-bound: FLOPs count the visible (query, key) pairs only, 4 * D per pair per query head
(q k^T and p v), so a masked kernel that skips hidden tiles and one that computes them and
throws them away are credited the same useful work. Peers get the layout they want
([B, H, S, D] for torch) prepared outside the timed call.
"""

import numpy as np
import pytest

import anychip.ops as ops
from anychip.ops import masks
from benchlib import Case, FasterThan, host_tensor

B, S, HQ, HK, D = 1, 2048, 9, 3, 64
DOCS, DOC_LEN = 8, 256
PEAK = {"float32": "fp32", "bfloat16": "bf16"}
SHORT = {"float32": "fp32", "bfloat16": "bf16"}


def _flops(pairs: int) -> float:
    return 4.0 * B * HQ * D * pairs


CAUSAL_PAIRS = S * (S + 1) // 2
DOC_PAIRS = DOCS * DOC_LEN * (DOC_LEN + 1) // 2


def causal_case(dtype):
    return Case(
        f"attention causal GQA fwd {SHORT[dtype]} S{S} H{HQ}/{HK} D{D}", "compute", _flops(CAUSAL_PAIRS),
        peak=PEAK[dtype], targets=(FasterThan("torch", 1.0, "torch SDPA"),),
        note="FLOPs: 4*D per visible (query, key) pair per query head")


def document_case(dtype):
    return Case(
        f"causal-document mask {DOCS}x{DOC_LEN} fwd {SHORT[dtype]} S{S} H{HQ}/{HK} D{D}", "compute",
        _flops(DOC_PAIRS), peak=PEAK[dtype],
        targets=(FasterThan("anychip_dense", 2.5, "anychip dense-masked attention"),
                 FasterThan("torch", 1.0, "torch SDPA dense mask")),
        note="anychip = flashmask_attention; FLOPs of the visible pairs only")


def _arrays():
    rng = np.random.default_rng(0)
    q = rng.standard_normal((B, S, HQ, D), dtype=np.float32)
    k = rng.standard_normal((B, S, HK, D), dtype=np.float32)
    v = rng.standard_normal((B, S, HK, D), dtype=np.float32)
    return q, k, v


def _document_startend() -> np.ndarray:
    return masks.causal_document([DOC_LEN] * DOCS)


def _dense_document_mask() -> np.ndarray:
    """[1, 1, S, S] bool, True = visible: causal within each document (the same mask as
    ``_document_startend``, expanded by anychip's own rule)."""
    return ops.flashmask_dense_mask(_document_startend(), S, HQ, causal=True)


def _torch_qkv(torch, dtype):
    tdt = {"float32": torch.float32, "bfloat16": torch.bfloat16}[dtype]
    return [torch.from_numpy(a.transpose(0, 2, 1, 3).copy()).to(tdt) for a in _arrays()]


def _paddle_qkv(dtype):
    return [host_tensor(a, dtype) for a in _arrays()]


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("impl", ["anychip", "torch", "paddle"])
def test_attention_causal(benchmark, bench, pd, request, impl, dtype):
    case = causal_case(dtype)
    if impl == "torch":
        torch = request.getfixturevalue("torch")
        q, k, v = _torch_qkv(torch, dtype)
        sdpa = torch.nn.functional.scaled_dot_product_attention
        with torch.no_grad():
            bench.run(benchmark, case, impl, lambda: sdpa(q, k, v, is_causal=True, enable_gqa=True),
                      label="torch SDPA (enable_gqa)")
        return
    if impl == "paddle" and dtype != "float32":
        pytest.skip("Paddle's CPU scaled_dot_product_attention has no bf16 kernel")
    q, k, v = _paddle_qkv(dtype)
    with pd.no_grad():
        if impl == "anychip":
            bench.run(benchmark, case, impl, lambda: ops.attention(q, k, v, causal=True),
                      label="anychip ops.attention")
        else:
            sdpa = pd.nn.functional.scaled_dot_product_attention
            bench.run(benchmark, case, impl, lambda: sdpa(q, k, v, is_causal=True, training=False),
                      label="paddle F.scaled_dot_product_attention", min_rounds=3)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("impl", ["anychip", "anychip_dense", "torch", "paddle"])
def test_document_mask(benchmark, bench, pd, request, impl, dtype):
    case = document_case(dtype)
    dense = _dense_document_mask()
    if impl == "torch":
        torch = request.getfixturevalue("torch")
        q, k, v = _torch_qkv(torch, dtype)
        mask = torch.from_numpy(dense)
        sdpa = torch.nn.functional.scaled_dot_product_attention
        with torch.no_grad():
            bench.run(benchmark, case, impl, lambda: sdpa(q, k, v, attn_mask=mask, enable_gqa=True),
                      label="torch SDPA, dense bool mask")
        return
    if impl == "paddle" and dtype != "float32":
        pytest.skip("Paddle's CPU scaled_dot_product_attention has no bf16 kernel")
    q, k, v = _paddle_qkv(dtype)
    with pd.no_grad():
        if impl == "anychip":
            startend = host_tensor(_document_startend())
            bench.run(benchmark, case, impl, lambda: ops.flashmask_attention(q, k, v, startend, causal=True),
                      label="anychip ops.flashmask_attention")
        elif impl == "anychip_dense":
            mask = host_tensor(dense)
            bench.run(benchmark, case, impl, lambda: ops.attention(q, k, v, causal=True, mask=mask),
                      label="anychip ops.attention, causal + dense bool mask")
        else:
            mask = host_tensor(dense)
            sdpa = pd.nn.functional.scaled_dot_product_attention
            bench.run(benchmark, case, impl, lambda: sdpa(q, k, v, attn_mask=mask, training=False),
                      label="paddle F.scaled_dot_product_attention, dense mask", min_rounds=3)
