"""Asks a model the single-turn questions of ``dev.jsonl`` (phrasings never seen in training)
and counts the greedy answers that start like the reference answer (its first 40 characters):
how a fine-tune on this sample data changed what the model says, beyond its loss.

    python models/training/sample_data/check_answers.py MODEL [--device DEV] [--show]

MODEL: anything ``anychip generate --model`` takes (``smollm2`` for the base model, a fine-tune's
output folder for the result).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

PREFIX = 40


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--show", action="store_true", help="print every question and answer")
    args = parser.parse_args()
    records = [json.loads(line) for line in (Path(__file__).parent / "dev.jsonl").read_text().splitlines() if line]
    pairs = [(r["src"], r["tgt"]) for r in records if isinstance(r["src"], str)]
    run = subprocess.run(["anychip", "generate", "--device", args.device, "--json", "--model", args.model,
                          "--max-new-tokens", "48", *[q for q, _ in pairs]], capture_output=True, text=True)
    if run.returncode != 0:
        sys.stderr.write(run.stderr)
        return run.returncode
    completions = json.loads(run.stdout)["completions"]
    hits = 0
    for (question, reference), completion in zip(pairs, completions):
        ok = completion["text"].strip()[:PREFIX] == reference[:PREFIX]
        hits += ok
        if args.show:
            print(f"{'OK ' if ok else '-- '}{question}\n    {completion['text'].strip()[:100]}")
    print(f"{args.model}: {hits}/{len(pairs)} dev answers start like the reference")
    return 0


if __name__ == "__main__":
    sys.exit(main())
