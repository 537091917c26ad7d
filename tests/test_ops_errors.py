"""Bad input to anychip.ops fails before any kernel runs, with the argument named; missing
kernels fall back to the reference and are counted, or raise in strict mode."""

import textwrap

import numpy as np
import pytest

from conftest import run_python
from ops_helpers import host, paddle, tensor

paddle()  # through anychip, so its devices are registered with Paddle

import anychip  # noqa: E402
import anychip.ops as ops  # noqa: E402
from anychip.ops import OpArgumentError  # noqa: E402


def t(shape, device="cpu", dtype="float32"):
    return tensor(np.random.default_rng(0).standard_normal(shape), device, dtype)


@pytest.mark.parametrize("call,message", [
    (lambda: ops.rms_norm(t((4, 8)), t((7,))), "weight must have shape [8]"),
    (lambda: ops.rms_norm(t((4, 8)), t((8,)), eps=0), "eps must be > 0"),
    (lambda: ops.rms_norm(t((4, 8)), t((8,)), residual=t((4, 9))), "residual must have shape [4, 8]"),
    (lambda: ops.rms_norm(t((4, 8)), t((8,), dtype="float16")), "weight has dtype float16"),
    (lambda: ops.rms_norm(tensor(np.ones((2, 2), np.int32), "cpu"), t((2,))), "x has dtype int32"),
    (lambda: ops.rms_norm(t((4, 8)), np.ones(8)), "weight must be a paddle.Tensor"),
    (lambda: ops.attention(t((1, 4, 3, 8)), t((1, 4, 2, 8)), t((1, 4, 2, 8))), "multiple of k's kv_heads"),
    (lambda: ops.attention(t((1, 4, 2, 8)), t((1, 4, 2, 16)), t((1, 4, 2, 16))), "k must be [1, seq_k, kv_heads, 8]"),
    (lambda: ops.attention(t((1, 4, 2, 8)), t((1, 5, 2, 8)), t((1, 4, 2, 8))), "v must have shape [1, 5, 2, 8]"),
    (lambda: ops.attention(t((4, 2, 8)), t((1, 4, 2, 8)), t((1, 4, 2, 8))), "q must be 4-D"),
    (lambda: ops.attention(t((1, 4, 2, 8)), t((1, 4, 2, 8)), t((1, 4, 2, 8)),
                           mask=tensor(np.ones((1, 1, 4, 5), bool), "cpu")), "mask must be [1 or 1, 2 or 1, 4, 4]"),
    (lambda: ops.attention(t((1, 4, 2, 8)), t((1, 4, 2, 8)), t((1, 4, 2, 8)), mask=t((1, 1, 4, 4))), "mask has dtype float32"),
    (lambda: ops.flashmask_attention(t((1, 4, 2, 8)), t((1, 4, 2, 8)), t((1, 4, 2, 8)),
                                     tensor(np.zeros((1, 1, 5, 1), np.int32), "cpu")), "must be [1, 1|2|2, 4, 1|2|4]"),
    (lambda: ops.flashmask_attention(t((1, 4, 2, 8)), t((1, 4, 2, 8)), t((1, 4, 2, 8)),
                                     tensor(np.full((1, 1, 4, 1), 9, np.int32), "cpu")), "outside the query rows [0, 4]"),
    (lambda: ops.flashmask_attention(t((1, 4, 2, 8)), t((1, 4, 2, 8)), t((1, 4, 2, 8)),
                                     tensor(np.zeros((1, 1, 4, 1), np.int64), "cpu")), "startend_row_indices has dtype int64"),
    (lambda: ops.flashmask_attention(t((1, 4, 2, 8)), t((1, 4, 2, 8)), t((1, 4, 2, 8)),
                                     tensor(np.zeros((1, 1, 4, 1), np.int32), "cpu"), causal=False), "needs causal=True"),
    (lambda: ops.weight_quantize(t((100, 8)), bits=8, group_size=64), "group_size must be -1 or divide K=100"),
    (lambda: ops.weight_quantize(t((96, 8)), bits=4), "multiple of 64"),
    (lambda: ops.weight_quantize(t((64, 8)), bits=3), "bits must be 4 or 8"),
    (lambda: ops.weight_only_linear(t((2, 64)), tensor(np.zeros((8, 64), np.int8), "cpu"),
                                    tensor(np.ones((8, 2), np.float32), "cpu")), "scales must have shape [8, 1]"),
    (lambda: ops.weight_only_linear(t((2, 64)), tensor(np.zeros((8, 32), np.int8), "cpu"),
                                    tensor(np.ones((8, 1), np.float32), "cpu")), "qweight must have shape [8, 64]"),
    (lambda: ops.rotary_embedding(t((1, 4, 2, 7)), t((1, 4, 1, 7)), tensor(np.zeros((1, 4), np.int64), "cpu")), "head_dim must be even"),
    (lambda: ops.rotary_embedding(t((1, 4, 2, 8)), t((1, 4, 1, 8)), tensor(np.zeros((1, 5), np.int64), "cpu")), "positions must have shape [1, 4]"),
    (lambda: ops.swiglu(t((3, 4)), t((3, 5))), "up must have shape [3, 4]"),
    (lambda: ops.adamw_step([t((3,))], [t((3,))], [t((3,))], [], lr=1e-3, step=1), "moments2 has 0 tensors"),
    (lambda: ops.adamw_step([t((3,))], [t((3,))], [t((3,))], [t((3,))], lr=1e-3, step=0), "step is 1-based"),
])
def test_bad_input_is_named_before_any_kernel(call, message):
    anychip.reset_fallbacks()
    with pytest.raises(OpArgumentError) as info:
        call()
    assert message in str(info.value)
    assert not anychip.fallback_counts()


def test_tensors_on_different_devices():
    with pytest.raises(OpArgumentError, match=r"one device, got x on cpu:0, weight on npu:0"):
        ops.rms_norm(t((2, 4)), t((4,), "npu"))


def test_views_are_dense_so_every_device_takes_them():
    """anychip runs Paddle without stride kernels (FLAGS_use_stride_kernel=0): a transpose or a
    slice is a dense tensor, so no device needs a `contiguous` kernel to feed an op."""
    x, on_npu = t((8, 6)).transpose([1, 0]), t((8, 6), "npu").transpose([1, 0])
    assert x.is_contiguous() and on_npu.is_contiguous()
    np.testing.assert_allclose(host(ops.swiglu(on_npu, on_npu)), host(ops.swiglu(x, x)))


def test_a_non_contiguous_tensor_is_refused_on_a_device():
    from anychip.ops import checks

    class StridedView:  # what Paddle would hand over with stride kernels on
        def is_contiguous(self):
            return False

    with pytest.raises(OpArgumentError, match="gate is a non-contiguous view on npu:0"):
        checks.contiguous("swiglu", "gate", StridedView(), ("npu", 0))


def test_a_dtype_the_chip_lacks_falls_back_and_is_counted():
    # the simulated Hygon Z100 has no bfloat16: its plugin registers no bf16 kernels
    anychip.reset_fallbacks()
    x = t((3, 16), "dcu", "bfloat16")
    y = ops.rms_norm(x, t((16,), "dcu", "bfloat16"))
    want = ops.rms_norm(t((3, 16), "cpu", "bfloat16"), t((16,), "cpu", "bfloat16"))
    np.testing.assert_allclose(host(y), host(want), rtol=2e-2, atol=2e-2)
    assert anychip.fallback_counts()[("dcu", "anychip.rms_norm", "bfloat16")] == 1
    assert "anychip.rms_norm" in anychip.fallback_report()


def test_strict_mode_fails_on_a_device_that_lacks_a_kernel():
    code = textwrap.dedent("""
        import numpy as np, anychip, anychip.ops as ops
        from anychip.frontends.paddle import import_paddle
        paddle = import_paddle()
        x = paddle.to_tensor(np.ones((2, 8), np.float32), place=paddle.CPUPlace()).astype("bfloat16")
        x = x._copy_to(paddle.CustomPlace("anychip_hygon", 0), True)
        w = paddle.ones([8], "float32").astype("bfloat16")._copy_to(paddle.CustomPlace("anychip_hygon", 0), True)
        try:
            ops.rms_norm(x, w)
        except anychip.fallback.KernelFallbackError as e:
            print("STRICT:", e)
    """)
    result = run_python(code, env={"ANYCHIP_STRICT": "1"})
    assert "STRICT: anychip.ops.rms_norm on dcu (bfloat16): no kernel is registered for dcu/bfloat16" in result.stdout, result.stderr


def test_kernels_touch_only_their_tensors_in_checking_mode():
    """With simulated memory guarded (mprotect), a kernel on npu runs because the launch opens
    exactly its tensors' ranges; a host read of device memory outside a launch would crash."""
    code = textwrap.dedent("""
        import numpy as np, anychip.ops as ops
        from anychip.frontends.paddle import import_paddle
        paddle = import_paddle()
        npu = paddle.CustomPlace("anychip_ascend", 0)
        x = paddle.to_tensor(np.arange(12, dtype=np.float32).reshape(3, 4), place=paddle.CPUPlace())._copy_to(npu, True)
        w = paddle.to_tensor(np.ones(4, np.float32), place=paddle.CPUPlace())._copy_to(npu, True)
        y = ops.rms_norm(x, w, eps=1e-6)
        print("OK", y._copy_to(paddle.CPUPlace(), True).numpy()[0].astype(float).round(3).tolist())
    """)
    result = run_python(code, env={"ANYCHIP_SIM_CHECK": "1"})
    assert "OK [0.0, 0.535, 1.069, 1.604]" in result.stdout, result.stderr


def test_a_kernel_error_names_the_op_and_device():
    from anychip.kernels import NativeKernel
    from anychip.ops.dispatch import KernelError, launch
    from anychip_plugins.host import LIBRARY

    x = t((2, 4))
    y = t((2, 4), dtype="float64")  # not a float dtype the kernel takes
    with pytest.raises(KernelError, match=r"anychip.ops.swiglu on cpu:0: .*dtype"):
        launch(NativeKernel(str(LIBRARY), "anychip_cpu_swiglu"), "swiglu", ("cpu", 0), [y, y], [x])
    assert paddle() is not None


def test_a_forward_only_kernel_gets_the_reference_backward_counted(monkeypatch):
    from anychip.kernels import Kernel
    from anychip.plugins import registry

    kernels = registry().kernels
    full = kernels.find("swiglu", "cpu", "float32")
    monkeypatch.setitem(kernels._kernels, ("swiglu", "cpu", "float32"),
                        Kernel("swiglu", "cpu", ("float32",), full.forward, None))
    anychip.reset_fallbacks()
    gate = tensor(np.linspace(-3, 3, 12).reshape(3, 4), "cpu", "float32", grad=True)
    up = tensor(np.linspace(1, 2, 12).reshape(3, 4), "cpu", "float32", grad=True)
    dgate, dup = paddle().grad([ops.swiglu(gate, up)], [gate, up])
    sig = 1 / (1 + np.exp(-host(gate)))
    np.testing.assert_allclose(host(dup), host(gate) * sig, rtol=1e-5)
    np.testing.assert_allclose(host(dgate), host(up) * sig * (1 + host(gate) * (1 - sig)), rtol=1e-5)
    assert anychip.fallback_counts() == {("cpu", "anychip.swiglu_grad", "float32"): 1}


def test_a_python_kernel_can_be_registered(monkeypatch):
    """Backends that generate Python-level code register plain callables."""
    from anychip.plugins import registry

    calls = []

    def scaled_copy(inputs, outputs, attrs):
        calls.append(attrs)
        paddle().assign(inputs[0] * 0 + 7, output=outputs[0])

    kernels = registry().kernels
    monkeypatch.setattr(kernels, "_kernels", dict(kernels._kernels))
    kernels._kernels.pop(("swiglu", "cpu", "float32"))
    kernels.register("swiglu", "cpu", ("float32",), forward=scaled_copy)
    y = ops.swiglu(t((2, 3)), t((2, 3)))
    assert calls == [()] and np.all(host(y) == 7)


def test_kernels_get_the_thread_count_from_anychip_not_from_paddles_omp_setting():
    code = textwrap.dedent("""
        import os
        from anychip.ops.dispatch import num_threads
        import anychip.frontends.paddle as pf
        pf.import_paddle()
        print(os.environ.get("OMP_NUM_THREADS"), num_threads())
    """)
    result = run_python(code, env={"ANYCHIP_NUM_THREADS": "3"})
    assert result.stdout.split()[-1] == "3", result.stderr[-2000:]
    bad = run_python(code, env={"ANYCHIP_NUM_THREADS": "many"})
    assert "ANYCHIP_NUM_THREADS must be a positive integer, got 'many'" in bad.stderr


def test_every_fused_op_has_a_documented_function_and_a_tolerance_per_dtype():
    import inspect

    for name, spec in ops.OPS.items():
        function = getattr(ops, name)
        assert function.__doc__ and inspect.signature(function).parameters, name
        assert set(spec.tolerance) == set(spec.dtypes), name


@pytest.mark.parametrize("offsets,message", [
    (lambda: tensor(np.zeros((8, 3), np.float32), "cpu"), "offsets must have shape [8, 2] (one per group"),
    (lambda: t((8, 2), dtype="float16"), "offsets has dtype float16, expected one of float32"),
    (lambda: np.zeros((8, 2), np.float32), "offsets must be a paddle.Tensor"),
    (lambda: tensor(np.zeros((8, 2), np.float32), "npu"), "offsets on npu:0"),
])
def test_bad_weight_only_offsets_are_named_before_any_kernel(offsets, message):
    anychip.reset_fallbacks()
    x, qweight = t((3, 64)), tensor(np.zeros((8, 32), np.uint8), "cpu")
    scales = tensor(np.ones((8, 2), np.float32), "cpu")
    with pytest.raises(OpArgumentError) as info:
        ops.weight_only_linear(x, qweight, scales, bits=4, group_size=32, offsets=offsets())
    assert message in str(info.value)
    assert not anychip.fallback_counts()


def _packed_call(**change):
    """weight_only_linear's tensor arguments (4 bits, K 128, N 8, groups of 32), one changed."""
    args = dict(x=t((3, 128)), qweight=tensor(np.zeros((8, 64), np.uint8), "cpu"),
                scales=tensor(np.ones((8, 4), np.float32), "cpu"), bias=t((8,)), bits=4, group_size=32,
                offsets=tensor(np.zeros((8, 4), np.float32), "cpu"))
    return args | {name: value() if callable(value) else value for name, value in change.items()}


@pytest.mark.parametrize("change", [
    {}, {"bias": None, "offsets": None}, {"x": lambda: t((3, 128), dtype="bfloat16"), "bias": None},
    {"x": lambda: t((128,))}, {"x": lambda: t(())}, {"x": lambda: t((3, 64))}, {"x": lambda: np.zeros((3, 128))},
    {"x": lambda: t((3, 128), dtype="float64")}, {"x": lambda: t((3, 128), "npu")},
    {"qweight": lambda: tensor(np.zeros((8, 64), np.int8), "cpu")}, {"qweight": lambda: t((8, 64))},
    {"qweight": lambda: tensor(np.zeros((8, 65), np.uint8), "cpu")},
    {"qweight": lambda: tensor(np.zeros((8, 64, 1), np.uint8), "cpu")},
    {"scales": lambda: tensor(np.ones((8, 2), np.float32), "cpu")}, {"scales": lambda: t((8, 4), dtype="float16")},
    {"scales": lambda: tensor(np.ones((7, 4), np.float32), "cpu")}, {"scales": lambda: t((8, 4), "npu")},
    {"bias": lambda: t((8,), dtype="bfloat16")}, {"bias": lambda: t((9,))}, {"bias": lambda: t((8,), "npu")},
    {"offsets": lambda: tensor(np.zeros((8, 3), np.float32), "cpu")}, {"bits": 3}, {"bits": 8},
    {"group_size": 48}, {"group_size": 0}, {"group_size": -1},
])
def test_one_pass_packed_checks_accept_only_what_the_full_checks_do(change):
    """weight_only_linear first reads its arguments in one pass (quant._accept_packed) and only
    calls the step-by-step checks when that pass does not accept them: it must never accept a
    call those checks refuse, and must accept the plain good calls (else no call gains)."""
    from anychip.ops import quant

    args = _packed_call(**change)
    fast = quant._accept_packed(args["x"], args["qweight"], args["scales"], args["bias"], args["bits"],
                                args["group_size"], args["offsets"])
    try:
        *_, device = quant._check_packed("weight_only_linear", args["x"], args["qweight"], args["scales"],
                                         args["bias"], args["bits"], args["group_size"], args["offsets"])
    except (OpArgumentError, ValueError):
        assert fast is None
        return
    assert fast == device
    if not change or change.keys() <= {"bias", "offsets"} or "bfloat16" in str(change):
        assert fast == ("cpu", 0)
