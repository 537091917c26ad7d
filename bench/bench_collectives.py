"""Collectives bandwidth, as nccl-tests reports it: ``anychip bench collectives --nproc 2``.

N processes, one rank each (device r of the chip; a simulated chip gets ANYCHIP_SIM_DEVICES=N
there), time all_reduce (sum), all_gather, reduce_scatter (sum) and broadcast (root 0) on
float32 per message size, 4 KiB to 64 MiB in powers of 4 by default. Per size and collective:
two warm-up calls (their results checked), a barrier, then ``iters`` calls enqueued back to back
and one synchronize; a rank's time is the mean per call, and the reported time the slowest
rank's. Sizes are nccl-tests': all_reduce and broadcast move ``size`` bytes per rank,
all_gather's ``size`` is the gathered result (each rank sends size / N), reduce_scatter's the
input of each rank (each receives size / N).

    algbw = size / time
    busbw = algbw * 2(N-1)/N (all_reduce), * (N-1)/N (all_gather, reduce_scatter), * 1 (broadcast)

Beside each size, the host memory copy bandwidth of the same size (``np.copyto``, i.e. glibc
memcpy, measured in the same run in every rank process at once, between the same barriers, the
slowest rank's mean): the roofline of a shared-memory simulator, whose collectives are host
memcpys and reductions running in every rank at once. (Rank 0's copy alone, the others idle,
is in the JSON as ``copy_alone_gbps``, for reference.) ``share`` = busbw / copy bandwidth.
Target (reported, never asserted): all_reduce on 2 processes reaches >= 50% of the copy
bandwidth for every size >= 16 MiB.

Writes collectives.json, collectives.md and collectives.png (busbw and copy bandwidth against
message size, log x) to --out. A simulated device is labelled "simulated (host speed)" in every
table heading, the plot's title and every plotted line: its times are the host's.
Under pytest-benchmark (``python -m pytest bench/bench_collectives.py``): one case, 2 ranks,
the default sizes, on ANYCHIP_BENCH_DEVICE (default npu); outputs in <--bench-out>/collectives.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "broadcast")
DEFAULT_SIZES = tuple(4096 * 4 ** k for k in range(8))  # 4 KiB .. 64 MiB
SIMULATED = "simulated (host speed)"
TARGET = {"collective": "all_reduce", "nproc": 2, "min_bytes": 16 << 20, "share": 0.5}
WARMUP = 2
RESULT_MARK = "ANYCHIP-BENCH-COLLECTIVES "
ELEMENT = 4  # float32


def bus_factor(collective: str, n: int) -> float:
    return {"all_reduce": 2 * (n - 1) / n, "all_gather": (n - 1) / n, "reduce_scatter": (n - 1) / n,
            "broadcast": 1.0}[collective]


def iterations(nbytes: int) -> int:
    """Timed calls per size: about 512 MiB moved, 5 to 100 calls (the same on every rank)."""
    return max(5, min(100, (512 << 20) // max(nbytes, 1)))


def parse_sizes(text: str | None) -> tuple[int, ...]:
    """"4K,1M,64M" (KiB, MiB, GiB) or bytes -> sizes in bytes."""
    if not text:
        return DEFAULT_SIZES
    sizes = []
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(part[-1].upper(), 1)
        digits = part[:-1] if part[-1].isalpha() else part
        if not digits.isdigit() or int(digits) <= 0 or (part[-1].isalpha() and mult == 1):
            raise ValueError(f"--sizes: expected sizes like 4K,1M,64M (or bytes), got {part!r}")
        sizes.append(int(digits) * mult)
    if not sizes:
        raise ValueError(f"--sizes: expected sizes like 4K,1M,64M, got {text!r}")
    return tuple(sorted(set(sizes)))


def human(nbytes: float) -> str:
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if nbytes >= size:
            value = nbytes / size
            return f"{value:g} {unit}" if value == int(value) else f"{value:.1f} {unit}"
    return f"{int(nbytes)} B"


def counts_for(collective: str, nbytes: int, n: int) -> tuple[int, int]:
    """(count passed to the call, bytes the size stands for: nccl-tests' size of that count)."""
    if collective in ("all_gather", "reduce_scatter"):
        count = max(1, nbytes // (n * ELEMENT))
        return count, count * n * ELEMENT
    count = max(1, nbytes // ELEMENT)
    return count, count * ELEMENT


# ---- one rank ------------------------------------------------------------------------------------

def _rank_main(spec_json: str) -> int:
    """A rank in its own process: times every size and prints its figures as one JSON line."""
    import anychip.runtime as rt
    from anychip.runtime.collectives import Communicator

    spec = json.loads(spec_json)
    rank, n = spec["rank"], spec["nproc"]
    dev = rt.open_device(f"{spec['chip']}:{spec['index']}")
    comm = Communicator.init(dev, bytes.fromhex(spec["uid"]), rank, n)
    stream = dev.stream()
    token = dev.upload(np.zeros(1, np.float32))

    def barrier():
        comm.all_reduce(token.ptr, token.ptr, 1, "float32", "sum", stream)
        stream.synchronize()

    rows, copies = [], []
    for nbytes in spec["sizes"]:
        iters = spec.get("iters") or iterations(nbytes)
        # the host copy of the same size, in every rank at once
        src = np.ones(nbytes, np.uint8)
        dst = np.zeros(nbytes, np.uint8)
        for _ in range(WARMUP):
            np.copyto(dst, src)
        barrier()
        t0 = time.perf_counter()
        for _ in range(iters):
            np.copyto(dst, src)
        concurrent = (time.perf_counter() - t0) / iters
        barrier()
        alone = None
        if rank == 0:  # and rank 0 alone, for reference (the others wait at the barrier)
            t0 = time.perf_counter()
            for _ in range(iters):
                np.copyto(dst, src)
            alone = (time.perf_counter() - t0) / iters
        barrier()
        copies.append({"bytes": nbytes, "time_s": concurrent, "alone_s": alone, "iters": iters})
        del src, dst
        for collective in COLLECTIVES:
            count, size = counts_for(collective, nbytes, n)
            send_elems = count * n if collective == "reduce_scatter" else count
            recv_elems = count * n if collective == "all_gather" else count
            send = dev.upload(np.full(send_elems, rank + 1, np.float32))
            recv = dev.allocate(recv_elems * ELEMENT)

            def call():
                if collective == "all_reduce":
                    comm.all_reduce(send.ptr, recv.ptr, count, "float32", "sum", stream)
                elif collective == "all_gather":
                    comm.all_gather(send.ptr, recv.ptr, count, "float32", stream)
                elif collective == "reduce_scatter":
                    comm.reduce_scatter(send.ptr, recv.ptr, count, "float32", "sum", stream)
                else:
                    comm.broadcast(send.ptr, recv.ptr, count, "float32", 0, stream)

            for _ in range(WARMUP):
                call()
            stream.synchronize()
            got = recv.to_numpy(np.float32)
            total = n * (n + 1) / 2
            want = {"all_reduce": np.full(count, total, np.float32),
                    "reduce_scatter": np.full(count, total, np.float32),
                    "broadcast": np.ones(count, np.float32),
                    "all_gather": np.repeat(np.arange(1, n + 1, dtype=np.float32), count)}[collective]
            ok = bool(np.array_equal(got, want))
            barrier()
            t0 = time.perf_counter()
            for _ in range(iters):
                call()
            stream.synchronize()
            rows.append({"collective": collective, "bytes": size, "count": count, "iters": iters,
                         "time_s": (time.perf_counter() - t0) / iters, "ok": ok})
            send.free()
            recv.free()
    comm.destroy()
    print(RESULT_MARK + json.dumps({"rank": rank, "rows": rows, "copies": copies}), flush=True)
    return 0


# ---- the run ---------------------------------------------------------------------------------------

def measure(chip: str, nproc: int, sizes, iters: int | None = None, timeout_s: float = 1800) -> dict:
    """Starts ``nproc`` rank processes and returns the run's document (see ``table``)."""
    os.environ.pop("ANYCHIP_SIM_CHECK", None)  # the memory guard would slow every copy
    import anychip.runtime as rt
    from anychip.devices import describe
    from anychip.runtime.collectives import require_collectives, unique_id

    dev = rt.open_device(f"{chip}:0")
    require_collectives(dev.runtime)
    info = describe(chip)
    simulated = info.status == "simulated"
    count = dev.runtime.device_count
    env = dict(os.environ)
    if simulated:
        env["ANYCHIP_SIM_DEVICES"] = str(max(nproc, count))
        count = max(nproc, count)
    uid = unique_id(dev)
    code = ("import sys; from anychip_bench.bench_collectives import _rank_main; "
            "sys.exit(_rank_main(sys.argv[1]))")
    start = time.perf_counter()
    procs = []
    for r in range(nproc):
        spec = {"chip": chip, "index": r % count, "uid": uid.hex(), "rank": r, "nproc": nproc,
                "sizes": list(sizes), "iters": iters}
        procs.append(subprocess.Popen([sys.executable, "-c", code, json.dumps(spec)], stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, text=True, env=env))
    ranks = []
    for r, p in enumerate(procs):
        try:
            text, _ = p.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            raise RuntimeError(f"rank {r} did not finish within {timeout_s:g} s") from None
        lines = [ln for ln in text.splitlines() if ln.startswith(RESULT_MARK)]
        if p.returncode != 0 or not lines:
            for q in procs:
                q.kill()
            raise RuntimeError(f"rank {r} exited {p.returncode} without its figures:\n{text[-3000:]}")
        ranks.append(json.loads(lines[-1][len(RESULT_MARK):]))
    wall = time.perf_counter() - start
    return document(chip, nproc, simulated, info, ranks, wall)


def document(chip, nproc, simulated, info, ranks, wall_s) -> dict:
    label = f"{chip}, {SIMULATED}" if simulated else chip
    copy, alone = {}, {}
    for c in (c for rank in ranks for c in rank["copies"]):
        copy[c["bytes"]] = max(copy.get(c["bytes"], 0.0), c["time_s"])
        if c.get("alone_s"):
            alone[c["bytes"]] = c["alone_s"]
    rows = []
    for i, row in enumerate(ranks[0]["rows"]):
        peers = [rank["rows"][i] for rank in ranks]
        t = max(p["time_s"] for p in peers)
        nbytes = row["bytes"]
        requested = next(b for b in sorted(copy) if b >= nbytes) if any(b >= nbytes for b in copy) else max(copy)
        algbw = nbytes / t / 1e9
        busbw = algbw * bus_factor(row["collective"], nproc)
        copy_gbps = requested / copy[requested] / 1e9
        rows.append({"collective": row["collective"], "bytes": nbytes, "count": row["count"], "iters": row["iters"],
                     "time_us": t * 1e6, "algbw_gbps": algbw, "busbw_gbps": busbw, "copy_gbps": copy_gbps,
                     "share_of_copy": busbw / copy_gbps, "ok": all(p["ok"] for p in peers),
                     "device_label": label})
    from anychip_bench.benchlib import cpu_model

    return {
        "format": "anychip-bench-collectives/1",
        "device": chip, "device_label": label, "simulated": simulated,
        "description": info.description + (f" ({info.model})" if getattr(info, "model", "") else ""),
        "nproc": nproc, "dtype": "float32", "op": "sum", "broadcast_root": 0,
        "ranks": "processes, rank r on device r",
        "cpu": cpu_model(), "logical_cpus": os.cpu_count(),
        "command": "anychip " + " ".join(shlex.quote(a) for a in sys.argv[1:]),
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "wall_s": wall_s,
        "copy": [{"bytes": b, "copy_gbps": b / t / 1e9,
                  "copy_alone_gbps": b / alone[b] / 1e9 if b in alone else None} for b, t in sorted(copy.items())],
        "rows": rows,
        "target": verdict(rows, nproc, label),
    }


def verdict(rows, nproc: int, label: str) -> dict:
    """The issue's target against the measured rows: PASS, MISS or n/a, with the figures."""
    want = TARGET
    text = (f"all_reduce busbw >= {want['share']:.0%} of the host copy bandwidth for messages >= "
            f"{human(want['min_bytes'])} on {want['nproc']} processes")
    if nproc != want["nproc"]:
        return {"target": text, "result": "n/a", "detail": f"this run has {nproc} processes", "device_label": label}
    big = [r for r in rows if r["collective"] == want["collective"] and r["bytes"] >= want["min_bytes"]]
    if not big:
        return {"target": text, "result": "n/a", "detail": f"no size >= {human(want['min_bytes'])} in this run",
                "device_label": label}
    worst = min(big, key=lambda r: r["share_of_copy"])
    result = "PASS" if worst["share_of_copy"] >= want["share"] else "MISS"
    figures = ", ".join(f"{human(r['bytes'])}: {r['busbw_gbps']:.2f} of {r['copy_gbps']:.2f} GB/s = "
                        f"{r['share_of_copy']:.0%}" for r in big)
    detail = figures
    if result == "MISS":
        detail += (f"; short by {want['share'] - worst['share_of_copy']:.0%} of the copy bandwidth "
                   f"({want['share'] / worst['share_of_copy']:.2f}x the busbw needed at {human(worst['bytes'])})")
    return {"target": text, "result": result, "detail": detail, "device_label": label}


# ---- the outputs -----------------------------------------------------------------------------------

HEAD = ("size", "count", "time (us)", "algbw (GB/s)", "busbw (GB/s)", "copy (GB/s)", "busbw/copy", "check")


def _cells(row) -> list[str]:
    return [human(row["bytes"]), str(row["count"]), f"{row['time_us']:.1f}", f"{row['algbw_gbps']:.2f}",
            f"{row['busbw_gbps']:.2f}", f"{row['copy_gbps']:.2f}", f"{row['share_of_copy']:.0%}",
            "ok" if row["ok"] else "WRONG"]


def header_lines(doc) -> list[str]:
    return [f"anychip bench collectives: {doc['device_label']}: {doc['nproc']} ranks as processes, float32, sum; "
            f"{doc['description']}",
            f"host: {doc['cpu']}, {doc['logical_cpus']} logical CPUs; copy = np.copyto of the same size in every "
            f"rank at once (the roofline of a shared-memory simulator)"]


def target_line(doc) -> str:
    t = doc["target"]
    return f"target [{t['device_label']}]: {t['target']}: {t['result']} ({t['detail']})"


def table(doc) -> str:
    """The printed table: one block per collective, nccl-tests' columns plus the copy roofline."""
    lines = header_lines(doc) + [""]
    for collective in COLLECTIVES:
        rows = [r for r in doc["rows"] if r["collective"] == collective]
        if not rows:
            continue
        cells = [list(HEAD)] + [_cells(r) for r in rows]
        widths = [max(len(c[i]) for c in cells) for i in range(len(HEAD))]
        lines.append(f"{collective} on {doc['device_label']} (busbw = algbw x "
                     f"{bus_factor(collective, doc['nproc']):g})")
        for c in cells:
            lines.append("  " + "  ".join(x.rjust(w) for x, w in zip(c, widths)))
        lines.append("")
    lines.append(target_line(doc))
    return "\n".join(lines)


def markdown(doc, png: Path | None) -> str:
    out = [f"# anychip bench collectives: {doc['device_label']}", "",
           *(f"- {line}" for line in header_lines(doc)), f"- command: `{doc['command']}`", ""]
    for collective in COLLECTIVES:
        rows = [r for r in doc["rows"] if r["collective"] == collective]
        if not rows:
            continue
        out += [f"## {collective} on {doc['device_label']}", "", "| " + " | ".join(HEAD) + " |",
                "|" + "---:|" * len(HEAD)]
        out += ["| " + " | ".join(_cells(r)) + " |" for r in rows]
        out.append("")
    out += [f"**{target_line(doc)}**", ""]
    if png is not None:
        out += [f"![busbw and copy bandwidth]({png.name})", ""]
    return "\n".join(out)


def plot(doc, path: Path) -> Path | None:
    try:
        import matplotlib
    except ImportError:
        return None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5))
    for collective in COLLECTIVES:
        rows = [r for r in doc["rows"] if r["collective"] == collective]
        if rows:
            ax.plot([r["bytes"] for r in rows], [r["busbw_gbps"] for r in rows], marker="o",
                    label=f"{collective} busbw, {doc['device_label']}")
    ax.plot([c["bytes"] for c in doc["copy"]], [c["copy_gbps"] for c in doc["copy"]], "k--", marker="s",
            label="host memcpy of the same size, every rank at once (roofline)")
    ax.set_xscale("log", base=2)
    ax.set_xticks([c["bytes"] for c in doc["copy"]], [human(c["bytes"]) for c in doc["copy"]], rotation=45)
    ax.set_xlabel("message size")
    ax.set_yscale("log")
    ax.set_ylabel("GB/s (log)")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    ax.set_title(f"anychip collectives on {doc['device_label']}: {doc['nproc']} ranks, bus bandwidth vs host copy",
                 fontsize=10)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110, metadata={"Title": f"anychip collectives on {doc['device_label']}"})
    plt.close(fig)
    return path


def write(doc, out: Path) -> list[Path]:
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    json_path = out / "collectives.json"
    json_path.write_text(json.dumps(doc, indent=2) + "\n")
    png = plot(doc, out / "collectives.png")
    md_path = out / "collectives.md"
    md_path.write_text(markdown(doc, png))
    return [p for p in (json_path, md_path, png) if p is not None]


def run_cli(args) -> int:
    """``anychip bench collectives`` (bench/cli.py's parser)."""
    chip = (args.device or "npu").split(":")[0]
    sizes = parse_sizes(args.sizes)
    print(f"anychip bench collectives: {args.nproc} ranks of {chip}, {len(sizes)} sizes "
          f"({human(sizes[0])} .. {human(sizes[-1])}) ...", file=sys.stderr, flush=True)
    doc = measure(chip, args.nproc, sizes, iters=args.iters)
    written = write(doc, args.collectives_out)
    print(table(doc))
    print(f"written: {', '.join(map(str, written))}")
    if len(written) < 3:
        print("no plot: matplotlib is not installed")
    wrong = [r for r in doc["rows"] if not r["ok"]]
    if wrong:
        print(f"anychip bench collectives: {len(wrong)} result(s) were wrong (check column)", file=sys.stderr)
        return 1
    return 0


# ---- pytest-benchmark (python -m pytest bench/bench_collectives.py) --------------------------------

def test_collectives_bandwidth(benchmark, request):
    chip = os.environ.get("ANYCHIP_BENCH_DEVICE", "npu")
    doc = benchmark.pedantic(measure, args=(chip, 2, DEFAULT_SIZES), rounds=1, iterations=1, warmup_rounds=0)
    out = Path(request.config.getoption("--bench-out", default=".benchmarks/anychip")) / "collectives"
    write(doc, out)
    benchmark.group = f"anychip collectives: {doc['device_label']}, 2 ranks"
    benchmark.extra_info.update({"device": doc["device_label"], "target": doc["target"],
                                 "rows": [{k: r[k] for k in ("collective", "bytes", "time_us", "busbw_gbps",
                                                             "copy_gbps", "share_of_copy")} for r in doc["rows"]]})
    print("\n" + table(doc))
    assert all(r["ok"] for r in doc["rows"]), [r for r in doc["rows"] if not r["ok"]]
