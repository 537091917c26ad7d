"""The OpenAI request and response shapes the server speaks: parsing a JSON body into a prompt
and :class:`SamplingParams` (with errors naming the field), and building completion objects and
stream chunks the way the official clients parse them."""

from __future__ import annotations

import math
import reprlib
import time
import uuid
from dataclasses import dataclass

import jinja2

from ..sampling import MAX_LOGPROBS, SamplingParams, TokenLogprob

MAX_STOP = 4  # as OpenAI's API

_REPR = reprlib.Repr()
_REPR.maxstring = _REPR.maxother = 80  # an error quotes what it got, not a megabyte of it


def _shown(value) -> str:
    return _REPR.repr(value)


class APIError(Exception):
    """A request the server refuses: rendered as OpenAI's error object with ``status``."""

    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None,
                 kind: str = "invalid_request_error"):
        super().__init__(message)
        self.status, self.message, self.param, self.code, self.kind = status, message, param, code, kind

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}}


MAX_N = 16               # choices per request
MAX_COMPLETION_LOGPROBS = 5  # /v1/completions' logprobs, as OpenAI's API


@dataclass
class ParsedRequest:
    prompt: list[int]
    params: SamplingParams
    stream: bool
    include_usage: bool
    max_tokens_given: bool
    n: int = 1
    echo: str | None = None  # /v1/completions with echo: the prompt's text, put before each choice's


def _number(body: dict, name: str, default, low=None, high=None, integer=False, low_open=False):
    value = body.get(name)
    if value is None:
        return default
    kinds = (int,) if integer else (int, float)
    if isinstance(value, bool) or not isinstance(value, kinds):
        raise APIError(400, f"{name} must be {'an integer' if integer else 'a number'}, got {_shown(value)}", name)
    # Python's JSON reads NaN (which every bound lets through) and Infinity (which a missing one does)
    if isinstance(value, float) and not math.isfinite(value):
        raise APIError(400, f"{name} must be a finite number, got {value}", name)
    if low is not None and (value <= low if low_open else value < low):
        raise APIError(400, f"{name} must be {'>' if low_open else '>='} {low}, got {value}", name)
    if high is not None and value > high:
        raise APIError(400, f"{name} must be <= {high}, got {value}", name)
    return value


def _flag(body: dict, name: str) -> bool:
    value = body.get(name, False)
    if not isinstance(value, bool):
        raise APIError(400, f"{name} must be true or false, got {_shown(value)}", name)
    return value


def _stop(body: dict) -> list[str]:
    stop = body.get("stop")
    if stop is None:
        return []
    stops = [stop] if isinstance(stop, str) else stop
    if not isinstance(stops, list) or not all(isinstance(s, str) and s for s in stops):
        raise APIError(400, "stop must be a non-empty string or a list of them", "stop")
    if len(stops) > MAX_STOP:
        raise APIError(400, f"stop takes at most {MAX_STOP} sequences, got {len(stops)}", "stop")
    return [_utf8(s, "stop") for s in stops]


def check_model(body: dict, served_id: str, names: set[str]) -> None:
    """``model``, if given, must name the served model (its id, as /v1/models lists it, or an alias)."""
    model = body.get("model")
    if model is None:
        return
    if not isinstance(model, str):
        raise APIError(400, f"model must be a string, got {type(model).__name__}", "model")
    if model not in names:
        raise APIError(404, f"The model {_shown(model)} does not exist; this server serves {served_id!r}", "model",
                       "model_not_found")


def _utf8(text: str, field: str) -> str:
    """``text`` if it encodes as UTF-8: JSON's \\ud800-style escapes can make lone surrogates."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise APIError(400, f"{field} is not valid Unicode text: {e.reason} at character {e.start}", field) from None
    return text


def _message_text(i: int, message) -> dict:
    if not isinstance(message, dict):
        raise APIError(400, f"messages[{i}] must be an object with role and content", f"messages[{i}]")
    role = message.get("role")
    if role not in ("system", "developer", "user", "assistant"):
        raise APIError(400, f"messages[{i}].role must be system, developer, user or assistant, got {_shown(role)}",
                       f"messages[{i}].role")
    content = message.get("content")
    if isinstance(content, list):  # content parts: only text ones
        if not all(isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str) for p in content):
            raise APIError(400, f"messages[{i}].content parts must all be of type text", f"messages[{i}].content")
        content = "".join(p["text"] for p in content)
    if not isinstance(content, str):
        raise APIError(400, f"messages[{i}].content must be a string", f"messages[{i}].content")
    return {"role": "system" if role == "developer" else role, "content": _utf8(content, f"messages[{i}].content")}


def parse(body, kind: str, tokenizer, max_len: int) -> ParsedRequest:
    """The prompt ids and sampling of a ``kind`` ("chat" or "completion") request body."""
    if not isinstance(body, dict):
        raise APIError(400, "the request body must be a JSON object")
    if kind == "chat":
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise APIError(400, "messages must be a non-empty list", "messages")
        if not tokenizer.has_chat_template:
            raise APIError(400, "this model has no chat template; use /v1/completions", "messages")
        turns = [_message_text(i, m) for i, m in enumerate(messages)]
        try:
            text = tokenizer.apply_chat_template(turns, add_generation_prompt=True)
        except jinja2.TemplateError as e:  # e.g. a template that wants user and assistant to alternate
            raise APIError(400, f"the model's chat template refused these messages: {e}", "messages") from None
        prompt = tokenizer.encode(text)
    else:
        raw = body.get("prompt")
        if isinstance(raw, list) and len(raw) == 1 and isinstance(raw[0], (str, list)):
            raw = raw[0]
        if isinstance(raw, str) and raw:
            prompt = tokenizer.encode(_utf8(raw, "prompt"), add_bos=tokenizer.add_bos)
        elif isinstance(raw, list) and raw and all(isinstance(t, int) and not isinstance(t, bool) for t in raw):
            prompt = list(raw)
        else:
            raise APIError(400, "prompt must be a non-empty string or a list of token ids (one prompt per request)",
                           "prompt")
    n = _number(body, "n", 1, low=1, high=MAX_N, integer=True)
    for name in ("presence_penalty", "frequency_penalty"):
        if _number(body, name, 0) != 0:
            raise APIError(400, f"{name} is not supported; use repetition_penalty", name)
    echo = None
    if kind == "chat":
        logprobs = _number(body, "top_logprobs", 0, low=0, high=MAX_LOGPROBS, integer=True) \
            if _flag(body, "logprobs") else None
        if logprobs is None and body.get("top_logprobs") is not None:
            raise APIError(400, "top_logprobs needs logprobs: true", "top_logprobs")
    else:
        logprobs = _number(body, "logprobs", None, low=0, high=MAX_COMPLETION_LOGPROBS, integer=True)
        if _flag(body, "echo"):
            echo = raw if isinstance(raw, str) else tokenizer.decode(prompt, skip_special=False)
    given = body.get("max_completion_tokens", body.get("max_tokens"))
    name = "max_completion_tokens" if "max_completion_tokens" in body else "max_tokens"
    room = max_len - len(prompt)
    if room < 1:
        raise APIError(400, f"the prompt is {len(prompt)} tokens; this server holds at most {max_len} per request, "
                            "prompt and completion together", "messages" if kind == "chat" else "prompt",
                       "context_length_exceeded")
    max_tokens = _number(body, name, room, low=1, integer=True) if given is not None else room
    if max_tokens > room:
        raise APIError(400, f"the prompt ({len(prompt)} tokens) plus {name} ({max_tokens}) exceeds the "
                            f"{max_len} tokens this server holds per request", name, "context_length_exceeded")
    stream = _flag(body, "stream")
    options = body.get("stream_options") or {}
    if not isinstance(options, dict):
        raise APIError(400, "stream_options must be an object", "stream_options")
    params = SamplingParams(
        max_new_tokens=max_tokens,
        temperature=_number(body, "temperature", 1.0, low=0, high=2),
        top_p=_number(body, "top_p", 1.0, low=0, high=1, low_open=True),
        top_k=_number(body, "top_k", 0, low=0, integer=True),
        repetition_penalty=_number(body, "repetition_penalty", 1.0, low=0, low_open=True),
        stop=_stop(body),
        seed=_number(body, "seed", None, low=0, high=2**64 - 1, integer=True),
        ignore_eos=_flag(body, "ignore_eos"),  # vLLM's extension: benchmarks want fixed lengths
        logprobs=logprobs,
        prompt_logprobs=logprobs if echo is not None else None,
    )
    return ParsedRequest(prompt, params, stream, bool(options.get("include_usage")), given is not None, n, echo)


class Shaper:
    """Builds one request's response objects: ``chat`` ones or ``completion`` ones, with the
    tokens' log-probabilities in the kind's own shape where they were asked for."""

    def __init__(self, kind: str, model: str, fingerprint: str, tokenizer=None, echo: str | None = None):
        self.kind, self.model, self.fingerprint, self.tokenizer, self.echo = kind, model, fingerprint, tokenizer, echo
        self.id = ("chatcmpl-" if kind == "chat" else "cmpl-") + uuid.uuid4().hex[:24]
        self.created = int(time.time())

    def _base(self, chunk: bool) -> dict:
        obj = "chat.completion" if self.kind == "chat" else "text_completion"
        return {"id": self.id, "object": obj + (".chunk" if chunk and self.kind == "chat" else ""),
                "created": self.created, "model": self.model, "system_fingerprint": self.fingerprint}

    @staticmethod
    def usage(prompt_tokens: int, completion_tokens: int) -> dict:
        return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                "total_tokens": prompt_tokens + completion_tokens}

    # ---- log-probabilities ---------------------------------------------------------------------

    def _token(self, token_id: int) -> tuple[str, list[int]]:
        raw = self.tokenizer.token_bytes(token_id)
        return raw.decode("utf-8", errors="replace"), list(raw)

    def logprobs(self, entries: list[TokenLogprob] | None, prompt: list[TokenLogprob] | None = None,
                 first_prompt_token: int | None = None, offset: int = 0):
        """``entries`` (None: not asked for) as the kind shows them. Completions: ``prompt`` (echo)
        goes first, its first token (``first_prompt_token``) without a log-probability, and
        ``text_offset`` counts from ``offset`` characters."""
        if entries is None:
            return None
        if self.kind == "chat":
            content = []
            for e in entries:
                text, raw = self._token(e.token)
                top = []
                for token, lp in e.top:
                    t, b = self._token(token)
                    top.append({"token": t, "logprob": lp, "bytes": b})
                content.append({"token": text, "logprob": e.logprob, "bytes": raw, "top_logprobs": top})
            return {"content": content, "refusal": None}
        tokens, token_logprobs, tops, offsets = [], [], [], []
        rows = ([(first_prompt_token, None)] if first_prompt_token is not None else []) + \
            [(e.token, e) for e in (prompt or []) + entries]
        for token, e in rows:
            text = self._token(token)[0]
            tokens.append(text)
            token_logprobs.append(None if e is None else e.logprob)
            tops.append(None if e is None else {self._token(t)[0]: lp for t, lp in e.top})
            offsets.append(offset)
            offset += len(text)
        return {"tokens": tokens, "token_logprobs": token_logprobs, "top_logprobs": tops, "text_offset": offsets}

    # ---- objects -------------------------------------------------------------------------------

    def choice(self, index: int, text: str, finish_reason: str, logprobs=None) -> dict:
        if self.kind == "chat":
            return {"index": index, "message": {"role": "assistant", "content": text}, "logprobs": logprobs,
                    "finish_reason": finish_reason}
        return {"index": index, "text": text, "logprobs": logprobs, "finish_reason": finish_reason}

    def full(self, choices: list[dict], prompt_tokens: int, completion_tokens: int) -> dict:
        return {**self._base(False), "choices": choices, "usage": self.usage(prompt_tokens, completion_tokens)}

    def chunk(self, text: str | None = None, finish_reason: str | None = None, first: bool = False, index: int = 0,
              logprobs=None) -> dict:
        if self.kind == "chat":
            delta = {}
            if first:
                delta["role"] = "assistant"
            if text is not None:
                delta["content"] = text
            choice = {"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish_reason}
        else:
            choice = {"index": index, "text": text or "", "logprobs": logprobs, "finish_reason": finish_reason}
        return {**self._base(True), "choices": [choice]}

    def usage_chunk(self, prompt_tokens: int, completion_tokens: int) -> dict:
        return {**self._base(True), "choices": [], "usage": self.usage(prompt_tokens, completion_tokens)}
