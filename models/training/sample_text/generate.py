"""Builds this folder's pretraining corpus from the project's own English text: README.md and
docs/*.md, with code blocks, tables and markup taken out, one document per section (a ``#``
heading and what follows it). Every fifth section is held out as dev.jsonl.

    python models/training/sample_text/generate.py     # rewrites train.jsonl and dev.jsonl

The output depends only on those files; it was last run on the tree that added it, and need not
follow later edits of the docs (the tests only need a fixed corpus).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]
SOURCES = ["README.md", *sorted(str(p.relative_to(ROOT)) for p in (ROOT / "docs").glob("*.md"))]
MIN_WORDS = 20


def prose(markdown: str) -> list[str]:
    """The sections of ``markdown`` as plain paragraphs of text."""
    markdown = re.sub(r"```.*?```", "", markdown, flags=re.S)
    sections, current = [], []
    for line in markdown.splitlines():
        if line.startswith("#"):
            sections.append(current)
            current = [line.lstrip("#").strip() + "."]
            continue
        if line.lstrip().startswith(("|", "<", "![")):
            continue
        line = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", line)  # links keep their text
        line = re.sub(r"[`*_]", "", line).strip()
        line = re.sub(r"^[-+] |^\d+\. ", "", line)
        current.append(line)
    sections.append(current)
    out = []
    for lines in sections:
        text = re.sub(r"\n{3,}", "\n\n", "\n".join(lines)).strip()
        if len(text.split()) >= MIN_WORDS:
            out.append(text)
    return out


def main() -> None:
    docs = [text for source in SOURCES for text in prose((ROOT / source).read_text(encoding="utf-8"))]
    train = [d for i, d in enumerate(docs) if i % 5 != 4]
    dev = [d for i, d in enumerate(docs) if i % 5 == 4]
    for name, items in (("train.jsonl", train), ("dev.jsonl", dev)):
        (HERE / name).write_text("".join(json.dumps({"text": t}) + "\n" for t in items), encoding="utf-8")
    print(f"{len(train)} training and {len(dev)} dev documents, {sum(len(d.split()) for d in docs)} words")


if __name__ == "__main__":
    main()
