"""The two framework front ends sit side by side in core/frontends/ and are the only homes of
their framework: the rest of core (runtime, registry, op specs, simulator, conformance's runtime
checks) imports neither Paddle nor PyTorch, and only the front ends' C++ includes their headers."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import anychip

CORE = Path(anychip.__file__).parent
REPO = CORE.parent
FRAMEWORKS = ("paddle", "torch")


def _imports(path: Path):
    """(line, absolute module name) of every import in ``path``."""
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            yield from ((node.lineno, a.name) for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            yield node.lineno, node.module or ""


def test_only_the_front_ends_import_a_framework():
    offenders = []
    for path in sorted(CORE.rglob("*.py")):
        rel = path.relative_to(CORE)
        if rel.parts[0] in ("frontends", "templates"):  # templates: a new plugin's own package
            continue
        offenders += [f"{rel}:{line}: import {name}" for line, name in _imports(path)
                      if name.split(".")[0] in FRAMEWORKS]
    assert not offenders, "framework imports outside core/frontends/:\n" + "\n".join(offenders)


def test_the_framework_free_core_runs_without_loading_a_framework():
    """Importing the runtime, registry, simulator and op specs, opening a simulated device and
    running the device.h contract checks on it loads neither framework."""
    code = """
import json, sys
import anychip, anychip.runtime, anychip.plugins, anychip.simulator, anychip.spec, anychip.hookspecs
import anychip.ops.support, anychip.ops.base, anychip.fallback, anychip.devices
from anychip.conformance import run_runtime
results = run_runtime("npu")
print(json.dumps({"loaded": [m for m in ("paddle", "torch") if m in sys.modules],
                  "statuses": sorted({r.status for r in results}), "checks": len(results)}))
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    found = json.loads(out.stdout.strip().splitlines()[-1])
    assert found["loaded"] == [], found
    assert found["checks"] > 10 and found["statuses"] == ["pass"], found


def test_only_the_front_ends_csrc_includes_framework_headers():
    headers = ("paddle/", "torch/", "ATen/", "c10/")
    offenders = []
    for folder in ("core", "plugins", "codegen"):
        for path in sorted((REPO / folder).rglob("*")):
            if path.suffix not in (".c", ".cc", ".h", ".cu") or "_prebuilt" in path.parts:
                continue
            rel = path.relative_to(REPO)
            inside = rel.parts[:2] == ("core", "frontends") and "csrc" in rel.parts
            for n, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
                target = line.strip().removeprefix("#include").strip().strip('<">')
                if line.lstrip().startswith("#include") and target.startswith(headers) and not inside:
                    offenders.append(f"{rel}:{n}: {line.strip()}")
    assert not offenders, offenders
    for framework in FRAMEWORKS:  # side by side: each front end holds its Python and its C++
        assert (CORE / "frontends" / framework / "__init__.py").is_file()
        assert any((CORE / "frontends" / framework / "csrc").rglob("*.cc"))
