"""`anychip` from the command line, as a newcomer would run it."""

import json
import subprocess
import sys


def anychip(*args, env=None):
    return subprocess.run([sys.executable, "-m", "anychip.cli.main", *args], capture_output=True, text=True,
                          env=env)


def test_devices_lists_every_builtin_with_an_honest_status():
    result = anychip("devices")
    assert result.returncode == 0, result.stderr
    rows = {line.split()[0]: line.split()[1] for line in result.stdout.splitlines()[1:7]}
    assert rows == {"cpu": "hardware", "dcu": "simulated", "gcu": "simulated", "gpu": rows["gpu"],
                    "npu": "simulated", "xpu": "simulated"}
    assert rows["gpu"] in ("hardware", "unavailable")
    for chip in ("xpu", "npu", "gcu", "dcu"):
        assert f"{chip}: " in result.stdout and "running on the simulator" in result.stdout
    assert "(simulated)" in result.stdout


def test_devices_json_and_device_filter():
    result = anychip("devices", "--json", "--device", "npu")
    (npu,) = json.loads(result.stdout)
    assert npu["name"] == "npu" and npu["status"] == "simulated" and npu["count"] >= 1
    assert npu["memory_bytes"] == 64 << 30 and "bfloat16" in npu["dtypes"]
    assert "Ascend ACL" in npu["reason"]


def test_unknown_device_is_a_clear_error():
    result = anychip("devices", "--device", "tpu")
    assert result.returncode == 1
    assert "unknown device 'tpu'; known devices: cpu, dcu, gcu, gpu, npu, xpu" in result.stderr


def test_help_explains_itself():
    result = anychip("--help")
    assert result.returncode == 0
    assert "devices" in result.stdout and "--device" in result.stdout and "--report-fallbacks" in result.stdout


def test_report_fallbacks_flag():
    result = anychip("devices", "--report-fallbacks")
    assert result.returncode == 0
    assert "CPU fallbacks: none (no anychip device was used with Paddle)" in result.stderr


def test_ci_runs_the_readme_test_command():
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    readme = (root / "README.md").read_text()
    blocks = [b.split("```", 1)[0].strip() for b in readme.split("```bash\n")[1:]]
    setup = [b for b in blocks if b.startswith("python3 -m venv")]
    assert len(setup) == 2, "the README has exactly two set-up commands"
    assert setup[1] in (root / ".ci" / "run").read_text()


def test_ops_table_is_generated_from_the_registry_and_the_readme_shows_it_current():
    from pathlib import Path

    from anychip.cli.ops import readme_section
    from anychip.ops.support import support_table

    result = anychip("ops")
    assert result.returncode == 0, result.stderr
    table = support_table()
    assert result.stdout.strip() == table
    lines = table.splitlines()
    assert lines[0].startswith("| op | cpu | ") and "npu (simulated)" in lines[0]
    rows = {line.split("|")[1].strip(" `"): line for line in lines[2:]}
    assert "fp32 bf16 fp16 · fwd+bwd" in rows["rms_norm"].split("|")[2]  # cpu
    assert "bf16" not in rows["rms_norm"].split("|")[3]                 # dcu: the Z100 has no bf16
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    assert readme_section(table) in readme, "README's op table is stale: run `anychip ops --update-readme README.md`"


def test_ops_update_readme_needs_its_markers(tmp_path):
    target = tmp_path / "README.md"
    target.write_text("# no table here\n")
    result = anychip("ops", "--update-readme", str(target))
    assert result.returncode == 1 and "has no <!-- anychip ops: begin -->" in result.stderr


def test_output_cut_short_by_the_reader_is_not_an_error():
    proc = subprocess.Popen([sys.executable, "-m", "anychip.cli.main", "ops"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    proc.stdout.close()  # like `anychip ops | head -0`
    assert proc.wait(timeout=60) == 0
    assert "BrokenPipeError" not in proc.stderr.read()


def test_a_command_package_that_fails_to_import_leaves_the_others_working(monkeypatch, capsys):
    """Commands above the core come from entry points; a broken one is named, not fatal."""
    import importlib.metadata as md

    from anychip.cli import main as cli

    broken = md.EntryPoint(name="broken", value="no_such_package.cli", group="anychip.commands")
    real = md.entry_points
    monkeypatch.setattr(md, "entry_points", lambda group: [*real(group=group), broken])
    available = cli.commands()
    assert "broken" not in available
    assert {"devices", "ops", "generate", "chat", "models"} <= set(available)
    assert "command 'broken' is unavailable: ModuleNotFoundError" in capsys.readouterr().err
    assert cli.main(["ops"]) == 0


def test_ops_paddle_lists_the_routed_paddle_kernels_per_device():
    result = anychip("ops", "--paddle")
    assert result.returncode == 0, result.stderr
    for chip, paddle_type in (("xpu", "anychip_kunlun"), ("npu", "anychip_ascend"), ("gcu", "anychip_enflame"),
                              ("dcu", "anychip_hygon")):
        assert f"{chip} ({paddle_type}, simulated): " in result.stdout
    npu = anychip("ops", "--paddle", "--device", "npu").stdout.splitlines()
    count = int(npu[0].split(": ")[1].split()[0])
    rows = {line.split()[0]: line.split()[1:] for line in npu[1:]}
    assert len(rows) == count and "float32" in rows["add"] and "float32" in rows["matmul_grad"]
    assert "custom_device_load" not in result.stderr and "init.cc" not in result.stderr  # Paddle's chatter kept out


def test_ops_paddle_script_lists_what_a_script_fell_back_on(tmp_path):
    script = tmp_path / "prog.py"
    script.write_text("import numpy as np, paddle\n"
                      "x = paddle.to_tensor(np.arange(6, dtype=np.float32))\n"
                      "y = paddle.lgamma(x + 1) + paddle.exp(x)\n"  # lgamma has no device kernel
                      "print(float(y.sum()))\n")
    result = anychip("ops", "--paddle", "--device", "npu", "--script", str(script))
    assert result.returncode == 0, result.stderr
    assert f"{script} on npu: 1 Paddle kernel(s) fell back to the CPU" in result.stdout
    assert "lgamma  float32   1 call(s)" in result.stdout
    missing = anychip("ops", "--paddle", "--script", str(script))
    assert missing.returncode != 0 and "--script needs --device" in missing.stderr


def test_devices_says_whether_a_plain_import_paddle_gets_them():
    import os

    env = {k: v for k, v in os.environ.items() if k != "ANYCHIP_SIM_CHECK"}
    result = anychip("devices", env=env)
    # pip install put them in Paddle's own folder, so a plain `import paddle` has them too
    assert "paddle: `import paddle` loads these devices from " in result.stdout, result.stdout
    assert result.stdout.rstrip().endswith("paddle_custom_device")
    # the simulator's memory checking changes the devices' options: not what pip install wrote
    checked = anychip("devices", env={**env, "ANYCHIP_SIM_CHECK": "1"})
    assert "does not hold these devices as they are now" in checked.stdout
    assert "python -m anychip.frontends.paddle.root" in checked.stdout
