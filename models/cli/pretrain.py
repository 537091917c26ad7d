"""``anychip pretrain``: next-token training on raw text, from a model config alone (random
weights, seeded) or continuing from a model."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from .session import DEFAULT_MODEL
from .training_flags import (add_run_flags, add_training_flags, check_output, launch_ranks, train_args,
                             training_device)

SAMPLE_CONFIG = Path(__file__).resolve().parents[1] / "training" / "configs" / "llama-tiny.json"


def add_parser(sub, common):
    p = sub.add_parser(
        "pretrain", parents=[common], help="pretrain a model on raw text (from scratch or continuing)",
        description="Causal language-model training on raw text: .txt/.md files (one document each), .jsonl "
                    "files (one document per line, in a \"text\" field) or a folder of them. The text is "
                    "tokenized once into a cached token file, then cut into --max-length sequences across "
                    "document boundaries (each document ends with the tokenizer's EOS), with a FlashMask so "
                    "that documents in one sequence never see each other (--no-document-mask turns it off). "
                    "Writes checkpoints, metrics.jsonl (loss, dev perplexity, tokens/s) and loss.png into "
                    "--output, then the model itself, which `anychip generate --model OUTPUT` loads. "
                    "Example: anychip pretrain --config models/training/configs/llama-tiny.json --data "
                    "models/training/sample_text --max-steps 200 --batch-size 8 --max-length 128 "
                    "--output runs/tiny")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--config", metavar="FILE",
                     help=f"start from random weights of this Hugging Face config.json (e.g. {SAMPLE_CONFIG.name}, "
                          "shipped in models/training/configs/)")
    src.add_argument("--model", metavar="M",
                     help="continue pretraining this model: a known name, a .gguf file or a Hugging Face folder "
                          "(weights dequantized to float32)")
    p.add_argument("--tokenizer", default=DEFAULT_MODEL, metavar="M",
                   help=f"with --config: the model whose tokenizer to use (default {DEFAULT_MODEL})")
    p.add_argument("--data", required=True, metavar="PATH",
                   help="a text file or a folder of them; in a folder, files named dev.* (or under dev/) are the "
                        "evaluation split")
    p.add_argument("--eval-data", metavar="PATH", help="evaluation text (default: the data folder's dev split)")
    p.add_argument("--document-mask", action=argparse.BooleanOptionalAction, default=True,
                   help="keep the documents of one sequence apart with a causal-document FlashMask, positions "
                        "restarting at each (default on)")
    p.add_argument("--on-bad-record", choices=("skip", "fail"), default="skip",
                   help="a malformed jsonl record is reported with its file and line and skipped (default), or "
                        "stops the run")
    add_run_flags(p)
    add_training_flags(p, 512, "peak learning rate (default 1e-3 with --config, 5e-5 with --model)",
                       "tokens per training sequence (default 512)")


def run(args) -> int:
    check_output(Path(args.output), args.resume, args.overwrite)  # before the imports: Paddle's take seconds
    if (status := launch_ranks(args)) is not None:
        return status
    if args.config and not Path(args.config).is_file():
        raise ValueError(f"--config {args.config}: no such file (expected a Hugging Face config.json, e.g. "
                         f"{SAMPLE_CONFIG})")
    from ..loader import load_checkpoint
    from ..hub import resolve
    from ..tensor_parallel import check as check_tensor_parallel
    from ..training.distributed import join
    from ..training.from_scratch import new_checkpoint
    from ..training.model import TrainableModel
    from ..training.pretrain_data import (TokenSequences, format_bad_documents, has_dev_split,
                                          tokenize_corpus)
    from ..training.trainer import Trainer, device_label

    device = training_device(args)
    if args.config:
        tokenizer = _tokenizer(resolve(args.tokenizer))
        base = new_checkpoint(args.config, tokenizer, args.seed)
    else:
        base = load_checkpoint(resolve(args.model), weights="float")
    tok = base.tokenizer
    split = "train" if has_dev_split(args.data) else None
    stream, bad = tokenize_corpus(args.data, tok, split=split, on_bad=args.on_bad_record)
    if args.eval_data or split:
        dev_stream, dev_bad = tokenize_corpus(args.eval_data or args.data, tok, split=None if args.eval_data else "dev",
                                              on_bad=args.on_bad_record)
        bad += dev_bad
        dev = TokenSequences(dev_stream, args.max_length, args.document_mask)
    else:
        dev = []
    if bad:
        print(format_bad_documents(bad), file=sys.stderr)
    train = TokenSequences(stream, args.max_length, args.document_mask)
    # before the process groups, so that every rank refuses a degree the model cannot take alike,
    # instead of one rank's refusal reaching the others as a broken connection
    check_tensor_parallel(base.config, args.tensor_parallel)
    world = join(device, args.tensor_parallel)
    model = TrainableModel(base, device, recompute=args.recompute, seed=args.seed, compute_dtype=args.compute_dtype,
                           tp=world.tp)
    trainer = Trainer(model, base, train, dev, train_args(args, 1e-3 if args.config else 5e-5), args.output,
                      kind="pretrain", world=world)
    params = sum(int(p.size) for p in model.params.values())
    print(f"pretrain on {device_label(device)}: {len(stream):,} tokens in {stream.num_documents} documents "
          f"({len(train)} sequences of {args.max_length}{', document mask' if args.document_mask else ''}), "
          f"{len(dev) and len(dev.stream):,} for evaluation; {'a new' if args.config else 'continuing a'} model of "
          f"{params:,} parameters for {trainer.total_steps} steps", file=sys.stderr)
    last = trainer.train(resume=args.resume, overwrite=args.overwrite)
    summary = f"done: step {last.get('step', trainer.step)}, loss {last.get('loss', float('nan')):.4f}"
    if "eval_loss" in last:
        summary += f", dev perplexity {last['eval_ppl']:.2f}"
    print(f"{summary}. Model in {args.output}: try `anychip generate --model {args.output} ...`", file=sys.stderr)
    return 0


def _tokenizer(path: Path):
    """The tokenizer of the model at ``path``, without loading its weights."""
    from ..tokenizer import Tokenizer

    if path.is_dir():
        return Tokenizer.from_hf_folder(path)
    from ..gguf_file import metadata, open_gguf

    return Tokenizer.from_gguf_metadata(metadata(path, open_gguf(path)), str(path))
