"""Anychip devices as Paddle CustomDevices: tensors, training, fallbacks, strict mode, errors.

Each case runs in a fresh interpreter, because Paddle registers CustomDevices once, at import.
"""

import importlib.util
import json
import textwrap

import pytest

from conftest import SIMULATED, run_python

# Not importorskip: importing Paddle here, before anychip registers its devices, would break the
# in-process Paddle of the op tests.
if importlib.util.find_spec("paddle") is None:
    pytest.skip("paddlepaddle is not installed", allow_module_level=True)

TRAIN = textwrap.dedent("""
    import json, numpy as np, anychip
    import anychip.frontends.paddle as pf
    from anychip.runtime.open import parse_device
    paddle = pf.import_paddle()

    def train(device, steps=5):
        anychip.set_device(device)
        rng = np.random.default_rng(0)
        x = paddle.to_tensor(rng.standard_normal((32, 8)).astype("float32"))
        y = paddle.to_tensor(rng.standard_normal((32, 1)).astype("float32"))
        model = paddle.nn.Sequential(paddle.nn.Linear(8, 32), paddle.nn.GELU(), paddle.nn.Linear(32, 1))
        for p in model.parameters():
            p.set_value(rng.standard_normal(p.shape).astype("float32") * 0.3)
        opt = paddle.optimizer.AdamW(learning_rate=0.01, parameters=model.parameters(), weight_decay=0.01)
        losses = []
        for _ in range(steps):
            loss = paddle.nn.functional.mse_loss(model(x), y)
            loss.backward()
            opt.step()
            opt.clear_grad()
            losses.append(float(loss))
        assert str(model[0].weight.place) == str(pf.place(*parse_device(device)))
        return losses, [p.numpy().tolist() for p in model.parameters()]

    cpu_losses, cpu_params = train("cpu")
    dev_losses, dev_params = train("{device}:1")
    print(json.dumps(dict(cpu=cpu_losses, dev=dev_losses,
                          max_param_diff=max(float(np.abs(np.array(a) - np.array(b)).max())
                                             for a, b in zip(cpu_params, dev_params)),
                          fallbacks=[[*k, n] for k, n in anychip.fallback_counts().items()])))
    print(anychip.fallback_report())
""")


@pytest.mark.parametrize("device", SIMULATED)
def test_mlp_adamw_on_simulated_chip_matches_cpu(device):
    result = run_python(TRAIN.replace("{device}", device))
    assert result.returncode == 0, result.stderr[-3000:]
    out = json.loads(result.stdout.splitlines()[0])
    assert out["cpu"][-1] < out["cpu"][0]  # it trains
    for a, b in zip(out["cpu"], out["dev"]):
        assert abs(a - b) <= 1e-5 * max(1.0, abs(a))
    assert out["max_param_diff"] <= 1e-5
    # GELU and AdamW have device kernels since the op-coverage work: the whole step stays on the chip
    assert [f for f in out["fallbacks"] if f[0] == device] == []
    assert "CPU fallbacks: 0 op call(s) ran on the CPU, none" in result.stdout


def test_strict_mode_turns_a_fallback_into_an_error():
    code = textwrap.dedent("""
        import anychip
        anychip.set_device("npu:0")
        import paddle
        x = paddle.to_tensor([1.0, -1.0])
        paddle.lgamma(x)  # no device kernel
    """)
    result = run_python(code, env={"ANYCHIP_STRICT": "1"})
    assert result.returncode != 0
    assert "kernel `lgamma` is not registered" in result.stderr, result.stderr[-2000:]
    assert "anychip_ascend" in result.stderr


@pytest.mark.parametrize("device, message", [
    ("tpu", "unknown device 'tpu'; known devices: cpu, dcu, gcu, gpu, npu, xpu"),
    ("npu:7", "device index 7 out of range: npu has 2 device"),
])
def test_set_device_rejects_bad_devices_before_paddle_runs(device, message):
    result = run_python(f"import anychip, sys\nanychip.set_device({device!r})\n")
    assert result.returncode != 0 and message in result.stderr


def test_require_hardware_refuses_simulated_device_for_paddle():
    result = run_python("import anychip\nanychip.set_device('npu')", env={"ANYCHIP_REQUIRE_HARDWARE": "1"})
    assert result.returncode != 0
    assert "HardwareRequiredError: npu:0 is simulated" in result.stderr


def test_device_out_of_memory_through_paddle_is_an_error_not_a_crash():
    code = textwrap.dedent("""
        import anychip
        anychip.set_device("npu:0")
        import paddle
        try:
            paddle.zeros([64, 1024, 1024], dtype="float32")  # 256 MiB on a 64 MiB device
        except Exception as exc:
            print("raised", type(exc).__name__)
        small = paddle.to_tensor([1.0, 2.0])
        print("still works", float(small.sum()))
    """)
    result = run_python(code, env={"ANYCHIP_SIM_CAPACITY": str(64 << 20)})
    assert result.returncode == 0, result.stderr[-2000:]
    assert "raised" in result.stdout and "still works 3.0" in result.stdout
    assert "out of memory" in result.stderr


def test_anychip_device_environment_sets_the_default():
    code = textwrap.dedent("""
        import anychip
        print(anychip.get_device())
        anychip.set_device()
        import paddle
        from anychip.frontends.paddle import place
        print(paddle.to_tensor([1.0]).place)
        print(paddle.to_tensor([2.0], place=place("npu", 1)).place)
    """)
    result = run_python(code, env={"ANYCHIP_DEVICE": "gcu:1"})
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.split() == ["gcu:1", "Place(anychip_enflame:1)", "Place(anychip_ascend:1)"]


def test_importing_paddle_through_anychip_keeps_the_cpu_default():
    code = textwrap.dedent("""
        from anychip.frontends.paddle import import_paddle
        paddle = import_paddle()
        print(paddle.get_device(), paddle.to_tensor([1.0]).place)
    """)
    result = run_python(code)
    assert result.stdout.split() == ["cpu", "Place(cpu)"], result.stderr[-2000:]
