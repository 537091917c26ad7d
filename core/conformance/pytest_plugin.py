"""``pytest --anychip-device=DEV``: the conformance checks as pytest items.

Installed as a pytest11 entry point, so pytest loads it in every run: without
``--anychip-device`` it only adds its options. With it, the session gets one item per runtime
contract check, per (op, dtype, direction) and per ``anychip.conformance`` entry point, each
failing with its check's detail, and ends with the conformance matrix. It needs no test files,
so a vendor can run it from their own package:

    pytest --anychip-device=mychip
    pytest --anychip-device=mychip --anychip-ops rms_norm,attention --anychip-skip e2e
    pytest -p anychip_conformance --anychip-device=mychip    # with PYTEST_DISABLE_PLUGIN_AUTOLOAD=1

A fallback, a kernel the device does not declare, or a skipped check is reported as a skip
with its reason; only a failure fails.
"""

from __future__ import annotations

import pytest

_PLAN = pytest.StashKey[tuple]()  # (device, sections, [(op, dtype)]) when --anychip-device is given
_RESULTS = pytest.StashKey[list]()  # the Results of the checks run so far


def pytest_addoption(parser):
    group = parser.getgroup("anychip", "anychip conformance (see `anychip conformance --help`)")
    group.addoption("--anychip-device", metavar="DEV",
                    help="run anychip's conformance checks on DEV (e.g. npu, mychip:0) as test items")
    group.addoption("--anychip-ops", metavar="OP[,OP...]", help="with --anychip-device: only these ops")
    group.addoption("--anychip-dtypes", metavar="DTYPE[,DTYPE...]", help="with --anychip-device: only these dtypes")
    group.addoption("--anychip-skip", metavar="SECTION[,SECTION...]",
                    help="with --anychip-device: leave out sections (runtime, op, e2e)")


def _listed(config, name):
    text = config.getoption(name)
    return None if text is None else [n.strip() for n in text.split(",") if n.strip()]


def pytest_configure(config):
    device = config.getoption("anychip_device")
    if not device:
        return
    from . import SECTIONS, check_sections
    from .op_checks import plan, resolve_device

    try:
        resolve_device(device)
        sections = [s for s in SECTIONS if s not in check_sections(_listed(config, "anychip_skip") or ())]
        pairs = plan(_listed(config, "anychip_ops"), _listed(config, "anychip_dtypes")) if "op" in sections else []
    except ValueError as exc:
        raise pytest.UsageError(f"--anychip-*: {exc}") from None
    config.stash[_PLAN] = (device, sections, pairs)
    config.stash[_RESULTS] = []


def pytest_report_header(config):
    if _PLAN not in config.stash:
        return None
    from ..devices import describe
    from ..runtime.open import parse_device

    device = config.stash[_PLAN][0]
    info = describe(parse_device(device)[0])
    label = f"{device} (simulated)" if info.status == "simulated" else device
    return f"anychip conformance: {label}, plugin {info.plugin}"


@pytest.hookimpl(wrapper=True)
def pytest_make_collect_report(collector):
    """Adds the device's checks to what the session collects, beside any test files: so the
    usual collection reports, -k and -m and --collect-only see them."""
    report = yield
    if isinstance(collector, pytest.Session) and _PLAN in collector.config.stash and report.passed:
        device, sections, pairs = collector.config.stash[_PLAN]
        name = f"anychip-conformance[{device}]"
        # a child of the session with no file: its items' ids start with this name
        report.result.append(Conformance.from_parent(collector, name=name, nodeid=name, device=device,
                                                     sections=sections, pairs=pairs))
    return report


def pytest_terminal_summary(terminalreporter, config):
    if not config.stash.get(_RESULTS, None):
        return
    from .report import Report

    report = Report.of(config.stash[_PLAN][0], config.stash[_RESULTS])
    terminalreporter.section("anychip conformance")
    for line in report.matrix_text().splitlines():
        terminalreporter.write_line(line)


class ConformanceFailure(Exception):
    """A check's FAIL: the message is its detail."""


class Conformance(pytest.Collector):
    """The checks of one device, collected without running anything."""

    def __init__(self, *, device, sections, pairs, **kwargs):
        super().__init__(**kwargs)
        self.device, self.sections, self.pairs = device, sections, pairs
        self._op_results = {}

    def collect(self):
        from . import e2e_checks, run_e2e
        from .op_checks import check_op, directions

        if "runtime" in self.sections:
            from .runtime_contract import CHECKS

            for name in CHECKS:
                yield Check.from_parent(self, name=f"runtime[{name}]", run=lambda name=name: self._runtime(name))
        for op, dtype in self.pairs:
            for direction in directions(op):
                def run(op=op, dtype=dtype, direction=direction):
                    if (op, dtype) not in self._op_results:
                        self._op_results[op, dtype] = check_op(self.device, op, dtype)
                    return [r for r in self._op_results[op, dtype] if r.direction == direction]

                yield Check.from_parent(self, name=f"{op}[{dtype}-{direction}]", run=run)
        for ep in e2e_checks() if "e2e" in self.sections else ():
            yield Check.from_parent(self, name=f"e2e[{ep.name}]", run=lambda ep=ep: run_e2e(self.device, ep))

    def _runtime(self, name):
        from ..runtime import open_device
        from .runtime_contract import run_check

        return [run_check(name, open_device(self.device))]


class Check(pytest.Item):
    """One check; ``run()`` returns its Results."""

    def __init__(self, *, run, **kwargs):
        super().__init__(**kwargs)
        self._run = run

    def runtest(self):
        from .result import FAIL, PASS

        results = self._run()
        self.config.stash[_RESULTS].extend(results)
        failed = [r for r in results if r.status == FAIL]
        if failed:
            raise ConformanceFailure("\n".join(_line(r) for r in failed))
        others = [r for r in results if r.status != PASS]
        if others and len(others) == len(results):
            pytest.skip("; ".join(_line(r) for r in others))

    def repr_failure(self, excinfo, style=None):
        if isinstance(excinfo.value, ConformanceFailure):
            return str(excinfo.value)
        return super().repr_failure(excinfo, style)

    def reportinfo(self):
        return self.path, None, self.nodeid


def _line(result) -> str:
    what = " ".join(x for x in (result.name, result.dtype, result.direction) if x)
    error = "" if result.max_error is None else f", max |error| {result.max_error:.2e}"
    return f"{what}: {result.status}{error}: {result.detail}"
