"""The conformance kit against third-party plugins installed from their own package: a broken
kernel is caught and named, a correct plugin passes; and each stage of the end-to-end Llama check
fails on the kernel break it is there to catch."""

import json
import os
import re
import subprocess
import sys
import textwrap

import pytest

from conftest import run_python

# Two simulated chips with anychip's host kernels (their memory is host memory) but a Python
# swiglu for float32; the broken one forgets the up factor, as a first hand-written kernel might.
PLUGIN = {
    "anychip_testchips/__init__.py": textwrap.dedent('''
        import anychip
        from anychip.frontends.paddle import import_paddle
        from anychip_plugins.host import register_host_kernels

        def chip(name):
            return anychip.simulated_device(name, anychip.ChipTraits(
                model=f"Test {name}", vendor="Test", memory_bytes=1 << 30, dtypes=("float32",)),
                description=f"test chip {name}", paddle_type=f"anychip_{name}")

        def register(registry, name, with_up):
            def swiglu(inputs, outputs, attrs):
                paddle = import_paddle()
                gate, up = inputs
                with paddle.no_grad():  # a kernel computes values; autograd is the op's business
                    y = paddle.nn.functional.silu(gate)
                    paddle.assign(y * up if with_up else y, output=outputs[0])

            host = anychip.KernelRegistry()
            register_host_kernels(host, name, ("float32",))
            for k in host.kernels():
                if k.op != "swiglu":
                    registry.register(k.op, k.device, k.dtypes, k.forward, k.backward, k.capabilities)
            registry.register("swiglu", name, ("float32",), forward=swiglu)
    '''),
    "anychip_testchips/broken.py": textwrap.dedent('''
        import anychip
        from anychip_testchips import chip, register

        @anychip.hookimpl
        def anychip_register_devices():
            return [chip("brokenchip")]

        @anychip.hookimpl
        def anychip_register_kernels(registry):
            register(registry, "brokenchip", with_up=False)
    '''),
    "anychip_testchips/good.py": textwrap.dedent('''
        import anychip
        from anychip_testchips import chip, register

        @anychip.hookimpl
        def anychip_register_devices():
            return [chip("goodchip")]

        @anychip.hookimpl
        def anychip_register_kernels(registry):
            register(registry, "goodchip", with_up=True)
    '''),
    "pyproject.toml": textwrap.dedent('''
        [build-system]
        requires = ["setuptools>=61"]
        build-backend = "setuptools.build_meta"

        [project]
        name = "anychip-testchips"
        version = "0.1.0"

        [project.entry-points."anychip.plugins"]
        brokenchip = "anychip_testchips.broken"
        goodchip = "anychip_testchips.good"

        [tool.setuptools]
        packages = ["anychip_testchips"]
    '''),
}


@pytest.fixture(scope="module")
def plugin_env(tmp_path_factory):
    """The environment of a process that has the test chips' package installed."""
    root = tmp_path_factory.mktemp("testchips")
    for path, text in PLUGIN.items():
        (root / "src" / path).parent.mkdir(parents=True, exist_ok=True)
        (root / "src" / path).write_text(text)
    site = root / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-build-isolation", "--no-deps",
                    "--target", str(site), str(root / "src")], check=True, capture_output=True, text=True)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")]))
    env.pop("ANYCHIP_SIM_CHECK", None)  # the Python kernels run Paddle's CPU ops on device memory
    return env


def conformance(env, *args):
    return subprocess.run([sys.executable, "-m", "anychip.cli.main", "conformance", *args], env=env,
                          capture_output=True, text=True, timeout=300)


def test_a_broken_kernel_is_caught_and_named(plugin_env, tmp_path):
    run = conformance(plugin_env, "--device", "brokenchip", "--ops", "swiglu", "--skip", "e2e", "--out", tmp_path)
    assert run.returncode == 1, run.stdout + run.stderr
    assert "brokenchip (simulated)" in run.stdout
    row = next(line for line in run.stdout.splitlines() if line.startswith("swiglu"))
    assert re.search(r"FAIL \d\.\d+e[-+]\d+", row), run.stdout  # the float32 forward, with its max error
    assert "float32" in run.stdout
    report = json.loads((tmp_path / "conformance.json").read_text())
    [failure] = [r for r in report["results"] if r["status"] == "fail"]
    assert (failure["section"], failure["name"], failure["dtype"], failure["direction"]) == \
        ("op", "swiglu", "float32", "fwd")
    assert failure["max_error"] > 0.01
    runtime = [r for r in report["results"] if r["section"] == "runtime"]
    assert runtime and all(r["status"] == "pass" for r in runtime)  # the simulator's runtime is fine


def test_a_correct_plugin_passes_everything(plugin_env):
    run = conformance(plugin_env, "--device", "goodchip", "--ops", "swiglu")
    assert run.returncode == 0, run.stdout + run.stderr
    assert "goodchip (simulated): PASSED" in run.stdout
    row = next(line for line in run.stdout.splitlines() if line.startswith("swiglu"))
    assert row.split()[1:3] == ["pass", "fallback"], row  # a forward kernel; the backward is the reference's
    assert re.search(r"llama_logits +pass", run.stdout)  # the end-to-end check ran with the Python kernel


# ---- the end-to-end check: each stage catches its break -----------------------------------------

BREAKS = textwrap.dedent('''
    import json
    from dataclasses import replace

    from anychip import KernelRegistry
    from anychip.ops.dispatch import launch
    from anychip.frontends.paddle import import_paddle
    from anychip.plugins import registry
    from anychip_models import conformance

    DEV = ("npu", 0)
    paddle = import_paddle()
    correct = registry().kernels

    def broken(op, **parts):
        """The kernels, with npu's ``op`` kernel parts replaced."""
        kernels = KernelRegistry()
        for k in correct.kernels():
            k = replace(k, **parts) if (k.op, k.device) == (op, DEV[0]) else k
            kernels.register(k.op, k.device, k.dtypes, k.forward, k.backward, k.capabilities)
        return kernels

    real = {op: correct.find(op, "npu", "float32") for op in ("swiglu", "adamw_step", "decoder_step")}

    def swiglu_without_up(inputs, outputs, attrs):
        launch(real["swiglu"].forward, "swiglu", DEV, [inputs[0], paddle.ones_like(inputs[1])], outputs)

    def swiglu_grad_off_by_1_percent(inputs, outputs, attrs):
        launch(real["swiglu"].backward, "swiglu_grad", DEV, [inputs[0] * 1.01, *inputs[1:]], outputs)

    def adamw_without_weight_decay(inputs, outputs, attrs):
        launch(real["adamw_step"].forward, "adamw_step", DEV, inputs, outputs, [*attrs[:4], 0.0, attrs[5]])

    def decoder_step_with_twice_the_rope_theta(inputs, outputs, attrs):
        attrs = list(attrs)
        attrs[6] *= 2
        launch(real["decoder_step"].forward, "decoder_step", DEV, inputs, outputs, attrs)

    def rms_norm_grad_that_raises(inputs, outputs, attrs):
        raise RuntimeError("rms_norm_grad: out of registers")

    cases = {
        "none": correct,
        "swiglu forward": broken("swiglu", forward=swiglu_without_up),
        "swiglu backward": broken("swiglu", backward=swiglu_grad_off_by_1_percent),
        "adamw_step": broken("adamw_step", forward=adamw_without_weight_decay),
        "decoder_step": broken("decoder_step", forward=decoder_step_with_twice_the_rope_theta),
        "rms_norm backward raises": broken("rms_norm", backward=rms_norm_grad_that_raises),
    }
    out = {}
    for case, kernels in cases.items():
        registry().kernels = kernels
        out[case] = {r.name: [r.status, r.detail] for r in conformance.run("npu") if r.status != "pass"}
    print(json.dumps(out))
''')


def test_each_e2e_stage_fails_on_its_kernel_break():
    run = run_python(BREAKS, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    found = json.loads(run.stdout.splitlines()[-1])
    assert {case: {stage: status for stage, (status, _detail) in stages.items()} for case, stages in found.items()} == {
        "none": {},
        "swiglu forward": {"llama_logits": "fail", "llama_loss": "fail", "llama_gradients": "fail",
                           "llama_greedy_decode": "fail"},
        "swiglu backward": {"llama_gradients": "fail"},
        "adamw_step": {"llama_adamw_step": "fail"},
        "decoder_step": {"llama_greedy_decode": "fail"},
        "rms_norm backward raises": {"llama_gradients": "fail", "llama_adamw_step": "skipped"},
    }
    raised = found["rms_norm backward raises"]["llama_gradients"][1]
    assert raised.startswith("on npu:0: ") and "rms_norm_grad: out of registers" in raised
    assert "steps' logits" in found["decoder_step"]["llama_greedy_decode"][1]


def test_e2e_on_the_host_cpu_is_measured_against_the_op_references():
    from anychip_models import conformance

    results = conformance.run("cpu")
    assert [r.name for r in results] == list(conformance.STAGES)
    assert all(r.status == "pass" and "reference implementations on cpu" in r.detail for r in results), results
    assert any(r.max_error > 0 for r in results)  # the kernels and the references really both ran
