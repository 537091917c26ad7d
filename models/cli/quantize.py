"""``anychip quantize``: post-training quantization (WINT8, WINT4 with optional GPTQ, A8W8 with
optional SmoothQuant) into a quantized model folder."""

from __future__ import annotations

import sys
from pathlib import Path

from .session import DEFAULT_MODEL


def add_parser(sub, common):
    p = sub.add_parser(
        "quantize", parents=[common], help="quantize a model after training (wint8, wint4, a8w8)",
        description="Post-training quantization, as PaddleNLP's PTQ: wint8 / wint4 make every projection "
                    "weight-only int8 / int4 (round-to-nearest, or --gptq with calibration); a8w8 makes them int8 "
                    "with int8 activations per token at run time (--smooth first moves activation outliers into "
                    "the weights). Calibration runs the float model on --device over the first --calib-samples "
                    "records of a fine-tuning jsonl. The result is a folder that `anychip generate --model DIR` "
                    "and `anychip eval ppl --model DIR` load on any device. Example: anychip quantize --type wint4 "
                    "--group-size 64 --gptq --act-order --calib models/eval_data/calibration.txt --output runs/smollm2-wint4")
    p.add_argument("--model", default=DEFAULT_MODEL, metavar="M",
                   help=f"model to quantize (default {DEFAULT_MODEL}); its weights are dequantized to float32 first")
    p.add_argument("--type", required=True, choices=("wint8", "wint4", "a8w8"), dest="quant_type",
                   help="wint8 / wint4: weight-only int8 / int4; a8w8: int8 weights and activations")
    p.add_argument("--group-size", type=int, default=-1, choices=(-1, 64, 128), metavar="G",
                   help="weight-only: one scale per G input channels (64 or 128; G must divide every layer's input size, "
                        "e.g. 64 for SmolLM2's 576), or -1: one per output channel (default)")
    p.add_argument("--gptq", action="store_true", help="GPTQ (Hessian-based error compensation) instead of rounding")
    p.add_argument("--act-order", action="store_true",
                   help="GPTQ: quantize the input channels with the largest activations first")
    p.add_argument("--smooth", action="store_true", help="a8w8: SmoothQuant migration of activation outliers")
    p.add_argument("--alpha", type=float, default=0.5, metavar="A", help="SmoothQuant migration strength (default 0.5)")
    p.add_argument("--calib", metavar="FILE",
                   help="calibration data: a .txt text (cut into --max-length windows), or a jsonl of {\"src\", \"tgt\"} "
                        "records (the fine-tuning format) or a data folder")
    p.add_argument("--calib-samples", type=int, default=128, metavar="N", help="calibration sequences to use, at most (default 128)")
    p.add_argument("--max-length", type=int, default=512, metavar="N", help="tokens per calibration record (default 512)")
    p.add_argument("--output", required=True, metavar="DIR", help="the quantized model folder to write")
    p.add_argument("--overwrite", action="store_true", help="replace --output if it is a folder that holds files")


def _check_output(path: Path, overwrite: bool) -> None:
    """Refuses, before any work, to replace a file or (without --overwrite) a folder's contents."""
    if path.exists() and not path.is_dir():
        raise ValueError(f"--output {path} is a file, not a model folder: choose another path")
    if path.is_dir() and any(path.iterdir()) and not overwrite:
        raise ValueError(f"--output {path} already holds files: pass --overwrite to replace them, "
                         "or choose another folder")


def _calibration_sequences(path: Path, tokenizer, max_length: int) -> list[list[int]]:
    """Token sequences of a calibration file: the records of a fine-tuning jsonl (or data folder)
    through the chat template, or a plain .txt text cut into windows of ``max_length``."""
    from ..training.data import ChatFormat, format_bad_records, load_sft_data

    if path.suffix == ".txt":
        if not path.is_file():
            raise FileNotFoundError(f"{path}: no such calibration file")
        ids = tokenizer.encode(path.read_text(encoding="utf-8"), add_bos=tokenizer.add_bos)
        return [ids[i:i + max_length] for i in range(0, len(ids), max_length) if len(ids[i:i + max_length]) > 1]
    examples, bad = load_sft_data(path, ChatFormat.from_tokenizer(tokenizer), max_length)
    if bad:
        print(format_bad_records(path, bad), file=sys.stderr)
    return [e.input_ids for e in examples]


def run(args) -> int:
    import anychip
    from anychip.devices import describe

    from ..loader import load_checkpoint
    from ..hub import resolve
    from ..quantization.checkpoint import folder_size, write_quantized
    from ..quantization.ptq import calibrate, check_scheme, quantize

    needs_calibration = args.gptq or args.smooth
    if needs_calibration and not args.calib:
        raise ValueError("--gptq and --smooth need calibration data: pass --calib FILE")
    if args.calib_samples < 1:
        raise ValueError(f"--calib-samples must be >= 1, got {args.calib_samples}")
    _check_output(Path(args.output), args.overwrite)
    device = anychip.set_device(args.device)
    name, _, index = device.partition(":")
    if describe(name).status == "simulated":
        print(f"anychip: {name} is simulated: its timings are the host CPU's, not the chip's", file=sys.stderr)
    checkpoint = load_checkpoint(resolve(args.model), weights="float")
    if checkpoint.prefix is not None:  # the quantized folder would silently lose it
        raise ValueError(f"--model {args.model} is a prefix adapter: quantize its base model, whose folder the "
                         "adapter's prefix_config.json names (base_model)")
    check_scheme(checkpoint.config, args.quant_type, args.group_size)
    stats = None
    calibration = {}
    if needs_calibration:
        sequences = _calibration_sequences(Path(args.calib), checkpoint.tokenizer, args.max_length)[:args.calib_samples]
        if not sequences:
            raise ValueError(f"--calib {args.calib} holds no calibration text (at least 2 tokens are needed)")
        calibration = {"data": str(args.calib), "sequences": len(sequences), "tokens": sum(map(len, sequences))}
        print(f"calibrating on {len(sequences)} sequences ({calibration['tokens']} tokens) on {device}", file=sys.stderr)
        stats = calibrate(checkpoint, (name, int(index or 0)), sequences)
    tensors = quantize(checkpoint, args.quant_type, stats, group_size=args.group_size, use_gptq=args.gptq,
                       smooth=args.smooth, alpha=args.alpha, act_order=args.act_order)
    method = {"group_size": args.group_size, "gptq": args.gptq, "act_order": args.act_order, "smooth": args.smooth,
              "alpha": args.alpha if args.smooth else None, "calibration": calibration, "source": str(args.model)}
    folder = write_quantized(args.output, checkpoint.config, tensors, checkpoint.tokenizer, args.quant_type, method)
    print(f"{args.quant_type} model in {folder} ({folder_size(folder) / 2**20:.0f} MiB); try "
          f"`anychip eval ppl --model {folder}`", file=sys.stderr)
    return 0
