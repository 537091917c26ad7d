"""The README's quantization table: SmolLM2-135M-Instruct quantized every way `anychip quantize`
offers, each scored with `anychip eval ppl` on the same held-out English text, its size on disk,
and its decode speed on `cpu` (`anychip generate --json`, 128 greedy tokens).

    python bench/quant_table.py [--out runs/quant] [--device cpu]

The float32 baseline is the GGUF's weights dequantized (`--weights float`). Calibration (GPTQ,
SmoothQuant): models/eval_data/calibration.txt, varied English written for it, never the
evaluation text. Prints a Markdown table
and writes it, with every command's JSON, to OUT/table.md and OUT/results.json.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CALIB = ROOT / "models" / "eval_data" / "calibration.txt"
TEXT = ROOT / "models" / "eval_data" / "english.txt"
PROMPT = "Write a short story about a lighthouse keeper who spends a winter alone on an island."

SCHEMES = [  # (label, quantize arguments); None: the float baseline
    ("fp32 (GGUF dequantized)", None),
    ("WINT8, round-to-nearest", ["--type", "wint8"]),
    ("WINT8, GPTQ", ["--type", "wint8", "--gptq", "--act-order"]),
    ("WINT4 g64, round-to-nearest", ["--type", "wint4", "--group-size", "64"]),
    ("WINT4 g64, GPTQ", ["--type", "wint4", "--group-size", "64", "--gptq", "--act-order"]),
    ("A8W8", ["--type", "a8w8"]),
    ("A8W8, SmoothQuant", ["--type", "a8w8", "--smooth"]),
]


def anychip(*args) -> dict | None:
    run = subprocess.run(["anychip", *map(str, args)], capture_output=True, text=True)
    if run.returncode != 0:
        sys.stderr.write(run.stderr)
        raise SystemExit(f"anychip {' '.join(map(str, args[:3]))} failed")
    return json.loads(run.stdout) if run.stdout.strip().startswith("{") else None


def folder_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.iterdir() if p.name.endswith(".safetensors"))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="runs/quant", help="where the quantized models and the table go")
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    for label, quant_args in SCHEMES:
        if quant_args is None:
            model, weights = "smollm2", "float"
            params = anychip("eval", "ppl", "--model", model, "--weights", "float", "--data", TEXT, "--json",
                             "--device", args.device)
            size = None  # float32 bytes of the tensors, below
        else:
            folder = out / "-".join(a.strip("-") for a in quant_args[1:])
            extra = ["--calib", CALIB] if any(a in quant_args for a in ("--gptq", "--smooth")) else []
            if not (folder / "quantization.json").is_file():  # kept from an earlier run of this script
                anychip("quantize", "--model", "smollm2", *quant_args, *extra, "--output", folder, "--device", args.device)
            model, weights = str(folder), "native"
            params = anychip("eval", "ppl", "--model", model, "--data", TEXT, "--json", "--device", args.device)
            size = folder_bytes(folder)
        gen = anychip("generate", "--model", model, "--weights", weights, "--json", "--max-new-tokens", "128",
                      "--device", args.device, PROMPT)
        rows.append({"scheme": label, "perplexity": params["perplexity"], "tokens": params["tokens"],
                     "bytes": size, "decode_tok_s": gen["timings"]["decode_tok_s"], "model": model})
        print(f"{label}: perplexity {params['perplexity']:.3f}, decode {gen['timings']['decode_tok_s']:.1f} tok/s",
              file=sys.stderr)
    base = rows[0]
    if base["bytes"] is None:
        from anychip_models.loader import load_checkpoint
        from anychip_models.hub import resolve

        base["bytes"] = sum(t.nbytes for t in load_checkpoint(resolve("smollm2"), weights="float").tensors.values())
    from anychip.devices import describe

    simulated = describe(args.device.split(":")[0]).status == "simulated"
    where = f"`{args.device}`" + (" (simulated: host speed)" if simulated else "")
    lines = [f"| SmolLM2-135M-Instruct | perplexity ({base['tokens']} tokens) | vs fp32 | size on disk | decode on {where} |",
             "|---|---|---|---|---|"]
    for r in rows:
        change = (r["perplexity"] / base["perplexity"] - 1) * 100
        lines.append(f"| {r['scheme']} | {r['perplexity']:.3f} | {change:+.2f}% | {r['bytes'] / 2**20:.0f} MiB | "
                     f"{r['decode_tok_s']:.1f} tok/s |")
    table = "\n".join(lines)
    print(table)
    (out / "table.md").write_text(table + "\n")
    (out / "results.json").write_text(json.dumps(rows, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
