"""anychip's devices as a PyTorch device (anychip.torch): the conventions PyTorch's out-of-tree
backend tests check, fallbacks counted and refused in strict mode, and ops against torch's CPU."""

from __future__ import annotations

import re

import pytest

torch = pytest.importorskip("torch")

import anychip  # noqa: E402
import anychip.torch as at  # noqa: E402

CHIP = "npu"


@pytest.fixture(scope="module", autouse=True)
def enabled():
    at.enable(CHIP)
    yield


def dev(t):
    return t.to("anychip")


def test_tensors_print_and_live_on_the_chip():
    x = torch.ones(3, device="anychip")
    assert x.device == torch.device("anychip", 0)
    assert "device='anychip:0'" in repr(x)
    assert at.enabled_chip() == CHIP
    assert torch.anychip.device_count() == anychip.runtime.open_device(f"{CHIP}:0").runtime.device_count
    assert "simulated" in torch.anychip.get_device_name()


def test_copies_views_and_strided_round_trips():
    x = torch.arange(24, dtype=torch.float32).reshape(2, 3, 4)
    d = dev(x)
    assert torch.equal(d.cpu(), x)
    assert torch.equal(d.transpose(0, 2).cpu(), x.transpose(0, 2))
    assert torch.equal(d.transpose(0, 2).contiguous().cpu(), x.transpose(0, 2).contiguous())
    assert torch.equal(d[:, 1:, ::2].cpu(), x[:, 1:, ::2])
    target = torch.zeros(4, 3, 2, device="anychip")
    target.copy_(x.permute(2, 1, 0))  # host -> a device tensor, through a non-contiguous source
    assert torch.equal(target.cpu(), x.permute(2, 1, 0))
    view = target.transpose(0, 1)  # host -> a non-contiguous device view
    view.copy_(torch.ones(3, 4, 2))
    assert torch.equal(target.cpu(), torch.ones(4, 3, 2))
    assert torch.equal(dev(x).to(torch.bfloat16).cpu(), x.to(torch.bfloat16))
    assert d.sum().item() == x.sum().item()


def test_elementwise_broadcasting_and_type_promotion_match_the_cpu():
    torch.manual_seed(0)
    a, b = torch.randn(4, 1, 5), torch.randn(3, 1)
    for fn in (lambda a, b: a + b * 2, lambda a, b: a - b, lambda a, b: a * b, lambda a, b: a / b,
               lambda a, b: torch.maximum(a, b), lambda a, b: torch.where(a > b, a, b), lambda a, b: a.exp() + b.sin(),
               lambda a, b: torch.rsqrt(a.abs() + 1) * b.cos(), lambda a, b: (a + 1).pow(2) - 1,
               lambda a, b: 1 - a, lambda a, b: torch.rsub(a, b, alpha=2), lambda a, b: torch.sub(a, b, alpha=3)):
        torch.testing.assert_close(fn(dev(a), dev(b)).cpu(), fn(a, b), rtol=1e-6, atol=1e-6)
    i = torch.arange(6)
    assert torch.equal((dev(i) * 3 + 1).cpu(), i * 3 + 1)
    assert (dev(i) / 4).dtype == torch.float32


def test_reductions_softmax_matmul_and_indexing_match_the_cpu():
    torch.manual_seed(0)
    x, w = torch.randn(2, 7, 16), torch.randn(9, 16)
    checks = [lambda x, w: x.sum(-1), lambda x, w: x.mean((0, 2), keepdim=True), lambda x, w: x.amax(1),
              lambda x, w: x.softmax(-1), lambda x, w: x.log_softmax(-1), lambda x, w: x @ w.t(),
              lambda x, w: torch.nn.functional.linear(x, w, w[:, 0]), lambda x, w: torch.cat([x, x * 2], 1),
              lambda x, w: w.index_select(0, torch.tensor([2, 0, 2]).to(w.device))]
    for fn in checks:
        torch.testing.assert_close(fn(dev(x), dev(w)).cpu(), fn(x, w), rtol=1e-5, atol=1e-5)
    ids = torch.tensor([[1, 5, 5, 8]])
    torch.testing.assert_close(torch.nn.functional.embedding(dev(ids), dev(w)).cpu(),
                               torch.nn.functional.embedding(ids, w))


def test_sdpa_runs_the_attention_kernel_with_its_gradients():
    torch.manual_seed(0)
    q, k, v = torch.randn(1, 6, 9, 16), torch.randn(1, 2, 9, 16), torch.randn(1, 2, 9, 16)
    ref = [t.clone().requires_grad_() for t in (q, k, v)]
    ours = [dev(t).requires_grad_() for t in (q, k, v)]
    f = torch.nn.functional.scaled_dot_product_attention
    o_ref, o = f(*ref, is_causal=True, enable_gqa=True), f(*ours, is_causal=True, enable_gqa=True)
    torch.testing.assert_close(o.cpu(), o_ref, rtol=1e-5, atol=1e-5)
    g = torch.randn_like(o_ref)
    o_ref.backward(g)
    o.backward(dev(g))
    for a, b in zip(ref, ours):
        torch.testing.assert_close(b.grad.cpu(), a.grad, rtol=1e-5, atol=1e-5)
    anychip.fallback.reset_fallbacks()
    f(*[t.detach() for t in ours], is_causal=True, enable_gqa=True)
    assert not anychip.fallback.fallback_counts()


def test_manual_seed_reproduces_and_random_ops_are_counted_fallbacks():
    anychip.fallback.reset_fallbacks()
    torch.manual_seed(7)
    a = torch.randn(5, device="anychip").cpu()
    torch.manual_seed(7)
    b = torch.randn(5, device="anychip").cpu()
    assert torch.equal(a, b)
    assert any(op.startswith("aten::normal") for (_d, op, _t) in anychip.fallback.fallback_counts())


def test_an_op_without_a_kernel_is_counted_and_reported():
    anychip.fallback.reset_fallbacks()
    x = dev(torch.tensor([3.0, 1.0, 2.0]))
    assert x.argmax().item() == 0
    counts = anychip.fallback.fallback_counts()
    assert any(d == CHIP and op.startswith("aten::argmax") for (d, op, _t) in counts), counts
    assert "aten::argmax" in anychip.fallback_report()


def test_streams_events_and_synchronize():
    s = torch.Stream(device="anychip")
    e1, e2 = torch.Event(device="anychip", enable_timing=False), torch.Event(device="anychip")
    with s:  # kernels launched here are ordered on s
        x = torch.ones(1000, device="anychip") * 3
        e1.record(s)
    e1.wait()  # the current (default) stream waits for s
    e1.synchronize()
    assert e1.query()
    e2.record()
    torch.anychip.synchronize()
    assert s.query()
    assert x.sum().item() == 3000


def test_memory_statistics_and_out_of_memory():
    before = torch.anychip.memory_allocated()
    x = torch.empty(1 << 20, device="anychip")
    assert torch.anychip.memory_allocated() >= before + (4 << 20)
    assert torch.anychip.max_memory_allocated() >= torch.anychip.memory_allocated()
    free, total = torch.anychip.mem_get_info()
    assert 0 < free <= total
    del x
    assert torch.anychip.memory_allocated() == before
    with pytest.raises(torch.OutOfMemoryError, match="out of memory"):
        torch.empty(total + (1 << 20), dtype=torch.uint8, device="anychip")


def test_bad_device_index_and_second_chip_are_refused():
    with pytest.raises((RuntimeError, IndexError), match="out of range"):
        torch.empty(2, device=f"anychip:{torch.anychip.device_count()}")
    with pytest.raises(at.BridgeError, match="one chip per process"):
        at.enable("xpu")
    with pytest.raises(ValueError, match="host CPU"):
        at.enable("cpu")


def test_tied_weights_stay_tied_when_moved():
    emb = torch.nn.Embedding(10, 4)
    head = torch.nn.Linear(4, 10, bias=False)
    head.weight = emb.weight
    model = torch.nn.Sequential(emb, head).to("anychip")
    assert model[0].weight is model[1].weight


def test_models_export_writes_a_folder_transformers_loads(tmp_path):
    import subprocess
    import sys

    out = tmp_path / "smollm2-hf"
    result = subprocess.run([sys.executable, "-m", "anychip.cli.main", "models", "export", "smollm2", str(out)],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    from transformers import AutoConfig

    assert AutoConfig.from_pretrained(out).num_hidden_layers == 30


def test_fused_ops_run_the_chips_kernels_with_autograd():
    torch.manual_seed(0)
    x, w = torch.randn(2, 5, 64), torch.rand(64) + 0.5
    gate, up = torch.randn(3, 32), torch.randn(3, 32)
    q, k, pos = torch.randn(1, 4, 6, 64), torch.randn(1, 4, 2, 64), torch.arange(4)[None]
    cases = [(lambda x, w: torch.ops.anychip.rms_norm(x, w, 1e-5)[0], (x, w)),
             (lambda g, u: torch.ops.anychip.swiglu(g, u), (gate, up)),
             (lambda q, k, p: sum(torch.ops.anychip.rotary_embedding(q, k, p, 10000.0)[i].sum() * (i + 2) for i in (0, 1)),
              (q, k, pos))]
    anychip.fallback.reset_fallbacks()
    for fn, args in cases:
        ref = [a.clone().requires_grad_(a.is_floating_point()) for a in args]
        ours = [dev(a).requires_grad_(a.is_floating_point()) for a in args]
        out_ref, out = fn(*ref), fn(*ours)
        torch.testing.assert_close(out.cpu(), out_ref, rtol=1e-5, atol=1e-5)
        (out_ref * out_ref).sum().backward()
        (out * out).sum().backward()
        for a, b in zip(ref, ours):
            if a.is_floating_point():
                torch.testing.assert_close(b.grad.cpu(), a.grad, rtol=1e-4, atol=1e-5)
    assert not anychip.fallback.fallback_counts()


def test_fused_attention_equals_its_reference_with_gradients():
    torch.manual_seed(0)
    q, k, v = torch.randn(2, 5, 4, 16), torch.randn(2, 7, 2, 16), torch.randn(2, 7, 2, 16)
    mask = torch.rand(2, 1, 5, 7) > 0.3
    anychip.fallback.reset_fallbacks()
    for m in (None, mask):
        _assert_attention_matches(torch.ops.anychip.attention, (q, k, v), m, True)
    assert not anychip.fallback.fallback_counts()


def _assert_attention_matches(op, qkv, mask, causal):
    """``op`` on the device equals its reference on the CPU, output and q/k/v gradients."""
    ref = [t.clone().requires_grad_() for t in qkv]
    ours = [dev(t).requires_grad_() for t in qkv]
    o_ref, _ = op(*ref, mask, 0.25, causal)
    o, _ = op(*ours, None if mask is None else dev(mask), 0.25, causal)
    torch.testing.assert_close(o.cpu(), o_ref, rtol=1e-5, atol=1e-5)
    o_ref.square().sum().backward()
    o.square().sum().backward()
    for a, b in zip(ref, ours):
        torch.testing.assert_close(b.grad.cpu(), a.grad, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("bits,group_size,offsets", [(8, -1, False), (8, 32, True), (4, 64, False), (4, 32, True)])
def test_fused_weight_only_linear_equals_its_dequantized_reference(bits, group_size, offsets):
    torch.manual_seed(0)
    n, k = 24, 128
    x, bias = torch.randn(3, k, requires_grad=True), torch.randn(n)
    if bits == 8:
        qweight = torch.randint(-127, 128, (n, k), dtype=torch.int8)
    else:
        qweight = torch.randint(0, 256, (n, k // 2), dtype=torch.uint8)
    groups = 1 if group_size == -1 else k // group_size
    scales = torch.rand(n, groups) * 0.02
    offs = torch.randn(n, groups) * 0.01 if offsets else None
    y_ref = torch.ops.anychip.weight_only_linear(x, qweight, scales, offs, bias, bits, group_size)
    xd = dev(x.detach()).requires_grad_()
    anychip.fallback.reset_fallbacks()
    y = torch.ops.anychip.weight_only_linear(xd, dev(qweight), dev(scales), None if offs is None else dev(offs),
                                             dev(bias), bits, group_size)
    torch.testing.assert_close(y.cpu(), y_ref, rtol=1e-4, atol=1e-4)
    y_ref.sum().backward()
    y.sum().backward()
    torch.testing.assert_close(xd.grad.cpu(), x.grad, rtol=1e-4, atol=1e-4)
    assert not anychip.fallback.fallback_counts()


def test_fused_w8a8_linear_equals_its_reference():
    torch.manual_seed(0)
    x, qweight = torch.randn(4, 96), torch.randint(-127, 128, (16, 96), dtype=torch.int8)
    scales, bias = torch.rand(16, 1) * 0.01, torch.randn(16)
    y_ref = torch.ops.anychip.w8a8_linear(x, qweight, scales, bias)
    anychip.fallback.reset_fallbacks()
    y = torch.ops.anychip.w8a8_linear(dev(x), dev(qweight), dev(scales), dev(bias))
    torch.testing.assert_close(y.cpu(), y_ref, rtol=1e-4, atol=1e-4)
    assert not anychip.fallback.fallback_counts()


@pytest.mark.parametrize("e,causal", [(1, True), (2, True), (2, False), (4, False)])
def test_fused_flashmask_attention_equals_its_dense_reference(e, causal):
    torch.manual_seed(0)
    b, s, hq, hk, d = 2, 8, 4, 2, 16
    q, k, v = torch.randn(b, s, hq, d), torch.randn(b, s, hk, d), torch.randn(b, s, hk, d)
    idx = torch.sort(torch.randint(0, s + 1, (b, hk, s, e), dtype=torch.int32), -1).values
    anychip.fallback.reset_fallbacks()
    _assert_attention_matches(torch.ops.anychip.flashmask_attention, (q, k, v), idx, causal)
    assert not anychip.fallback.fallback_counts()


def test_conformance_through_torch_passes_every_op_torch_reaches():
    from anychip import conformance

    report = conformance.run(CHIP, sections=["op"], framework="torch", progress=False)
    assert not report.failed, report.matrix_text()
    assert report.framework == "torch" and "ops checked through PyTorch" in report.matrix_text()
    checked = {r.name for r in report.results}
    assert {"rms_norm", "attention", "flashmask_attention", "weight_only_linear", "w8a8_linear", "add",
            "matmul", "cast", "softmax_grad", "embedding_grad"} <= checked
    assert report.counts()["pass"] > 150 and report.counts()["fallback"] == 0
    # what no PyTorch call reaches is named, with what runs instead, and not planned
    assert not checked & {"linear", "decoder_step", "matmul_grad"}
    assert any(n.startswith("not reached from torch: linear (F.linear runs ATen's addmm") for n in report.notes)
    assert report.counts()["skipped"] == 0  # every planned op has cases PyTorch states


def test_conformance_through_torch_catches_a_wrong_kernel_and_a_missing_backward(monkeypatch):
    """exp on the chip computing sin (a wrong kernel) fails with its error; rms_norm without its
    backward kernel is a fallback in the bwd column, counted as anychip::rms_norm_grad."""
    from anychip import conformance
    from anychip.plugins import registry

    kernels = registry().kernels
    exp, sin, norm = (kernels.find(op, CHIP, "float32") for op in ("exp", "sin", "rms_norm"))
    table = dict(kernels._kernels)
    table[("exp", CHIP, "float32")] = exp.__class__(exp.op, CHIP, ("float32",), sin.forward, None, ())
    table[("rms_norm", CHIP, "float32")] = norm.__class__(norm.op, CHIP, ("float32",), norm.forward, None, ())
    monkeypatch.setattr(kernels, "_kernels", table)
    report = conformance.run(CHIP, sections=["op"], ops=["exp", "rms_norm"], dtypes=["float32"], framework="torch",
                             progress=False)
    status = {(r.name, r.direction): r for r in report.results}
    assert status[("exp", "fwd")].status == "fail" and status[("exp", "fwd")].max_error > 0.1
    assert "outside tolerance" in status[("exp", "fwd")].detail
    assert status[("rms_norm", "fwd")].status == "pass"
    assert status[("rms_norm", "bwd")].status == "fallback"
    assert "anychip::rms_norm_grad" in status[("rms_norm", "bwd")].detail
    assert report.exit_code == 1


def test_conformance_cli_runs_through_torch_and_refuses_what_torch_cannot():
    import subprocess
    import sys

    def cli(*args):
        return subprocess.run([sys.executable, "-m", "anychip.cli.main", "conformance", *args], capture_output=True,
                              text=True, timeout=300)

    run = cli("--device", "xpu", "--framework", "torch", "--ops", "swiglu,matmul")
    assert run.returncode == 0, run.stdout + run.stderr
    assert "xpu (simulated)" in run.stdout and "ops checked through PyTorch" in run.stdout
    assert re.search(r"\nswiglu +pass +pass", run.stdout) and "Runtime contract" in run.stdout
    refused = cli("--device", "npu", "--framework", "torch", "--sections", "e2e")
    assert refused.returncode == 2 and "e2e cannot run through torch" in refused.stderr
    refused = cli("--device", "cpu", "--framework", "torch")
    assert refused.returncode == 2 and "PyTorch's own 'cpu' device" in refused.stderr
