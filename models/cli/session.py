"""What the model commands share: their flags, and loading a model onto the chosen device."""

from __future__ import annotations

import sys
from dataclasses import dataclass

from anychip.ops.decoder import CACHE_DTYPES

from ..sampling import SamplingParams
from . import ranks

DEFAULT_MODEL = "smollm2"


def add_model_flags(p) -> None:
    p.add_argument("--model", default=DEFAULT_MODEL, metavar="M",
                   help=f"a known model name (see `anychip models list`; default {DEFAULT_MODEL}, fetched on "
                        "first use), a .gguf file, or a Hugging Face folder (config.json + safetensors)")
    p.add_argument("--weights", choices=("native", "float"), default="native",
                   help="native: keep GGUF-quantized tensors quantized, run through anychip's weight-only "
                        "int8/int4 kernels (default); float: dequantize everything to float32")
    p.add_argument("--int8-activations", action="store_true",
                   help="decode faster by quantizing the activations that meet quantized weights to int8 "
                        "(per 32 to 128 values, as llama.cpp does); logits move by about 0.5%%")
    p.add_argument("--bf16", action="store_true",
                   help="multiply in bfloat16 (AMX tiles where the CPU has them): prefill rounds activations to "
                        "bfloat16, decode reads bfloat16 copies of the weights (2 bytes each). For serving: a "
                        "decode step of 16 requests then costs about two of one; logits move by about "
                        "bfloat16's rounding")
    p.add_argument("--kv-cache", choices=CACHE_DTYPES, default="float32", metavar="DTYPE",
                   help="the KV cache's dtype: float32 (default), bfloat16 or float16. A 16-bit cache holds "
                        "twice the tokens in the same memory and makes long-context decode faster (each step "
                        "reads the whole cache); keys and values are rounded once, as they are stored")
    p.add_argument("--no-fused", action="store_true",
                   help="decode op by op instead of the device's fused decoder_step kernel (for comparison)")


def add_sampling_flags(p, max_new_tokens: int = 128) -> None:
    g = p.add_argument_group("sampling")
    g.add_argument("--max-new-tokens", type=int, default=max_new_tokens, metavar="N",
                   help=f"stop after N new tokens (default {max_new_tokens})")
    g.add_argument("--temperature", type=float, default=0.0, metavar="T",
                   help="0 picks the most likely token every time (greedy, the default); higher is more random")
    g.add_argument("--top-k", type=int, default=0, metavar="K", help="sample among the K likeliest tokens (0: all)")
    g.add_argument("--top-p", type=float, default=1.0, metavar="P",
                   help="sample among the likeliest tokens whose probabilities add up to P (default 1: all)")
    g.add_argument("--repetition-penalty", type=float, default=1.0, metavar="R",
                   help="R > 1 makes tokens already in the text less likely (default 1: off)")
    g.add_argument("--stop", action="append", default=[], metavar="TEXT",
                   help="end the answer where TEXT appears (repeatable); EOS always ends it")
    g.add_argument("--seed", type=int, default=None, help="random seed, for reproducible sampling")


def utf8_text(what: str, text: str) -> str:
    """``text``, refused unless it is valid Unicode. Bytes that are not UTF-8 (in argv, or on a
    stdin read with surrogateescape) reach Python as lone surrogates ("\\udcff" for the byte
    0xff), which the tokenizer cannot encode; ``what`` names the argument in the error."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        code = ord(text[exc.start])
        bad = f"byte 0x{code - 0xDC00:02x}" if 0xDC80 <= code <= 0xDCFF else f"lone surrogate U+{code:04X}"
        raise ValueError(f"{what} is not valid UTF-8 text ({bad} at character {exc.start}); "
                         "pass UTF-8 encoded text") from None
    return text


def sampling_params(args) -> SamplingParams:
    params = SamplingParams(max_new_tokens=args.max_new_tokens, temperature=args.temperature, top_k=args.top_k,
                            top_p=args.top_p, repetition_penalty=args.repetition_penalty,
                            stop=[utf8_text("--stop", s) for s in args.stop], seed=args.seed)
    params.validate()
    return params


@dataclass
class Session:
    generator: object
    tokenizer: object
    device: str
    simulated: bool
    model_name: str
    weights: str
    main: bool = True  # False on the ranks of a tensor-parallel job other than rank 0


def add_parallel_flags(p, what: str) -> None:
    """--nproc and --tensor-parallel of the commands that run a model split across ranks."""
    g = p.add_argument_group("tensor parallelism")
    g.add_argument("--nproc", type=int, default=1, metavar="N",
                   help="run as N ranks under paddle.distributed.launch, rank r on device r of --device's chip "
                        "(with --tensor-parallel N)")
    g.add_argument("--tensor-parallel", type=int, default=1, metavar="K",
                   help="split the model across K ranks (attention by heads, the MLP by its inner features, the "
                        f"vocabulary in chunks; float weights); {what}")


def launch_tensor_parallel(args) -> int | None:
    """With ``--nproc N`` (N > 1) in a process that is not one of the ranks yet: checks the flags
    and runs this command as N tensor-parallel ranks, returning their exit status; else None.
    Sampling needs the same random draws on every rank: a run without --seed gets one here."""
    import random

    from ..training import distributed

    nproc, k = getattr(args, "nproc", 1), getattr(args, "tensor_parallel", 1)
    if distributed.launched():
        return None
    if nproc < 1 or k < 1 or nproc != k:
        raise ValueError(f"--nproc {nproc} and --tensor-parallel {k}: the ranks split one model, so they must be "
                         "equal (and >= 1)")
    if nproc == 1:
        return None
    argv = list(args.argv)
    if hasattr(args, "seed") and args.seed is None:  # (serve: each request brings its own seed)
        argv += ["--seed", str(random.SystemRandom().randrange(2**31))]
    return ranks.launch(args.device, argv, nproc)


def open_session(args) -> Session:
    """Validates the device, finds (or pulls) the model, loads it onto the device (this rank's
    share of it, in a tensor-parallel job)."""
    import anychip
    from anychip.devices import describe

    from ..loader import load_checkpoint
    from ..hub import resolve
    from ..training import distributed

    device = anychip.set_device(ranks.rank_device(args.device))
    simulated = describe(device.split(":")[0]).status == "simulated"
    path = resolve(args.model)
    checkpoint = load_checkpoint(path, weights=args.weights)
    from ..generate import Generator
    from ..llama import LlamaForCausalLM

    name, _, index = device.partition(":")
    world = distributed.join((name, int(index or 0)), getattr(args, "tensor_parallel", 1))
    model = LlamaForCausalLM(checkpoint, device, x_int8=args.int8_activations, bf16=args.bf16,
                             kv_dtype=args.kv_cache, tp=world.tp, batch_int8=getattr(args, "batch_int8", False))
    if world.tp is not None:
        how = ("the fused decode step by half layers" if model.has_fused_decode() and not args.no_fused
               else "decoding op by op")
        print(f"anychip: rank {world.rank} of {world.size} holds 1/{world.tp.size} of the model "
              f"(tensor parallel; {how})", file=sys.stderr)
    if simulated and world.main:
        print(f"anychip: {device} is simulated: its timings are the host CPU's, not the chip's", file=sys.stderr)
    return Session(Generator(model, checkpoint.tokenizer, fused=not args.no_fused), checkpoint.tokenizer, device,
                   simulated, checkpoint.config.name or str(path),
                   args.weights + (", bf16" if args.bf16 else "")
                   + (", int8 activations" if args.int8_activations else "")
                   + (", int8 activations in batches" if model.batches_int8() else "")
                   + (f", {args.kv_cache} KV cache" if args.kv_cache != "float32" else ""), world.main)


def prompt_ids(tokenizer, text: str, raw: bool, system: str | None = None, history: list | None = None) -> list[int]:
    """Token ids of ``text``: as a user turn in the model's chat template (after ``history``),
    or as it is with ``raw`` (or when the model has no chat template)."""
    if raw or not tokenizer.has_chat_template:
        return tokenizer.encode(text, add_bos=tokenizer.add_bos)
    messages = ([{"role": "system", "content": system}] if system else []) + list(history or [])
    messages.append({"role": "user", "content": text})
    return tokenizer.encode(tokenizer.apply_chat_template(messages, add_generation_prompt=True))
