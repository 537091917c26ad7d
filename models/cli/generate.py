"""``anychip generate``: complete one or more prompts on a device."""

from __future__ import annotations

import json
import sys

from .session import (add_model_flags, add_parallel_flags, add_sampling_flags, launch_tensor_parallel, open_session,
                      prompt_ids, sampling_params, utf8_text)


def add_parser(sub, common):
    p = sub.add_parser(
        "generate", parents=[common], help="generate text from a prompt",
        description="Generate text with a Llama-family model on any device. Instruct models get the "
                    "prompt wrapped in their chat template (--raw skips that). Several prompts run as one "
                    "batch. Example: anychip generate --device npu \"What is the capital of France?\"")
    p.add_argument("prompts", nargs="+", metavar="PROMPT", help="the prompt text (several: one batch)")
    p.add_argument("--raw", action="store_true", help="feed the prompt as it is, without the chat template")
    p.add_argument("--system", metavar="TEXT", help="a system message for the chat template")
    p.add_argument("--json", action="store_true",
                   help="print one JSON object with the texts, token counts and timings instead of plain text")
    p.add_argument("--framework", choices=("paddle", "torch"), default="paddle",
                   help="paddle (default): anychip's Llama on Paddle; torch: Hugging Face transformers' own Llama "
                        "on PyTorch, the chip as PyTorch's device 'anychip' (needs torch and transformers)")
    add_model_flags(p)
    add_sampling_flags(p)
    add_parallel_flags(p, "rank 0 prints the text")


def run(args) -> int:
    params = sampling_params(args)
    for i, text in enumerate(args.prompts):  # before the model loads: a bad prompt fails at once
        utf8_text("PROMPT" if len(args.prompts) == 1 else f"PROMPT {i + 1}", text)
    if args.system is not None:
        utf8_text("--system", args.system)
    if args.framework == "torch":
        from .torch_generate import run as run_torch

        return run_torch(args, params)
    if (status := launch_tensor_parallel(args)) is not None:
        return status
    session = open_session(args)
    if not session.main:  # the other ranks only compute their share
        session.generator.generate([prompt_ids(session.tokenizer, t, args.raw, args.system) for t in args.prompts],
                                   params)
        return 0
    tok = session.tokenizer
    prompts = [prompt_ids(tok, text, args.raw, args.system) for text in args.prompts]
    stream = not args.json and len(prompts) == 1

    def show(_index: int, piece: str) -> None:
        sys.stdout.write(piece)
        sys.stdout.flush()

    completions, stats = session.generator.generate(prompts, params, on_text=show if stream else None)
    if args.json:
        print(json.dumps({
            "device": session.device, "simulated": session.simulated, "model": session.model_name,
            "weights": session.weights,
            "completions": [{"prompt": text, "text": c.text, "prompt_tokens": c.prompt_tokens,
                             "completion_tokens": len(c.tokens), "finish_reason": c.finish_reason}
                            for text, c in zip(args.prompts, completions)],
            "timings": stats.as_dict()}, indent=2))
        return 0
    if stream:
        print()
    else:
        for text, c in zip(args.prompts, completions):
            print(f"### {text}\n{c.text}\n")
    note = " (simulated device: host speed)" if session.simulated else ""
    print(f"[{session.device}{note}] prefill {stats.prefill_tokens} tokens at {stats.prefill_tok_s:.0f} tok/s, "
          f"decode {stats.decode_tokens} tokens at {stats.decode_tok_s:.1f} tok/s", file=sys.stderr)
    return 0
