"""``anychip dpo``: Direct Preference Optimization (full or LoRA) on preference pairs."""

from __future__ import annotations

import sys
from pathlib import Path

from .session import DEFAULT_MODEL
from .training_flags import (add_lora_flags, add_run_flags, add_training_flags, chat_model, check_output,
                             lora_config, launch_ranks, train_args, training_device)


def add_parser(sub, common):
    p = sub.add_parser(
        "dpo", parents=[common], help="align a model on preference pairs (DPO, full or LoRA)",
        description="Direct Preference Optimization on PaddleNLP's preference format: one JSON object per line, "
                    "{\"src\": question or [turns], \"tgt\": [earlier answers], \"response\": [chosen, rejected]}. "
                    "The reference model's log-probabilities are computed once on the device (with --lora the "
                    "frozen base is the reference). --zero-padding packs each prompt once with both responses "
                    "(a shared-question FlashMask keeps the responses apart). Writes checkpoints, metrics.jsonl "
                    "(loss, rewards of chosen and rejected, margin, accuracy) and loss.png into --output, then "
                    "the model or adapter. Example: anychip dpo --lora --zero-padding --data "
                    "models/training/sample_preferences --output runs/anychip-dpo")
    p.add_argument("--model", default=DEFAULT_MODEL, metavar="M",
                   help=f"model to align (and the reference): a known name (default {DEFAULT_MODEL}), a .gguf file "
                        "or a Hugging Face folder (an SFT run's output, say); weights dequantized to float32")
    p.add_argument("--data", required=True, metavar="PATH",
                   help="a .jsonl file, or a folder with train.jsonl (and dev.jsonl for evaluation)")
    p.add_argument("--eval-data", metavar="PATH", help="evaluation jsonl (default: the data folder's dev.jsonl)")
    p.add_argument("--chat-template", metavar="FILE",
                   help="a PaddleNLP chat_template.json; default: the model's own chat template")
    p.add_argument("--on-bad-record", choices=("skip", "fail"), default="skip",
                   help="a malformed record is reported with its line number and skipped (default), or stops the run")
    add_run_flags(p)

    g = p.add_argument_group("DPO")
    g.add_argument("--beta", type=float, default=0.1, metavar="B",
                   help="strength of the pull towards the reference (default 0.1)")
    g.add_argument("--loss", choices=("sigmoid", "ipo"), default="sigmoid",
                   help="sigmoid: the DPO loss (default); ipo: the squared IPO loss")
    g.add_argument("--label-smoothing", type=float, default=0.0, metavar="S",
                   help="with --loss sigmoid: the assumed share of flipped preference labels (default 0)")

    add_lora_flags(p, "train LoRA adapters on a frozen base (the reference)")

    g = add_training_flags(p, 512, "peak learning rate (default 5e-5 with --lora, 5e-7 otherwise)",
                           "tokens of a prompt and its two responses together (default 512)")
    g.add_argument("--zero-padding", action="store_true",
                   help="shared-prompt packing: each prompt once with both responses, several pairs to a sequence")


def run(args) -> int:
    check_output(Path(args.output), args.resume, args.overwrite)  # before the imports: Paddle's take seconds
    if (status := launch_ranks(args)) is not None:
        return status
    from ..tensor_parallel import check as check_tensor_parallel
    from ..training.data import format_bad_records
    from ..training.distributed import join
    from ..training.dpo import DpoTrainer
    from ..training.model import TrainableModel
    from ..training.preference import PreferenceData, load_preference_data
    from ..training.trainer import device_label

    device = training_device(args)
    path, base, fmt = chat_model(args)
    train, bad = load_preference_data(args.data, fmt, args.max_length, on_bad=args.on_bad_record)
    if bad:
        print(format_bad_records(args.data, bad), file=sys.stderr)
    dev = []
    folder = Path(args.data)
    if args.eval_data or (folder.is_dir() and (folder / "dev.jsonl").is_file()):
        dev, dev_bad = load_preference_data(args.eval_data or folder, fmt, args.max_length, on_bad=args.on_bad_record,
                                            split="train" if args.eval_data else "dev")
        if dev_bad:
            print(format_bad_records(args.eval_data or folder, dev_bad, split="train" if args.eval_data else "dev"),
                  file=sys.stderr)
    lora = lora_config(args, path)
    # before the process groups, as finetune does: every rank refuses a degree alike
    check_tensor_parallel(base.config, args.tensor_parallel)
    world = join(device, args.tensor_parallel)
    model = TrainableModel(base, device, lora=lora, recompute=args.recompute, seed=args.seed,
                           compute_dtype=args.compute_dtype, tp=world.tp)
    trainer = DpoTrainer(model, base, PreferenceData(train), PreferenceData(dev),
                         train_args(args, 5e-5 if args.lora else 5e-7, zero_padding=args.zero_padding), args.output,
                         beta=args.beta, loss=args.loss, label_smoothing=args.label_smoothing, world=world)
    print(f"dpo on {device_label(device)}: {len(train)} pairs ({len(bad)} skipped), {len(dev)} for evaluation; "
          f"{'LoRA' if lora else 'full'} training for {trainer.total_steps} steps, {args.loss} loss, beta "
          f"{args.beta}, {'shared-prompt packing' if args.zero_padding else 'unpacked pairs'}", file=sys.stderr)
    last = trainer.train(resume=args.resume, overwrite=args.overwrite)
    summary = f"done: step {last.get('step', trainer.step)}, loss {last.get('loss', float('nan')):.4f}"
    if "eval_reward_accuracy" in last:
        summary += (f", dev preference accuracy {last['eval_reward_accuracy']:.0%}, margin "
                    f"{last['eval_reward_margin']:.3f}")
    print(f"{summary}. Model in {args.output}: try `anychip generate --model {args.output} ...`", file=sys.stderr)
    return 0
