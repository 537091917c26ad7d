"""The kernel cases of ``anychip bench`` (bench/cases.py) through pytest-benchmark: anychip's op on
each device, the op's reference and the host peers, in the session's summary like every bench.

    python -m pytest bench/bench_ops.py --benchmark-only
    ANYCHIP_BENCH_SHAPES=tiny ANYCHIP_BENCH_DEVICES=cpu,npu python -m pytest bench/bench_ops.py --benchmark-only

Environment: ANYCHIP_BENCH_SHAPES (tiny, smollm2 (default), llama-7b), ANYCHIP_BENCH_DTYPE
(float32 (default), bfloat16), ANYCHIP_BENCH_DEVICES (comma-separated, default cpu),
ANYCHIP_BENCH_OPS (comma-separated, default all). A case on another device than the host is
named "... on npu, simulated (host speed)"; host work listed under it (the reference of a
simulated device, the peers) is timed once and recorded in each device's case.
"""

import os

import pytest

from anychip_bench import cases as kernel_cases

PRESET = os.environ.get("ANYCHIP_BENCH_SHAPES", "smollm2")
DTYPE = os.environ.get("ANYCHIP_BENCH_DTYPE", "float32")
OPS = [o for o in os.environ.get("ANYCHIP_BENCH_OPS", ",".join(kernel_cases.OPS)).split(",") if o]
TARGETS = kernel_cases.resolve_devices(os.environ.get("ANYCHIP_BENCH_DEVICES", "cpu"))
CASES = kernel_cases.build_cases(PRESET, DTYPE, OPS)
PLAN = [(case, m) for case in CASES for m in kernel_cases.measurements(case, TARGETS)]


def _id(case, m) -> str:
    where = ":".join(map(str, m.device)).removesuffix(":0")
    return f"{case.op}-{case.short.replace(' ', '_')}-{where}-{m.impl.name}"


def _case_for(case, target):
    """The harness case of ``case`` as listed under ``target`` (the host's keeps the plain name)."""
    return case.harness_case("" if target.host else f" on {target.label}")


@pytest.mark.parametrize("case,m", PLAN, ids=[_id(c, m) for c, m in PLAN])
def test_kernel_case(benchmark, bench, pd, request, case, m):
    if m.impl.library == "torch":
        request.getfixturevalue("torch")  # skips under --bench-no-torch or without torch
    try:
        once = case.prepare(m.impl, m.device)
    except kernel_cases.Unavailable as exc:
        pytest.skip(f"{m.impl.label} does not run on {m.device[0]}: {exc}")
    amount = m.impl.bytes if case.bound == "memory" else None
    first, *others = m.targets
    with pd.no_grad():
        row = bench.run(benchmark, _case_for(case, first), m.impl.name, once, label=m.label(first),
                        min_rounds=3 if m.impl.role == kernel_cases.REFERENCE else 5, amount=amount)
    for target in others:
        bench.collector.record(_case_for(case, target), m.impl.name, list(benchmark.stats.stats.data),
                               label=m.label(target), foreign_load=row["foreign_load"], amount=amount)
