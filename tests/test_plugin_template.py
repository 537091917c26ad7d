"""A vendor's path: `anychip new-plugin` writes a separate pip package, which builds and installs
from its own folder; anychip finds its device through the entry point, its own tests pass, and
the conformance kit passes with its hand-written kernel (swiglu) and its generated one (rms_norm,
built by anychip_codegen with the package's own CodeGen target)."""

import json
import os
import re
import subprocess
import sys

import pytest

from anychip.cli.main import main as anychip_main
from anychip.plugin_template import TEMPLATE_DIR, render


def anychip(*args, env=None, cwd=None):
    return subprocess.run([sys.executable, "-m", "anychip.cli.main", *args], env=env, cwd=cwd,
                          capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def generated(tmp_path_factory):
    """The package as `anychip new-plugin mychip` writes it (default --dest), and its output."""
    root = tmp_path_factory.mktemp("vendor")
    made = anychip("new-plugin", "mychip", cwd=root)
    assert made.returncode == 0, made.stderr
    return root / "anychip-mychip", made.stdout


@pytest.fixture(scope="module")
def installed_plugin(generated):
    """Installed with --target into a folder of its own, which the subprocesses put on their
    path: the venv never sees it, so there is nothing to uninstall."""
    pkg, _stdout = generated
    site = pkg.parent / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-build-isolation", "--no-deps",
                    "--target", str(site), str(pkg)], check=True, capture_output=True, text=True)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")]))
    return pkg, site, env


def test_new_plugin_writes_the_package_and_the_next_steps(generated):
    pkg, stdout = generated
    for path in ("pyproject.toml", "setup.py", "README.md", "anychip_mychip/__init__.py",
                 "anychip_mychip/runtime.c", "anychip_mychip/kernels.c", "anychip_mychip/codegen_target.py",
                 "tests/test_mychip_conformance.py"):
        assert (pkg / path).is_file(), path
    assert "{{name}}" not in "".join(p.read_text() for p in pkg.rglob("*") if p.is_file())
    for step in ("pip install --no-build-isolation ./anychip-mychip", "anychip devices",
                 "anychip conformance --device mychip"):
        assert step in stdout


def test_readme_names_every_runtime_function_to_replace(generated):
    pkg, _stdout = generated
    runtime = (pkg / "anychip_mychip" / "runtime.c").read_text()
    filled = ["rt_" + field for field in re.findall(r"SET\((\w+)\);", runtime)]
    assert len(filled) > 30, "anychip_device_init no longer fills the table as expected"
    readme = (pkg / "README.md").read_text()
    assert [f for f in filled if f"`{f}`" not in readme] == []
    assert "TODO(vendor)" in (pkg / "anychip_mychip" / "kernels.c").read_text()


def test_the_runtime_a_vendor_writes_is_what_its_readme_counts(generated):
    """The contract's bookkeeping lives in anychip's runtime book: the generated runtime.c is at
    most half the 783 lines it took before, and its README says how many lines and TODOs."""
    pkg, _stdout = generated
    runtime = (pkg / "anychip_mychip" / "runtime.c").read_text()
    lines, todos = len(runtime.splitlines()), runtime.count("TODO(vendor)")
    assert lines <= 783 // 2
    assert "anychip/runtime_book.h" in runtime
    readme = (pkg / "README.md").read_text()
    said = re.search(r"`runtime\.c` is (\d+) lines with (\d+)\s+`TODO\(vendor\)` places", readme)
    assert said and (int(said[1]), int(said[2])) == (lines, todos)


def registered(env) -> dict:
    """What the installed plugin registered, seen from a fresh interpreter with ``env``."""
    code = ("import json; from anychip.plugins import registry; r = registry(); print(json.dumps({"
            "'kernels': sorted({(k.op, d, k.forward.host_code, k.backward is not None) "
            "for k in r.kernels.kernels() if k.device == 'mychip' for d in k.dtypes}), "
            "'backends': sorted(r.codegen_backends), "
            "'problems': [p.reason for p in r.problems if p.plugin == 'mychip']}))")
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_installed_plugin_is_listed_as_simulated_with_its_kernels(installed_plugin):
    _pkg, _site, env = installed_plugin
    listed = anychip("devices", "--json", env=env)
    assert listed.returncode == 0, listed.stderr
    devices = {d["name"]: d for d in json.loads(listed.stdout)}
    assert devices["mychip"]["status"] == "simulated"
    assert devices["mychip"]["plugin"] == "mychip"
    assert devices["mychip"]["kernels"] == 2  # swiglu, rms_norm
    assert devices["mychip"]["reason"] == "template runtime: host memory, synchronous"  # nothing failed
    assert devices["npu"]["status"] == "simulated"  # built-ins unaffected


def test_generated_kernel_is_registered_through_the_plugins_codegen_target(installed_plugin):
    _pkg, _site, env = installed_plugin
    found = registered(env)
    assert found["problems"] == []
    assert "mychip-c" in found["backends"]
    # (op, dtype, host_code, has a backward): called directly like kernels.c's, with its grad
    assert found["kernels"] == [["rms_norm", d, False, True] for d in ("bfloat16", "float16", "float32")] + [
        ["swiglu", "float32", False, True]]


def test_a_failed_codegen_build_disables_only_the_generated_kernel(installed_plugin, tmp_path):
    _pkg, _site, env = installed_plugin
    # an empty cache, so the library must be built, by a compiler that always fails
    broken = dict(env, CXX="false", ANYCHIP_CODEGEN_CACHE=str(tmp_path / "cache"))
    found = registered(broken)
    assert [k[0] for k in found["kernels"]] == ["swiglu"]
    [reason] = found["problems"]
    assert "anychip_register_kernels: CodeGenBuildError" in reason and "'mychip_generated'" in reason
    listed = anychip("devices", "--json", env=broken)
    mychip = next(d for d in json.loads(listed.stdout) if d["name"] == "mychip")
    assert mychip["status"] == "simulated" and mychip["kernels"] == 1
    assert "CodeGenBuildError" in mychip["reason"] and "run their references" in mychip["reason"]


def test_installed_plugin_passes_its_own_tests(installed_plugin, tmp_path):
    pkg, _site, env = installed_plugin
    own = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(pkg / "tests")],
                         env=env, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert own.returncode == 0, own.stdout[-3000:] + own.stderr[-2000:]
    assert " passed" in own.stdout and "skipped" not in own.stdout


def test_conformance_passes_with_the_hand_written_and_the_generated_kernel(installed_plugin, tmp_path):
    _pkg, _site, env = installed_plugin
    run = anychip("conformance", "--device", "mychip", "--out", str(tmp_path), env=env)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-2000:]
    assert "simulated" in run.stdout
    results = json.loads((tmp_path / "conformance.json").read_text())["results"]
    ops = [r for r in results if r["section"] == "op"]
    declared = {(r["name"], r["dtype"], r["direction"]): r["status"] for r in ops
                if (r["name"], r["dtype"]) == ("swiglu", "float32") or r["name"] == "rms_norm"}
    assert declared == {(op, dtype, direction): "pass" for op, dtypes in
                        (("swiglu", ("float32",)), ("rms_norm", ("float32", "float16", "bfloat16")))
                        for dtype in dtypes for direction in ("fwd", "bwd")}
    others = {r["status"] for r in ops if (r["name"], r["dtype"], r["direction"]) not in declared}
    assert others == {"not declared"}
    assert {r["status"] for r in results if r["section"] == "runtime"} == {"pass"}
    assert {r["status"] for r in results if r["section"] == "e2e"} == {"pass"}


@pytest.mark.parametrize("name, message", [("my-chip", "must match"), ("mynpu", "contains 'npu'"),
                                           ("gcu", "already provided by the installed plugin 'gcu'")])
def test_bad_names_are_refused(tmp_path, capsys, name, message):
    assert anychip_main(["new-plugin", name, "--dest", str(tmp_path / "x")]) == 2
    err = capsys.readouterr().err
    assert "argument NAME: " in err and message in err
    assert not (tmp_path / "x").exists()


def test_refuses_a_non_empty_dest(tmp_path, capsys):
    (tmp_path / "keep.txt").write_text("mine")
    assert anychip_main(["new-plugin", "mychip", "--dest", str(tmp_path)]) == 2
    assert "argument --dest: " in capsys.readouterr().err
    assert [p.name for p in tmp_path.iterdir()] == ["keep.txt"]


@pytest.mark.parametrize("name, message", [("my-chip", "must match"), ("mynpu", "contains 'npu'")])
def test_render_refuses_bad_names(tmp_path, name, message):
    with pytest.raises(ValueError, match=message):
        render(tmp_path / "x", name)


def test_render_refuses_to_overwrite(tmp_path):
    (tmp_path / "keep.txt").write_text("mine")
    with pytest.raises(FileExistsError):
        render(tmp_path, "mychip")


def test_template_has_no_file_the_anychip_package_would_leave_out():
    # setup.py ships templates/plugin/* and templates/plugin/*/*: nothing deeper
    deep = [p for p in TEMPLATE_DIR.rglob("*") if p.is_file() and len(p.relative_to(TEMPLATE_DIR).parts) > 2
            and "__pycache__" not in p.parts]
    assert deep == []
