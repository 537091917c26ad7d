"""The contract's dtypes and their groups are defined once, in anychip.dtypes (issue 40): no other
module of the product spells the floating dtypes out as a tuple of its own."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FLOAT_SET = {"float32", "bfloat16", "float16"}


def float_tuples(path: Path) -> list[int]:
    """Lines of ``path`` holding a tuple or list literal of exactly the three float dtype names."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, (ast.Tuple, ast.List)) and node.elts and all(
                isinstance(e, ast.Constant) and isinstance(e.value, str) for e in node.elts):
            names = [e.value for e in node.elts]
            if len(names) == 3 and set(names) == FLOAT_SET:
                found.append(node.lineno)
    return found


def test_the_float_dtypes_are_spelled_out_only_in_anychip_dtypes():
    offenders = []
    for folder in ("core", "codegen", "plugins", "models", "bench"):
        for path in (ROOT / folder).rglob("*.py"):
            if "templates" in path.parts or path == ROOT / "core" / "dtypes.py":
                continue
            offenders += [f"{path.relative_to(ROOT)}:{line}" for line in float_tuples(path)]
    assert not offenders, f"import the float dtypes from anychip.dtypes instead: {offenders}"


def test_the_groups_build_on_each_other_and_on_the_bits():
    from anychip import dtypes

    assert set(dtypes.FLOATS) == FLOAT_SET
    assert dtypes.BASE[:3] == dtypes.FLOATS and set(dtypes.CASTABLE) - set(dtypes.BASE) == {"int8"}
    assert set(dtypes.CASTABLE) <= set(dtypes.DTYPE_BITS)
    assert sorted(dtypes.DTYPE_BITS.values()) == list(range(len(dtypes.DTYPE_BITS)))
