"""One conformance check's outcome: the unit the report's matrix, its Markdown and JSON, and the
pytest plugin are made of."""

from __future__ import annotations

from dataclasses import asdict, dataclass

PASS, FAIL, FALLBACK, NOT_DECLARED, SKIPPED = "pass", "fail", "fallback", "not declared", "skipped"
STATUSES = (PASS, FAIL, FALLBACK, NOT_DECLARED, SKIPPED)


@dataclass
class Result:
    """``section``: "runtime" (device.h contract), "op" (a registered op against its reference)
    or "e2e" (a whole workload against cpu). ``name``: the check or op name. ``dtype`` and
    ``direction`` ("fwd" / "bwd") for op checks, else None. ``max_error``: the largest absolute
    difference seen where a comparison was made. ``detail``: for a failure, the error message
    naming what broke (shape, index, exception text); for a fallback, its reason."""

    section: str
    name: str
    status: str
    dtype: str | None = None
    direction: str | None = None
    max_error: float | None = None
    detail: str = ""

    def __post_init__(self):
        if self.status not in STATUSES:
            raise ValueError(f"status must be one of {STATUSES}, got {self.status!r}")

    @property
    def failed(self) -> bool:
        return self.status == FAIL

    def as_dict(self) -> dict:
        return asdict(self)
