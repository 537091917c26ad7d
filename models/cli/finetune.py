"""``anychip finetune``: supervised fine-tuning (full, LoRA or Prefix Tuning) of a model on jsonl data."""

from __future__ import annotations

import sys
from pathlib import Path

from .session import DEFAULT_MODEL
from .training_flags import (add_lora_flags, add_run_flags, add_training_flags, chat_model, check_output,
                             lora_config, launch_ranks, train_args, training_device)


def add_parser(sub, common):
    p = sub.add_parser(
        "finetune", parents=[common], help="fine-tune a model (full, LoRA or Prefix Tuning) on chat data",
        description="Supervised fine-tuning on a jsonl file of {\"src\": ..., \"tgt\": ...} records (strings, or "
                    "lists of strings for multi-turn chats; PaddleNLP's format), with the loss on the target "
                    "tokens only. Writes checkpoints, metrics.jsonl and loss.png into --output, then the "
                    "trained model itself, which `anychip generate --model OUTPUT` loads. Example: "
                    "anychip finetune --lora --zero-padding --data models/training/sample_data "
                    "--output runs/anychip-lora")
    p.add_argument("--model", default=DEFAULT_MODEL, metavar="M",
                   help=f"model to start from: a known name (default {DEFAULT_MODEL}), a .gguf file or a Hugging "
                        "Face folder; weights are dequantized to float32 for training")
    p.add_argument("--data", required=True, metavar="PATH",
                   help="a .jsonl file, or a folder with train.jsonl (and dev.jsonl for evaluation)")
    p.add_argument("--eval-data", metavar="PATH", help="evaluation jsonl (default: the data folder's dev.jsonl)")
    p.add_argument("--chat-template", metavar="FILE",
                   help="a PaddleNLP chat_template.json (system, conversation, query); default: the model's own "
                        "chat template")
    p.add_argument("--on-bad-record", choices=("skip", "fail"), default="skip",
                   help="a malformed record is reported with its line number and skipped (default), or stops the run")
    add_run_flags(p)

    g = add_lora_flags(p, "train LoRA adapters on a frozen base instead of every weight")
    g.add_argument("--lora-dropout", type=float, default=0.0, metavar="P", help="dropout on adapter inputs (default 0)")
    g.add_argument("--lora-base", choices=("float", "int8", "int4"), default="float",
                   help="keep the frozen base as float32, or weight-only int8/int4 (QLoRA-style)")

    g = p.add_argument_group("Prefix Tuning")
    g.add_argument("--prefix-tuning", action="store_true",
                   help="train P keys and values per layer that every sequence attends to first, on a frozen base "
                        "(PaddleNLP's prefix tuning); the result is a prefix adapter folder")
    g.add_argument("--num-prefix-tokens", type=int, default=64, metavar="P", help="prefix length (default 64)")
    g.add_argument("--prefix-projection", action="store_true",
                   help="make the prefix with an embedding and an MLP (Li & Liang's reparametrisation) instead of "
                        "training its keys and values directly; it wants a far smaller --lr (on SmolLM2 3e-3 "
                        "diverged)")
    g.add_argument("--prefix-projection-hidden", type=int, default=512, metavar="N",
                   help="hidden units of that MLP (default 512)")

    g = add_training_flags(p, 512, "peak learning rate (default 2e-4 with --lora, 1e-1 with --prefix-tuning, "
                           "2e-5 otherwise)",
                           "tokens per example (and per packed sequence with --zero-padding; default 512)")
    g.add_argument("--zero-padding", action="store_true",
                   help="pack several examples into each max-length sequence, kept apart by a FlashMask")


def run(args) -> int:
    check_output(Path(args.output), args.resume, args.overwrite)  # before the imports: Paddle's take seconds
    if (status := launch_ranks(args)) is not None:
        return status
    if args.prefix_tuning:
        if args.lora:
            raise ValueError("--lora and --prefix-tuning train different adapters: pass one")
        for flag in ("num_prefix_tokens", "prefix_projection_hidden"):
            if getattr(args, flag) < 1:
                raise ValueError(f"--{flag.replace('_', '-')} must be >= 1, got {getattr(args, flag)}")
    from ..training.data import format_bad_records, load_sft_data
    from ..tensor_parallel import check as check_tensor_parallel
    from ..training.distributed import join
    from ..training.model import TrainableModel
    from ..training.trainer import Trainer, device_label

    device = training_device(args)
    path, base, fmt = chat_model(args)
    train, bad = load_sft_data(args.data, fmt, args.max_length, on_bad=args.on_bad_record)
    if bad:
        print(format_bad_records(args.data, bad), file=sys.stderr)
    dev = _eval_examples(args, fmt)
    lora = lora_config(args, path)
    prefix = _prefix_config(args, path)
    # before the process groups, so that every rank refuses a degree the model cannot take alike,
    # instead of one rank's refusal reaching the others as a broken connection
    check_tensor_parallel(base.config, args.tensor_parallel)
    world = join(device, args.tensor_parallel)
    model = TrainableModel(base, device, lora=lora, recompute=args.recompute, seed=args.seed,
                           compute_dtype=args.compute_dtype, prefix=prefix, tp=world.tp)
    lr = 2e-4 if lora else 1e-1 if prefix else 2e-5
    trainer = Trainer(model, base, train, dev, train_args(args, lr, zero_padding=args.zero_padding), args.output,
                      world=world)
    trained = sum(int(p.size) for p in model.params.values())
    method = "LoRA" if lora else f"Prefix Tuning ({prefix.num_prefix_tokens} tokens)" if prefix else "full"
    print(f"finetune on {device_label(device)}: {len(train)} examples ({len(bad)} skipped), {len(dev)} for "
          f"evaluation; {method} training of {trained:,} parameters for {trainer.total_steps} steps", file=sys.stderr)
    print(_padding_report(train, args), file=sys.stderr)
    last = trainer.train(resume=args.resume, overwrite=args.overwrite)
    summary = f"done: step {last.get('step', trainer.step)}, loss {last.get('loss', float('nan')):.4f}"
    if "eval_loss" in last:
        summary += f", eval loss {last['eval_loss']:.4f} (perplexity {last['eval_ppl']:.2f})"
    print(f"{summary}. Model in {args.output}: try `anychip generate --model {args.output} ...`", file=sys.stderr)
    return 0


def _prefix_config(args, model_path: Path):
    """The PrefixConfig of the --prefix-* flags (None without --prefix-tuning)."""
    if not args.prefix_tuning:
        return None
    from ..hub import MODELS
    from ..prefix import PrefixConfig

    return PrefixConfig(num_prefix_tokens=args.num_prefix_tokens, projection=args.prefix_projection,
                        projection_hidden=args.prefix_projection_hidden,
                        base_model=args.model if args.model in MODELS else str(model_path.resolve()), seed=args.seed)


def _padding_report(train, args) -> str:
    """Real tokens among those computed, zero padding against plain padding of batches holding
    as many examples as a packed batch does (the same examples per step)."""
    from ..training.packing import padding_efficiency

    packed = padding_efficiency(train, args.max_length, args.batch_size)
    per_batch = max(1, round(args.batch_size * len(train) / max(packed["sequences_packed"], 1)))
    padded = padding_efficiency(train, args.max_length, per_batch)
    using = "zero padding" if args.zero_padding else "plain padding"
    return (f"real tokens: {packed['zero_padding']:.0%} with zero padding ({packed['sequences_packed']} packs of "
            f"{args.max_length}), {padded['padding']:.0%} padding batches of {per_batch} examples to their longest; "
            f"using {using}")


def _eval_examples(args, fmt):
    from ..training.data import load_sft_data

    source = args.eval_data
    if source is None:
        folder = Path(args.data)
        if not (folder.is_dir() and any((folder / f"dev.{ext}").is_file() for ext in ("jsonl", "json"))):
            return []
        source, split = folder, "dev"
    else:
        split = "train"
    examples, _ = load_sft_data(source, fmt, args.max_length, on_bad=args.on_bad_record, split=split)
    return examples
