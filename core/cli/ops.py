"""``anychip ops``: which ops each device runs with its own kernels, per dtype and direction;
with ``--paddle``, which of Paddle's own kernels each device serves, and which ones a script
fell back on."""

from __future__ import annotations

import re
from pathlib import Path

BEGIN, END = "<!-- anychip ops: begin -->", "<!-- anychip ops: end -->"


def add_parser(sub, common):
    p = sub.add_parser("ops", parents=[common], help="show which ops have kernels on which devices",
                       description="The op support table, generated from the kernel registry: one row "
                                   "per op, one column per device; a cell lists the dtypes with a "
                                   "device kernel and whether the backward has one. 'ref' means the "
                                   "op runs its Paddle reference there, counted as a CPU fallback.")
    p.add_argument("--update-readme", metavar="PATH", type=Path,
                   help=f"rewrite the table between the {BEGIN} / {END} markers of PATH")
    p.add_argument("--paddle", action="store_true",
                   help="list, per device (all, or --device), the Paddle kernels routed to the device's own "
                        "kernels, with their dtypes")
    p.add_argument("--script", metavar="FILE", type=Path,
                   help="with --paddle: run the Python script FILE on --device (as `python FILE` would, after "
                        "anychip.set_device) and list every Paddle kernel it fell back on to the CPU")


def readme_section(table: str) -> str:
    return f"{BEGIN}\n{table}\n{END}"


def paddle_kernel_listing(devices: list[str]) -> str:
    """Per device, the Paddle kernels its plugin's kernels serve (anychip.frontends.paddle.kernels.plan)."""
    from ..frontends.paddle import kernels as paddle_kernels
    from ..frontends.paddle.root import device_configs
    from ..plugins import registry

    configs = device_configs()
    blocks = []
    for device in devices:
        if device not in configs:
            blocks.append(f"{device}: no Paddle CustomDevice here (Paddle's own CPU, or unavailable)")
            continue
        _used, served = paddle_kernels.plan(registry().kernels, device)
        conf = configs[device]
        lines = [f"{device} ({conf['paddle_type']}, {conf['sub_type']}): {len(served)} Paddle kernels routed to "
                 "device kernels"]
        width = max((len(name) for name in served), default=0)
        lines += [f"  {name:{width}}  {' '.join(dtypes)}" for name, dtypes in sorted(served.items())]
        blocks.append("\n".join(lines))
    unserved = paddle_kernels.unserved()
    if unserved:
        blocks.append("Paddle kernels that op definitions name and no device gets:\n"
                      + "\n".join(f"  {name}: {why}" for name, why in sorted(unserved.items())))
    return "\n\n".join(blocks)


def run_script_fallbacks(script: Path, device: str) -> str:
    """Runs ``script`` on ``device`` and reports the Paddle kernels it fell back on."""
    import runpy
    import sys

    import anychip
    from ..fallback import fallback_counts, reset_fallbacks

    if not script.is_file():
        raise FileNotFoundError(f"--script {script}: no such file")
    anychip.set_device(device)
    reset_fallbacks()
    argv = sys.argv
    sys.argv = [str(script)]
    try:
        runpy.run_path(str(script), run_name="__main__")
    finally:
        sys.argv = argv
    name = device.partition(":")[0]
    fell = sorted(((op, dtype), n) for (dev, op, dtype), n in fallback_counts().items() if dev == name)
    if not fell:
        return f"{script} on {device}: no Paddle kernel fell back to the CPU"
    width = max(len(op) for (op, _d), _n in fell)
    lines = [f"{script} on {device}: {len(fell)} Paddle kernel(s) fell back to the CPU"]
    lines += [f"  {op:{width}}  {dtype:9} {n} call(s)" for (op, dtype), n in fell]
    return "\n".join(lines)


def run(args) -> int:
    from ..ops.support import support_table

    if args.script is not None and not args.paddle:
        raise ValueError("--script lists the Paddle kernels a script fell back on: pass it with --paddle")
    if args.paddle:
        if args.script is not None:
            if not args.device:
                raise ValueError("--script needs --device: the device to run the script on")
            print(run_script_fallbacks(args.script, args.device))
            return 0
        from ..frontends.paddle.root import device_configs

        print(paddle_kernel_listing([args.device.split(":")[0]] if args.device else list(device_configs())))
        return 0

    table = support_table(devices=[args.device.split(":")[0]] if args.device else None)
    if args.update_readme is None:
        print(table)
        return 0
    text = args.update_readme.read_text()
    pattern = re.compile(re.escape(BEGIN) + ".*?" + re.escape(END), re.S)
    if not pattern.search(text):
        raise ValueError(f"{args.update_readme} has no {BEGIN} ... {END} section to rewrite")
    args.update_readme.write_text(pattern.sub(lambda _m: readme_section(table), text))
    print(f"updated the op table in {args.update_readme}")
    return 0
