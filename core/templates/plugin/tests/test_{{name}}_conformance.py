"""anychip's conformance kit on {{name}}: the runtime contract (anychip/device.h), every op
against its reference (the kernels registered in anychip_{{name}}/__init__.py must match it
within the op's tolerance, forward and backward, in every dtype they declare), and a tiny
Llama forward, backward and AdamW step matching the same on cpu.

The same checks as `anychip conformance --device {{name}}`, which also prints the whole matrix.
"""

import pytest

import anychip.conformance


@pytest.mark.parametrize("section", ["runtime", "op", "e2e"])
def test_conformance_finds_no_failure(section):
    report = anychip.conformance.run("{{name}}", sections=(section,), progress=False)
    assert not report.failed, report.matrix_text()
