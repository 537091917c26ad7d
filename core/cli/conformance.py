"""``anychip conformance``: checks a device against anychip's contracts and prints the matrix."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

DESCRIPTION = """\
Check that a device keeps anychip's contracts, the way a chip vendor validates a plugin:

  runtime  the device runtime contract of anychip/device.h (memory, copies, streams, events)
  op       every registered op against its plain-Paddle reference: forward and backward, each
           dtype the op declares, normal and odd shapes, within the op's tolerance (gradients
           4x looser); inputs are rounded to the dtype and the reference runs on the host CPU
           in float32 from the same values, so only the kernel's own error is measured
  e2e      whole workloads against the host CPU (e.g. a tiny Llama's forward, backward and
           AdamW step), from the anychip.conformance entry points of installed packages
  collectives  (only with --sections collectives) the device.h ABI 1.2 collectives against
           numpy: every collective x dtype x world sizes 2 and 3 x counts 1, 7 and one past the
           simulator's staging slot, in place and not; groups, send/recv order, a missing
           rank's timeout; a plugin without collectives is reported skipped, not failed

--framework torch runs the op section through PyTorch instead of Paddle: the same cases, through
torch.ops.anychip.<op> for the fused ops and the ATen call that runs each base op's kernel (torch.add,
x.to(dtype), x @ y, ...) on PyTorch's anychip device, against the same call on torch's CPU; the
notes name the ops no PyTorch call reaches. Its sections are runtime and op (e2e is Paddle's).

Reading the op matrix (one row per op, a column per dtype and direction):
  pass          every sample case within tolerance
  FAIL 3.1e-02  out of tolerance, with the largest |error| seen (or "FAIL raised": the kernel
                raised); the details below the matrix name the case (shapes, arguments), the
                output or gradient, the worst element, its value and the reference's;
                "case 2/5" of OP in DTYPE is anychip.conformance.cases.cases(OP, DTYPE)[1]
  fallback      the op ran its reference on the device instead of a kernel, e.g. a kernel
                registered without a backward
  —             the device registers no kernel for that op and dtype (not declared)
  ·             not part of the op (a dtype it does not declare, or it has no backward)

Simulated devices (anychip's simulator standing in for the chip) are labelled "(simulated)".
Exit status: 0 when nothing failed, 1 when a check failed, 2 for a bad argument."""

EPILOG = """\
examples:
  anychip conformance --device npu
  anychip conformance --device mychip --ops rms_norm,attention --dtypes bfloat16 --skip e2e
  anychip conformance --device npu --out conformance-npu/   # conformance.json + conformance.md
  anychip conformance --device npu --sections collectives
  anychip conformance --device npu --framework torch          # the op checks through PyTorch
  pytest --anychip-device=mychip                             # the same checks as pytest items"""


def _names(kind: str, known):
    """An argparse type: a comma-separated list of ``known()`` names."""

    def parse(text: str) -> tuple[str, ...]:
        names = tuple(n.strip() for n in text.split(",") if n.strip())
        choices = known()
        unknown = [n for n in names if n not in choices]
        if unknown or not names:
            raise argparse.ArgumentTypeError(
                f"unknown {kind} {', '.join(map(repr, unknown)) or repr(text)}; choose from {', '.join(choices)}")
        return names

    return parse


def _known_ops():
    from ..ops.defs import definitions

    return list(definitions())


def _known_dtypes():
    from ..ops.defs import definitions

    return list(dict.fromkeys(d for spec in definitions().values() for d in spec.dtypes))


def _known_sections():
    from ..conformance import SECTIONS

    return list(SECTIONS)


def add_parser(sub, common):
    p = sub.add_parser("conformance", parents=[common], help="check a device against anychip's contracts and ops",
                       description=DESCRIPTION, epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ops", type=_names("op", _known_ops), metavar="OP[,OP...]",
                   help="check only these ops (default: every registered op)")
    p.add_argument("--dtypes", type=_names("dtype", _known_dtypes), metavar="DTYPE[,DTYPE...]",
                   help="check only these dtypes, e.g. float32,bfloat16 (default: each op's own)")
    p.add_argument("--skip", type=_names("section", _known_sections), default=(), metavar="SECTION[,SECTION...]",
                   help="leave out sections: runtime, op, e2e, collectives")
    p.add_argument("--sections", type=_names("section", _known_sections), metavar="SECTION[,SECTION...]",
                   help="run these sections (default: runtime,op,e2e; collectives runs only when named here)")
    p.add_argument("--framework", choices=("paddle", "torch"), default="paddle",
                   help="run the op checks through this framework (default: paddle; torch needs PyTorch installed)")
    p.add_argument("--out", type=Path, metavar="DIR", help="also write conformance.json and conformance.md to DIR")
    p.add_argument("--json", action="store_true", help="print the JSON report instead of the matrix")


def run(args) -> int:
    from .. import conformance
    from ..conformance.op_checks import resolve_device
    from ..selection import default_device

    device = args.device or default_device()
    try:
        resolve_device(device)
    except ValueError as exc:  # unknown, out of range or unavailable here
        print(f"anychip conformance: error: --device {device}: {exc}", file=sys.stderr)
        return 2
    sections = [s for s in (args.sections or conformance.default_sections(args.framework)) if s not in args.skip]
    try:
        conformance.check_sections(sections, args.framework)
        if args.framework == "torch":
            from ..runtime.open import parse_device
            from ..torch import enable

            enable(parse_device(device)[0])
    except (ValueError, ImportError, RuntimeError) as exc:  # a section torch cannot run, no torch, the cpu
        print(f"anychip conformance: error: --framework {args.framework}: {exc}", file=sys.stderr)
        return 2
    report = conformance.run(device, ops=args.ops, dtypes=args.dtypes, sections=sections, framework=args.framework)
    print(report.as_json() if args.json else report.matrix_text())
    if args.out is not None:
        json_path, md_path = report.write(args.out)
        print(f"wrote {json_path} and {md_path}", file=sys.stderr if args.json else sys.stdout)
    return report.exit_code
