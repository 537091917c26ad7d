"""``anychip eval ppl``: perplexity of a model on a text, to compare checkpoints and quantization
schemes on the same text; ``anychip eval mc``: multiple-choice accuracy from the model's
log-likelihoods, scored as lm-evaluation-harness scores such a task."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from anychip.ops.decoder import CACHE_DTYPES

from .session import DEFAULT_MODEL

SAMPLE_TEXT = Path(__file__).resolve().parents[1] / "eval_data" / "english.txt"


def add_parser(sub, common):
    p = sub.add_parser("eval", parents=[common], help="evaluate a model (perplexity, multiple-choice accuracy)",
                       description="`ppl` scores a text with the model: the perplexity is exp of the mean "
                                   "negative log-likelihood of each token given the ones before it, in windows of "
                                   "--window tokens. Lower is better; compare models on the same text. Example: "
                                   "anychip eval ppl --model runs/smollm2-wint4 --data models/eval_data/english.txt")
    actions = p.add_subparsers(dest="action", metavar="ACTION", required=True)
    ppl = actions.add_parser("ppl", parents=[common], help="perplexity on a text")
    ppl.add_argument("--model", default=DEFAULT_MODEL, metavar="M",
                     help=f"a known model (default {DEFAULT_MODEL}), .gguf file, model folder or quantized folder")
    ppl.add_argument("--weights", choices=("native", "float"), default="native",
                     help="native: keep quantized tensors quantized (default); float: dequantize to float32")
    ppl.add_argument("--data", default=str(SAMPLE_TEXT), metavar="FILE",
                     help="a UTF-8 text file, or a .jsonl file with a \"text\" field per line "
                          f"(default: {SAMPLE_TEXT.relative_to(SAMPLE_TEXT.parents[2])}, an English text written for this)")
    ppl.add_argument("--window", type=int, default=512, metavar="N", help="tokens per scored window (default 512)")
    ppl.add_argument("--through", choices=("prefill", "decode"), default="prefill",
                     help="prefill: score each window in one forward pass (default); decode: one token at a time "
                          "through the KV cache and the decode step, as generation computes it (slower)")
    ppl.add_argument("--bf16", action="store_true",
                     help="multiply in bfloat16, as `anychip serve --bf16` does (see `anychip generate --help`)")
    ppl.add_argument("--kv-cache", choices=CACHE_DTYPES, default="float32", metavar="DTYPE",
                     help="with --through decode: the KV cache's dtype, float32 (default), bfloat16 or float16, to "
                          "measure what a 16-bit cache costs in perplexity")
    ppl.add_argument("--batch", type=int, default=1, metavar="N",
                     help="with --through decode: decode N windows side by side, one step for all of them, as a "
                          "server's running requests decode (default 1)")
    ppl.add_argument("--int8-batches", action="store_true",
                     help="with --through decode: steps of four or more windows quantize the activations that meet "
                          "quantized weights to int8, as `anychip serve` does by default (see its --exact-batches); "
                          "measures what that costs in perplexity")
    ppl.add_argument("--json", action="store_true", help="print one JSON object instead of a sentence")
    mc = actions.add_parser(
        "mc", parents=[common], help="multiple-choice accuracy from log-likelihoods",
        description="Scores each item's choices by the log-likelihood of ' ' + choice after the context (summed "
                    "over its tokens, as lm-evaluation-harness does) and counts the items whose answer scores "
                    "highest. Items: a .jsonl file, one {\"context\": str, \"choices\": [str, ...], \"answer\": "
                    "index} per line. Example: anychip eval mc --model smollm2 --data tests/data/mc_items.jsonl")
    mc.add_argument("--model", default=DEFAULT_MODEL, metavar="M",
                    help=f"a known model (default {DEFAULT_MODEL}), .gguf file, model folder or quantized folder")
    mc.add_argument("--weights", choices=("native", "float"), default="native",
                    help="native: keep quantized tensors quantized (default); float: dequantize to float32")
    mc.add_argument("--data", required=True, metavar="FILE.jsonl", help="the items")
    mc.add_argument("--json", action="store_true", help="print one JSON object (with every item's log-likelihoods)")


def read_text(path: Path) -> str:
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such data file")
    raw = path.read_text(encoding="utf-8")
    if path.suffix != ".jsonl":
        return raw
    texts = []
    for number, line in enumerate(raw.splitlines(), 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{path}:{number}: invalid JSON ({exc.msg})") from exc
        if not isinstance(record, dict) or not isinstance(record.get("text"), str):
            raise ValueError(f"{path}:{number}: expected an object with a \"text\" string")
        texts.append(record["text"])
    return "\n\n".join(texts)


def read_items(path: Path) -> list[dict]:
    """Multiple-choice items of a .jsonl file, each checked (the error names the line)."""
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such data file")
    items = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            item = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{path}:{number}: invalid JSON ({exc.msg})") from exc
        ok = (isinstance(item, dict) and isinstance(item.get("context"), str) and isinstance(item.get("choices"), list)
              and len(item["choices"]) >= 2 and all(isinstance(c, str) and c for c in item["choices"])
              and isinstance(item.get("answer"), int) and not isinstance(item["answer"], bool)
              and 0 <= item["answer"] < len(item["choices"]))
        if not ok:
            raise ValueError(f"{path}:{number}: expected {{\"context\": str, \"choices\": [2 or more non-empty "
                             "str], \"answer\": index of the right choice}")
        items.append(item)
    if not items:
        raise ValueError(f"{path}: no items")
    return items


def run(args) -> int:
    if args.action == "mc":
        return run_mc(args)
    return run_ppl(args)


def run_mc(args) -> int:
    import anychip
    from anychip.devices import describe
    from tqdm import tqdm

    from ..loader import load_checkpoint
    from ..evaluate import multiple_choice
    from ..hub import resolve
    from ..llama import LlamaForCausalLM

    items = read_items(Path(args.data))
    device = anychip.set_device(args.device)
    simulated = describe(device.split(":")[0]).status == "simulated"
    checkpoint = load_checkpoint(resolve(args.model), weights=args.weights)
    model = LlamaForCausalLM(checkpoint, device)
    with tqdm(total=len(items), desc="items", unit="item", file=sys.stderr, disable=args.json) as bar:
        result = multiple_choice(model, checkpoint.tokenizer, items, progress=bar.update)
    if args.json:
        print(json.dumps({"model": args.model, "weights": args.weights, "data": args.data, "device": device,
                          "simulated": simulated, **result}))
    else:
        label = f"{device} (simulated)" if simulated else device
        print(f"{args.model}: accuracy {result['accuracy']:.4f} ({result['correct']} of {result['items']} items of "
              f"{args.data}, {label})")
    return 0


def run_ppl(args) -> int:
    import anychip
    from anychip.devices import describe

    from ..loader import load_checkpoint
    from ..evaluate import decode_perplexity, perplexity
    from ..hub import resolve
    from ..llama import LlamaForCausalLM

    if args.window < 1:
        raise ValueError(f"--window must be >= 1, got {args.window}")
    if args.kv_cache != "float32" and args.through != "decode":
        raise ValueError("--kv-cache applies to --through decode (a prefill pass keeps no cache)")
    if (args.batch != 1 or args.int8_batches) and args.through != "decode":
        raise ValueError("--batch and --int8-batches apply to --through decode (a prefill pass has no decode steps)")
    if args.batch < 1:
        raise ValueError(f"--batch must be >= 1, got {args.batch}")
    text = read_text(Path(args.data))
    device = anychip.set_device(args.device)
    simulated = describe(device.split(":")[0]).status == "simulated"
    checkpoint = load_checkpoint(resolve(args.model), weights=args.weights)
    ids = checkpoint.tokenizer.encode(text, add_bos=checkpoint.tokenizer.add_bos)
    model = LlamaForCausalLM(checkpoint, device, bf16=args.bf16, kv_dtype=args.kv_cache, batch_int8=args.int8_batches)
    started = time.perf_counter()
    if args.through == "decode":
        from tqdm import tqdm

        with tqdm(total=len(ids) - 1, desc="decode", unit="tok", file=sys.stderr) as bar:
            value = decode_perplexity(model, ids, window=args.window, progress=bar.update, batch=args.batch)
    else:
        value = perplexity(model, ids, window=args.window)
    seconds = time.perf_counter() - started
    label = f"{device} (simulated)" if simulated else device
    if args.json:
        print(json.dumps({"model": args.model, "weights": args.weights, "bf16": args.bf16, "through": args.through,
                          "kv_cache": args.kv_cache, "batch": args.batch, "int8_batches": args.int8_batches,
                          "data": args.data, "device": device, "simulated": simulated, "tokens": len(ids),
                          "window": args.window, "perplexity": value, "seconds": seconds}))
    else:
        mode = ((", bf16" if args.bf16 else "") + (", through decode" if args.through == "decode" else "")
                + (f", {args.kv_cache} KV cache" if args.kv_cache != "float32" else "")
                + (f", {args.batch} windows a step" if args.batch != 1 else "")
                + (", int8 activations in batches" if args.int8_batches else ""))
        print(f"{args.model}: perplexity {value:.3f} on {len(ids)} tokens of {args.data} "
              f"(windows of {args.window}{mode}, {label}, {seconds:.1f} s)")
    return 0
