"""The HTTP side of ``anychip serve``: a Starlette app exposing the engine through OpenAI's API
(``/v1/chat/completions``, ``/v1/completions``, ``/v1/models``), vLLM's tokenizer endpoints
(``/tokenize``, ``/detokenize``, ``/tokenizer_info``: what lm-evaluation-harness's ``remote``
tokenizer reads), ``/health``, Prometheus ``/metrics`` and the chat page at ``/``.

Handlers run on the event loop and never touch the model: they parse and check a request, hand
it to the :class:`~.engine.Engine`, and relay its events (delivered from the engine's thread
through a :class:`_Relay`) as one JSON response or as server-sent events. A client that
goes away cancels its request, which frees its cache row at the engine's next step.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import threading
import weakref
from dataclasses import dataclass
from pathlib import Path

from starlette.applications import Starlette
from starlette.requests import ClientDisconnect, Request
from starlette.responses import HTMLResponse, JSONResponse, PlainTextResponse, StreamingResponse
from starlette.routing import Route

from .access import Guard, ServerConfig
from .engine import Engine, EngineBusy, Event, RequestTooLong
from .openai_api import APIError, Shaper, check_model, parse

PAGE = Path(__file__).with_name("static") / "chat.html"


@dataclass
class ServedModel:
    """What the server says about itself."""

    id: str              # the name clients put in "model"
    aliases: set[str]    # other names accepted for it
    device: str
    simulated: bool
    weights: str

    @property
    def fingerprint(self) -> str:
        return f"anychip-{self.device}" + ("-simulated" if self.simulated else "")


def _error(e: APIError) -> JSONResponse:
    return JSONResponse(e.body(), status_code=e.status)


def _sse(obj) -> str:
    return f"data: {json.dumps(obj, ensure_ascii=False)}\n\n"


async def _body(request: Request, limit: int) -> bytes:
    """The request body, read as it arrives and refused (413) as soon as it passes ``limit``
    bytes, so that a huge body costs neither the memory nor the time to receive it whole."""
    chunks, size = [], 0
    try:
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                raise APIError(413, f"the request body is larger than this server takes ({limit} bytes, "
                                    "--max-body-bytes)", code="request_too_large")
            chunks.append(chunk)
    except ClientDisconnect:  # nobody will read the answer; this keeps it out of the error log
        raise APIError(400, "the client went away before sending the whole body") from None
    return b"".join(chunks)


async def _json(request: Request, limit: int):
    """The request body (at most ``limit`` bytes) parsed as JSON, or a 400 saying why not."""
    raw = await _body(request, limit)
    try:
        return json.loads(raw)
    except ValueError as e:  # bad JSON, bad UTF-8, or an integer of more digits than Python reads
        raise APIError(400, f"the request body is not valid JSON: {e}") from None
    except RecursionError:
        raise APIError(400, "the request body is nested too deeply to be a request") from None


class _Relay:
    """Carries events from the engine's thread into one event loop's queues, waking the loop
    once for the events that arrive together (a decode step's, one per stream) rather than once
    each: every wake-up is a write to the loop's self-pipe, and the loop then takes the GIL from
    the engine thread. One a stream took 4% of the engine thread's time at 16 streams."""

    def __init__(self, loop: asyncio.AbstractEventLoop):
        # weakly: the app keeps its relays by their loop, weakly too, so a closed loop goes
        self._loop, self._lock, self._pending = weakref.ref(loop), threading.Lock(), []

    def put(self, queue: asyncio.Queue, item) -> None:
        """From any thread; raises RuntimeError if the loop has closed."""
        with self._lock:
            self._pending.append((queue, item))
            if len(self._pending) > 1:  # a wake-up is on its way and will take this one too
                return
        loop = self._loop()
        if loop is None:
            raise RuntimeError("the event loop is gone")
        loop.call_soon_threadsafe(self._drain)

    def _drain(self) -> None:
        with self._lock:
            pending, self._pending = self._pending, []
        for queue, item in pending:
            queue.put_nowait(item)


def create_app(engine: Engine, served: ServedModel, config: ServerConfig | None = None):
    """The server's ASGI app: the routes behind ``config``'s checks (default: loopback only,
    no API key)."""
    config = config or ServerConfig()
    rejected: dict[int, int] = {}
    names = {served.id} | served.aliases
    relays: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Relay] = weakref.WeakKeyDictionary()

    def refuse(e: APIError) -> JSONResponse:
        rejected[e.status] = rejected.get(e.status, 0) + 1
        return _error(e)

    async def completions(request: Request, kind: str):
        try:
            body = await _json(request, config.max_body_bytes)
            if isinstance(body, dict):
                check_model(body, served.id, names)
            parsed = parse(body, kind, engine.tokenizer, engine.config.max_len)
            loop = asyncio.get_running_loop()
            relay = relays.setdefault(loop, _Relay(loop))
            events: asyncio.Queue[tuple[int, Event]] = asyncio.Queue()

            def deliverer(index: int):
                def deliver(event: Event) -> None:
                    try:
                        relay.put(events, (index, event))
                    except RuntimeError:  # the loop has closed: nobody is listening
                        pass
                return deliver

            handles = []
            try:
                for index in range(parsed.n):  # n choices: n requests, the seed (if any) stepped per choice
                    params = parsed.params
                    if index and params.seed is not None:
                        params = dataclasses.replace(params, seed=(params.seed + index) % 2**64)
                    handles.append(engine.submit(parsed.prompt, params, deliverer(index)))
            except (RequestTooLong, EngineBusy, ValueError) as e:
                for handle in handles:
                    handle.cancel()
                if isinstance(e, RequestTooLong):
                    raise APIError(400, str(e), code="context_length_exceeded") from None
                if isinstance(e, EngineBusy):
                    raise APIError(503, str(e), code="overloaded", kind="server_error") from None
                raise APIError(400, str(e)) from None
        except APIError as e:
            return refuse(e)
        shaper = Shaper(kind, served.id, served.fingerprint, engine.tokenizer, parsed.echo)
        reply = _Reply(handles, shaper, parsed)
        if parsed.stream:
            return StreamingResponse(_stream(reply, events), media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache"})
        return await _collect(request, reply, events)

    async def chat_completions(request: Request):
        return await completions(request, "chat")

    async def text_completions(request: Request):
        return await completions(request, "completion")

    async def json_body(request: Request) -> dict:
        body = await _json(request, config.max_body_bytes)
        if not isinstance(body, dict):
            raise APIError(400, f"the request body must be a JSON object, got {type(body).__name__}")
        return body

    async def tokenize(request: Request):
        """vLLM's /tokenize: {"prompt": text, "add_special_tokens": true} (or "messages", through
        the chat template) -> {"count", "max_model_len", "tokens"}."""
        try:
            body = await json_body(request)
            tok = engine.tokenizer
            if "messages" in body:
                if not tok.has_chat_template:
                    raise APIError(400, "this model has no chat template; send a prompt", "messages")
                messages = body["messages"]
                if not isinstance(messages, list) or not all(isinstance(m, dict) for m in messages):
                    raise APIError(400, "messages must be a list of {role, content} objects", "messages")
                try:
                    text = tok.apply_chat_template(messages, add_generation_prompt=bool(
                        body.get("add_generation_prompt", True)))
                except Exception as e:
                    raise APIError(400, f"the chat template refused the messages: {e}", "messages") from None
                special = False  # the template writes its own bos
            else:
                text = body.get("prompt")
                if not isinstance(text, str):
                    raise APIError(400, f"prompt must be a string, got {type(text).__name__}", "prompt")
                special = body.get("add_special_tokens", True)
                if not isinstance(special, bool):
                    raise APIError(400, "add_special_tokens must be true or false", "add_special_tokens")
            tokens = await asyncio.to_thread(tok.encode, text, special and tok.add_bos)
        except APIError as e:
            return refuse(e)
        return JSONResponse({"count": len(tokens), "max_model_len": engine.config.max_len, "tokens": tokens})

    async def detokenize(request: Request):
        """vLLM's /detokenize: {"tokens": [ids]} -> {"prompt": text}."""
        try:
            body = await json_body(request)
            tokens, vocab = body.get("tokens"), engine.tokenizer.vocab_size
            if not isinstance(tokens, list) or not all(isinstance(t, int) and not isinstance(t, bool) and
                                                       0 <= t < vocab for t in tokens):
                raise APIError(400, f"tokens must be a list of token ids in [0, {vocab})", "tokens")
            text = await asyncio.to_thread(engine.tokenizer.decode, tokens, False)
        except APIError as e:
            return refuse(e)
        return JSONResponse({"prompt": text})

    async def tokenizer_info(_request: Request):
        tok = engine.tokenizer
        return JSONResponse({"tokenizer_class": "anychip", "bos_token": tok.bos_token or None,
                             "eos_token": tok.eos_token or None, "pad_token": None,
                             "add_bos_token": tok.add_bos, "chat_template": tok.chat_template,
                             "model_max_length": engine.config.max_len, "vocab_size": tok.vocab_size})

    async def models(_request: Request):
        return JSONResponse({"object": "list", "data": [
            {"id": served.id, "object": "model", "created": 0, "owned_by": "anychip",
             "device": served.device, "simulated": served.simulated, "weights": served.weights,
             "max_model_len": engine.config.max_len}]})

    async def health(_request: Request):
        alive = engine.alive
        about = {"model": served.id, "device": served.device, "simulated": served.simulated, **engine.snapshot(),
                 "max_batch": engine.config.max_batch, "max_len": engine.config.max_len}
        if not alive:  # a server whose engine died must not look healthy to a load balancer
            return JSONResponse({"status": "error", "error": f"the engine is not running: {engine.failure or 'stopped'}",
                                 **about}, status_code=503)
        return JSONResponse({"status": "ok", **about})

    async def metrics(_request: Request):
        return PlainTextResponse(render_metrics(engine, served, rejected),
                                 media_type="text/plain; version=0.0.4; charset=utf-8")

    async def page(_request: Request):
        return HTMLResponse(PAGE.read_text(encoding="utf-8"))

    async def not_found(request: Request, _exc):
        return _error(APIError(404, f"no route {request.method} {request.url.path}", code="not_found"))

    async def not_allowed(request: Request, _exc):
        return _error(APIError(405, f"{request.method} is not allowed on {request.url.path}", code="method_not_allowed"))

    async def failed(_request: Request, exc: Exception):  # a bug, not the client's fault: still JSON
        said = str(exc).encode("utf-8", "backslashreplace").decode()  # JSON must encode it
        return _error(APIError(500, f"the server failed on this request: {type(exc).__name__}: {said}",
                               code="internal_error", kind="server_error"))

    return Guard(Starlette(routes=[
        Route("/", page),
        Route("/health", health),
        Route("/metrics", metrics),
        Route("/v1/models", models),
        Route("/tokenize", tokenize, methods=["POST"]),
        Route("/detokenize", detokenize, methods=["POST"]),
        Route("/tokenizer_info", tokenizer_info),
        Route("/v1/chat/completions", chat_completions, methods=["POST"]),
        Route("/v1/completions", text_completions, methods=["POST"]),
    ], exception_handlers={404: not_found, 405: not_allowed, Exception: failed}), config, refuse)


async def _disconnected(request: Request) -> None:
    """Returns when the client hangs up: after the body, the next ASGI message is the disconnect.
    (Waiting on it, not polling between events: tokens arrive faster than any poll interval, so a
    poll that waited for a quiet moment never came while the request generated.)"""
    while (await request.receive())["type"] != "http.disconnect":
        pass


class _Reply:
    """One request's choices as their events arrive: their text and how each ended."""

    def __init__(self, handles: list, shaper: Shaper, parsed):
        self.handles, self.shaper, self.parsed = handles, shaper, parsed
        self.parts = [[] for _ in handles]
        self.done = [None] * len(handles)

    @property
    def wants_logprobs(self) -> bool:
        return self.parsed.params.logprobs is not None

    def cancel(self) -> None:
        for handle in self.handles:
            handle.cancel()

    def echoed(self, prompt_logprobs: list) -> dict:
        """The echoed prompt's logprobs fields (completions with echo), for a choice's first piece."""
        return dict(prompt=prompt_logprobs, first_prompt_token=self.parsed.prompt[0])

    def full(self) -> dict:
        shaper, echo = self.shaper, self.parsed.echo
        choices, completion_tokens = [], 0
        for index, c in enumerate(self.done):
            text = "".join(self.parts[index])
            logprobs = None
            if self.wants_logprobs:
                extra = self.echoed(c.prompt_logprobs) if echo is not None else {}
                logprobs = shaper.logprobs(c.logprobs, **extra)
            choices.append(shaper.choice(index, (echo or "") + text, c.finish_reason, logprobs))
            completion_tokens += len(c.tokens)
        return shaper.full(choices, self.done[0].prompt_tokens, completion_tokens)


async def _collect(request: Request, reply: _Reply, events: asyncio.Queue) -> JSONResponse:
    """Waits for every choice's whole completion, cancelling them if the client disconnects
    meanwhile."""
    gone = asyncio.ensure_future(_disconnected(request))
    try:
        while True:
            got = asyncio.ensure_future(events.get())
            await asyncio.wait({got, gone}, return_when=asyncio.FIRST_COMPLETED)
            if not got.done():
                got.cancel()
                reply.cancel()
                return JSONResponse({}, status_code=499)
            index, event = got.result()
            if event.kind == "text":
                reply.parts[index].append(event.text)
            elif event.kind == "error":
                reply.cancel()
                return _error(APIError(500, event.error, code="generation_failed", kind="server_error"))
            else:
                reply.done[index] = event.completion
                if all(c is not None for c in reply.done):
                    return JSONResponse(reply.full())
    except asyncio.CancelledError:
        reply.cancel()
        raise
    finally:
        gone.cancel()


async def _stream(reply: _Reply, events: asyncio.Queue):
    """Server-sent events as OpenAI sends them (each choice's chunks carry its index); closing
    the stream early cancels the request."""
    shaper, parsed = reply.shaper, reply.parsed
    finished = False
    offsets = [len(parsed.echo or "")] * len(reply.handles)  # text_offset of each choice's next token
    # echo with logprobs: a choice's first chunk waits for its prompt's log-probabilities (its prefill)
    echo_logprobs = parsed.echo is not None and reply.wants_logprobs
    started = [not echo_logprobs] * len(reply.handles)
    try:
        for index in range(len(reply.handles)):
            if started[index]:
                yield _sse(shaper.chunk(text="" if shaper.kind == "chat" else parsed.echo, first=True, index=index))
        while True:
            index, event = await events.get()
            if event.kind == "error":
                finished = True
                yield _sse(APIError(500, event.error, code="generation_failed", kind="server_error").body())
                break
            if not started[index]:
                started[index] = True
                prompt = event.prompt_logprobs if event.kind == "text" else event.completion.prompt_logprobs
                echoed = shaper.logprobs([], **reply.echoed(prompt))
                offsets[index] = sum(len(t) for t in echoed["tokens"])
                yield _sse(shaper.chunk(text=parsed.echo, first=True, index=index, logprobs=echoed))
            logprobs = None
            if reply.wants_logprobs and (event.logprobs or event.kind == "done"):
                logprobs = shaper.logprobs(event.logprobs, offset=offsets[index])
                if shaper.kind != "chat":
                    offsets[index] += sum(len(t) for t in logprobs["tokens"])
            if event.kind == "text":
                yield _sse(shaper.chunk(text=event.text, index=index, logprobs=logprobs))
                continue
            c = event.completion
            reply.done[index] = c
            yield _sse(shaper.chunk(finish_reason=c.finish_reason, index=index, logprobs=logprobs))
            if all(d is not None for d in reply.done):
                finished = True
                if parsed.include_usage:
                    yield _sse(shaper.usage_chunk(c.prompt_tokens, sum(len(d.tokens) for d in reply.done)))
                break
        yield "data: [DONE]\n\n"
    finally:
        if not finished:
            reply.cancel()


def render_metrics(engine: Engine, served: ServedModel, rejected: dict[int, int]) -> str:
    """The Prometheus text exposition of the engine's counters and gauges."""
    m, now = engine.metrics, engine.snapshot()
    out = []

    def metric(name, kind, help_text, samples):
        out.append(f"# HELP anychip_{name} {help_text}")
        out.append(f"# TYPE anychip_{name} {kind}")
        for labels, value in samples:
            label = "{" + ",".join(f'{k}="{v}"' for k, v in labels.items()) + "}" if labels else ""
            out.append(f"anychip_{name}{label} {value}")

    metric("info", "gauge", "The served model and device (simulated: host speed).",
           [({"model": served.id, "device": served.device, "simulated": str(served.simulated).lower()}, 1)])
    metric("requests_total", "counter", "Requests that left the engine, by outcome.",
           [({"outcome": k}, v) for k, v in sorted(m.requests.items())])
    metric("rejected_requests_total", "counter", "Requests refused before generation, by HTTP status.",
           [({"status": str(k)}, v) for k, v in sorted(rejected.items())])
    metric("prompt_tokens_total", "counter", "Prompt tokens of the requests prefilled.", [({}, m.prompt_tokens)])
    metric("prefix_cache_hit_tokens_total", "counter",
           "Prompt tokens whose keys and values cached blocks held already (not prefilled again).",
           [({}, m.prefix_hit_tokens)])
    metric("prefix_cache_hit_rate", "gauge", "Share of prompt tokens served from the prefix cache since start.",
           [({}, round(m.prefix_hit_tokens / m.prompt_tokens, 4) if m.prompt_tokens else 0.0)])
    metric("completion_tokens_total", "counter", "Tokens generated.", [({}, m.completion_tokens)])
    metric("decode_steps_total", "counter", "Batched decode steps.", [({}, m.decode_steps)])
    metric("decode_seconds_total", "counter", "Time in batched decode calls.", [({}, round(m.decode_s, 6))])
    metric("prefill_seconds_total", "counter", "Time in prefill passes.", [({}, round(m.prefill_s, 6))])
    metric("tokens_per_second", "gauge", "Decode throughput over the last 10 s.", [({}, round(m.tokens_per_second(), 2))])
    metric("queue_depth", "gauge", "Requests waiting for a cache row.", [({}, now["queue_depth"])])
    metric("batch_size", "gauge", "Requests decoding together now.", [({}, now["running"])])
    metric("reserved_tokens", "gauge", "Prompt plus max tokens of the running requests.", [({}, now["reserved_tokens"])])
    metric("kv_cache_bytes", "gauge", "Bytes the KV cache holds now.", [({}, now["kv_cache_bytes"])])
    metric("kv_cache_fixed_bytes", "gauge",
           "Bytes a cache of max-batch rows of max-len tokens would reserve up front (the paged cache's limit).",
           [({}, now["kv_cache_fixed_bytes"])])
    metric("weight_panel_bytes", "gauge",
           "Bytes of the panel-ordered copy of the quantized weights that decode steps of 4+ requests read.",
           [({}, now["weight_panel_bytes"])])
    if "kv_blocks" in now:
        metric("kv_cache_blocks", "gauge", "Blocks of the paged KV cache, by state.",
               [({"state": "allocated"}, now["kv_blocks"]), ({"state": "in_use"}, now["kv_blocks_in_use"]),
                ({"state": "cached_idle"}, now["kv_blocks_cached"]), ({"state": "limit"}, now["kv_blocks_limit"])])
        metric("kv_cache_block_size", "gauge", "Token slots per block.", [({}, now["kv_block_size"])])
    out.append("# HELP anychip_time_to_first_token_seconds From submission to the first generated token.")
    out.append("# TYPE anychip_time_to_first_token_seconds histogram")
    for bound, count in sorted(m.ttft_buckets.items()):  # each bucket already counts every ttft <= its bound
        out.append(f'anychip_time_to_first_token_seconds_bucket{{le="{bound}"}} {count}')
    out.append(f'anychip_time_to_first_token_seconds_bucket{{le="+Inf"}} {m.ttft_count}')
    out.append(f"anychip_time_to_first_token_seconds_sum {round(m.ttft_sum, 6)}")
    out.append(f"anychip_time_to_first_token_seconds_count {m.ttft_count}")
    return "\n".join(out) + "\n"
