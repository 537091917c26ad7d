"""ops.WeightOnlyLinear: weight_only_linear with its weights checked once. Every call must give
what weight_only_linear gives for the same arguments (values bit for bit, dtype, gradients,
errors, counted fallbacks), whether it takes the short launch or defers to the op."""

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ops_helpers import host, paddle, tensor

paddle()  # through anychip, so its devices are registered with Paddle

import anychip  # noqa: E402
import anychip.ops as ops  # noqa: E402
from anychip.ops import OpArgumentError, quant  # noqa: E402
from anychip.ops.quant import quantize_numpy  # noqa: E402

SETTINGS = settings(max_examples=10, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])


def weights(rng, device, k, n, bits, group_size, offsets=False, bias_dtype=None):
    qweight, scales = quantize_numpy(rng.standard_normal((k, n)) * 0.1, bits, group_size)
    out = {"qweight": tensor(qweight, device), "scales": tensor(scales, device)}
    if offsets:
        out["offsets"] = tensor(rng.uniform(-0.1, 0.05, scales.shape) + 8 * scales, device, "float32")
    if bias_dtype:
        out["bias"] = tensor(rng.standard_normal(n), device, bias_dtype)
    return out


@pytest.fixture
def no_op_calls(monkeypatch):
    """Fails any call that reaches weight_only_linear: the short launch must not."""
    def refuse(*args, **kwargs):
        raise AssertionError("WeightOnlyLinear deferred to weight_only_linear")

    monkeypatch.setattr(quant, "weight_only_linear", refuse)


@pytest.mark.parametrize("device", ["cpu", "npu"])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
@SETTINGS
@given(m=st.integers(1, 6), n=st.integers(1, 40), k_blocks=st.integers(1, 4), bits=st.sampled_from([4, 8]),
       group_size=st.sampled_from([-1, 32, 64, 128]), offsets=st.booleans(), bias=st.booleans(),
       x_int8=st.booleans(), seed=st.integers(0, 99))
def test_calls_equal_the_op_bit_for_bit(device, dtype, m, n, k_blocks, bits, group_size, offsets, bias, x_int8, seed):
    anychip.reset_fallbacks()
    rng = np.random.default_rng(seed)
    k = 64 * k_blocks
    if group_size != -1 and k % group_size:
        group_size = 32
    w = weights(rng, device, k, n, bits, group_size, offsets, dtype if bias else None)
    lin = ops.WeightOnlyLinear(bits=bits, group_size=group_size, **w)
    x = tensor(rng.standard_normal((2, m, k)), device, dtype)
    want = ops.weight_only_linear(x, bits=bits, group_size=group_size, x_int8=x_int8, **w)
    with paddle().no_grad():
        got = lin(x, x_int8=x_int8)
    assert got.dtype == want.dtype and got.shape == want.shape == [2, m, n] and got.stop_gradient
    np.testing.assert_array_equal(host(got), host(want))
    assert not anychip.fallback_counts()


@pytest.mark.parametrize("device", ["cpu", "npu"])
def test_good_calls_take_the_short_launch(device, no_op_calls):
    rng = np.random.default_rng(1)
    lin = ops.WeightOnlyLinear(bits=4, group_size=64, **weights(rng, device, 128, 24, 4, 64, True, "float32"))
    x = tensor(rng.standard_normal((3, 128)), device, "float32")
    for kwargs in ({}, {"x_int8": True}, {"compute_dtype": "bfloat16"}):
        y = lin(x, **kwargs)  # gradients on, but nothing requires one
        assert y.shape == [3, 24] and y.stop_gradient


def test_compute_dtype_bfloat16_equals_the_op():
    rng = np.random.default_rng(2)
    w = weights(rng, "cpu", 576, 40, 4, 32, True, "float32")
    lin = ops.WeightOnlyLinear(bits=4, group_size=32, **w)
    x = tensor(rng.standard_normal((5, 576)), "cpu", "float32")
    want = ops.weight_only_linear(x, bits=4, group_size=32, compute_dtype="bfloat16", **w)
    np.testing.assert_array_equal(host(lin(x, compute_dtype="bfloat16")), host(want))


@pytest.mark.parametrize("device", ["cpu", "npu"])
def test_gradients_go_through_the_op(device):
    """x and bias requiring gradients: the op's autograd, the same gradients."""
    rng = np.random.default_rng(3)
    w = weights(rng, device, 128, 16, 4, 32, False, "float32")
    w["bias"].stop_gradient = False
    lin = ops.WeightOnlyLinear(bits=4, group_size=32, **w)
    x = tensor(rng.standard_normal((3, 128)), device, "float32", grad=True)
    seed = tensor(rng.standard_normal((3, 16)), device, "float32")
    got = paddle().grad([lin(x)], [x, w["bias"]], [seed])
    want = paddle().grad([ops.weight_only_linear(x, bits=4, group_size=32, **w)], [x, w["bias"]], [seed])
    for g, h in zip(got, want):
        np.testing.assert_array_equal(host(g), host(h))
    with pytest.raises(OpArgumentError, match="x_int8 is inference-only"):
        lin(x, x_int8=True)


def test_bad_x_gets_the_ops_errors():
    rng = np.random.default_rng(4)
    w = weights(rng, "cpu", 96, 8, 8, 32, False, "float32")
    lin = ops.WeightOnlyLinear(bits=8, group_size=32, **w)
    bad = [
        (tensor(rng.standard_normal((2, 64)), "cpu", "float32"), {}),
        (tensor(rng.standard_normal((2, 96)), "cpu", "float16"), {}),  # bias is float32
        (tensor(np.ones((2, 96), np.int32), "cpu"), {}),
        (np.ones((2, 96), np.float32), {}),
        (tensor(rng.standard_normal((2, 96)), "npu", "float32"), {}),
        (tensor(rng.standard_normal((2, 96)), "cpu", "float32"), {"compute_dtype": "float16"}),
        (tensor(rng.standard_normal((2, 96)), "cpu", "float32"), {"compute_dtype": "bfloat16", "x_int8": True}),
    ]
    for x, kwargs in bad:
        with pytest.raises(OpArgumentError) as got:
            lin(x, **kwargs)
        with pytest.raises(OpArgumentError) as want:
            ops.weight_only_linear(x, bits=8, group_size=32, **w, **kwargs)
        assert str(got.value) == str(want.value)


def test_x_int8_needs_runs_of_32_as_the_op_does():
    rng = np.random.default_rng(5)
    w = weights(rng, "cpu", 80, 8, 8, 16)
    lin = ops.WeightOnlyLinear(bits=8, group_size=16, **w)
    x = tensor(rng.standard_normal((2, 80)), "cpu", "float32")
    with pytest.raises(OpArgumentError, match="got K=80, group_size=16"):
        lin(x, x_int8=True)
    np.testing.assert_array_equal(host(lin(x)), host(ops.weight_only_linear(x, bits=8, group_size=16, **w)))


@pytest.mark.parametrize("change,message", [
    (dict(bits=3), "bits must be 4 or 8, got 3"),
    (dict(group_size=48), "group_size must be -1 or divide K=128"),
    (dict(scales=np.ones((8, 4), np.float32)), "scales must be a paddle.Tensor"),
    (dict(scales="wrong shape"), "scales must have shape [8, 2]"),
    (dict(qweight="int8 for 4 bits"), "qweight has dtype int8"),
    (dict(bias="float64"), "bias has dtype float64"),
    (dict(bias="npu"), "tensors must be on one device"),
])
def test_bad_weights_are_refused_when_bound(change, message):
    rng = np.random.default_rng(6)
    args = dict(bits=4, group_size=64, **weights(rng, "cpu", 128, 8, 4, 64, False, "float32"))
    fixes = {"wrong shape": lambda: tensor(np.ones((8, 3)), "cpu", "float32"),
             "int8 for 4 bits": lambda: tensor(np.ones((8, 64), np.int8), "cpu"),
             "float64": lambda: tensor(np.ones(8), "cpu", "float64"),
             "npu": lambda: tensor(np.ones(8), "npu", "float32")}
    args.update({k: fixes[v]() if isinstance(v, str) else v for k, v in change.items()})
    with pytest.raises(OpArgumentError, match=r"^WeightOnlyLinear: " + message.replace("[", r"\[")):
        ops.WeightOnlyLinear(**args)


def test_a_missing_kernel_falls_back_and_is_counted():
    """The simulated Hygon Z100 has no bfloat16: the call takes the op's counted fallback."""
    anychip.reset_fallbacks()
    rng = np.random.default_rng(7)
    w = weights(rng, "dcu", 64, 8, 8, -1)
    lin = ops.WeightOnlyLinear(bits=8, **w)
    x = tensor(rng.standard_normal((2, 64)), "dcu", "bfloat16")
    np.testing.assert_array_equal(host(lin(x)), host(ops.weight_only_linear(x, bits=8, **w)))
    assert anychip.fallback_counts()[("dcu", "anychip.weight_only_linear", "bfloat16")] == 2



def test_a_deep_copy_binds_its_own_weights():
    import copy
    import gc

    rng = np.random.default_rng(8)
    w = weights(rng, "cpu", 128, 24, 4, 64, True, "float32")
    x = tensor(rng.standard_normal((2, 128)), "cpu", "float32")
    want = host(ops.weight_only_linear(x, bits=4, group_size=64, **w))
    lin = ops.WeightOnlyLinear(bits=4, group_size=64, **w)
    twin = copy.deepcopy(lin)
    assert twin.qweight is not lin.qweight
    # what the kernel is handed is the copy's memory, not the original's
    assert [d[0] for d in twin._described] == [t.data_ptr() for t in (twin.qweight, twin.scales, twin.offsets,
                                                                       twin.bias)]
    del lin, w
    gc.collect()
    np.testing.assert_array_equal(host(twin(x)), want)
