"""What ``anychip bench`` writes and ``anychip bench compare`` reads: the results document
(bench.json), its tables (terminal, Markdown), the charts (one grouped bar chart per op, one
roofline chart), and the comparison of two runs.

The document has one record per (case, device, implementation); a host peer measured once is
listed under every device, with the speedup against that device's anychip time. Every record
of a simulated device carries the label "simulated (host speed)".
"""

from __future__ import annotations

import json
from pathlib import Path

from . import benchlib
from .cases import SIMULATED, SUBJECT

FORMAT = "anychip-bench/1"
COLORS = {"anychip": "#2a9d8f", "reference": "#8d99ae"}
DEVICE_COLORS = ["#2a9d8f", "#e76f51", "#6d597a", "#457b9d", "#e9c46a", "#264653"]
PEER_COLORS = ["#e76f51", "#457b9d", "#f4a261", "#6d597a", "#e9c46a", "#264653"]


# ---------------------------------------------------------------------------------------------
# The document


def declared_peak(case, target) -> tuple[float | None, str]:
    """A hardware device's peak for ``case`` in the case's unit, as its plugin declares it."""
    key = "memory_gbps" if case.bound == "memory" else f"{case.dtype}_tflops"
    peak = dict(target.peaks).get(key)
    if peak is None:
        return None, "no declared peak"
    unit = "GB/s" if case.bound == "memory" else "TFLOP/s"
    return float(peak), f"declared peak {peak:g} {unit} ({key}, from the plugin; not measured)"


def roofline_basis(case, target, roofline) -> str:
    """What a share on ``target`` is a share of."""
    if not (target.host or target.simulated):
        return declared_peak(case, target)[1]
    if case.bound == "memory":
        gbps = roofline.memory(case.pattern)
        what = f"{case.pattern} bandwidth {gbps:.1f} GB/s (measured in this run)"
        if case.sets == 1:
            what += "; the inputs stay in the cache, which this DRAM figure does not bound"
    else:
        peak = roofline.peaks.get(case.harness_case().peak)
        if peak is None:
            what = f"no {case.harness_case().peak} compute roof on this CPU"
        else:
            what = f"{peak['what']} {peak['value'] / 1e12:.2f} T{peak['unit']} ({peak['source']})"
    return what if target.host else f"host {what}: the simulated device runs on the host CPU"


def document(cases, targets, collectors, listed, unavailable, roofline, settings, machine) -> dict:
    """The results: settings, machine, roofline, devices, cases and one record per
    (case, device, implementation). ``collectors``: a benchlib.Collector per target key;
    ``listed``: {(case name, impl name, target key): (where it ran, role, label, fallback: whether
    anychip's op ran its reference for want of a kernel)};
    ``unavailable``: {(case name, impl name): reason}."""
    records, case_rows = [], []
    for case in cases:
        case_rows.append({
            "case": case.name, "op": case.op, "short": case.short, "dtype": case.dtype, "bound": case.bound,
            "bytes": case.bytes, "flops": case.flops, "intensity": case.intensity, "pattern": case.pattern,
            "inputs": case.inputs_note, "note": case.note,
            "unavailable": {impl: why for (name, impl), why in unavailable.items() if name == case.name}})
        for target in targets:
            collector = collectors[target.key]
            rows = collector.results.get(case.name, {})
            speedups = collector.speedups(case.name)
            for impl, row in rows.items():
                where, role, label, fallback = listed[(case.name, impl, target.key)]
                share = row.get("share")
                if not (target.host or target.simulated):  # hardware: against what its plugin declares
                    peak = declared_peak(case, target)[0]
                    share = None if peak is None or row["unit"] not in ("GB/s", "TFLOP/s") else row["rate"] / peak
                record = {
                    "case": case.name, "op": case.op, "dtype": case.dtype, "device": target.key,
                    "device_status": target.status, "device_label": target.label, "simulated": target.simulated,
                    "impl": impl, "role": role, "label": label, "where": where,
                    "ms": row["ms"], "min_ms": row["min_ms"], "rounds": row["rounds"],
                    "rate": row["rate"], "unit": row["unit"], "amount": row["amount"],
                    "roofline_share": share, "roofline_basis": roofline_basis(case, target, roofline),
                    "foreign_cpu_load": row.get("foreign_load"), "fallback": fallback}
                if impl == SUBJECT:
                    record["speedup_vs"] = speedups
                    record["speedup_vs_reference"] = speedups.get("reference")
                else:
                    record["anychip_speedup"] = speedups.get(impl)
                records.append(record)
    return {
        "format": FORMAT,
        "settings": settings,
        "machine": machine,
        "roofline": roofline.describe(),
        "devices": [{"device": t.key, "status": t.status, "label": t.label, "model": t.model, "host": t.host,
                     "simulated": t.simulated} for t in targets],
        "speedup": "anychip_speedup = this implementation's time / anychip's time on the same device "
                   "(above 1: anychip faster)",
        "simulated_devices": f"{SIMULATED}: anychip's simulator runs the chip's kernels on the host CPU, "
                             "so their times are host times, not the chip's",
        "cases": case_rows,
        "records": records,
    }


def write_json(doc: dict, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=2, default=str) + "\n")
    return path


def load(path) -> dict:
    """A bench.json, checked; errors name the file and what was expected."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such file (expected a bench.json written by `anychip bench`)")
    try:
        doc = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ValueError(f"{path}: not JSON ({exc}); expected a bench.json written by `anychip bench`") from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT or not isinstance(doc.get("records"), list):
        raise ValueError(f"{path}: not a bench.json written by `anychip bench` (expected \"format\": \"{FORMAT}\" "
                         "and a \"records\" list)")
    return doc


# ---------------------------------------------------------------------------------------------
# Tables


def _share(record) -> str:
    if record["roofline_share"] is None:
        return record["roofline_basis"] if record["roofline_basis"] == "no declared peak" else ""
    return f"{record['roofline_share']:.0%}"


def table_rows(doc: dict, op: str | None = None) -> list[list[str]]:
    """Per case, per device: anychip, then the reference and the peers."""
    order = {"anychip": 0, "reference": 1, "peer": 2}
    rows = []
    for case in doc["cases"]:
        if op is not None and case["op"] != op:
            continue
        first = True
        for device in doc["devices"]:
            recs = sorted((r for r in doc["records"] if r["case"] == case["case"] and r["device"] == device["device"]),
                          key=lambda r: order[r["role"]])
            for i, r in enumerate(recs):
                mine = r["role"] == "anychip" or r["anychip_speedup"] is None
                speedup = "" if mine else f"{r['anychip_speedup']:.2f}x"
                rows.append([case["case"] if first else "", device["label"] if i == 0 else "", r["label"],
                             f"{r['ms']:.3f}", f"{r['rate']:.3g} {r['unit']}", _share(r), speedup])
                first = False
    return rows


HEAD = ["case", "device", "implementation", "ms (median)", "rate", "roofline", "anychip speedup"]


def format_table(doc: dict) -> str:
    rows = table_rows(doc)
    widths = [max([len(h)] + [len(r[i]) for r in rows]) for i, h in enumerate(HEAD)]
    fmt = lambda cells: "  ".join(c.ljust(w) for c, w in zip(cells, widths)).rstrip()  # noqa: E731
    lines = [fmt(HEAD), fmt(["-" * w for w in widths])]
    for r in rows:
        if r[0] and len(lines) > 2:
            lines.append("")
        lines.append(fmt(r))
    return "\n".join(lines)


def _markdown_table(rows) -> list[str]:
    esc = lambda c: c.replace("|", "\\|")  # noqa: E731
    return (["| " + " | ".join(HEAD) + " |", "|" + "---|" * len(HEAD)]
            + ["| " + " | ".join(esc(c) for c in r) + " |" for r in rows])


def _load(share) -> str:
    return "an unknown share" if share is None else f"{share:.0%}"


def header_lines(doc: dict) -> list[str]:
    s, m, r = doc["settings"], doc["machine"], doc["roofline"]
    devices = ", ".join(d["label"] + (" (the host)" if d["host"] else "") for d in doc["devices"])
    return [
        f"shapes: {s['shapes']} ({s['preset']}); dtype {s['dtype']}; {s['threads']} host threads for every "
        f"implementation; up to {s['repeats']} timed calls after {s['warmup']} warm-up (fewer past "
        f"{s['budget_s']:g} s), median",
        f"devices: {devices}",
        f"host: {m['cpu']}; roofline measured in this run: copy {r['copy_gbps']:.1f} GB/s, read "
        f"{r['read_gbps']:.1f} GB/s; compute: {r['peaks_source']}",
        f"{SIMULATED}: anychip's simulator runs the chip's kernels on the host CPU; its times and roofline "
        "are the host's, not the chip's",
        "anychip speedup = that row's time / anychip's time on the same device (above 1: anychip faster); "
        "[host] rows ran on the host CPU",
        "roofline = share of the host's DRAM copy or read bandwidth (memory-bound cases; those marked "
        "'(in cache)' may exceed it) or of the compute roof (compute-bound cases)",
        f"other processes used {_load(s.get('foreign_cpu_load'))} of the CPUs during the run (above ~10%, "
        "expect noisy figures; rerun on a quiet machine)",
    ]


def write_markdown(doc: dict, path: Path, charts: dict) -> Path:
    lines = ["# anychip bench", ""] + [f"- {line}" for line in header_lines(doc)] + [""]
    if "roofline" in charts:
        lines += [f"![roofline]({charts['roofline'].name})", ""]
    for op in dict.fromkeys(c["op"] for c in doc["cases"]):
        lines += [f"## {op}", ""]
        if op in charts:
            lines += [f"![{op}]({charts[op].name})", ""]
        lines += _markdown_table(table_rows(doc, op)) + [""]
        for case in (c for c in doc["cases"] if c["op"] == op):
            lines.append(f"- {case['case']}: {case['note']}; {case['inputs']}")
            for impl, why in case["unavailable"].items():
                lines.append(f"  - not measured: {impl}: {why}")
        lines.append("")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines))
    return path


# ---------------------------------------------------------------------------------------------
# Charts


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _colors(doc: dict) -> dict:
    peers = dict.fromkeys(r["impl"] for r in doc["records"] if r["role"] == "peer")
    return {**COLORS, **{p: PEER_COLORS[i % len(PEER_COLORS)] for i, p in enumerate(peers)}}


def _groups(doc: dict, case_name: str) -> list[tuple[str, bool, list[dict]]]:
    """Bar groups of a case, (label, simulated, records): each device with what ran on it, then
    the host work not already shown under the cpu device (peers, the reference of simulated
    devices)."""
    recs = [r for r in doc["records"] if r["case"] == case_name]
    groups, shown = [], set()
    for d in doc["devices"]:
        mine = {r["impl"]: r for r in recs if r["device"] == d["device"] and r["where"] == d["device"]}
        groups.append((d["label"].replace(", ", "\n"), d["simulated"], list(mine.values())))
        if d["host"]:
            shown |= set(mine)
    host = {r["impl"]: r for r in recs if r["where"] == "cpu" and r["impl"] not in shown}
    if host:
        groups.append(("host CPU\n(peers, reference)", False, list(host.values())))
    return groups


def plot_op(doc: dict, op: str, path: Path) -> Path:
    """Grouped bars of median ms (log scale), one panel per case of ``op``."""
    plt = _pyplot()
    cases = [c for c in doc["cases"] if c["op"] == op]
    colors = _colors(doc)
    width_in = max(9.5, 5.2 * len(cases))
    fig, axes = plt.subplots(1, len(cases), figsize=(width_in, 5.8), squeeze=False)
    legend = {}
    for ax, case in zip(axes[0], cases):
        groups = _groups(doc, case["case"])
        width = 0.8 / max(1, max(len(g[2]) for g in groups))
        for gi, (_name, simulated, recs) in enumerate(groups):
            for bi, r in enumerate(recs):
                x = gi + width * (bi - (len(recs) - 1) / 2)
                bar = ax.bar(x, r["ms"], width * 0.9, color=colors.get(r["impl"], "#999999"),
                             hatch="//" if simulated and r["where"] != "cpu" else None, edgecolor="white")
                ax.text(x, r["ms"], f"{r['ms']:.0f}" if r["ms"] >= 100 else f"{r['ms']:.3g}", ha="center",
                        va="bottom", fontsize=7, rotation=90)
                legend.setdefault(r["impl"], (bar, r["label"].split(" [")[0]))
        ax.set_xticks(range(len(groups)), [g[0] for g in groups], fontsize=8)
        ax.set_yscale("log")
        ax.set_ylabel("median ms per call (log scale; lower is faster)")
        ax.set_title(f"{case['case']}\n{case['inputs']}", fontsize=8, wrap=True)
        ax.margins(y=0.25)
        ax.grid(axis="y", which="both", alpha=0.3)
    sims = [d["device"] for d in doc["devices"] if d["simulated"]]
    sim_note = f"\n{', '.join(sims)}: {SIMULATED}, hatched: the simulator runs on the host CPU" if sims else ""
    title = (f"anychip bench: {op}, {doc['settings']['dtype']}, shapes {doc['settings']['shapes']}, "
             f"on {doc['machine']['cpu']}{sim_note}")
    fig.suptitle(title, fontsize=10)
    handles = list(legend.values())
    ncol = max(1, min(len(handles), int(width_in // 3.4)))
    fig.legend([h[0] for h in handles], [h[1] for h in handles], loc="lower center", ncol=ncol, fontsize=8,
               frameon=False)
    fig.tight_layout(rect=(0, 0.03 + 0.04 * -(-len(handles) // ncol), 1, 0.92))
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110, metadata={"Title": title})
    plt.close(fig)
    return path


def plot_roofline(doc: dict, path: Path) -> Path:
    """anychip's achieved GFLOP/s against arithmetic intensity on each device, the host peers in
    grey, under the host's measured memory roofs and compute roof."""
    import numpy as np

    plt = _pyplot()
    roof = doc["roofline"]
    dtype = doc["settings"]["dtype"]
    peak = roof["peaks"]["fp32" if dtype == "float32" else "bf16"]
    cases = {c["case"]: c for c in doc["cases"]}
    fig, ax = plt.subplots(figsize=(9.5, 7.0))
    xs = [c["intensity"] for c in cases.values()]
    grid = np.logspace(np.log10(min(xs) / 4), np.log10(max(xs) * 4), 200)
    peak_g = peak["value"] / 1e9
    ax.plot(grid, np.minimum(grid * roof["copy_gbps"], peak_g), color="black", lw=1.2,
            label=f"roof: copy {roof['copy_gbps']:.1f} GB/s (measured) / {peak['what']} {peak_g:.0f} GFLOP/s "
                  f"({peak['source'].split(':')[0]})")
    if roof.get("read_gbps"):
        ax.plot(grid, np.minimum(grid * roof["read_gbps"], peak_g), color="black", lw=1, ls="--",
                label=f"roof: read {roof['read_gbps']:.1f} GB/s (measured; for the GEMVs, which stream W)")
    markers = "osD^vP*X"
    for i, d in enumerate(doc["devices"]):
        recs = [r for r in doc["records"] if r["device"] == d["device"] and r["role"] == "anychip"]
        if not recs:
            continue
        extra = "" if d["host"] or d["simulated"] else " (no declared peak: host roofs do not apply)"
        pts = [(cases[r["case"]]["intensity"], cases[r["case"]]["flops"] / (r["ms"] / 1e3) / 1e9, r) for r in recs]
        color = DEVICE_COLORS[i % len(DEVICE_COLORS)]
        ax.scatter([p[0] for p in pts], [p[1] for p in pts], marker=markers[i % len(markers)], s=60,
                   facecolors="none" if d["simulated"] else color, edgecolors=color, linewidths=1.5, zorder=3,
                   label=f"anychip on {d['label']}{extra}")
        if i == 0:
            for x, y, r in pts:
                ax.annotate(cases[r["case"]]["short"], (x, y), textcoords="offset points", xytext=(6, 4), fontsize=8)
    host = {(r["case"], r["impl"]): r for r in doc["records"] if r["role"] == "peer"}
    if host:
        pts = [(cases[c]["flops"] / (r["amount"] if cases[c]["bound"] == "memory" else cases[c]["bytes"]),
                cases[c]["flops"] / (r["ms"] / 1e3) / 1e9) for (c, _), r in host.items()]
        ax.scatter([p[0] for p in pts], [p[1] for p in pts], marker="x", s=25, color="#999999", zorder=2,
                   label="host peers (Paddle, torch), at their own bytes")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("arithmetic intensity (useful FLOPs per byte moved)")
    ax.set_ylabel("achieved GFLOP/s (useful FLOPs)")
    sims = [d["device"] for d in doc["devices"] if d["simulated"]]
    sim_note = f"\n{', '.join(sims)}: {SIMULATED}, hollow markers: the host roofline applies" if sims else ""
    title = (f"anychip bench roofline: {dtype}, shapes {doc['settings']['shapes']}, {roof['copy']['threads']} "
             f"threads on {doc['machine']['cpu']}{sim_note}")
    ax.set_title(title, fontsize=9)
    ax.grid(which="both", alpha=0.3)
    ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.11), ncol=2, frameon=False)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110, metadata={"Title": title})
    plt.close(fig)
    return path


def write_charts(doc: dict, out: Path) -> dict:
    """{op: path, "roofline": path}; {} without matplotlib."""
    try:
        _pyplot()
    except ImportError:
        return {}
    charts = {op: plot_op(doc, op, out / f"{op}.png") for op in dict.fromkeys(c["op"] for c in doc["cases"])}
    charts["roofline"] = plot_roofline(doc, out / "roofline.png")
    return charts


# ---------------------------------------------------------------------------------------------
# Comparing two runs


def compare(a: dict, b: dict, threshold: float) -> tuple[list[str], int]:
    """Lines of the comparison of anychip's times in ``a`` (before) and ``b`` (after), and how
    many cases regressed: B's time above (1 + threshold) x A's."""
    key = lambda r: (r["case"], r["device"])  # noqa: E731
    before = {key(r): r for r in a["records"] if r["role"] == SUBJECT}
    after = {key(r): r for r in b["records"] if r["role"] == SUBJECT}
    common = [k for k in before if k in after]
    if not common:
        raise ValueError("the two files have no (case, device) in common: run both with the same --ops, "
                         "--shapes, --dtype and --devices")
    lines = []
    for what in ("cpu",):
        if a["machine"].get(what) != b["machine"].get(what):
            lines.append(f"note: different hosts: A ran on {a['machine'].get(what)}, B on {b['machine'].get(what)}")
    for what in ("threads", "repeats"):
        if a["settings"].get(what) != b["settings"].get(what):
            lines.append(f"note: different {what}: A {a['settings'].get(what)}, B {b['settings'].get(what)}")
    head = ["case", "device", "A ms", "B ms", "B / A", "verdict"]
    rows, regressions = [], 0
    for k in common:
        ra, rb = before[k], after[k]
        ratio = rb["ms"] / ra["ms"]
        if ratio > 1 + threshold:
            verdict, regressions = f"REGRESSION ({ratio - 1:+.0%})", regressions + 1
        elif ratio < 1 - threshold:
            verdict = f"faster ({ratio - 1:+.0%})"
        else:
            verdict = "same (within threshold)"
        rows.append([k[0], rb["device_label"], f"{ra['ms']:.3f}", f"{rb['ms']:.3f}", f"{ratio:.2f}", verdict])
    widths = [max([len(h)] + [len(r[i]) for r in rows]) for i, h in enumerate(head)]
    fmt = lambda cells: "  ".join(c.ljust(w) for c, w in zip(cells, widths)).rstrip()  # noqa: E731
    lines += [fmt(head), fmt(["-" * w for w in widths])] + [fmt(r) for r in rows]
    for label, only in (("A", [k for k in before if k not in after]), ("B", [k for k in after if k not in before])):
        for case, device in only:
            lines.append(f"only in {label}: {case} on {device}")
    lines.append(f"{regressions} regression(s) beyond {threshold:.0%} (anychip's median time, B against A)")
    return lines, regressions
