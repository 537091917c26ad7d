"""The conformance kit: does a device keep anychip's contracts?

    from anychip import conformance
    report = conformance.run("npu")
    print(report.matrix_text())

Three sections run by default: "runtime" (the device.h contract, :mod:`.runtime_contract`), "op"
(every registered op against its reference, :mod:`.op_checks`) and "e2e" (the checks of every
``anychip.conformance`` entry point, e.g. a tiny Llama's training step against the host CPU).
"collectives" (device.h ABI 1.2 collectives against numpy, :mod:`.collectives`) runs when named
in ``sections`` (it starts processes and waits out a timeout on purpose).
The same run is ``anychip conformance --device DEV`` and ``pytest --anychip-device=DEV``.

This package is imported by the pytest plugin in every pytest run, so it imports nothing
heavy until a run starts.
"""

from __future__ import annotations

import os
import sys
from contextlib import contextmanager

from .result import FAIL, FALLBACK, NOT_DECLARED, PASS, SKIPPED, Result

SECTIONS = ("runtime", "op", "e2e", "collectives")
DEFAULT_SECTIONS = ("runtime", "op", "e2e")
# The frameworks the op section runs through, and the sections each can run: the e2e entry points
# are Paddle workloads, the runtime and collectives checks use no framework.
FRAMEWORKS = {"paddle": SECTIONS, "torch": ("runtime", "op", "collectives")}
ENTRY_POINT_GROUP = "anychip.conformance"

__all__ = ["DEFAULT_SECTIONS", "ENTRY_POINT_GROUP", "FAIL", "FRAMEWORKS", "FALLBACK", "NOT_DECLARED", "PASS", "SECTIONS", "SKIPPED",
           "Result", "check_sections", "default_sections", "e2e_checks", "run", "run_collectives", "run_e2e", "run_runtime"]


def check_sections(sections, framework: str = "paddle") -> tuple[str, ...]:
    if framework not in FRAMEWORKS:
        raise ValueError(f"framework: unknown framework {framework!r}; choose from {', '.join(FRAMEWORKS)}")
    unknown = [s for s in sections if s not in SECTIONS]
    if unknown:
        raise ValueError(f"sections: unknown section(s) {', '.join(map(repr, unknown))}; "
                         f"choose from {', '.join(SECTIONS)}")
    beyond = [s for s in sections if s not in FRAMEWORKS[framework]]
    if beyond:
        raise ValueError(f"sections: {', '.join(beyond)} cannot run through {framework} (the e2e checks are the "
                         "anychip.conformance entry points' Paddle workloads); with framework "
                         f"{framework} choose from {', '.join(FRAMEWORKS[framework])}")
    return tuple(sections)


def default_sections(framework: str = "paddle") -> tuple[str, ...]:
    return tuple(s for s in DEFAULT_SECTIONS if s in FRAMEWORKS.get(framework, ()))


def _op_driver(framework: str):
    """The module whose ``plan`` and ``check_op`` run the op section through ``framework``."""
    if framework == "torch":
        from ..frontends.torch import conformance as driver
    else:
        from . import op_checks as driver
    return driver


def _failure(section: str, name: str, what: str, exc: BaseException) -> Result:
    return Result(section, name, FAIL, detail=f"{what} raised {type(exc).__name__}: {exc}")


def _checked(section: str, name: str, results) -> list[Result]:
    """``results`` as returned by a section's ``run(device)``, with anything that is not a list
    of Results turned into a FAIL naming its source."""
    if not isinstance(results, (list, tuple)):
        return [Result(section, name, FAIL, detail=f"{name}.run returned {type(results).__name__}, "
                                                   "expected a list of anychip.conformance.Result")]
    bad = [r for r in results if not isinstance(r, Result)]
    if bad:
        return [Result(section, name, FAIL, detail=f"{name}.run returned {type(bad[0]).__name__} items, "
                                                   "expected anychip.conformance.Result")]
    return list(results)


def run_runtime(device: str) -> list[Result]:
    """The device.h contract checks; one that cannot run at all is a FAIL, never a crash."""
    try:
        from . import runtime_contract

        return _checked("runtime", "runtime_contract", runtime_contract.run(device))
    except Exception as exc:  # noqa: BLE001 - reported as a failure
        return [_failure("runtime", "runtime_contract", "the runtime contract checks", exc)]


def run_collectives(device: str) -> list[Result]:
    """The collectives checks (one SKIPPED result for a plugin without collectives); one that
    cannot run at all is a FAIL, never a crash."""
    try:
        from . import collectives

        return _checked("collectives", "collectives", collectives.run(device))
    except Exception as exc:  # noqa: BLE001 - reported as a failure
        return [_failure("collectives", "collectives", "the collectives checks", exc)]


def e2e_checks() -> list:
    """The ``anychip.conformance`` entry points, by name."""
    from importlib.metadata import entry_points

    return sorted(entry_points(group=ENTRY_POINT_GROUP), key=lambda ep: ep.name)


def run_e2e(device: str, entry_point) -> list[Result]:
    """The results of one ``anychip.conformance`` entry point's ``run(device)``; an entry point
    that fails to load or raises is a FAIL in section "e2e" naming it."""
    try:
        module = entry_point.load()
    except Exception as exc:  # noqa: BLE001
        return [_failure("e2e", entry_point.name, f"loading entry point {entry_point.value!r}", exc)]
    if not callable(getattr(module, "run", None)):
        return [Result("e2e", entry_point.name, FAIL,
                       detail=f"entry point {entry_point.value!r} has no run(device) -> list[Result]")]
    try:
        return _checked("e2e", entry_point.name, module.run(device))
    except Exception as exc:  # noqa: BLE001
        return [_failure("e2e", entry_point.name, f"{entry_point.value}.run({device!r})", exc)]


@contextmanager
def _terminal_stderr(wanted: bool):
    """A stream on the terminal behind stderr, for the progress bar. Importing Paddle routes fd 2
    through anychip's fallback filter (anychip.fallback), which reads whole lines and would take
    a bar's unfinished line and a sync marker for one line; a copy of fd 2 taken before that
    import keeps writing to the terminal. (Once Paddle is in, the copy is a pipe: no bar.)"""
    try:
        fd = os.dup(sys.stderr.fileno()) if wanted else None
    except (AttributeError, OSError, ValueError):  # no file descriptor (e.g. a notebook)
        fd = None
    if fd is None:
        yield sys.stderr
        return
    with os.fdopen(fd, "w") as stream:
        yield stream


def run(device: str, ops=None, dtypes=None, sections=None, progress: bool = True, framework: str = "paddle"):
    """Runs the chosen ``sections`` (default :func:`default_sections`) on ``device`` ("npu",
    "npu:1") and returns a :class:`~anychip.conformance.report.Report`. ``ops`` and ``dtypes``
    limit the op checks, which run through ``framework`` ("paddle", or "torch": PyTorch's
    ``anychip`` device bound to the device's chip). Progress goes to stderr (with tqdm, when that
    is a terminal). Raises ValueError for an unknown or unavailable device, op, dtype, section or
    framework before anything runs."""
    from tqdm import tqdm

    from .op_checks import resolve_device
    from .report import Report

    sections = check_sections(default_sections(framework) if sections is None else sections, framework)
    resolve_device(device)
    driver = _op_driver(framework) if "op" in sections else None
    pairs = driver.plan(ops, dtypes) if driver else []
    entry_points = e2e_checks() if "e2e" in sections else []
    steps = ([("runtime", None)] if "runtime" in sections else []) + [("op", p) for p in pairs]
    steps += [("e2e", ep) for ep in entry_points]
    steps += [("collectives", None)] if "collectives" in sections else []
    results: list[Result] = []
    with _terminal_stderr(progress) as stream, tqdm(steps, desc=f"conformance {device}", unit="check", file=stream,
                                                    disable=None if progress else True) as bar:
        for section, what in bar:
            if section == "runtime":
                bar.set_postfix_str("runtime contract")
                results += run_runtime(device)
            elif section == "collectives":
                bar.set_postfix_str("collectives")
                results += run_collectives(device)
            elif section == "op":
                bar.set_postfix_str(" ".join(what))
                results += driver.check_op(device, *what)
            else:
                bar.set_postfix_str(what.name)
                results += run_e2e(device, what)
    unreached = getattr(driver, "UNREACHED", {})
    notes = [f"not reached from {framework}: {op} ({why})" for op, why in unreached.items()
             if not ops or op in ops]
    return Report.of(device, results, framework, notes)
