"""Every registered op against its reference on one device: forward and backward, each dtype the
op declares, on the sample inputs of its definition (:mod:`anychip.conformance.cases`), within
the op's tolerance. The ops are anychip's fused ops, then its base ops (each grad op a
forward-only op of its own), then those the plugins define.

As in anychip's own op tests, inputs are drawn in float32, rounded to the dtype under test, and
the reference runs on the host CPU in float32 from the same rounded values, so only the
kernel's own error is measured. Gradients get 4x the forward tolerance (two more roundings).
"""

from __future__ import annotations

import os

import numpy as np

from ..ops.defs import definitions
from .result import FAIL, FALLBACK, NOT_DECLARED, PASS, SKIPPED, Result

GRAD_TOLERANCE_SCALE = 4
# Integer outputs are quantization codes: a value within float error of a .5 boundary may round
# either way, so this share of codes (at least one) may be off by one.
CODE_MISMATCH_SHARE = 1e-3

_paddle = None


def paddle():
    """Paddle with anychip's devices registered. Imported with the simulator's memory guard off
    (ANYCHIP_SIM_CHECK): Paddle's own CPU fallbacks (e.g. ``full``) write device memory
    directly, which the guard would trap though the kernels under test are fine."""
    global _paddle
    if _paddle is None:
        from ..frontends.paddle import import_paddle

        saved = os.environ.pop("ANYCHIP_SIM_CHECK", None)
        try:
            _paddle = import_paddle()
        finally:
            if saved is not None:
                os.environ["ANYCHIP_SIM_CHECK"] = saved
    return _paddle


def resolve_device(device: str) -> tuple[str, int]:
    """("npu", 0) for "npu" or "npu:0"; raises ValueError naming the device when it is unknown,
    out of range or unavailable on this machine."""
    from ..runtime.open import open_device, parse_device

    name, index = parse_device(device)
    try:
        open_device(f"{name}:{index}")
    except RuntimeError as exc:  # the runtime's errors; a simulated device under ANYCHIP_REQUIRE_HARDWARE
        raise ValueError(f"device {device!r} cannot be checked on this machine: {exc}") from None
    return name, index


def plan(ops=None, dtypes=None) -> list[tuple[str, str]]:
    """The (op, dtype) pairs to check: every op in ``ops`` (default all registered) for every
    dtype its spec declares, limited to ``dtypes`` when given."""
    specs = definitions()
    unknown = [op for op in ops or () if op not in specs]
    if unknown:
        raise ValueError(f"ops: unknown op(s) {', '.join(map(repr, unknown))}; known ops: {', '.join(specs)}")
    known_dtypes = {d for spec in specs.values() for d in spec.dtypes}
    unknown = [d for d in dtypes or () if d not in known_dtypes]
    if unknown:
        raise ValueError(f"dtypes: unknown dtype(s) {', '.join(map(repr, unknown))}; "
                         f"the ops declare {', '.join(sorted(known_dtypes))}")
    return [(op, dtype) for op in (ops or specs) for dtype in specs[op].dtypes
            if dtypes is None or dtype in dtypes]


def run_ops(device: str, ops=None, dtypes=None) -> list[Result]:
    """Results of :func:`check_op` for every pair of :func:`plan`."""
    resolve_device(device)
    return [r for op, dtype in plan(ops, dtypes) for r in check_op(device, op, dtype)]


def directions(op: str) -> tuple[str, ...]:
    return ("fwd", "bwd") if definitions()[op].backward else ("fwd",)


def check_op(device: str, op: str, dtype: str) -> list[Result]:
    """One Result per direction of ``op`` in ``dtype`` on ``device``: NOT_DECLARED without a
    registered kernel; else every case run, FAIL (naming the case, the output and the worst
    element, or the exception), FALLBACK (the reference ran on the device instead of the
    kernel) or PASS."""
    from ..plugins import registry
    from ..runtime.open import parse_device

    name, index = parse_device(device)
    kernel = registry().kernels.find(op, name, dtype)
    if kernel is None:
        detail = (f"{name} registers no {op} kernel for {dtype}, so the op runs its Paddle reference there "
                  "(a counted fallback)")
        return [Result("op", op, NOT_DECLARED, dtype, d, detail=detail) for d in directions(op)]
    return tally(op, dtype, lambda case: _run_case(case, (name, index), op, dtype))


def sample_cases(op: str, dtype: str) -> list:
    """The sample cases of ``op`` in ``dtype``."""
    from .cases import cases

    return cases(op, dtype)


def tally(op: str, dtype: str, run_case) -> list[Result]:
    """One Result per direction: ``run_case(case)`` ({direction: (status, max |error|,
    detail)}, as :func:`outcomes` makes it) of every sample case, folded."""
    tallies = {d: _Tally(op, dtype, d) for d in directions(op)}
    all_cases = sample_cases(op, dtype)
    for number, case in enumerate(all_cases, 1):
        where = f"case {number}/{len(all_cases)} '{case.label}' ({case.describe()})"
        for direction, outcome in run_case(case).items():
            tallies[direction].add(where, *outcome)
    return [t.result() for t in tallies.values()]


class _Tally:
    """The cases' outcomes in one direction, folded into one Result."""

    def __init__(self, op, dtype, direction):
        self.op, self.dtype, self.direction = op, dtype, direction
        self.max_error, self.ran = None, 0
        self.failures, self.fallbacks, self.skips = [], [], []

    def add(self, where: str, status: str, max_error: float | None, detail: str):
        if max_error is not None:
            self.max_error = max_error if self.max_error is None else max(self.max_error, max_error)
        if status == SKIPPED:
            self.skips.append(detail)
            return
        self.ran += 1
        if status == FAIL:
            self.failures.append(f"{where}: {detail}")
        elif status == FALLBACK:
            self.fallbacks.append(detail)

    def result(self) -> Result:
        def make(status, detail):
            return Result("op", self.op, status, self.dtype, self.direction, self.max_error, detail)

        if self.failures:  # one line per failing case: the pattern across cases is often the clue
            return make(FAIL, "\n".join(self.failures))
        if self.fallbacks:
            return make(FALLBACK, self.fallbacks[0])
        if not self.ran:
            reasons = "; ".join(dict.fromkeys(self.skips)) or "no case exercises this direction"
            return make(SKIPPED, f"{reasons} ({len(self.skips)} case(s))")
        return make(PASS, f"{self.ran} case(s)")


def _rounded(array: np.ndarray, dtype: str) -> np.ndarray:
    """``array`` as float32 after a round trip through ``dtype``."""
    pd = paddle()
    return pd.to_tensor(array.astype(np.float32), place=pd.CPUPlace()).astype(dtype).astype("float32").numpy()


def _tensor(array: np.ndarray, device: tuple[str, int], dtype: str | None, grad: bool):
    from ..frontends.paddle import place

    pd = paddle()
    t = pd.to_tensor(np.ascontiguousarray(array), place=pd.CPUPlace())
    if dtype is not None and dtype != str(t.dtype).removeprefix("paddle."):
        t = t.astype(dtype)
    if device[0] != "cpu":
        t = t._copy_to(place(*device), True)
    t.stop_gradient = not grad
    return t


def _host(t) -> np.ndarray | None:
    if t is None:
        return None
    pd = paddle()
    if not t.place.is_cpu_place():
        t = t._copy_to(pd.CPUPlace(), True)
    if str(t.dtype) in ("paddle.bfloat16", "paddle.float16"):
        t = t.astype("float32")
    a = t.numpy()
    return a.astype(np.float64) if a.dtype.kind == "f" else a


def error_text(exc: BaseException) -> str:
    """The exception on one line (Paddle's span several), so each case keeps one line."""
    return " ".join(f"{type(exc).__name__}: {exc}".split())


def _evaluate(fn, case, inputs, seeds, device, dtype, backward):
    """Runs ``fn`` (the op or its reference) on ``inputs`` placed on ``device`` as ``dtype``:
    (outputs, {input: grad}, forward error, backward error), host copies."""
    def kind(name, array):
        if array.dtype.kind != "f":
            return None
        return "float32" if name in case.float32_inputs else dtype

    try:  # copying the inputs to the device is part of what may break
        tensors = {n: _tensor(a, device, kind(n, a), backward and n in case.grads) for n, a in inputs.items()}
        outs = fn(**tensors)
        outs = tuple(outs) if isinstance(outs, (tuple, list)) else (outs,)
        host_outs = [_host(o) for o in outs]
    except Exception as exc:  # noqa: BLE001 - a broken kernel must not stop the run
        return None, None, error_text(exc), ""
    if case.host_outputs is not None:
        host_outs = case.host_outputs(host_outs)
    if not backward:
        return host_outs, {}, "", ""
    try:
        seeded = [(o, _tensor(s, device, dtype, False)) for o, s in zip(outs, seeds) if s is not None]
        found = paddle().grad([o for o, _ in seeded], [tensors[n] for n in case.grads], [s for _, s in seeded],
                              allow_unused=True)
        grads = {n: _host(g) for n, g in zip(case.grads, found)}
    except Exception as exc:  # noqa: BLE001
        return host_outs, None, "", error_text(exc)
    return host_outs, grads, "", ""


def _run_case(case, device, op, dtype) -> dict[str, tuple[str, float | None, str]]:
    """{direction: (status, max |error|, detail)} of one case."""
    import anychip

    spec = definitions()[op]
    backward = spec.backward and bool(case.grads)
    inputs = {n: _rounded(a, dtype) if a.dtype.kind == "f" and n not in case.float32_inputs else a
              for n, a in case.inputs.items()}
    seeds = [None if s is None else _rounded(s, dtype) for s in case.output_grads]
    anychip.reset_fallbacks()
    got, got_grads, fwd_error, bwd_error = _evaluate(case.call, case, inputs, seeds, device, dtype, backward)
    counts = anychip.fallback_counts()
    want, want_grads, ref_error, ref_grad_error = _evaluate(case.reference, case, inputs, seeds, ("cpu", 0),
                                                            "float32", backward)
    forward_fallback = _fallback_detail(counts, device, op, dtype, "", "the forward")
    backward_fallback = (_fallback_detail(counts, device, op, dtype, "_grad", "the backward")
                         or _fallback_detail(counts, device, op, dtype, "", "the forward (and so the backward)"))
    return outcomes(case, spec, dtype, backward, (got, want, fwd_error, ref_error, forward_fallback),
                    (got_grads, want_grads, bwd_error, ref_error or ref_grad_error, backward_fallback))


def outcomes(case, spec, dtype, backward: bool, forward: tuple, gradients: tuple):
    """{direction: (status, max |error|, detail)} of one case, from what a framework's driver
    ran: ``forward`` is (outputs, reference outputs, error text, reference's error text,
    fallback detail) as host arrays, ``gradients`` the same of {input: gradient}."""
    fwd_error = forward[2]
    outcome = {"fwd": _forward_outcome(case, spec, dtype, *forward)}
    if spec.backward:
        if not backward:
            outcome["bwd"] = (SKIPPED, None, "forward only (no input takes a gradient in this case)")
        elif fwd_error:
            outcome["bwd"] = (SKIPPED, None, "not run: the forward raised")
        else:
            outcome["bwd"] = _backward_outcome(case, spec, dtype, *gradients)
    return outcome


def _fallback_detail(counts, device, op, dtype, suffix, what):
    calls = counts.get((device[0], f"anychip.{op}{suffix}", dtype), 0)
    if not calls:
        return ""
    return (f"{what} ran the Paddle reference on {device[0]} instead of a kernel ({calls} call(s) counted as "
            f"anychip.{op}{suffix} fallbacks)")


def _forward_outcome(case, spec, dtype, got, want, error, ref_error, fell_back):
    if ref_error:
        return FAIL, None, f"the reference raised (a bug in the conformance case, not the kernel): {ref_error}"
    if error:
        return FAIL, None, f"raised {error}"
    rtol, atol = spec.tolerance[dtype]
    worst, problems = _compare_all(zip(case.outputs, got, want), rtol, atol, "output")
    if problems:
        return FAIL, worst, problems
    if fell_back:
        return FALLBACK, worst, fell_back
    return PASS, worst, ""


def _backward_outcome(case, spec, dtype, got, want, error, ref_error, fell_back):
    if ref_error:
        return FAIL, None, f"the reference raised (a bug in the conformance case, not the kernel): {ref_error}"
    if error:
        return FAIL, None, f"the backward raised {error}"
    rtol, atol = spec.tolerance[dtype]
    scale = GRAD_TOLERANCE_SCALE
    worst, problems = _compare_all(((f"gradient of {n}", got[n], want[n]) for n in case.grads),
                                   rtol * scale, atol * scale, "")
    if problems:
        return FAIL, worst, problems
    if fell_back:
        return FALLBACK, worst, fell_back
    return PASS, worst, ""


def _compare_all(named, rtol, atol, kind) -> tuple[float, str]:
    """(largest |error| over all arrays, '; '-joined problems, '' when all are within tolerance)."""
    worst, problems = 0.0, []
    for i, (name, got, want) in enumerate(named):
        label = f"{kind} {i} ({name})" if kind else name
        if got is None or want is None:
            if (got is None) != (want is None):
                problems.append(f"{label}: {'none was computed' if got is None else 'computed'} but the reference "
                                f"{'has one' if got is None else 'has none'}")
            continue
        error, problem = compare(got, want, rtol, atol)
        worst = max(worst, error)
        if problem:
            problems.append(f"{label}: {problem}")
    return worst, "; ".join(problems)


def _index(flat: int, shape) -> list[int]:
    return [int(i) for i in np.unravel_index(flat, shape)] if shape else []


def compare(got: np.ndarray, want: np.ndarray, rtol: float, atol: float) -> tuple[float, str]:
    """(max |got - want|, '' or what is out of tolerance: how many elements, the worst one, its
    value and the reference's). Integer arrays are compared as quantization codes."""
    if got.shape != want.shape:
        return float("inf"), f"shape {list(got.shape)}, the reference's is {list(want.shape)}"
    if got.size == 0:
        return 0.0, ""
    if want.dtype.kind in "iub":
        return _compare_codes(got, want)
    g, w = got.astype(np.float64), want.astype(np.float64)
    equal = (g == w) | (np.isnan(g) & np.isnan(w))  # also -inf == -inf: rows that see no key
    with np.errstate(invalid="ignore"):
        error = np.where(equal, 0.0, np.abs(g - w))
    error = np.where(np.isnan(error), np.inf, error)
    allowed = np.where(np.isfinite(w), atol + rtol * np.abs(w), 0.0)
    bad = error > allowed
    max_error = float(error.max())
    if not bad.any():
        return max_error, ""
    with np.errstate(divide="ignore", invalid="ignore"):
        excess = np.where(bad, error / np.maximum(allowed, np.finfo(np.float64).tiny), 0.0)
    at = int(np.argmax(excess))
    idx = _index(at, g.shape)
    gv, wv = g.flat[at], w.flat[at]
    return max_error, (f"{int(bad.sum())} of {bad.size} elements outside tolerance (rtol {rtol:.0e}, atol {atol:.0e}); "
                       f"worst at {idx}: got {gv:.6g}, want {wv:.6g} (|error| {error.flat[at]:.2e}, "
                       f"allowed {allowed.flat[at]:.2e}); max |error| {max_error:.2e}")


def _compare_codes(got, want) -> tuple[float, str]:
    diff = np.abs(got.astype(np.int64) - want.astype(np.int64))
    max_error = float(diff.max())
    differ = int((diff != 0).sum())
    may = max(1, int(CODE_MISMATCH_SHARE * diff.size))
    if max_error <= 1 and differ <= may:
        return max_error, ""
    at = int(np.argmax(diff))
    return max_error, (f"{differ} of {diff.size} codes differ (at most {may} may, by 1, where a value sits "
                       f"within float error of a .5 boundary); worst at {_index(at, got.shape)}: got "
                       f"{got.flat[at]}, want {want.flat[at]}")
