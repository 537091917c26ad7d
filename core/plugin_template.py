"""Renders the device-plugin package template (templates/plugin) for a new chip.

    from pathlib import Path
    from anychip.plugin_template import render
    render(Path("anychip-mychip"), "mychip")   # then: pip install --no-build-isolation ./anychip-mychip

Deliberately standalone (standard library only), so it also loads straight from its file.
"""

from __future__ import annotations

import re
from pathlib import Path

TEMPLATE_DIR = Path(__file__).resolve().parent / "templates" / "plugin"
PLACEHOLDER = "{{name}}"

# The same names DeviceSpec refuses in a paddle_type; the template derives "anychip_<name>" from
# the device name, so a bad name is caught here rather than when the plugin first loads.
_PADDLE_RESERVED = ("cpu", "gpu", "xpu", "npu", "dcu", "ipu", "mlu", "cuda")


def check_name(name: str) -> None:
    """Raises ValueError unless ``name`` can be a device, a Python package suffix and a paddle_type."""
    if not isinstance(name, str) or not re.fullmatch(r"[a-z][a-z0-9_]*", name):
        raise ValueError(f"name must match [a-z][a-z0-9_]*, got {name!r}")
    bad = [word for word in _PADDLE_RESERVED if word in name]
    if bad:
        raise ValueError(f"name {name!r} contains {bad[0]!r}, which Paddle treats specially in a "
                         "device type; pick another name")


def render(dest: Path, name: str) -> Path:
    """Writes the plugin package for device ``name`` into ``dest`` and returns ``dest``.

    ``dest`` may exist only as an empty directory. ``{{name}}`` is replaced in file contents and
    in paths.
    """
    check_name(name)
    dest = Path(dest)
    if dest.exists() and (not dest.is_dir() or any(dest.iterdir())):
        raise FileExistsError(f"dest {str(dest)!r} exists and is not an empty directory")
    sources = [p for p in sorted(TEMPLATE_DIR.rglob("*"))
               # pip byte-compiles the template's .py files when anychip is installed
               if p.is_file() and "__pycache__" not in p.relative_to(TEMPLATE_DIR).parts]
    if not sources:
        raise FileNotFoundError(f"plugin template missing: {TEMPLATE_DIR} has no files")
    for source in sources:
        target = dest / str(source.relative_to(TEMPLATE_DIR)).replace(PLACEHOLDER, name)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(source.read_text(encoding="utf-8").replace(PLACEHOLDER, name),
                          encoding="utf-8")
    return dest
