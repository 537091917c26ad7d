"""``anychip models``: fetch models into the local cache and list what is there."""

from __future__ import annotations


def add_parser(sub, common):
    p = sub.add_parser("models", parents=[common], help="fetch and list models",
                       description="Models live in $ANYCHIP_CACHE_DIR/models (default ~/.cache/anychip). "
                                   "`pull NAME` fetches a known model and verifies it; `list` shows the known "
                                   "models and which are cached. Commands that need a model pull it on first use.")
    actions = p.add_subparsers(dest="action", metavar="ACTION", required=True)
    pull = actions.add_parser("pull", help="fetch a known model into the cache and verify it")
    pull.add_argument("name", help="a known model, e.g. smollm2")
    actions.add_parser("list", help="show known and cached models")
    export = actions.add_parser("export", help="write a model as a Hugging Face folder (float32 safetensors)",
                                description="Writes config.json, model.safetensors (float32: quantized weights "
                                            "dequantized), tokenizer.json and tokenizer_config.json: what "
                                            "transformers' AutoModelForCausalLM.from_pretrained reads, e.g. on "
                                            "PyTorch's anychip device (anychip.torch).")
    export.add_argument("name", help="a known model (smollm2), a .gguf file or a Hugging Face folder")
    export.add_argument("output", help="the folder to write (created; must not hold another model)")


def run(args) -> int:
    from .. import hub

    if args.action == "export":
        from ..export import write_hf_folder
        from ..loader import load_checkpoint

        ckpt = load_checkpoint(hub.resolve(args.name), weights="float")
        print(f"{args.name}: {write_hf_folder(args.output, ckpt.config, ckpt.tensors, ckpt.tokenizer)}")
        return 0
    if args.action == "pull":
        path = hub.pull(args.name)
        print(f"{args.name}: {path}")
        return 0
    present = {entry.name: entry for entry in hub.cached()}
    rows = [("NAME", "CACHED", "SIZE", "PATH")]
    for name in sorted(hub.MODELS):
        entry = present.get(name)
        if entry is None:
            rows.append((name, "no", "-", str(hub.model_path(name))))
        else:
            state = "yes" if entry.verified else "CORRUPT (pull again)"
            rows.append((name, state, f"{entry.size / 2**20:.0f} MiB", str(entry.path)))
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    for r in rows:
        print("  ".join(v.ljust(w) for v, w in zip(r, widths)).rstrip())
    return 0
