"""What the training commands (``finetune``, ``pretrain``, ``dpo``) share: their run, LoRA and
training flags, the check of ``--output`` before any work, the device they train on, and
TrainArgs and LoraConfig from the parsed flags."""

from __future__ import annotations

import os
from pathlib import Path

from ..training import distributed
from . import ranks


def add_run_flags(p) -> None:
    """--output, --resume, --overwrite."""
    p.add_argument("--output", required=True, metavar="DIR", help="where checkpoints and the result go")
    p.add_argument("--resume", action="store_true", help="continue from the latest checkpoint in --output")
    p.add_argument("--overwrite", action="store_true",
                   help="start afresh in an --output that holds files: an earlier run's checkpoints and "
                        "metrics.jsonl are deleted, the model files replaced")


def add_lora_flags(p, lora_help: str):
    """The "LoRA" group of flags; returned, for a command's own additions."""
    g = p.add_argument_group("LoRA")
    g.add_argument("--lora", action="store_true", help=lora_help)
    g.add_argument("--lora-rank", type=int, default=8, metavar="R", help="adapter rank (default 8)")
    g.add_argument("--lora-alpha", type=float, default=16.0, metavar="A", help="scaling alpha / rank (default alpha 16)")
    g.add_argument("--lora-targets", default="q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj", metavar="LIST",
                   help="comma-separated projections to adapt (default: all seven)")
    return g


def lora_config(args, model_path: Path):
    """The LoraConfig the --lora flags ask for (None without --lora); the adapter names its base
    as a known model's name, else by the resolved ``model_path``."""
    if not args.lora:
        return None
    from ..hub import MODELS
    from ..lora import LoraConfig

    return LoraConfig(rank=args.lora_rank, alpha=args.lora_alpha, dropout=getattr(args, "lora_dropout", 0.0),
                      targets=tuple(t.strip() for t in args.lora_targets.split(",") if t.strip()),
                      base_model=args.model if args.model in MODELS else str(model_path.resolve()),
                      base_weights=getattr(args, "lora_base", "float"), seed=args.seed)


def launch_ranks(args) -> int | None:
    """With ``--nproc N`` (N > 1) in a process that is not one of the ranks yet: runs this command
    as N ranks under paddle.distributed.launch and returns their exit status; else None."""
    if args.nproc < 1:
        raise ValueError(f"--nproc must be >= 1, got {args.nproc}")
    if getattr(args, "sharding", None) and args.nproc == 1 and not distributed.launched():
        raise ValueError(f"--sharding {args.sharding} partitions the optimizer across ranks: pass --nproc N (N >= 2)")
    k = getattr(args, "tensor_parallel", 1)
    if not distributed.launched():
        if k < 1 or args.nproc % k:
            raise ValueError(f"--tensor-parallel {k} must be >= 1 and divide --nproc {args.nproc}")
        if k > 1 and getattr(args, "sharding", None):
            raise ValueError("--sharding partitions the optimizer of data-parallel ranks; with --tensor-parallel "
                             "each rank holds a split model already: pass one of them")
    if args.nproc == 1 or distributed.launched():
        return None
    return ranks.launch(args.device, args.argv, args.nproc)


def training_device(args) -> tuple[str, int]:
    """(chip, index) of --device, made current; a simulated chip is said to be one. A rank of a
    launched job takes the chip's device of its rank's index (the host, ``cpu``, for all)."""
    import sys

    import anychip
    from anychip.devices import describe

    name, _, index = anychip.set_device(ranks.rank_device(args.device)).partition(":")
    if describe(name).status == "simulated" and distributed.rank() == 0:
        print(f"anychip: {name} is simulated: its timings are the host CPU's, not the chip's", file=sys.stderr)
    return name, int(index or 0)


def chat_model(args):
    """(resolved path, float32 checkpoint, chat format) of --model and --chat-template."""
    from ..loader import load_checkpoint
    from ..hub import resolve
    from ..training.data import ChatFormat

    path = resolve(args.model)
    base = load_checkpoint(path, weights="float")
    fmt = (ChatFormat.from_json(args.chat_template, base.tokenizer) if args.chat_template
           else ChatFormat.from_tokenizer(base.tokenizer))
    return path, base, fmt


def add_training_flags(p, max_length: int, lr_help: str, max_length_help: str):
    """The "training" group of flags; returned, for a command's own additions."""
    g = p.add_argument_group("training")
    g.add_argument("--max-length", type=int, default=max_length, metavar="N", help=max_length_help)
    g.add_argument("--batch-size", type=int, default=1, metavar="B", help="sequences per micro-batch (default 1)")
    g.add_argument("--grad-accum", type=int, default=1, metavar="N", help="micro-batches per optimizer step (default 1)")
    g.add_argument("--epochs", type=float, default=1.0, metavar="E", help="passes over the data (default 1)")
    g.add_argument("--max-steps", type=int, metavar="N", help="optimizer steps (overrides --epochs)")
    g.add_argument("--lr", type=float, default=None, metavar="LR", help=lr_help)
    g.add_argument("--schedule", choices=("cosine", "linear", "constant"), default="cosine",
                   help="decay after warmup (default cosine)")
    g.add_argument("--warmup-steps", type=int, default=0, metavar="N", help="linear warmup steps (default 0)")
    g.add_argument("--weight-decay", type=float, default=0.0, metavar="W", help="AdamW weight decay (default 0)")
    g.add_argument("--max-grad-norm", type=float, default=1.0, metavar="N",
                   help="clip the global gradient norm to N (0: off; default 1)")
    g.add_argument("--compute-dtype", choices=("float32", "bfloat16"), default="float32",
                   help="dtype of the matmuls (bfloat16: AMX on CPUs that have it); weights, optimizer state and "
                        "the other ops stay float32")
    g.add_argument("--recompute", action="store_true",
                   help="recompute each layer's activations in the backward instead of keeping them (less memory)")
    g.add_argument("--eval-steps", type=int, metavar="N", help="evaluate every N steps (and at the end)")
    g.add_argument("--save-steps", type=int, metavar="N", help="checkpoint every N steps (and at the end)")
    g.add_argument("--save-total-limit", type=int, default=3, metavar="N", help="checkpoints to keep (default 3)")
    g.add_argument("--seed", type=int, default=42,
                   help="seed for the data order, the initial weights or adapters, and dropout")
    g.add_argument("--nproc", type=int, default=1, metavar="N",
                   help="data parallelism: N ranks under paddle.distributed.launch, rank r on device r of --device's "
                        "chip (on cpu all share the host); each optimizer step takes --grad-accum micro-batches per "
                        "rank, so the global batch is N x --grad-accum x --batch-size")
    g.add_argument("--tensor-parallel", type=int, default=1, metavar="K",
                   help="with --nproc N: split the model across groups of K ranks (attention by heads, the MLP by "
                        "its inner features, the vocabulary in chunks), as PaddleNLP's tensor_parallel_degree; "
                        "N / K groups train data parallel. Checkpoints stay whole: they resume on any N and K")
    g.add_argument("--sharding", choices=("stage1", "stage2"),
                   help="with --nproc: partition the optimizer across the ranks (stage1: its state, each rank "
                        "updating its share of the parameters; stage2: the gradients too), as PaddleNLP's "
                        "sharding; the updates and checkpoints are those of plain data parallelism")
    return g


def check_output(path: Path, resume: bool, overwrite: bool) -> None:
    """Refuses, before any work, an --output the run cannot use the way it was asked to (in a
    rank of a launched job: the launching process has checked it)."""
    from ..training.checkpoints import latest_checkpoint

    if distributed.launched():
        return
    if resume and overwrite:
        raise ValueError("--resume continues the run in --output, --overwrite starts afresh over it: pass one")
    if path.exists() and not path.is_dir():
        raise ValueError(f"--output {path} is a file, not a folder: choose another path")
    existing = next(p for p in (path, *path.parents) if p.exists())  # what the run's mkdir starts from
    if not existing.is_dir() or not os.access(existing, os.W_OK | os.X_OK):
        why = "is a file" if not existing.is_dir() else "is not writable"
        raise ValueError(f"--output {path} cannot be created: {existing} {why}; choose another place")
    earlier = latest_checkpoint(path) is not None
    holds_files = path.is_dir() and any(path.iterdir())
    if resume and not earlier:
        raise ValueError(f"--resume: {path} holds no complete checkpoint-<step> folder to resume from; "
                         + ("pass --overwrite instead to start afresh over its files" if holds_files
                            else "run without --resume to start afresh"))
    if holds_files and not (resume or overwrite):
        if earlier:
            raise ValueError(f"--output {path} holds checkpoints of an earlier run: pass --resume to continue "
                             "it, or --overwrite to start afresh (its checkpoints are deleted)")
        raise ValueError(f"--output {path} already holds files: pass --overwrite to train into it anyway "
                         "(files of the same names are replaced), or choose another folder")


def train_args(args, lr: float, **extra):
    """TrainArgs from the parsed training flags (``lr`` when --lr was not given)."""
    from ..training.trainer import TrainArgs

    return TrainArgs(
        max_length=args.max_length, batch_size=args.batch_size, grad_accum=args.grad_accum, epochs=args.epochs,
        max_steps=args.max_steps, lr=args.lr if args.lr is not None else lr, warmup_steps=args.warmup_steps,
        schedule=args.schedule, weight_decay=args.weight_decay, max_grad_norm=args.max_grad_norm or None,
        eval_steps=args.eval_steps, save_steps=args.save_steps, save_total_limit=args.save_total_limit,
        seed=args.seed, sharding=getattr(args, "sharding", None), **extra)
