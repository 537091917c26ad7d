"""Renders the device-plugin package template (templates/plugin) for a new chip; the command
line is ``anychip new-plugin NAME``.

    from pathlib import Path
    from anychip.plugin_template import render
    render(Path("anychip-mychip"), "mychip")   # then: pip install --no-build-isolation ./anychip-mychip

"""

from __future__ import annotations

from pathlib import Path

from .spec import DeviceSpec

TEMPLATE_DIR = Path(__file__).resolve().parent / "templates" / "plugin"
PLACEHOLDER = "{{name}}"


def check_name(name: str) -> None:
    """Raises ValueError unless ``name`` works as a device name and, as ``anychip_<name>``, as
    the Paddle device type the template registers (it also names the package, its Python
    module and its C symbols, which the same rule keeps valid)."""
    if not isinstance(name, str):
        raise ValueError(f"name must be a string, got {name!r}")
    try:
        DeviceSpec(name=name, description="", library="", paddle_type=f"anychip_{name}")
    except ValueError as exc:
        raise ValueError(f"name {name!r} cannot name a device: {exc}") from None


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
