"""``anychip serve``: an OpenAI-compatible HTTP server with continuous batching and a chat page."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from ..serving.limits import BODY_BYTES_PER_TOKEN, MIN_MAX_BODY_BYTES, default_max_body_bytes
from .session import add_model_flags, add_parallel_flags, launch_tensor_parallel, open_session


def add_parser(sub, common):
    p = sub.add_parser(
        "serve", parents=[common], help="serve a model over an OpenAI-compatible HTTP API, with a chat page",
        description="Serve a model on any device: /v1/chat/completions and /v1/completions (OpenAI's request "
                    "and response shapes, stream: true as server-sent events), /v1/models, /health, /metrics "
                    "(Prometheus) and a chat page at /. Requests join the running batch between decode steps "
                    "(continuous batching). Example: anychip serve --device npu --port 8000, then open "
                    "http://127.0.0.1:8000/ or point any OpenAI client at http://127.0.0.1:8000/v1.")
    add_model_flags(p)
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1: this machine only)")
    p.add_argument("--port", type=int, default=8000, help="port to listen on (default 8000)")
    p.add_argument("--max-batch", type=int, default=16, metavar="N",
                   help="requests decoding together, one KV cache row (a block table) each (default 16)")
    p.add_argument("--max-len", type=int, default=None, metavar="N",
                   help="tokens one request may hold, prompt and completion together (default 1024, or the "
                        "model's context if shorter). The paged KV cache grows with the blocks requests fill, up to "
                        "max-batch x max-len tokens")
    p.add_argument("--kv-block-size", type=int, default=32, metavar="N",
                   help="token slots per block of the paged KV cache, and the unit of prefix sharing (default 32)")
    p.add_argument("--max-tokens-in-flight", type=int, default=None, metavar="N",
                   help="prompt plus max_tokens summed over the running requests; more wait in the queue "
                        "(default: max-batch x max-len, every slot)")
    p.add_argument("--max-queue", type=int, default=256, metavar="N",
                   help="requests that may wait for a row; beyond, new ones get 503 (default 256)")
    p.add_argument("--api-key", metavar="KEY", default=os.environ.get("ANYCHIP_API_KEY"),
                   help="require 'Authorization: Bearer KEY' on every /v1 request, 401 otherwise (default: "
                        "$ANYCHIP_API_KEY, else none); /health and the chat page stay open, and the page asks "
                        "for the key")
    p.add_argument("--allowed-origins", metavar="ORIGINS", default="",
                   help="comma-separated web origins (e.g. http://localhost:3000,https://app.example, or * for "
                        "any) whose pages may call the server; by default a browser request from any other "
                        "origin than the server's own page gets 403")
    p.add_argument("--max-body-bytes", type=int, default=None, metavar="N",
                   help="largest request body taken; a larger one gets 413 as soon as it is known to be larger "
                        f"(default {MIN_MAX_BODY_BYTES} bytes, or {BODY_BYTES_PER_TOKEN} per token of --max-len "
                        "where that is more)")
    p.add_argument("--no-prefix-cache", action="store_true",
                   help="prefill every prompt whole, instead of sharing the cached KV blocks of the longest run "
                        "of whole blocks of the prompt that an earlier request had (a system prompt, say)")
    p.add_argument("--exact-batches", action="store_true",
                   help="decode steps of four or more requests multiply exactly, in float32, as fewer requests' "
                        "do. By default they quantize the activations that meet quantized weights to int8 (per "
                        "32 to 128 values, as --int8-activations), so that the weights are unpacked once for "
                        "all requests and summed with int8 dot products: about twice the throughput under "
                        "load, logits within about 0.5%% of the exact ones. A lone request is always exact")
    p.add_argument("--served-name", metavar="NAME", help="the model id clients send (default: the --model value)")
    p.add_argument("--log-level", default="warning", choices=("critical", "error", "warning", "info", "debug"),
                   help="uvicorn's log level (default warning)")
    add_parallel_flags(p, "rank 0 runs the engine and the HTTP server, the others follow its every step")


def run(args) -> int:
    import uvicorn

    from ..serving.engine import Engine, EngineConfig
    from ..serving.server import ServedModel, ServerConfig, create_app

    if not 0 <= args.port <= 65535:
        raise ValueError(f"--port must be in 0..65535, got {args.port}")
    # checked before the model loads; without --max-len, a row is at most 1024 tokens
    body_cap = default_max_body_bytes(args.max_len or 1024) if args.max_body_bytes is None else args.max_body_bytes
    server_config = ServerConfig(bind_host=args.host, allowed_origins=set(args.allowed_origins.split(",")),
                                 api_key=args.api_key or None, max_body_bytes=body_cap)
    if (status := launch_tensor_parallel(args)) is not None:
        return status
    args.batch_int8 = not (args.exact_batches or args.bf16 or args.int8_activations)
    session = open_session(args)
    model = session.generator.model
    config = EngineConfig(max_batch=args.max_batch, max_len=args.max_len or min(1024, model.context),
                          max_tokens_in_flight=args.max_tokens_in_flight, max_queue=args.max_queue,
                          prefix_cache=not args.no_prefix_cache, block_size=args.kv_block_size)
    if model.tp is not None:
        from ..serving.lockstep import LeaderModel, follow

        if not session.main:  # a tensor-parallel rank other than 0: rank 0's engine drives it
            config.validate(model.context)
            follow(model, model.new_paged_cache(config.max_batch, config.max_len, config.block_size,
                                                config.initial_blocks))
            return 0
        model = LeaderModel(model)
    engine = Engine(model, session.tokenizer, config, fused=session.generator.fused)
    name = args.served_name or (Path(args.model).name if Path(args.model).exists() else args.model)
    served = ServedModel(name, {session.model_name, args.model}, session.device, session.simulated, session.weights)
    note = " (simulated: host speed)" if session.simulated else ""
    if session.generator.model.batches_int8():
        note += ("; decode steps of 4+ requests take int8 activations (--exact-batches: exact), reading a "
                 f"panel-ordered copy of the quantized weights ({engine.panel_bytes / 2**20:.0f} MiB)")
    cache = (f"a paged KV cache of blocks of {config.block_size} tokens, {engine.cache_bytes / 2**20:.0f} MiB now, "
             f"growing as needed up to {engine.fixed_cache_bytes / 2**20:.0f} MiB for {config.max_batch} requests "
             f"of {config.max_len} tokens" if engine.blocks is not None else
             f"{config.max_batch} rows x {config.max_len} tokens of KV cache ({engine.cache_bytes / 2**20:.0f} MiB)")
    print(f"anychip serve: {name} on {session.device}{note}, {cache}; http://{args.host}:{args.port}/",
          file=sys.stderr)
    engine.start()
    try:
        uvicorn.run(create_app(engine, served, server_config), host=args.host, port=args.port, log_level=args.log_level)
    finally:
        engine.stop()
        if hasattr(model, "stop"):  # the followers of a tensor-parallel engine end with it
            model.stop()
    return 0
