"""``anychip bench``: anychip's kernels on each device against the op's reference and host peers,
rated against the host roofline measured in the run; ``anychip bench compare A.json B.json``:
regressions between two runs."""

from __future__ import annotations

import argparse
import os
import shlex
import sys
import time
from pathlib import Path

from .cases import DTYPES, OPS, PRESETS, SUBJECT, Unavailable

DEFAULT_OUT = Path(".benchmarks/anychip-bench")
SLOW_CALL_S = 0.25  # past this, one warm-up call is enough

EXAMPLES = """\
examples:
  anychip bench                                      # every op on the host CPU, SmolLM2 shapes
  anychip bench --devices cpu,npu --ops rms_norm,attention --shapes llama-7b --dtype bfloat16
  anychip bench compare before/bench.json after/bench.json --threshold 0.1
  anychip bench collectives --nproc 2 --device npu      # all_reduce etc. bandwidth, nccl-tests style

Each case runs anychip's op on every device, the op's reference (plain Paddle) and the peers
(Paddle's own op, PyTorch) on the host. Simulated devices (anychip's simulator on the host CPU)
are labelled "simulated (host speed)": their times are the host's, not the chip's.
Writes bench.json, bench.md, <op>.png (median ms per device and implementation) and
roofline.png (achieved GFLOP/s against arithmetic intensity) to --out.
"""


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text}")
    return value


def _non_negative(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, got {text}")
    return value


def _fraction(text: str) -> float:
    value = float(text)
    if not 0 <= value < 10:
        raise argparse.ArgumentTypeError(f"must be a fraction like 0.1 (10%), got {text}")
    return value


def add_parser(sub, common):
    p = sub.add_parser(
        "bench", parents=[common], help="benchmark anychip's kernels on devices against references and peers",
        usage="anychip bench [--devices DEV,...] [--ops OP,...] [--shapes PRESET] [--dtype DTYPE] [options]\n"
              "       anychip bench compare A.json B.json [--threshold F]\n"
              "       anychip bench collectives [--nproc N] [--device DEV] [--sizes 4K,...] [--out DIR]",
        formatter_class=argparse.RawDescriptionHelpFormatter, epilog=EXAMPLES,
        description="Time anychip's ops on each device (median of the timed calls, the device synchronized\n"
                    "around each), with GB/s or TFLOP/s, the share of the host's roofline measured in this\n"
                    "run, and the speedup over the op's reference and over each peer.")
    p.add_argument("--devices", metavar="DEV[,DEV...]",
                   help="devices to benchmark, e.g. cpu,npu,xpu (default: --device, else cpu)")
    p.add_argument("--ops", metavar="OP[,OP...]", default=",".join(OPS),
                   help=f"ops to benchmark (default: all of {','.join(OPS)})")
    p.add_argument("--shapes", choices=list(PRESETS), default="smollm2",
                   help="shape preset: " + "; ".join(f"{p.name} = {p.describe()}" for p in PRESETS.values())
                        + " (default: smollm2)")
    p.add_argument("--dtype", choices=DTYPES, default="float32", help="element type (default: float32)")
    p.add_argument("--repeats", type=_positive, default=10, metavar="N",
                   help="timed calls per implementation (default 10; fewer, at least 3, for one slower "
                        "than --budget allows)")
    p.add_argument("--warmup", type=_non_negative, default=2, metavar="N",
                   help="untimed calls before timing (default 2; 1 for a call over 0.25 s)")
    p.add_argument("--budget", type=float, default=2.0, metavar="S",
                   help="seconds of timed calls per implementation before --repeats is cut (default 2)")
    p.add_argument("--copy-mb", type=_positive, metavar="MB",
                   help="size of the roofline's copy buffers (default: max(256, 2 x the last-level cache), "
                        "so the copy cannot run from the cache)")
    p.add_argument("--no-torch", action="store_true", help="leave out the PyTorch peers")
    p.add_argument("--out", type=Path, default=DEFAULT_OUT, metavar="DIR",
                   help=f"where bench.json, bench.md and the PNGs go (default: {DEFAULT_OUT})")
    sub_bench = p.add_subparsers(dest="bench_command", title="subcommand")
    c = sub_bench.add_parser(
        "compare", help="compare two bench.json files and flag regressions", prog="anychip bench compare",
        usage="anychip bench compare A.json B.json [--threshold F]",
        description="Compare anychip's median times per case and device in two bench.json files (A before, "
                    "B after); exit 1 if any case is slower in B than (1 + threshold) x A.")
    c.add_argument("a", type=Path, metavar="A.json", help="the baseline run's bench.json")
    c.add_argument("b", type=Path, metavar="B.json", help="the run to check")
    c.add_argument("--threshold", type=_fraction, default=0.1, metavar="F",
                   help="allowed slowdown as a fraction (default 0.1: B may take up to 1.1 x A's time)")
    k = sub_bench.add_parser(
        "collectives", parents=[common], help="collectives bandwidth across N processes (nccl-tests style)",
        prog="anychip bench collectives",
        usage="anychip bench collectives [--nproc N] [--device DEV] [--sizes 4K,...] [--iters N] [--out DIR]",
        description="Start N processes (one rank each, device r of the chip) and time all_reduce, all_gather, "
                    "reduce_scatter and broadcast (float32) per message size: time, algbw, busbw, beside the "
                    "host copy bandwidth of the same size; see bench/bench_collectives.py and bench/README.md.")
    k.add_argument("--nproc", type=_positive, default=2, metavar="N", help="ranks, one process each (default 2)")
    k.add_argument("--sizes", metavar="SIZE[,SIZE...]",
                   help="message sizes in bytes or with K/M/G (KiB, MiB, GiB) (default: 4K..64M in powers of 4)")
    k.add_argument("--iters", type=_positive, metavar="N",
                   help="timed calls per size (default: about 512 MiB moved, 5 to 100 calls)")
    k.add_argument("--out", dest="collectives_out", type=Path, default=DEFAULT_OUT / "collectives", metavar="DIR",
                   help=f"where collectives.json, collectives.md and collectives.png go "
                        f"(default: {DEFAULT_OUT / 'collectives'}); --device defaults to npu here")


def run(args) -> int:
    if args.bench_command == "compare":
        return _compare(args)
    if args.bench_command == "collectives":
        from .bench_collectives import run_cli

        return run_cli(args)
    return _bench(args)


def _compare(args) -> int:
    from . import report

    a, b = report.load(args.a), report.load(args.b)
    lines, regressions = report.compare(a, b, args.threshold)
    print("\n".join(lines))
    return 1 if regressions else 0


# ---------------------------------------------------------------------------------------------
# The benchmark run


def _bench(args) -> int:
    # The simulated-memory guard (a debugging aid) would slow every device call, and trips on
    # Paddle's CPU fallbacks writing device memory; it must be off before a device opens.
    os.environ.pop("ANYCHIP_SIM_CHECK", None)
    from . import benchlib, report
    from .cases import build_cases, measurements, resolve_devices

    ops = [o.strip() for o in args.ops.split(",") if o.strip()]
    if not ops:
        raise ValueError(f"--ops: expected a comma-separated list of {', '.join(OPS)}, got {args.ops!r}")
    try:
        cases = build_cases(args.shapes, args.dtype, ops, torch=not args.no_torch)
    except ValueError as exc:
        raise ValueError(f"--{exc}") from None
    targets = resolve_devices(args.devices or args.device or "cpu")

    from anychip.host_threads import num_threads
    from anychip.frontends.paddle import import_paddle
    from anychip.plugins import registry

    pd = import_paddle()
    # The same lookup as the op's dispatch: without a kernel, the op runs its reference.
    kernels = registry().kernels
    threads = num_threads()
    roofline = _measure_roofline(benchlib, threads, args.copy_mb)
    collectors = {t.key: benchlib.Collector(roofline if (t.host or t.simulated) else None) for t in targets}
    listed, unavailable = {}, {}
    plan = [(case, m) for case in cases for m in measurements(case, targets)]

    from tqdm import tqdm

    run_load = benchlib.ForeignLoad().start()
    with pd.no_grad(), tqdm(plan, desc="anychip bench", unit="run", file=sys.stderr, dynamic_ncols=True) as bar:
        for case, m in bar:
            where = ":".join(map(str, m.device)).removesuffix(":0")
            bar.set_postfix_str(f"{case.short} on {where}: {m.impl.name}", refresh=True)
            try:
                once = case.prepare(m.impl, m.device)
            except Unavailable as exc:
                unavailable[(case.name, m.impl.name)] = f"on {where}: {exc}"
                continue
            meter = benchlib.ForeignLoad().start()
            samples = _time(once, args.repeats, args.warmup, args.budget)
            foreign = meter.stop()
            del once  # its input copies
            fell = m.impl.role == SUBJECT and kernels.find(case.op, m.device[0], case.dtype) is None
            for target in m.targets:
                label = m.label(target) + (f" [FALLBACK to reference: no {m.device[0]} kernel]" if fell else "")
                amount = None if m.impl.bytes is None or case.bound != "memory" else m.impl.bytes
                collectors[target.key].record(case.harness_case(), m.impl.name, samples, label=label,
                                              foreign_load=foreign, amount=amount)
                listed[(case.name, m.impl.name, target.key)] = (where, m.impl.role, label, fell)

    settings = {
        "command": "anychip " + " ".join(shlex.quote(a) for a in sys.argv[1:]),
        "shapes": args.shapes, "preset": PRESETS[args.shapes].describe(), "dtype": args.dtype, "ops": ops,
        "repeats": args.repeats, "warmup": args.warmup, "budget_s": args.budget, "threads": threads,
        "torch": "off (--no-torch)" if args.no_torch else _torch_version(),
        "paddle": pd.__version__, "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "foreign_cpu_load": run_load.stop(),
    }
    doc = report.document(cases, targets, collectors, listed, unavailable, roofline, settings,
                          benchlib.machine_info())
    out = args.out
    json_path = report.write_json(doc, out / "bench.json")
    charts = report.write_charts(doc, out)
    md_path = report.write_markdown(doc, out / "bench.md", charts)

    print("\n".join(report.header_lines(doc)))
    print()
    print(report.format_table(doc))
    for (name, impl), why in unavailable.items():
        print(f"not measured: {name}: {impl} {why}")
    written = [json_path, md_path, *charts.values()]
    print(f"written: {', '.join(str(p) for p in written)}")
    if not charts:
        print("no charts: matplotlib is not installed")
    failed = [(n, i) for (n, i) in unavailable if i == SUBJECT]
    if failed:
        print(f"anychip bench: anychip's op failed in {len(failed)} case(s); see 'not measured' above",
              file=sys.stderr)
        return 1
    return 0


def _measure_roofline(benchlib, threads: int, copy_mb: int | None):
    """The host's copy and read bandwidth (buffers beyond the last-level cache) and compute roofs."""
    mb = copy_mb or max(256, 2 * -(-benchlib.l3_bytes() // 2**20))
    print(f"measuring the host roofline ({threads} threads, {mb} MB buffers) ...", file=sys.stderr)
    return benchlib.measure_roofline(mb * 2**20, threads)


def _time(once, repeats: int, warmup: int, budget_s: float) -> list[float]:
    """Seconds of each timed call: ``warmup`` untimed calls (one if a call is slow), then up to
    ``repeats`` (at least 3, or ``repeats`` if fewer) that fit ``budget_s`` at the warm-up's pace."""
    from . import benchlib

    estimate = 0.0
    for _ in range(warmup):
        t0 = time.perf_counter()
        once()
        estimate = time.perf_counter() - t0
        if estimate > SLOW_CALL_S:
            break
    rounds = benchlib.plan_rounds(estimate, budget_s, min_rounds=min(3, repeats), max_rounds=repeats)
    return benchlib.time_calls(once, rounds, warmup=0)


def _torch_version() -> str:
    torch = sys.modules.get("torch")
    return f"torch {torch.__version__}, in this process" if torch else "not used"
