"""The ``anychip`` command line. Every command takes ``--device`` and ``--report-fallbacks``."""

from __future__ import annotations

import argparse
import os
import sys

from . import devices as devices_cmd
from . import ops as ops_cmd

COMMANDS = {"devices": devices_cmd, "ops": ops_cmd}


def common_flags() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--device", metavar="DEV", default=None,
                        help="device to run on, e.g. cpu, npu, npu:1 (default: $ANYCHIP_DEVICE or cpu)")
    common.add_argument("--report-fallbacks", action="store_true",
                        help="print which ops (anychip and Paddle) ran on the CPU instead of the device")
    return common


def build_parser() -> argparse.ArgumentParser:
    common = common_flags()
    parser = argparse.ArgumentParser(
        prog="anychip", parents=[common],
        description="Run LLM work on any chip through one device layer. "
                    "Start with `anychip devices` to see what this machine offers.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, module in COMMANDS.items():
        module.add_parser(sub, common)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 2
    try:
        code = COMMANDS[args.command].run(args)
    except BrokenPipeError:
        # The reader left early (`anychip ops | head`): stop quietly, as other CLI tools do.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except (ValueError, RuntimeError, FileNotFoundError) as exc:
        print(f"anychip {args.command}: error: {exc}", file=sys.stderr)
        code = 1
    if args.report_fallbacks:
        from ..fallback import fallback_report

        print(fallback_report(), file=sys.stderr)
    return code


if __name__ == "__main__":
    sys.exit(main())
