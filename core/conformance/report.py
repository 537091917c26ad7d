"""A conformance run's results for one device, as a terminal matrix, Markdown and JSON.

The op matrix has one row per op and a column per dtype and direction (fwd / bwd). Its cells:

    pass            every sample case within the op's tolerance of its reference
    FAIL 3.1e-02    out of tolerance (the largest |error| seen) or raised; the details follow
    fallback        the reference ran on the device instead of a kernel (e.g. no backward kernel)
    —               the device registers no kernel for this op and dtype (not declared)
    skipped         not run (its reason is in the details)
    ·               not part of the op: the op does not declare this dtype or has no backward
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

from .result import FAIL, FALLBACK, NOT_DECLARED, PASS, SKIPPED, STATUSES, Result

DIRECTIONS = ("fwd", "bwd")
FRAMEWORK_NAMES = {"paddle": "Paddle", "torch": "PyTorch (torch.ops.anychip and ATen on the anychip device)"}
FALLBACK_WORDS = {"paddle": "run their Paddle reference", "torch": "run on PyTorch's CPU"}
NOT_PART = "·"
SECTION_TITLES = {"runtime": "Runtime contract (device.h)", "e2e": "End to end",
                  "collectives": "Collectives (device.h ABI 1.2)"}
LEGEND = (f"pass: within the op's tolerance of its reference | FAIL <max |error|>: out of tolerance or raised | "
          f"fallback: the reference ran on the device instead of a kernel | —: no kernel declared for that dtype | "
          f"{NOT_PART}: not part of the op")


def _cell(result: Result | None) -> str:
    if result is None:
        return NOT_PART
    if result.status == FAIL:
        return "FAIL raised" if result.max_error is None else f"FAIL {result.max_error:.1e}"
    return {PASS: "pass", FALLBACK: "fallback", NOT_DECLARED: "—", SKIPPED: "skipped"}[result.status]


def _finite(value):
    """JSON has no inf or nan: those become strings."""
    return value if not isinstance(value, float) or math.isfinite(value) else str(value)


@dataclass
class Report:
    """``device`` as checked ("npu", "npu:1"); ``simulated``: it runs on anychip's simulator;
    ``plugin``: the ``anychip.plugins`` entry point that provides it, ``package`` the
    distribution (and version) that installed that plugin. ``framework``: what the op checks ran
    through ("paddle" or "torch"); ``notes``: lines about what was left out and why."""

    device: str
    results: list[Result]
    simulated: bool = False
    description: str = ""
    plugin: str = ""
    package: str = ""
    date: str = field(default_factory=lambda: datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"))
    anychip_version: str = ""
    framework: str = "paddle"
    notes: list[str] = field(default_factory=list)

    @classmethod
    def of(cls, device: str, results: list[Result], framework: str = "paddle", notes=()) -> Report:
        """A report with what anychip knows about ``device`` filled in."""
        from importlib.metadata import entry_points

        from .. import __version__
        from ..devices import describe
        from ..plugins import ENTRY_POINT_GROUP
        from ..runtime.open import parse_device

        info = describe(parse_device(device)[0])
        package = ""
        for ep in entry_points(group=ENTRY_POINT_GROUP, name=info.plugin):
            if ep.dist is not None:
                package = f"{ep.dist.name} {ep.dist.version}"
        description = info.description + (f" ({info.model})" if info.model else "")
        return cls(device, list(results), info.status == "simulated", description, info.plugin, package,
                   anychip_version=__version__, framework=framework, notes=list(notes))

    # ---- verdict ----------------------------------------------------------------------------

    @property
    def label(self) -> str:
        return f"{self.device} (simulated)" if self.simulated else self.device

    @property
    def failed(self) -> bool:
        return any(r.failed for r in self.results)

    @property
    def exit_code(self) -> int:
        return 1 if self.failed else 0

    def counts(self) -> dict[str, int]:
        return {s: sum(r.status == s for r in self.results) for s in STATUSES}

    def verdict(self) -> str:
        """One line: the device, the counts and FAILED or PASSED."""
        counts = ", ".join(f"{n} {s}" for s, n in self.counts().items() if n)
        word = "FAILED" if self.failed else "PASSED"
        return f"anychip conformance {self.label}: {word} ({counts or 'nothing checked'})"

    # ---- layout -------------------------------------------------------------------------------

    def _dtypes(self) -> list[str]:
        from ..ops.support import OPS

        order = list(dict.fromkeys(d for spec in OPS.values() for d in spec.dtypes))
        seen = {r.dtype for r in self.results if r.section == "op"}
        return [d for d in order if d in seen] + sorted(seen - set(order))

    def _op_rows(self) -> list[tuple[str, list[str]]]:
        ops = list(dict.fromkeys(r.name for r in self.results if r.section == "op"))
        cells = {(r.name, r.dtype, r.direction): r for r in self.results if r.section == "op"}
        return [(op, [_cell(cells.get((op, d, direction))) for d in self._dtypes() for direction in DIRECTIONS])
                for op in ops]

    def _section(self, section: str) -> list[Result]:
        return [r for r in self.results if r.section == section]

    def _header_lines(self) -> list[str]:
        lines = [f"device: {self.label}" + (f", {self.description}" if self.description else "")]
        if self.plugin:
            lines.append(f"plugin: {self.plugin}" + (f" (package {self.package})" if self.package else ""))
        lines.append(f"anychip {self.anychip_version}, {self.date}" if self.anychip_version else self.date)
        if self.framework != "paddle":
            lines.append(f"ops checked through {FRAMEWORK_NAMES.get(self.framework, self.framework)}")
        return lines

    def _notes(self, status: str) -> list[Result]:
        return [r for r in self.results if r.status == status]

    @staticmethod
    def _what(r: Result) -> str:
        return " ".join(x for x in (r.section, r.name, r.dtype, r.direction) if x)

    # ---- outputs ------------------------------------------------------------------------------

    def matrix_text(self) -> str:
        """The terminal table: the op matrix, the runtime and e2e checks, then the details of
        every failure and fallback, and the verdict."""
        lines = [f"anychip conformance: {self.label}", *(f"  {h}" for h in self._header_lines()[1:]), ""]
        rows = self._op_rows()
        if rows:
            dtypes = self._dtypes()
            width = max(len("op"), *(len(op) for op, _ in rows))
            cell_width = max(8, *(len(c) for _, cells in rows for c in cells))
            group = cell_width * 2 + 1
            lines.append(" " * width + "  " + " ".join(d.ljust(group) for d in dtypes).rstrip())
            lines.append("op".ljust(width) + "  "
                         + " ".join(x.ljust(cell_width) for _ in dtypes for x in DIRECTIONS).rstrip())
            for op, cells in rows:
                lines.append(op.ljust(width) + "  " + " ".join(c.ljust(cell_width) for c in cells).rstrip())
            lines.append("")
        for section, title in SECTION_TITLES.items():
            checks = self._section(section)
            if not checks:
                continue
            lines.append(title)
            names = [_check_name(r) for r in checks]
            width = max(map(len, names))
            for name, r in zip(names, checks):
                error = "" if r.max_error is None else f" {r.max_error:.1e}"
                lines.append(f"  {name.ljust(width)}  {'FAIL' + error if r.failed else r.status}")
            lines.append("")
        for status, title in ((FAIL, "Failures"), (FALLBACK, "Fallbacks"), (SKIPPED, "Skipped")):
            noted = self._notes(status)
            if noted:
                lines.append(f"{title}:")
                for r in noted:
                    first, *more = r.detail.splitlines() or [""]
                    lines.append(f"  {self._what(r)}: {first}")
                    lines += [f"    {line}" for line in more]
                lines.append("")
        pairs = {(r.name, r.dtype) for r in self._notes(NOT_DECLARED)}
        if pairs:
            lines.append(f"Not declared (—): {self.device} registers no kernel for {len(pairs)} op/dtype pair(s); "
                         f"there those ops {FALLBACK_WORDS.get(self.framework, 'fall back')}, counted as fallbacks.")
            lines.append("")
        if self.notes:
            lines += ["Notes:", *(f"  {n}" for n in self.notes), ""]
        if rows:
            lines.append(f"Legend: {LEGEND}")
        lines.append(self.verdict())
        return "\n".join(lines)

    def markdown(self) -> str:
        def esc(text: str) -> str:
            return str(text).replace("|", "\\|").replace("\n", "<br>")

        out = [f"# anychip conformance: {self.label}", "", *(f"- {h}" for h in self._header_lines()),
               f"- verdict: **{'FAILED' if self.failed else 'PASSED'}**", ""]
        rows = self._op_rows()
        if rows:
            columns = [f"{d} {x}" for d in self._dtypes() for x in DIRECTIONS]
            out += ["## Ops", "", "| op | " + " | ".join(columns) + " |", "|---|" + "---|" * len(columns)]
            out += [f"| `{op}` | " + " | ".join(cells) + " |" for op, cells in rows]
            out += ["", f"{LEGEND}", ""]
        for section, title in SECTION_TITLES.items():
            checks = self._section(section)
            if not checks:
                continue
            out += [f"## {title}", "", "| check | status | max error | detail |", "|---|---|---|---|"]
            out += [f"| {esc(_check_name(r))} | {r.status} | "
                    f"{'' if r.max_error is None else f'{r.max_error:.1e}'} | "
                    f"{esc(r.detail)} |" for r in checks]
            out.append("")
        for status, title in ((FAIL, "Failures"), (FALLBACK, "Fallbacks"), (SKIPPED, "Skipped"),
                              (NOT_DECLARED, "Not declared")):
            noted = self._notes(status)
            if noted:
                out += [f"## {title}", ""]
                for r in noted:
                    first, *more = r.detail.splitlines() or [""]
                    out.append(f"- **{esc(self._what(r))}**: {esc(first)}")
                    out += [f"  - {esc(line)}" for line in more]
                out.append("")
        if self.notes:
            out += ["## Notes", "", *(f"- {esc(n)}" for n in self.notes), ""]
        return "\n".join(out)

    def as_dict(self) -> dict:
        return {
            "device": self.device, "simulated": self.simulated, "description": self.description,
            "plugin": self.plugin, "package": self.package, "date": self.date,
            "anychip_version": self.anychip_version, "framework": self.framework, "notes": self.notes,
            "passed": not self.failed, "counts": self.counts(),
            "results": [{k: _finite(v) for k, v in r.as_dict().items()} for r in self.results],
        }

    def as_json(self) -> str:
        return json.dumps(self.as_dict(), indent=2, ensure_ascii=False)

    def write(self, folder) -> tuple[Path, Path]:
        """Writes ``conformance.json`` and ``conformance.md`` into ``folder`` (created if needed)."""
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        json_path, md_path = folder / "conformance.json", folder / "conformance.md"
        json_path.write_text(self.as_json() + "\n")
        md_path.write_text(self.markdown() + "\n")
        return json_path, md_path


def _check_name(r: Result) -> str:
    """A check's line name: the collectives section runs each check per dtype, so it names it."""
    return f"{r.name} {r.dtype}" if r.section == "collectives" and r.dtype else r.name
