"""``anychip/ops.h``, generated from the op definitions: each attribute's index by name, so that
a kernel reads ``call->attrs[ANYCHIP_ATTR_DECODER_STEP_X_INT8]`` rather than a number only prose
ties to a meaning. ``python -m anychip.ops.c_header`` rewrites the header from anychip's own
definitions (``anychip/ops/defs/``); a test fails while the committed header is stale.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from .definition import Attr, OpDef
from .defs import BUILTIN

HEADER = Path(__file__).resolve().parents[1] / "include" / "anychip" / "ops.h"


def macro(op: str, attr: str) -> str:
    return f"ANYCHIP_ATTR_{op.upper()}_{attr.upper()}"


def _attrs(op: str, attrs: tuple[Attr, ...]) -> list[str]:
    lines = []
    for i, a in enumerate(attrs):
        how = (" (repeated: the rest)" if a.variadic else f" (absent: {a.default:g})" if a.default is not None
               else " (may be absent)" if a.optional else "")
        lines.append(f"#define {macro(op, a.name)} {i}  /* {a.doc}{how} */")
    lines.append(f"#define ANYCHIP_NUM_ATTRS_{op.upper()} {len(attrs)}")
    return lines


def _comment(text: str) -> list[str]:
    return ["/*", *[f" * {line}".rstrip() for line in text.splitlines()], " */"]


def _op(op: OpDef) -> list[str]:
    lines = [f"/* {op.name} ({op.category}): {op.summary}; inputs {', '.join(op.inputs) or 'none'}, "
             f"outputs {', '.join(op.outputs)} */", *_attrs(op.name, op.attrs)]
    if op.fused and op.grad:
        lines += [f"/* {op.grad}: the backward of {op.name} */", *_attrs(op.grad, op.grad_attrs)]
    return lines


def render(ops=None) -> str:
    """The header's text for ``ops`` (default: anychip's own definitions)."""
    ops = BUILTIN if ops is None else ops
    out = ["/*",
           " * anychip/ops.h -- GENERATED from the op definitions (anychip/ops/defs/) by",
           " * `python -m anychip.ops.c_header`: do not edit.",
           " *",
           " * The op table of the kernel contract: per op (fused ops, then the base ops), its tensors",
           " * and math in words (\"inputs -> outputs\", under the conventions of anychip/kernel.h: B",
           " * batch, S/Sq/Sk sequence lengths, H heads, D head dim, R rows (all leading dims flattened),",
           " * N/K output/input features, \"float\" the call's compute dtype, \"?\" an optional trailing",
           " * input), then its attributes by name: ANYCHIP_ATTR_<OP>_<ATTR> is the attribute's index in",
           " * AnychipKernelCall.attrs and ANYCHIP_NUM_ATTRS_<OP> their number. Trailing attributes with",
           " * a default may be absent (num_attrs says how many were passed); flags are 0.0 or 1.0. A",
           " * fused op's backward kernel has attributes of its own, under its own name.",
           " */",
           "#ifndef ANYCHIP_OPS_H_",
           "#define ANYCHIP_OPS_H_",
           ""]
    contract = None
    for op in ops.values():
        if op.contract and op.contract != contract:  # a family of base ops shares one
            out += _comment(op.contract)
        contract = op.contract
        out += _op(op) + [""]
    out += ["#endif /* ANYCHIP_OPS_H_ */", ""]
    return "\n".join(out)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m anychip.ops.c_header", description=__doc__)
    parser.add_argument("--check", action="store_true", help="exit 1 if the header is stale instead of writing it")
    args = parser.parse_args(argv)
    text = render()
    if args.check:
        stale = not HEADER.exists() or HEADER.read_text() != text
        print(f"{HEADER}: {'stale; run python -m anychip.ops.c_header' if stale else 'up to date'}")
        return int(stale)
    HEADER.write_text(text)
    print(f"wrote {HEADER}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
