"""A vendor's path from docs/writing-a-plugin.md: render the template into a separate pip
package, build and install it, and find its device through the entry point."""

import json
import os
import subprocess
import sys

import pytest

from anychip.plugin_template import render


@pytest.fixture(scope="module")
def installed_plugin(tmp_path_factory):
    root = tmp_path_factory.mktemp("vendor")
    pkg = render(root / "anychip-mychip", "mychip")
    site = root / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-build-isolation", "--no-deps",
                    "--target", str(site), str(pkg)], check=True, capture_output=True, text=True)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")]))
    return pkg, site, env


def test_installed_plugin_is_listed_as_simulated(installed_plugin):
    _pkg, _site, env = installed_plugin
    out = subprocess.run([sys.executable, "-m", "anychip.cli.main", "devices", "--json"], env=env,
                         capture_output=True, text=True, check=True).stdout
    devices = {d["name"]: d for d in json.loads(out)}
    assert devices["mychip"]["status"] == "simulated"
    assert devices["mychip"]["plugin"] == "mychip"
    assert devices["npu"]["status"] == "simulated"  # built-ins unaffected


def test_installed_plugin_passes_its_own_tests_and_the_runtime_contract(installed_plugin, tmp_path):
    pkg, _site, env = installed_plugin
    own = subprocess.run([sys.executable, "-m", "pytest", "-q", str(pkg / "tests")], env=env, cwd=tmp_path,
                         capture_output=True, text=True)
    assert own.returncode == 0, own.stdout[-2000:] + own.stderr[-2000:]
    contract = os.path.join(os.path.dirname(__file__), "test_runtime_contract.py")
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", contract,
                          "-k", "mychip"], env=dict(env, ANYCHIP_TEST_DEVICES="mychip"), cwd=tmp_path,
                         capture_output=True, text=True)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-2000:]
    assert " passed" in run.stdout


@pytest.mark.parametrize("name, message", [("my-chip", "must match"), ("mynpu", "contains 'npu'")])
def test_bad_names_are_refused(tmp_path, name, message):
    with pytest.raises(ValueError, match=message):
        render(tmp_path / "x", name)


def test_refuses_to_overwrite(tmp_path):
    (tmp_path / "keep.txt").write_text("mine")
    with pytest.raises(FileExistsError):
        render(tmp_path, "mychip")
