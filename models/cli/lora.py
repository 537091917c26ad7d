"""``anychip lora merge``: fold a LoRA adapter into its base model and write a model folder."""

from __future__ import annotations

import sys


def add_parser(sub, common):
    p = sub.add_parser("lora", parents=[common], help="work with LoRA adapters (merge into a model)",
                       description="`merge` folds an adapter written by `anychip finetune --lora` into its base "
                                   "model (W + alpha/r * B A in float32) and writes a Hugging Face model folder "
                                   "that loads without the adapter. Example: anychip lora merge runs/anychip-lora "
                                   "--output runs/anychip-merged")
    actions = p.add_subparsers(dest="action", metavar="ACTION", required=True)
    merge = actions.add_parser("merge", parents=[common], help="write the base model with the adapter folded in")
    merge.add_argument("adapter", metavar="ADAPTER", help="the adapter folder (lora_config.json + model.safetensors)")
    merge.add_argument("--model", metavar="M",
                       help="the base model (default: the one recorded in the adapter's lora_config.json)")
    merge.add_argument("--output", required=True, metavar="DIR", help="the merged model folder to write")


def run(args) -> int:
    from pathlib import Path

    from ..checkpoint import CheckpointError
    from ..loader import load_checkpoint
    from ..export import write_hf_folder
    from ..hub import resolve
    from ..lora import merge, read_adapter

    config, adapters = read_adapter(Path(args.adapter))
    base_name = args.model or config.base_model
    if not base_name:
        raise CheckpointError(f"{args.adapter}: the adapter names no base model; pass --model")
    merged = merge(load_checkpoint(resolve(base_name), weights="float"), config, adapters)
    folder = write_hf_folder(args.output, merged.config, merged.tensors, merged.tokenizer)
    print(f"merged {len(adapters) // 2} adapters (rank {config.rank}, alpha {config.alpha:g}) into {base_name}: "
          f"{folder}", file=sys.stderr)
    return 0
