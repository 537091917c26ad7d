"""CodeGen: generated kernels against the hand-written ones, and what building them costs.

Kernels: the ``c`` backend's ``acg_<op>_float32`` (the subject, ``anychip``) and the cpu plugin's
hand-written ``anychip_cpu_<op>`` (the peer), both called directly on numpy buffers in host
memory (``NativeKernel.run_host``: descriptors, no device, no Paddle, no op checks), with the
same thread count and the same inputs, so the comparison is kernel against kernel. Each case
first checks that the two give the same result. Targets (reported, not asserted):

- RMSNorm (forward, [4096, 4096] and SmolLM2's [512, 576]) and softmax (last axis,
  [4096, 4096]): the generated kernel's time <= 1.25x the hand-written kernel's.
- Elementwise add (with and without broadcasting), exp, multiply, [4096, 4096]: >= 70% of the
  copy bandwidth measured in this run.
- matmul (SmolLM2's MLP up-projection over a 512-token pack, and its tied LM head at decode,
  the weight stored [vocab, hidden] and read transposed): reported against the hand-written
  kernel with the same 1.25x bound, TFLOP/s against the AVX-512 FP32 peak.

DRAM cases cycle through enough distinct inputs (``stream_count``) that each round reads from
DRAM, with one preallocated output, as ``bench_norm.py`` does. SmolLM2's [512, 576] stays in
the cache, as it does in the model (the previous op just wrote it); its roofline share can
exceed 100%, and at ~1 MB the Python launch (the same for both) is a visible part of the time.

Build: the npu plugin's whole kernel set (``anychip_codegen.ops.library(<npu's dtypes>)``,
named ``npu_kernels`` as the plugin names it) built into an EMPTY temporary cache with tuning
off (cold: render, ninja, every compile and the link), then the same call again (a cache hit:
timed over many calls, in this process and once in a fresh process), and registering the
library into a fresh KernelRegistry. A cache hit must run no compiler: every hit must report
``built=False``, start no child process other than the compiler's version query (part of the
cache key, once per process) and write no file in the cache; that is asserted, since a hit that
compiles is a bug, not noise. The build figures are printed in their own section after the
summary table (a section of their own: times of one-off steps, not rates against a roofline)
and written to ``<--bench-out>/codegen_build.json``.

The generated kernels benchmarked are the ones this cold build made: default schedules (tuning
off), what a fresh cache gives a plugin.
"""

from __future__ import annotations

import contextlib
import json
import os
import statistics
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import pytest

import anychip_codegen as cg
from anychip.kernels import KernelRegistry, NativeKernel
from anychip.ops import definition
from benchlib import THREADS, Case, Cycle, ForeignLoad, RooflineShare, aligned_empty_like, stream_count

SUBJECT_LABEL = "anychip CodeGen acg_{op}_float32 (c backend)"
PEER = "handwritten"
PEER_LABEL = "hand-written anychip_cpu_{op} (cpu plugin)"
LIBRARY_NAME = "npu_kernels"  # as plugins/npu names it
DEVICE = "npu"
EPS = 1e-5
MB = 2**20


def _attrs(op: str, **values) -> tuple:
    """The attrs of a launch of ``op`` by name, in its definition's order."""
    return tuple(definition(op).attr_values(**values))


@dataclass(frozen=True)
class TimeWithin:
    """PASS when anychip's time <= ``factor`` x the peer's (a generated kernel may be a little
    slower than a hand-written one)."""

    peer: str
    factor: float
    peer_label: str = ""

    def label(self, case) -> str:
        return f"time <= {self.factor:g}x {self.peer_label or self.peer}"

    def judge(self, case, rows) -> tuple[str, str]:
        me, peer = rows.get("anychip"), rows.get(self.peer)
        if me is None or peer is None:
            return "n/a", f"{'anychip' if me is None else self.peer} not measured"
        ratio = me["ms"] / peer["ms"]
        return ("PASS" if ratio <= self.factor else "MISS"), f"{ratio:.2f}x"


HANDWRITTEN_PEER = TimeWithin(PEER, 1.25, "hand-written")


# ---------------------------------------------------------------------------------------------
# The kernel cases: one call each, described so that a tiny shape can run it too


@dataclass(frozen=True)
class KernelCall:
    """One kernel call on host buffers: ``op`` with ``inputs`` shapes (``broadcast``: the
    inputs given stride-0 views of the output's shape, as the base-op ABI has the caller
    broadcast), outputs, attrs. ``dram``: cycle the inputs through DRAM (else one set, in cache)."""

    op: str
    inputs: tuple
    outputs: tuple
    attrs: tuple = ()
    broadcast: bool = False
    dram: bool = True
    positive: bool = False
    tolerance: tuple = (2e-5, 2e-6)  # rtol, atol between the two kernels' results

    def bytes(self) -> int:
        """The minimum bytes the call moves: each input read once, each output written once."""
        return 4 * sum(int(np.prod(s)) for s in self.inputs + self.outputs)

    def make_inputs(self, rng) -> list[np.ndarray]:
        arrays = []
        for shape in self.inputs:
            a = rng.standard_normal(shape, dtype=np.float32)
            arrays.append(np.abs(a) + 0.5 if self.positive else a)
        return arrays

    def views(self, arrays) -> list[np.ndarray]:
        """The arrays as the kernel gets them (broadcast: stride-0 views of the output's shape)."""
        if not self.broadcast:
            return list(arrays)
        return [np.broadcast_to(a, self.outputs[0]) for a in arrays]

    def make_outputs(self) -> list[np.ndarray]:
        return [aligned_empty_like(np.empty(s, np.float32)) for s in self.outputs]


def rms_norm_call(rows, cols, dram=True) -> KernelCall:
    return KernelCall("rms_norm", ((rows, cols), (cols,)), ((rows, cols), (rows,)), _attrs("rms_norm", eps=EPS),
                      dram=dram)


def softmax_call(rows, cols) -> KernelCall:
    return KernelCall("softmax", ((rows, cols),), ((rows, cols),), _attrs("softmax", axis=-1))


def binary_call(op, shape, other_shape=None) -> KernelCall:
    other = shape if other_shape is None else other_shape
    return KernelCall(op, (shape, other), (shape,), broadcast=other != shape)


def unary_call(op, shape) -> KernelCall:
    return KernelCall(op, (shape,), (shape,))


def matmul_call(m, k, n, transpose_y=False, dram=False) -> KernelCall:
    """x [m, k] times y [k, n] (transpose_y: y stored [n, k]); the two kernels sum in different
    orders, hence the looser tolerance."""
    y = (n, k) if transpose_y else (k, n)
    return KernelCall("matmul", ((m, k), y), ((m, n),), _attrs("matmul", transpose_x=0, transpose_y=transpose_y),
                      dram=dram, tolerance=(1e-4, 1e-4))


def matmul_flops(call: KernelCall) -> float:
    (m, k), (n,) = call.inputs[0], call.outputs[0][1:]
    return 2.0 * m * k * n


R, C = 4096, 4096
SMOL_T, SMOL_C = 512, 576  # SmolLM2-135M: a 512-token pack, hidden 576

# (case, call): the case names say the shape and whether the bytes come from DRAM
KERNEL_CASES = [
    (Case(f"codegen rms_norm fwd fp32 [{R},{C}] (DRAM)", "memory", rms_norm_call(R, C).bytes(),
          targets=(HANDWRITTEN_PEER,), note="bytes: read x, weight; write y, inv_rms"),
     rms_norm_call(R, C)),
    (Case(f"codegen rms_norm fwd fp32 [{SMOL_T},{SMOL_C}] SmolLM2 (in cache)", "memory",
          rms_norm_call(SMOL_T, SMOL_C, dram=False).bytes(), targets=(HANDWRITTEN_PEER,),
          note="one 1.2 MB input, cache-resident as in the model; share of copy bandwidth may exceed 100%"),
     rms_norm_call(SMOL_T, SMOL_C, dram=False)),
    (Case(f"codegen softmax last axis fp32 [{R},{C}] (DRAM)", "memory", softmax_call(R, C).bytes(),
          targets=(HANDWRITTEN_PEER,), note="bytes: read x; write out"),
     softmax_call(R, C)),
    (Case(f"codegen add fp32 [{R},{C}] + [{R},{C}] (DRAM)", "memory", binary_call("add", (R, C)).bytes(),
          targets=(RooflineShare(0.70),), note="bytes: read x, y; write out"),
     binary_call("add", (R, C))),
    (Case(f"codegen add fp32 [{R},{C}] + [{C}] broadcast (DRAM)", "memory",
          binary_call("add", (R, C), (C,)).bytes(), targets=(RooflineShare(0.70),),
          note="y broadcast over rows (stride 0 on dim 0); bytes: read x, y once; write out"),
     binary_call("add", (R, C), (C,))),
    (Case(f"codegen add fp32 [{R},{C}] + [{R},1] broadcast (DRAM)", "memory",
          binary_call("add", (R, C), (R, 1)).bytes(), targets=(RooflineShare(0.70),),
          note="y broadcast along each row (stride 0 on the last dim); bytes: read x, y once; write out"),
     binary_call("add", (R, C), (R, 1))),
    (Case(f"codegen exp fp32 [{R},{C}] (DRAM)", "memory", unary_call("exp", (R, C)).bytes(),
          targets=(RooflineShare(0.70),), note="bytes: read x; write out"),
     unary_call("exp", (R, C))),
    (Case(f"codegen multiply fp32 [{R},{C}] * [{R},{C}] (DRAM)", "memory", binary_call("multiply", (R, C)).bytes(),
          targets=(RooflineShare(0.70),), note="bytes: read x, y; write out"),
     binary_call("multiply", (R, C))),
    (Case(f"codegen matmul fp32 [{SMOL_T},{SMOL_C}] x [{SMOL_C},1536] SmolLM2 MLP (in cache)", "compute",
          matmul_flops(matmul_call(SMOL_T, SMOL_C, 1536)), peak="fp32", targets=(HANDWRITTEN_PEER,),
          note="FLOPs: 2*M*K*N"),
     matmul_call(SMOL_T, SMOL_C, 1536)),
    (Case(f"codegen matmul fp32 [1,{SMOL_C}] x [49152,{SMOL_C}]^T SmolLM2 tied LM head (DRAM)", "compute",
          matmul_flops(matmul_call(1, SMOL_C, 49152, True)), peak="fp32", targets=(HANDWRITTEN_PEER,),
          note="FLOPs: 2*M*K*N; y is the [vocab, hidden] embedding read transposed (transpose_y)"),
     matmul_call(1, SMOL_C, 49152, True, dram=True)),
]


def handwritten_kernel(op: str) -> NativeKernel:
    from anychip_plugins.host import LIBRARY

    return NativeKernel(str(LIBRARY), f"anychip_cpu_{op}")


def generated_kernel(library, op: str) -> NativeKernel:
    return library.load()[f"{op}.float32"]


class Streams:
    """The inputs of one call: ``count`` distinct copies handed out in turn (DRAM), and the one
    set of outputs every call writes."""

    def __init__(self, call: KernelCall, count: int, seed: int = 0):
        base = call.make_inputs(np.random.default_rng(seed))
        self.call = call
        self.sets = Cycle([call.views([a.copy() for a in base]) for _ in range(count)])
        self.outputs = call.make_outputs()

    def runner(self, kernel: NativeKernel):
        call, outputs, nxt = self.call, self.outputs, self.sets
        return lambda: kernel.run_host(nxt(), outputs, call.attrs, num_threads=THREADS)


def check_same_result(call: KernelCall, generated: NativeKernel, handwritten: NativeKernel, seed: int = 1) -> None:
    """Both kernels on one input set; raises AssertionError when their outputs differ."""
    inputs = call.views(call.make_inputs(np.random.default_rng(seed)))
    got, want = call.make_outputs(), call.make_outputs()
    generated.run_host(inputs, got, call.attrs, num_threads=THREADS)
    handwritten.run_host(inputs, want, call.attrs, num_threads=THREADS)
    for i, (g, w) in enumerate(zip(got, want)):
        np.testing.assert_allclose(g, w, rtol=call.tolerance[0], atol=call.tolerance[1],
                                   err_msg=f"{call.op}: output {i} of the generated kernel differs from the hand-written one")


# ---------------------------------------------------------------------------------------------
# Build: cold, cache hit, register


@contextlib.contextmanager
def codegen_cache(folder: Path):
    """ANYCHIP_CODEGEN_CACHE pointed at ``folder`` and tuning off, restored afterwards."""
    saved = {k: os.environ.get(k) for k in ("ANYCHIP_CODEGEN_CACHE", "ANYCHIP_CODEGEN_TUNE")}
    os.environ["ANYCHIP_CODEGEN_CACHE"] = str(folder)
    os.environ["ANYCHIP_CODEGEN_TUNE"] = "0"
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


@contextlib.contextmanager
def child_processes():
    """The argv of every child process started through ``subprocess`` (how CodeGen runs ninja
    and the compiler) inside the block."""
    seen: list[list[str]] = []
    real = subprocess.Popen

    class Spy(real):
        def __init__(self, args, *rest, **kwargs):
            seen.append([args] if isinstance(args, (str, bytes, os.PathLike)) else [str(a) for a in args])
            super().__init__(args, *rest, **kwargs)

    subprocess.Popen = Spy
    try:
        yield seen
    finally:
        subprocess.Popen = real


def compiles(children) -> list[list[str]]:
    """The child processes that built something: all but compiler version queries."""
    return [argv for argv in children if argv[-1:] != ["--version"]]


def snapshot(folder: Path) -> dict[str, int]:
    """path -> mtime_ns of every file under ``folder``."""
    return {str(p.relative_to(folder)): p.stat().st_mtime_ns for p in Path(folder).rglob("*") if p.is_file()}


def written_between(before: dict, after: dict) -> list[str]:
    """Files created or modified between two snapshots."""
    return sorted(p for p, t in after.items() if before.get(p) != t)


def npu_kernels():
    """The npu plugin's generated kernel set, for its dtypes."""
    from anychip_plugins.npu import TRAITS

    return cg.ops.library(TRAITS.dtypes)


def register_library(library) -> tuple[KernelRegistry, int]:
    """Registers ``library`` for the npu into a fresh registry and resolves every kernel's
    symbol (what the plugin's registration amounts to); returns the registry and the number of
    kernel objects."""
    registry = KernelRegistry()
    cg.register(registry, DEVICE, library)
    seen = set()
    for k in registry.kernels():
        for fn in (k.forward, k.backward):
            if isinstance(fn, NativeKernel) and fn.symbol not in seen:
                fn.address  # dlopen (once a process) and dlsym
                seen.add(fn.symbol)
    return registry, len(seen)


@dataclass
class BuildReport:
    """What building the npu kernel set cost, and the evidence that a cache hit compiled nothing."""

    kernels: int
    symbols: int
    cold_s: float
    cold_built: bool
    cold_foreign_load: float | None
    cold_children: list[str]  # the programs started (ninja; the compiler runs under it)
    hit_ms: list[float] = field(default_factory=list)
    hit_built: list[bool] = field(default_factory=list)
    hit_children: list[list[str]] = field(default_factory=list)
    hit_files_written: list[str] = field(default_factory=list)
    register_ms: list[float] = field(default_factory=list)
    fresh_process: dict | None = None

    def no_compiler_on_hits(self) -> tuple[bool, str]:
        fresh = self.fresh_process or {}
        built = [b for b in self.hit_built if b] + ([True] if fresh.get("built") else [])
        ran = compiles(self.hit_children) + compiles(fresh.get("children", []))
        files = self.hit_files_written + fresh.get("files_written", [])
        ok = bool(self.hit_built) and not built and not ran and not files
        why = (f"{len(self.hit_built)} hits in this process{' + 1 in a fresh one' if self.fresh_process else ''}: "
               f"built=True {len(built)}x, compiles {len(ran)}, cache files written {len(files)}")
        return ok, why

    def to_json(self) -> dict:
        ok, why = self.no_compiler_on_hits()
        d = asdict(self)
        d.update({"hit_ms_median": statistics.median(self.hit_ms) if self.hit_ms else None,
                  "register_ms_median": statistics.median(self.register_ms) if self.register_ms else None,
                  "no_compiler_on_hits": {"result": "PASS" if ok else "MISS", "evidence": why}})
        return d

    def lines(self) -> list[str]:
        ok, why = self.no_compiler_on_hits()
        load = "?" if self.cold_foreign_load is None else f"{self.cold_foreign_load:.0%}"
        out = [f"npu kernel set: {self.kernels} kernels, {self.symbols} kernel symbols (c backend, tuning off), "
               f"library {LIBRARY_NAME!r}",
               f"  cold build into an empty cache:  {self.cold_s:8.2f} s   (started: {', '.join(self.cold_children)}; "
               f"other load {load})"]
        if self.hit_ms:
            out.append(f"  cache hit, this process:         {statistics.median(self.hit_ms):8.2f} ms  (median of "
                       f"{len(self.hit_ms)}, min {min(self.hit_ms):.2f}; render + hash, library found)")
        if self.register_ms:
            out.append(f"  register + resolve symbols:      {statistics.median(self.register_ms):8.2f} ms  (median of "
                       f"{len(self.register_ms)}; the library is already loaded in this process)")
        if self.fresh_process:
            f = self.fresh_process
            out.append(f"  fresh process: cache hit {f['generate_ms']:.1f} ms + register (dlopen, dlsym) "
                       f"{f['register_ms']:.1f} ms = {f['generate_ms'] + f['register_ms']:.1f} ms; child processes: "
                       f"{', '.join(' '.join(a) for a in f['children']) or 'none'}")
        out.append(f"  target: a cache hit runs no compiler: {'PASS' if ok else 'MISS'} ({why})")
        return out


def cold_build(kernels, cache: Path) -> tuple[object, BuildReport]:
    """Builds ``kernels`` as ``npu_kernels`` into ``cache``, which must be empty."""
    cache.mkdir(parents=True, exist_ok=True)
    if any(cache.iterdir()):
        raise ValueError(f"cache: expected an empty folder for a cold build, {cache} has files")
    with codegen_cache(cache), child_processes() as children:
        meter, before = ForeignLoad().start(), os.times()
        t0 = time.perf_counter()
        library = cg.generate(LIBRARY_NAME, kernels, "c")
        seconds = time.perf_counter() - t0
        load, after = meter.stop(), os.times()
    if load is not None:  # ForeignLoad counts the compilers (our children) as foreign: take them out
        compilers = (after.children_user + after.children_system) - (before.children_user + before.children_system)
        load = max(0.0, load - compilers / (seconds * (os.cpu_count() or 1)))
    symbols = sum(len(k.dtypes) for k in kernels)
    started = [" ".join([Path(argv[0]).name, *argv[1:2]]) for argv in children]
    return library, BuildReport(len(kernels), symbols, seconds, library.built, load, started)


def cache_hits(kernels, cache: Path, report: BuildReport, rounds: int) -> None:
    """Times ``rounds`` cache hits of the same build; records what each reported, every child
    process and every cache file written meanwhile."""
    before = snapshot(cache)
    with codegen_cache(cache), child_processes() as children:
        for _ in range(rounds):
            t0 = time.perf_counter()
            library = cg.generate(LIBRARY_NAME, kernels, "c")
            report.hit_ms.append((time.perf_counter() - t0) * 1e3)
            report.hit_built.append(library.built)
    report.hit_children.extend(children)
    report.hit_files_written.extend(written_between(before, snapshot(cache)))


def registrations(library, report: BuildReport, rounds: int) -> None:
    for _ in range(rounds):
        t0 = time.perf_counter()
        register_library(library)
        report.register_ms.append((time.perf_counter() - t0) * 1e3)


def fresh_process_hit(cache: Path, timeout: float = 300) -> dict:
    """One cache hit and registration in a new Python process (what a plugin pays at startup),
    measured inside it after its imports."""
    env = dict(os.environ, ANYCHIP_CODEGEN_CACHE=str(cache), ANYCHIP_CODEGEN_TUNE="0")
    before = snapshot(cache)
    done = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--cache-hit"], env=env,
                          capture_output=True, text=True, timeout=timeout)
    if done.returncode != 0:
        raise RuntimeError(f"the fresh-process cache hit failed:\n{(done.stdout + done.stderr)[-3000:]}")
    result = json.loads(done.stdout.strip().splitlines()[-1])
    result["files_written"] = written_between(before, snapshot(cache))
    return result


def _cache_hit_main() -> None:
    """The fresh process's side of :func:`fresh_process_hit` (cache and tuning from the env)."""
    kernels = npu_kernels()
    with child_processes() as children:
        t0 = time.perf_counter()
        library = cg.generate(LIBRARY_NAME, kernels, "c")
        t1 = time.perf_counter()
        _registry, symbols = register_library(library)
        t2 = time.perf_counter()
    print(json.dumps({"generate_ms": (t1 - t0) * 1e3, "register_ms": (t2 - t1) * 1e3, "built": library.built,
                      "symbols": symbols, "children": children}))


# ---------------------------------------------------------------------------------------------
# The benchmarks


class BuildSection:
    """Prints the build figures in a terminal-summary section of their own and writes them next
    to summary.json (they are times of one-off steps, not rates against a roofline)."""

    name = "anychip-codegen-build"

    def __init__(self, report: BuildReport):
        self.report = report

    def pytest_terminal_summary(self, terminalreporter, config):
        tr = terminalreporter
        tr.section("anychip CodeGen: building the npu kernel set")
        for line in self.report.lines():
            tr.write_line(line)
        out = Path(config.getoption("--bench-out")) / "codegen_build.json"
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(self.report.to_json(), indent=2) + "\n")
        tr.write_line(f"written: {out}")


@pytest.fixture(scope="module")
def built(request, tmp_path_factory):
    """The npu kernel set, cold-built into an empty temporary cache (timed), and its report."""
    cache = tmp_path_factory.mktemp("codegen-cache")
    kernels = npu_kernels()
    library, report = cold_build(kernels, cache)
    request.config.pluginmanager.register(BuildSection(report), BuildSection.name)
    return kernels, library, report, cache


def test_build_cold(built):
    _kernels, library, report, _cache = built
    assert library.built and report.cold_built, "the first build into an empty cache must compile"


def test_build_cache_hit(benchmark, built):
    kernels, _library, report, cache = built
    before = snapshot(cache)
    with codegen_cache(cache), child_processes() as children:
        # pytest-benchmark's record of the hit (what each reported is kept; the report's times
        # come from cache_hits below)
        benchmark.pedantic(lambda: report.hit_built.append(cg.generate(LIBRARY_NAME, kernels, "c").built),
                           rounds=20, warmup_rounds=1)
    report.hit_children.extend(children)
    report.hit_files_written.extend(written_between(before, snapshot(cache)))
    cache_hits(kernels, cache, report, rounds=50)
    report.fresh_process = fresh_process_hit(cache)
    benchmark.extra_info.update(report.to_json())
    ok, why = report.no_compiler_on_hits()
    assert ok, f"a cache hit compiled: {why}; children {report.hit_children}, files {report.hit_files_written}"


def test_build_register(benchmark, built):
    _kernels, library, report, _cache = built
    benchmark.pedantic(lambda: register_library(library), rounds=20, warmup_rounds=1)
    registrations(library, report, rounds=50)
    registry, symbols = register_library(library)
    assert symbols == report.symbols and registry.count(DEVICE) > 0


@pytest.fixture(scope="module")
def streams():
    """The inputs of the case being measured, shared by its implementations (the same inputs),
    dropped when the next case starts (hundreds of MB each) and at the end."""
    held: dict = {}

    def get(case: Case, call: KernelCall) -> Streams:
        if case.name not in held:
            held.clear()
            held[case.name] = Streams(call, stream_count(call.bytes()) if call.dram else 1)
        return held[case.name]

    yield get
    held.clear()


@pytest.mark.parametrize(("case", "call", "impl"),
                         [(case, call, impl) for case, call in KERNEL_CASES for impl in ("anychip", PEER)],
                         ids=[f"{call.op}-{i}-{impl}" for i, (_case, call) in enumerate(KERNEL_CASES)
                              for impl in ("anychip", PEER)])
def test_kernel(benchmark, bench, built, streams, case, call, impl):
    _kernels, library, _report, _cache = built
    generated, handwritten = generated_kernel(library, call.op), handwritten_kernel(call.op)
    if impl == "anychip":
        check_same_result(call, generated, handwritten)
    kernel = generated if impl == "anychip" else handwritten
    label = (SUBJECT_LABEL if impl == "anychip" else PEER_LABEL).format(op=call.op)
    inputs = streams(case, call)
    bench.run(benchmark, case, impl, inputs.runner(kernel), label=label,
              max_rounds=100 if call.dram else 2000,
              notes=f"{THREADS} threads, run_host on numpy buffers, {len(inputs.sets.items)} input set(s)")


if __name__ == "__main__" and sys.argv[1:] == ["--cache-hit"]:
    _cache_hit_main()
