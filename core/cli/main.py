"""The ``anychip`` command line. Every command takes ``--device`` and ``--report-fallbacks``.

Commands beyond the core's own come from the ``anychip.commands`` entry points (models,
benchmarks, ...), so the core never imports the layers above it. An entry point names a module
with ``add_parser(sub, common)`` (adding the subcommand of the entry point's name) and
``run(args) -> int``.
"""

from __future__ import annotations

import argparse
import os
import sys

from . import conformance as conformance_cmd
from . import devices as devices_cmd
from . import new_plugin as new_plugin_cmd
from . import ops as ops_cmd

CORE_COMMANDS = {"devices": devices_cmd, "ops": ops_cmd, "conformance": conformance_cmd, "new-plugin": new_plugin_cmd}


def commands() -> dict:
    """Every command: the core's, then those of installed packages (a package that fails to
    import is reported, not fatal: the core commands must keep working)."""
    from importlib.metadata import entry_points

    found = dict(CORE_COMMANDS)
    for ep in sorted(entry_points(group="anychip.commands"), key=lambda e: e.name):
        try:
            module = ep.load()
        except Exception as exc:  # noqa: BLE001 - any import failure of a third-party package
            print(f"anychip: command {ep.name!r} is unavailable: {type(exc).__name__}: {exc}", file=sys.stderr)
            continue
        found[ep.name] = module
    return found


def common_flags(top_level: bool = True) -> argparse.ArgumentParser:
    """The flags every command takes, before or after its name. A command's copy has no
    defaults of its own, so that it keeps a value given before the command name."""
    common = argparse.ArgumentParser(add_help=False)
    unset = {} if top_level else {"default": argparse.SUPPRESS}
    common.add_argument("--device", metavar="DEV", **({"default": None} | unset),
                        help="device to run on, e.g. cpu, npu, npu:1 (default: $ANYCHIP_DEVICE or cpu)")
    common.add_argument("--report-fallbacks", action="store_true", **unset,
                        help="print which ops (anychip and Paddle) ran on the CPU instead of the device")
    return common


def build_parser(available: dict) -> argparse.ArgumentParser:
    common = common_flags(top_level=False)
    parser = argparse.ArgumentParser(
        prog="anychip", parents=[common_flags()],
        description="Run LLM work on any chip through one device layer. "
                    "Start with `anychip devices` to see what this machine offers.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for module in available.values():
        module.add_parser(sub, common)
    return parser


def main(argv: list[str] | None = None) -> int:
    available = commands()
    parser = build_parser(available)
    args = parser.parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)  # as given: a command may run itself again
    if args.command is None:
        parser.print_help()
        return 2
    try:
        code = available[args.command].run(args)
    except BrokenPipeError:
        # The reader left early (`anychip ops | head`): stop quietly, as other CLI tools do.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except (ValueError, RuntimeError, FileNotFoundError) as exc:
        print(f"anychip {args.command}: error: {exc}", file=sys.stderr)
        code = 1
    except OSError as exc:
        from ..frontends.paddle import device_error

        # Paddle's own error for a failed device call carries no reason: say the device's instead
        # (out of memory: the device, the bytes requested, free and capacity).
        error = device_error(exc)
        if error is None:
            raise
        print(f"anychip {args.command}: error: {error}", file=sys.stderr)
        code = 1
    if args.report_fallbacks:
        from ..fallback import fallback_report

        print(fallback_report(), file=sys.stderr)
    return code


if __name__ == "__main__":
    sys.exit(main())
