"""``anychip generate --framework torch``: the same prompts through Hugging Face transformers' own
Llama on PyTorch, on the chip's PyTorch device (``anychip.torch``), or torch's CPU for ``cpu``.

The model is exported once to a Hugging Face folder in anychip's cache (float32 weights), which
transformers loads; the prompt is built by anychip's tokenizer and chat template, so both
frameworks see the same token ids.
"""

from __future__ import annotations

import hashlib
import sys
import time
from pathlib import Path

from .session import prompt_ids


def hf_folder(model: str) -> tuple[Path, object]:
    """(a Hugging Face folder of ``model``, its anychip checkpoint): the folder itself when it is
    one, else an export cached under $ANYCHIP_CACHE_DIR/torch."""
    from anychip.native import cache_dir

    from ..export import write_hf_folder
    from ..hub import resolve
    from ..loader import load_checkpoint

    path = resolve(model)
    if path.is_dir():
        return path, load_checkpoint(path)
    stat = path.stat()
    key = hashlib.sha256(f"{path.resolve()}:{stat.st_size}:{stat.st_mtime_ns}".encode()).hexdigest()[:16]
    folder = cache_dir() / "torch" / f"{path.stem}-{key}"
    if (folder / "config.json").exists():  # exported before: its safetensors are only mapped, not dequantized again
        return folder, load_checkpoint(folder)
    print(f"anychip: exporting {path.name} for transformers into {folder}", file=sys.stderr)
    ckpt = load_checkpoint(path, weights="float")
    write_hf_folder(str(folder), ckpt.config, ckpt.tensors, ckpt.tokenizer)
    return folder, ckpt


def run(args, params) -> int:
    try:
        import torch
        from transformers import AutoModelForCausalLM
    except ImportError as exc:
        print(f"anychip generate: --framework torch needs torch and transformers ({exc}); "
              "pip install -r requirements-test.txt", file=sys.stderr)
        return 2
    if args.nproc != 1 or args.tensor_parallel != 1:
        print("anychip generate: --framework torch runs on one device (no --nproc/--tensor-parallel)", file=sys.stderr)
        return 2
    chip, _, index = (args.device or "cpu").partition(":")
    if chip == "cpu":
        device = "cpu"
    else:
        import anychip.torch as at

        at.enable(chip)
        device = f"anychip:{index or 0}"
    folder, ckpt = hf_folder(args.model)
    tok = ckpt.tokenizer
    model = AutoModelForCausalLM.from_pretrained(folder, attn_implementation="sdpa").to(device).eval()
    if params.seed is not None:
        torch.manual_seed(params.seed)
    sample = params.temperature > 0
    stops = sorted(tok.eos_ids)  # the end-of-text and end-of-turn ids, as anychip's generation stops
    options = dict(max_new_tokens=params.max_new_tokens, do_sample=sample, eos_token_id=stops or None,
                   pad_token_id=tok.eos_id)
    if sample:
        options.update(temperature=params.temperature, top_k=params.top_k or None, top_p=params.top_p)
    if params.repetition_penalty != 1.0:
        options["repetition_penalty"] = params.repetition_penalty
    for text in args.prompts:
        ids = torch.tensor([prompt_ids(tok, text, args.raw, args.system)], device=device)
        start = time.perf_counter()
        with torch.no_grad():
            out = model.generate(ids, **options)
        seconds = time.perf_counter() - start
        new = out[0, ids.shape[1]:].cpu().tolist()
        ends = [i for i, t in enumerate(new) if t in stops]
        new = new[:ends[0]] if ends else new
        if len(args.prompts) > 1:
            print(f"### {text}")
        print(tok.decode(new))
        where = f"{device} ({chip}, simulated device: host speed)" if device != "cpu" else "torch cpu"
        print(f"[{where}, transformers] {len(new)} tokens in {seconds:.2f} s", file=sys.stderr)
    if device != "cpu":
        import anychip

        print(anychip.fallback_report(), file=sys.stderr)
    return 0
