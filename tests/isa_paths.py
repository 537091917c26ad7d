"""The host kernels' instruction-set tiers, for the tests that rerun cases with ANYCHIP_CPU_ISA
capped to each: a tier this CPU lacks is skipped with the reason (capping to it would only run
a lower tier again)."""

from __future__ import annotations

import pytest

from anychip_plugins.host import ISAS, kernel_isa


def isa_params(*isas: str) -> list:
    best = kernel_isa()
    return [pytest.param(isa, marks=pytest.mark.skipif(
        ISAS.index(isa) > ISAS.index(best), reason=f"this CPU has no {isa} (its kernels use {best})"))
        for isa in isas]
