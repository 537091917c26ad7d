"""The tokenizer of a checkpoint, on the ``tokenizers`` library: from a Hugging Face tokenizer.json or
rebuilt from GGUF metadata the way llama.cpp reads it (byte-level BPE: tokens, merges, token types
and the named pre-tokenizer), with the checkpoint's chat template rendered as transformers does.

    tok.encode("Hi", add_bos=False) -> [ids]      tok.decode(ids) -> str
    tok.apply_chat_template([{"role": "user", "content": "Hi"}]) -> prompt text
    stream = tok.stream_decoder(); text = "".join(stream.feed(i) for i in generated_ids)
"""

from __future__ import annotations

import json
import traceback
from dataclasses import dataclass
from datetime import datetime
from functools import cached_property
from pathlib import Path

import jinja2
import tokenizers
from jinja2.ext import loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import AddedToken, Regex, decoders, models, pre_tokenizers

from .checkpoint import CheckpointError

# tokenizer.ggml.token_type values (llama.cpp's llama_token_type)
CONTROL, USER_DEFINED = 3, 4

# The pieces GPT-2's byte-level BPE splits text into before merging, and the variants other
# vocabularies were trained with (their tokenizer.json's Split regexes; llama.cpp's
# llama-vocab.cpp lists the same per tokenizer.ggml.pre).
GPT2_SPLIT = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
LLAMA3_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                r"|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
               r"|\s*[\r\n]+|\s+(?!\S)|\s+")


@dataclass(frozen=True)
class PreTokenizer:
    splits: tuple[str, ...]      # applied in order, each matched piece isolated
    ignore_merges: bool = False  # a word that is itself a token skips the merges (Llama 3)


_GPT2 = PreTokenizer((GPT2_SPLIT,))
_DIGITS_GPT2 = PreTokenizer((r"\p{N}", GPT2_SPLIT))  # every digit its own piece, then GPT-2's split
_LLAMA3 = PreTokenizer((LLAMA3_SPLIT,), ignore_merges=True)
_QWEN2 = PreTokenizer((QWEN2_SPLIT,))
PRE_TOKENIZERS = {
    "gpt-2": _GPT2, "phi-2": _GPT2, "mpt": _GPT2, "olmo": _GPT2,
    "smollm": _DIGITS_GPT2, "starcoder": _DIGITS_GPT2, "refact": _DIGITS_GPT2, "codeshell": _DIGITS_GPT2,
    "command-r": _DIGITS_GPT2,
    "llama3": _LLAMA3, "llama-v3": _LLAMA3, "llama-bpe": _LLAMA3, "falcon3": _LLAMA3,
    "dbrx": PreTokenizer((LLAMA3_SPLIT,)), "smaug-bpe": PreTokenizer((LLAMA3_SPLIT,)),
    "qwen2": _QWEN2, "deepseek-r1-qwen": _QWEN2, "stablelm2": _QWEN2, "megrez": _QWEN2,
}

def _byte_level_alphabet() -> dict[str, int]:
    """GPT-2's byte-level BPE alphabet: the character that spells each byte, inverted."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("\xa1"), ord("\xac") + 1)) \
        + list(range(ord("\xae"), ord("\xff") + 1))
    chars, extra = {}, 0
    for b in range(256):
        if b in printable:
            chars[chr(b)] = b
        else:
            chars[chr(256 + extra)] = b
            extra += 1
    return chars


_BYTE_OF_CHAR = _byte_level_alphabet()

# A marker no chat template alters, to find what a template writes after an assistant turn.
_PROBE = "AnychipProbe7"


class Tokenizer:
    """Text <-> token ids, and chat prompts.

    ``eos_ids``: every id that ends generation: the checkpoint's eos (and end-of-turn ids it
    names), plus the special token the chat template closes an assistant turn with.
    """

    def __init__(self, backend: tokenizers.Tokenizer, *, bos_id: int | None, eos_id: int | None,
                 extra_eos_ids=(), pad_id: int | None = None, chat_template: str | None = None,
                 add_bos: bool = False, chat_template_source: str = "the model's chat template"):
        self._backend = backend
        self.bos_id = bos_id
        self.eos_id = eos_id  # the checkpoint's own end-of-text id (pretraining's document separator)
        self.pad_id = pad_id
        self.chat_template = chat_template
        self.chat_template_source = chat_template_source  # where it was read, for its errors
        self.add_bos = add_bos  # whether the checkpoint's own tokenizer puts bos before plain text
        self.bos_token = "" if bos_id is None else backend.id_to_token(bos_id)  # the template's bos_token
        self.eos_token = "" if eos_id is None else backend.id_to_token(eos_id)
        self.eos_ids = {i for i in (eos_id, *extra_eos_ids) if i is not None}
        turn_end = self._template_turn_end()
        if turn_end is not None:
            self.eos_ids.add(turn_end)

    # ---- construction -----------------------------------------------------------------------

    @classmethod
    def from_gguf_metadata(cls, meta: dict, source: str) -> Tokenizer:
        """From a GGUF file's tokenizer.* metadata (``tokenizer.ggml.model`` "gpt2": byte-level BPE)."""
        kind = meta.get("tokenizer.ggml.model")
        if kind != "gpt2":
            raise CheckpointError(f"{source}: tokenizer.ggml.model {kind!r} is not supported (supported: 'gpt2', "
                                  "the byte-level BPE of Llama 3, Qwen2 and SmolLM2)")
        pre_name = meta.get("tokenizer.ggml.pre", "")
        pre = PRE_TOKENIZERS.get(pre_name)
        if pre is None:
            raise CheckpointError(f"{source}: tokenizer.ggml.pre {pre_name!r} is not supported "
                                  f"(supported: {', '.join(sorted(PRE_TOKENIZERS))})")
        tokens = meta.get("tokenizer.ggml.tokens")
        merges = meta.get("tokenizer.ggml.merges")
        if not tokens or merges is None:
            raise CheckpointError(f"{source}: tokenizer.ggml.tokens or tokenizer.ggml.merges is missing")
        types = meta.get("tokenizer.ggml.token_type") or [1] * len(tokens)

        vocab = {token: i for i, token in enumerate(tokens)}
        pairs = [tuple(merge.split(" ", 1)) for merge in merges]
        backend = tokenizers.Tokenizer(models.BPE(vocab=vocab, merges=pairs, ignore_merges=pre.ignore_merges))
        backend.pre_tokenizer = pre_tokenizers.Sequence(
            [pre_tokenizers.Split(Regex(split), behavior="isolated") for split in pre.splits]
            + [pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
        backend.decoder = decoders.ByteLevel()
        # Control tokens are special (never produced by splitting text, skipped when decoding);
        # user-defined ones are whole tokens wherever their text appears.
        backend.add_special_tokens([AddedToken(tokens[i], special=True, normalized=False)
                                    for i, t in enumerate(types) if t == CONTROL])
        backend.add_tokens([AddedToken(tokens[i], special=False, normalized=False)
                            for i, t in enumerate(types) if t == USER_DEFINED])
        return cls(backend,
                   bos_id=meta.get("tokenizer.ggml.bos_token_id"),
                   eos_id=meta.get("tokenizer.ggml.eos_token_id"),
                   extra_eos_ids=(meta.get("tokenizer.ggml.eot_token_id"), meta.get("tokenizer.ggml.eom_token_id")),
                   pad_id=meta.get("tokenizer.ggml.padding_token_id"),
                   chat_template=meta.get("tokenizer.chat_template"),
                   add_bos=bool(meta.get("tokenizer.ggml.add_bos_token", False)),
                   chat_template_source=f"the chat template in {source} (tokenizer.chat_template)")

    @classmethod
    def from_hf_folder(cls, folder: Path) -> Tokenizer:
        """From tokenizer.json, with tokenizer_config.json (special tokens, chat template),
        chat_template.jinja where present, and generation_config.json's eos ids."""
        path = folder / "tokenizer.json"
        if not path.is_file():
            raise CheckpointError(f"{folder}: tokenizer.json is missing (a fast tokenizer file is needed)")
        try:
            backend = tokenizers.Tokenizer.from_file(str(path))
        except Exception as exc:  # noqa: BLE001 - tokenizers raises plain Exception for bad files
            raise CheckpointError(f"{path}: not a readable tokenizer file ({exc})") from exc
        config = _read_json(folder / "tokenizer_config.json")
        generation = _read_json(folder / "generation_config.json")

        template = config.get("chat_template")
        if isinstance(template, list):  # named templates: [{"name": "default", "template": ...}, ...]
            template = {t.get("name"): t.get("template") for t in template}.get("default")
        template_source = f"the chat template in {folder / 'tokenizer_config.json'} (chat_template)"
        template_file = folder / "chat_template.jinja"
        if template_file.is_file():
            template = template_file.read_text(encoding="utf-8")
            template_source = f"the chat template {template_file}"

        def token_id(key: str) -> int | None:
            token = config.get(key)
            if isinstance(token, dict):  # serialized AddedToken
                token = token.get("content")
            return None if token is None else backend.token_to_id(token)

        bos_id = token_id("bos_token")
        if bos_id is None:
            bos_id = generation.get("bos_token_id")
        generation_eos = generation.get("eos_token_id", [])
        # tokenizer.json's post-processor is what puts bos before text (Llama's does, Qwen2's not)
        add_bos = bos_id is not None and backend.encode("a", add_special_tokens=True).ids[:2] == \
            [bos_id, *backend.encode("a", add_special_tokens=False).ids[:1]]
        return cls(backend, bos_id=bos_id, eos_id=token_id("eos_token"),
                   extra_eos_ids=generation_eos if isinstance(generation_eos, list) else [generation_eos],
                   pad_id=token_id("pad_token"), chat_template=template, add_bos=add_bos,
                   chat_template_source=template_source)

    def to_files(self) -> dict[str, bytes]:
        """tokenizer.json, tokenizer_config.json and generation_config.json: the tokenizer files of a
        Hugging Face folder, which :meth:`from_hf_folder` reads back as this tokenizer (same ids,
        special tokens, bos/eos/pad, add_bos and chat template)."""
        from tokenizers import processors

        backend = tokenizers.Tokenizer.from_str(self._backend.to_str())  # a copy: self stays as it is
        bos = self.bos_id

        def puts_bos() -> bool:  # as from_hf_folder decides add_bos: the post-processor puts bos first
            return bos is not None and backend.encode("a", add_special_tokens=True).ids[:2] == \
                [bos, *backend.encode("a", add_special_tokens=False).ids[:1]]

        if self.add_bos and not puts_bos():
            template = processors.TemplateProcessing(single=[self.bos_token, "$A"],
                                                     pair=[self.bos_token, "$A", self.bos_token, "$B"],
                                                     special_tokens=[(self.bos_token, bos)])
            existing = backend.post_processor
            backend.post_processor = template if existing is None else processors.Sequence([existing, template])
        elif not self.add_bos and puts_bos():
            backend.post_processor = None

        def token(token_id: int | None) -> str | None:
            return None if token_id is None else backend.id_to_token(token_id)

        config = {"tokenizer_class": "PreTrainedTokenizerFast", "add_bos_token": self.add_bos,
                  "add_eos_token": False, "clean_up_tokenization_spaces": False}
        eos_id = None if not self.eos_token else backend.token_to_id(self.eos_token)
        for key, token_id in (("bos_token", bos), ("eos_token", eos_id), ("pad_token", self.pad_id)):
            text = token(token_id)
            # a token string naming another id (duplicate vocabulary entries) would load as that id
            if text is not None and backend.token_to_id(text) == token_id:
                config[key] = text
        if self.chat_template:
            config["chat_template"] = self.chat_template
        generation = {"bos_token_id": bos, "eos_token_id": sorted(self.eos_ids), "pad_token_id": self.pad_id}
        generation = {key: value for key, value in generation.items() if value not in (None, [])}

        def dump(value: dict) -> bytes:
            return (json.dumps(value, indent=2, ensure_ascii=False) + "\n").encode("utf-8")

        return {"tokenizer.json": backend.to_str().encode("utf-8"), "tokenizer_config.json": dump(config),
                "generation_config.json": dump(generation)}

    # ---- text <-> ids -------------------------------------------------------------------------

    @property
    def vocab_size(self) -> int:
        return self._backend.get_vocab_size(with_added_tokens=True)

    def token_to_id(self, token: str) -> int | None:
        """The id of a token given as its vocabulary string (e.g. "<|im_start|>"), or None."""
        return self._backend.token_to_id(token)

    def encode(self, text: str, add_bos: bool = False) -> list[int]:
        """Special tokens written in ``text`` (e.g. "<|im_start|>") become their ids. ``add_bos``
        puts bos first unless the text already starts with it (chat templates often write it)."""
        ids = self._backend.encode(text, add_special_tokens=False).ids
        if add_bos and self.bos_id is not None and ids[:1] != [self.bos_id]:
            ids.insert(0, self.bos_id)
        return ids

    def decode(self, ids, skip_special: bool = True) -> str:
        return self._backend.decode([int(i) for i in ids], skip_special_tokens=skip_special)

    def token_bytes(self, token_id: int) -> bytes:
        """The bytes token ``token_id`` stands for (byte-level BPE spells each byte as one printable
        character; a token may hold part of a UTF-8 character), as OpenAI's logprobs give them."""
        piece = self._backend.id_to_token(int(token_id))
        if piece is None:
            return b""
        try:
            return bytes(_BYTE_OF_CHAR[c] for c in piece)
        except KeyError:  # not a byte-level spelling (an added token written as itself)
            return piece.encode("utf-8")

    def stream_decoder(self, skip_special: bool = True) -> StreamDecoder:
        return StreamDecoder(self, skip_special)

    # ---- chat -------------------------------------------------------------------------------------

    @property
    def has_chat_template(self) -> bool:
        return bool(self.chat_template)

    def apply_chat_template(self, messages: list[dict], add_generation_prompt: bool = True, **variables) -> str:
        """The prompt text for ``messages`` ([{"role": ..., "content": ...}]), rendered the way
        transformers renders chat templates; ``variables`` are extra template variables."""
        if not self.chat_template:
            raise ValueError("this checkpoint has no chat template; encode the prompt text directly")
        try:
            return self._template.render(messages=messages, add_generation_prompt=add_generation_prompt,
                                         bos_token=self.bos_token, eos_token=self.eos_token, **variables)
        except Exception as exc:  # noqa: BLE001 - a template fails any way: syntax, raise_exception, bad operands
            raise ChatTemplateError(f"{self.chat_template_source}: {template_failure(exc)}") from exc

    @cached_property
    def _template(self) -> jinja2.Template:
        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
        env.filters["tojson"] = _tojson
        env.globals["raise_exception"] = _raise_exception
        env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
        return env.from_string(self.chat_template)

    def _template_turn_end(self) -> int | None:
        """The special token the chat template writes right after an assistant message, if any."""
        if not self.chat_template:
            return None
        try:
            text = self.apply_chat_template([{"role": "user", "content": "Hi"},
                                             {"role": "assistant", "content": _PROBE}], add_generation_prompt=False)
        except Exception:  # noqa: BLE001 - a template may reject the probe conversation; then there is none
            return None
        after = text.partition(_PROBE)[2]
        specials = {t.content: i for i, t in self._backend.get_added_tokens_decoder().items() if t.special}
        matches = [content for content in specials if content and after.startswith(content)]
        return specials[max(matches, key=len)] if matches else None


class ChatTemplateError(ValueError, jinja2.TemplateError):
    """A chat template that does not compile, or that fails while rendering (its own
    raise_exception included): the message names the template's source, the line and Jinja's
    message. A jinja2.TemplateError too, for callers that catch Jinja's own errors."""


def template_failure(exc: Exception) -> str:
    """``exc``, raised compiling or rendering a Jinja template, as "line N: message"."""
    if isinstance(exc, jinja2.TemplateSyntaxError):
        line, message = exc.lineno, f"syntax error: {exc.message}"
    else:
        # Jinja rewrites tracebacks so that a template's frames carry its own line numbers.
        lines = [f.lineno for f in traceback.extract_tb(exc.__traceback__) if f.filename == "<template>"]
        line = lines[-1] if lines else None
        # raise_exception's message is the template's own; any other error is named by its type
        message = str(exc) if type(exc) is jinja2.TemplateError else f"{type(exc).__name__}: {exc}"
    return f"line {line}: {message}" if line else message


class StreamDecoder:
    """Incremental detokenization for streaming: ``feed`` one id at a time and get the text it
    completes, "" while a character is still split across tokens (never broken UTF-8)."""

    def __init__(self, tokenizer: Tokenizer, skip_special: bool = True):
        self._backend = tokenizer._backend
        self._stream = decoders.DecodeStream(skip_special_tokens=skip_special)

    def feed(self, token_id: int) -> str:
        return self._stream.step(self._backend, int(token_id)) or ""


def _read_json(path: Path) -> dict:
    if not path.is_file():
        return {}
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise CheckpointError(f"{path}: not valid JSON ({exc})") from exc


def _tojson(value, ensure_ascii=False, indent=None, separators=None, sort_keys=False) -> str:
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _raise_exception(message: str):
    raise jinja2.exceptions.TemplateError(message)
