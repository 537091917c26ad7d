"""Builds this folder's preference pairs from the SFT sample data beside it
(``../sample_data``): each single-turn question keeps its answer as the chosen response, and the
rejected one is the answer to a different question about anychip (drawn with SEED), so a model
that prefers the chosen response knows which fact the question asks for. The dev pairs come from
the SFT dev questions, phrasings that no training record uses.

    python models/training/sample_preferences/generate.py     # rewrites train.jsonl and dev.jsonl
"""

from __future__ import annotations

import json
import random
from pathlib import Path

HERE = Path(__file__).resolve().parent
SFT = HERE.parent / "sample_data"
SEED = 7


def pairs(records: list[dict], answers: list[str], rng: random.Random) -> list[dict]:
    out = []
    for r in records:
        if not isinstance(r["src"], str):
            continue  # multi-turn chats stay SFT's
        wrong = rng.choice([a for a in answers if a != r["tgt"]])
        out.append({"src": r["src"], "tgt": [], "response": [r["tgt"], wrong]})
    return out


def main() -> None:
    rng = random.Random(SEED)
    split = {name: [json.loads(line) for line in (SFT / f"{name}.jsonl").read_text().splitlines() if line.strip()]
             for name in ("train", "dev")}
    answers = sorted({r["tgt"] for r in split["train"] if isinstance(r["tgt"], str)})
    for name, records in split.items():
        items = pairs(records, answers, rng)
        (HERE / f"{name}.jsonl").write_text("".join(json.dumps(p) + "\n" for p in items), encoding="utf-8")
        print(f"{name}.jsonl: {len(items)} pairs")


if __name__ == "__main__":
    main()
