"""``anychip devices``: every plugin's devices with status, memory, dtypes and kernel count."""

from __future__ import annotations

import json

from ..devices import describe, describe_all
from ..runtime.open import parse_device


def add_parser(sub, common):
    p = sub.add_parser("devices", parents=[common], help="list devices and their status",
                       description="List every device the installed plugins provide: hardware, "
                                   "simulated (anychip's simulator standing in for the chip) or "
                                   "unavailable, with the reason. --device shows one device.")
    p.add_argument("--json", action="store_true", help="machine-readable output")


def _gib(n: int) -> str:
    return f"{n / (1 << 30):.0f} GiB" if n else "-"


def run(args) -> int:
    infos = [describe(parse_device(args.device)[0])] if args.device else describe_all()
    if args.json:
        print(json.dumps([i.as_dict() for i in infos], indent=2))
        return 0
    header = ("DEVICE", "STATUS", "COUNT", "MEMORY", "KERNELS", "MODEL", "DTYPES")
    rows = [(i.name, i.status, str(i.count), _gib(i.memory_bytes), str(i.kernels), i.model or i.description,
             ",".join(i.dtypes) or "-") for i in infos]
    widths = [max(len(r[c]) for r in rows + [header]) for c in range(len(header) - 1)]
    for row in [header] + rows:
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths)) + "  " + row[-1])
    notes = [(i.name, i.reason) for i in infos if i.reason]
    if notes:
        print()
        for name, reason in notes:
            print(reason if reason.startswith(f"{name}:") else f"{name}: {reason}")
    if not args.device:
        print()
        print(_paddle_folder())
    return 0


def _paddle_folder() -> str:
    """Whether a plain `import paddle` gets the devices above: the state of Paddle's own
    CustomDevice folder, which pip install writes."""
    from ..frontends.paddle import root as paddle_root

    try:
        folder = paddle_root.default_root()
        current = paddle_root.holds(folder, paddle_root.root_files())
    except (OSError, RuntimeError) as exc:
        return f"paddle: its CustomDevice folder cannot be checked: {exc}"
    if current:
        return f"paddle: `import paddle` loads these devices from {folder}"
    return (f"paddle: the CustomDevice folder {folder} does not hold these devices as they are now; a script "
            "importing paddle before anychip misses the difference: run `python -m anychip.frontends.paddle.root`")
