"""Plugin discovery: one broken plugin never takes the others down, and says why."""

import json
import os
import subprocess
import sys
import textwrap

import pytest

from anychip import DeviceSpec
from anychip.runtime import open_device

PLUGINS = {
    "exploding_plugin": "raise ImportError('vendor SDK python bindings missing')\n",
    "badlib_plugin": textwrap.dedent("""
        import anychip, os
        HERE = os.path.dirname(__file__)
        @anychip.hookimpl
        def anychip_register_devices():
            return [anychip.DeviceSpec(name="badlib", description="corrupt runtime library",
                                       library=os.path.join(HERE, "libcorrupt.so"))]
    """),
    "hookraise_plugin": textwrap.dedent("""
        import anychip
        @anychip.hookimpl
        def anychip_register_devices():
            raise RuntimeError("firmware query failed")
    """),
    "badkernels_plugin": textwrap.dedent("""
        import anychip
        @anychip.hookimpl
        def anychip_register_devices():
            return [anychip.simulated_device("halfok", anychip.ChipTraits(
                model="Half OK", vendor="Test", memory_bytes=1 << 30, dtypes=("float32",)),
                description="device fine, kernels broken", paddle_type="anychip_halfok")]
        @anychip.hookimpl
        def anychip_register_kernels(registry):
            raise OSError("libhalfok_kernels.so: cannot open shared object file")
    """),
    "thief_plugin": textwrap.dedent("""
        import anychip
        @anychip.hookimpl
        def anychip_register_devices():
            return [anychip.DeviceSpec(name="npu", description="second npu", library="/nonexistent.so")]
    """),
    "exiting_plugin": "import sys\nsys.exit('no licence server')\n",
    "aaa_cpu_thief_plugin": textwrap.dedent("""
        import anychip
        @anychip.hookimpl
        def anychip_register_devices():
            return [anychip.DeviceSpec(name="cpu", description="not the cpu", library="/nonexistent.so")]
    """),
    "generator_plugin": textwrap.dedent("""
        import anychip
        @anychip.hookimpl
        def anychip_register_devices():
            yield anychip.simulated_device("gen", anychip.ChipTraits(
                model="Gen", vendor="Test", memory_bytes=1 << 30, dtypes=("float32",)),
                description="registered by a generator", paddle_type="anychip_gen")
    """),
}


@pytest.fixture(scope="module")
def plugin_path(tmp_path_factory):
    root = tmp_path_factory.mktemp("site")
    for module, code in PLUGINS.items():
        (root / f"{module}.py").write_text(code)
    (root / "libcorrupt.so").write_bytes(b"this is not an ELF file")
    dist = root / "fake_plugins-0.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: fake-plugins\nVersion: 0.0\n")
    (dist / "entry_points.txt").write_text(
        "[anychip.plugins]\nexploding = exploding_plugin\nbadlib = badlib_plugin\n"
        "hookraise = hookraise_plugin\nthief = thief_plugin\nbadkernels = badkernels_plugin\n"
        "exiting = exiting_plugin\naaa = aaa_cpu_thief_plugin\ngenerator = generator_plugin\n")
    return root


def devices_json(plugin_path):
    env = dict(os.environ, PYTHONPATH=f"{plugin_path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    out = subprocess.run([sys.executable, "-m", "anychip.cli.main", "devices", "--json"],
                         capture_output=True, text=True, env=env, check=True).stdout
    return {d["name"]: d for d in json.loads(out)}


def test_broken_plugins_are_listed_with_reasons_and_others_work(plugin_path):
    devices = devices_json(plugin_path)
    assert devices["npu"]["status"] == "simulated"
    assert devices["npu"]["description"] == "Huawei Ascend NPU"  # the thief did not win
    assert devices["cpu"]["status"] == "hardware"
    assert devices["exploding"]["status"] == "unavailable"
    assert "import failed: ImportError: vendor SDK python bindings missing" in devices["exploding"]["reason"]
    assert devices["badlib"]["status"] == "unavailable"
    assert "cannot load" in devices["badlib"]["reason"] and "libcorrupt.so" in devices["badlib"]["reason"]
    assert "RuntimeError: firmware query failed" in devices["hookraise"]["reason"]
    assert "plugin 'thief' registers device 'npu', which belongs to the built-in npu plugin" in devices["thief"]["reason"]
    # a plugin whose device works but whose kernels fail: one row, usable, with the reason
    assert devices["halfok"]["status"] == "simulated" and devices["halfok"]["kernels"] == 0
    assert "plugin partly failed (anychip_register_kernels: OSError: libhalfok_kernels.so" in devices["halfok"]["reason"]
    assert "badkernels" not in devices


def test_a_plugin_that_exits_or_claims_cpu_is_listed_and_harms_nothing(plugin_path):
    """sys.exit() at import used to end every command; a plugin sorting before 'cpu' used to take
    the cpu device; a hook yielding its specs used to lose them."""
    devices = devices_json(plugin_path)
    assert devices["exiting"]["status"] == "unavailable"
    assert "import failed: SystemExit: no licence server" in devices["exiting"]["reason"]
    assert devices["cpu"]["status"] == "hardware" and devices["cpu"]["description"] != "not the cpu"
    assert "plugin 'aaa' registers device 'cpu', which belongs to the built-in cpu plugin" in devices["aaa"]["reason"]
    assert devices["gen"]["status"] == "simulated"


def test_unknown_device_lists_the_known_ones():
    with pytest.raises(ValueError, match=r"unknown device 'tpu'; known devices: cpu, dcu, gcu, gpu, npu, xpu"):
        open_device("tpu:0")


@pytest.mark.parametrize("text, message", [("npu:x", "non-negative integer"), ("", "like 'npu'")])
def test_malformed_device_strings(text, message):
    with pytest.raises(ValueError, match=message):
        open_device(text)


@pytest.mark.parametrize("kwargs, message", [
    (dict(name="Bad Name"), r"DeviceSpec.name must match"),
    (dict(name="ok", paddle_type="my_gpu"), "contains 'gpu'"),
])
def test_device_spec_validation(kwargs, message):
    with pytest.raises(ValueError, match=message):
        DeviceSpec(**{"name": "ok", "description": "", "library": "x.so", **kwargs})


def test_require_hardware_refuses_simulated_devices(monkeypatch):
    from anychip import HardwareRequiredError

    monkeypatch.setenv("ANYCHIP_REQUIRE_HARDWARE", "1")
    with pytest.raises(HardwareRequiredError, match="npu:0 is simulated .* ANYCHIP_REQUIRE_HARDWARE=1"):
        open_device("npu:0")
    open_device("cpu:0")  # real hardware is still fine
