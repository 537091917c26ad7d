"""``anychip ops``: which ops each device runs with its own kernels, per dtype and direction."""

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


def readme_section(table: str) -> str:
    return f"{BEGIN}\n{table}\n{END}"


def run(args) -> int:
    from ..ops.support import support_table

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
