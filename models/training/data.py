"""Supervised fine-tuning data: jsonl records of ``{"src": ..., "tgt": ...}`` (each a string, or a
list of strings for a multi-turn conversation) turned into token ids with a loss mask, the way
PaddleNLP's ``llm/`` fine-tuning reads them.

    fmt = ChatFormat.from_tokenizer(tokenizer)            # the model's own chat template
    fmt = ChatFormat.from_json("chat_template.json", tok)  # or PaddleNLP's chat_template.json
    examples, bad = load_sft_data("data/", fmt, max_length=512)   # data/train.jsonl

A conversation becomes a system segment and one (user, bot) pair of segments per turn; loss is
only on the bot segments, which include whatever the template writes after the reply (e.g.
``<|im_end|>``), so the model learns to stop. Truncation to ``max_length`` follows PaddleNLP's
documented rule: the system prompt is never truncated; a one-turn record is cut token-wise,
``(system + turn)[:max_length]``; a multi-turn record keeps its newest turns that fit, counting back
from the last one and dropping the first turn that does not fit together with everything older.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

import jinja2
import jinja2.meta
from jinja2.sandbox import ImmutableSandboxedEnvironment

from ..tokenizer import ChatTemplateError, template_failure

# A file with more lines than this shows a progress bar while it is tokenized.
PROGRESS_LINES = 5000
# How many bad records the error of on_bad="fail" lists.
LISTED_BAD = 10
# Text the probe conversations of ChatFormat.from_tokenizer use; no template alters them.
_PROBE_USER, _PROBE_BOT = "AnychipProbeUser7", "AnychipProbeBot7"
# Special-token spellings ("<|im_start|>") a chat_template.json may write.
_SPECIAL = re.compile(r"<\|[^|<>\s]+\|>")


class DataError(ValueError):
    """Bad fine-tuning data or chat format: the message names the file (and line) at fault."""


class _FatalDataError(DataError):
    """A DataError that no record can avoid (e.g. a system prompt longer than max_length):
    load_sft_data raises it even with on_bad="skip"."""


@dataclass
class Example:
    input_ids: list[int]
    target_mask: list[bool]  # True on the tokens of bot replies (and the turn end the template writes)
    line: int                # 1-based line of the jsonl file

    def __len__(self) -> int:
        return len(self.input_ids)


@dataclass
class BadRecord:
    line: int
    reason: str


# ---- chat formats ------------------------------------------------------------------------------

Segments = tuple[list[int], list[tuple[list[int], list[int]]]]


class ChatFormat:
    """How a conversation becomes token segments: ``segments(src, tgt)`` gives
    ``(system_ids, [(user_ids, bot_ids), ...])``. Texts are encoded without adding special tokens:
    only those the template writes (``<|im_start|>`` etc. map to their ids)."""

    def __init__(self, tokenizer, source: str):
        self.tokenizer = tokenizer
        self.source = source  # where the format came from, for messages

    # -- construction --

    @classmethod
    def from_json(cls, path, tokenizer) -> ChatFormat:
        """PaddleNLP's chat_template.json: ``"system"`` (optional string), ``"conversation"``
        ([user_template, bot_template] using ``{{user}}`` / ``{{bot}}``) and ``"query"`` (the
        inference prompt, using ``{{query}}``); each a jinja2 template (``{{index}}`` is the turn
        number, from 0). The texts are rendered as written, trailing newlines included."""
        path = Path(path)
        if path.is_dir():
            path = path / "chat_template.json"
        if not path.is_file():
            raise DataError(f"{path}: no such chat template file")
        try:
            config = json.loads(path.read_text(encoding="utf-8"))
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise DataError(f"{path}: not valid JSON ({exc})") from exc
        return cls.from_dict(config, tokenizer, source=str(path))

    @classmethod
    def from_dict(cls, config: dict, tokenizer, source: str = "chat template") -> ChatFormat:
        """A chat_template.json's content, already parsed."""
        return _JsonChatFormat(config, tokenizer, source)

    @classmethod
    def from_tokenizer(cls, tokenizer) -> ChatFormat:
        """The model's own jinja chat template (``tokenizer.apply_chat_template``): each turn's
        segments are the text a growing conversation adds; whatever the template writes before
        the first user turn (a default system prompt, bos) is the system segment."""
        if not getattr(tokenizer, "chat_template", None):
            raise DataError("the tokenizer has no chat template: pass a chat_template.json instead")
        return _TemplateChatFormat(tokenizer, "the tokenizer's chat template")

    # -- use --

    def segment_texts(self, src: list[str], tgt: list[str]) -> tuple[str, list[tuple[str, str]]]:
        """The texts of ``segments``: (system_text, [(user_text, bot_text), ...])."""
        raise NotImplementedError

    def prompt_text(self, src: list[str], tgt: list[str]) -> str:
        """The inference prompt for the last of ``src`` after the finished turns (``tgt`` has one
        reply fewer than ``src``), ending where the model's reply starts."""
        raise NotImplementedError

    def segments(self, src: list[str], tgt: list[str]) -> Segments:
        system, turns = self.segment_texts(src, tgt)
        return self.encode(system), [(self.encode(u), self.encode(b)) for u, b in turns]

    def prompt_ids(self, src: list[str], tgt: list[str]) -> list[int]:
        return self.encode(self.prompt_text(src, tgt))

    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_bos=False)) if text else []


class _JsonChatFormat(ChatFormat):
    def __init__(self, config, tokenizer, source: str):
        super().__init__(tokenizer, source)
        if not isinstance(config, dict):
            raise DataError(f"{source}: must be a JSON object with 'conversation' and 'query' keys")
        env = ImmutableSandboxedEnvironment(keep_trailing_newline=True)

        def compile_(key: str, text, needs: str | None):
            if not isinstance(text, str):
                raise DataError(f"{source}: '{key}' must be a string, not {type(text).__name__}")
            try:
                variables = jinja2.meta.find_undeclared_variables(env.parse(text))
                template = env.from_string(text)
            except jinja2.TemplateSyntaxError as exc:
                raise DataError(f"{source}: '{key}' is not a valid jinja2 template ({template_failure(exc)})") from exc
            if needs and needs not in variables:
                raise DataError(f"{source}: '{key}' must contain {{{{{needs}}}}}")
            for special in _SPECIAL.findall(text):
                if tokenizer.token_to_id(special) is None:
                    raise DataError(f"{source}: '{key}' writes {special}, which is not a token of this tokenizer")
            return template

        for key in ("conversation", "query"):
            if key not in config:
                raise DataError(f"{source}: the '{key}' key is missing")
        conversation = config["conversation"]
        if not isinstance(conversation, list) or len(conversation) != 2:
            raise DataError(f"{source}: 'conversation' must be a list of two templates [user, bot]")
        self._user = compile_("conversation[0]", conversation[0], "user")
        self._bot = compile_("conversation[1]", conversation[1], "bot")
        self._query = compile_("query", config["query"], "query")
        system = config.get("system")
        self._system = None if system is None else compile_("system", system, None)
        unknown = set(config) - {"system", "conversation", "query"}
        if unknown:
            raise DataError(f"{source}: unknown keys {sorted(unknown)} (expected system, conversation, query)")

    def _render(self, template, **variables) -> str:
        try:
            return template.render(**variables)
        except Exception as exc:  # noqa: BLE001 - a template fails any way: undefined names, bad operands
            raise DataError(f"{self.source}: rendering failed ({template_failure(exc)})") from exc

    def _system_text(self) -> str:
        return "" if self._system is None else self._render(self._system)

    def segment_texts(self, src, tgt):
        turns = [(self._render(self._user, user=u, index=i), self._render(self._bot, bot=b, index=i))
                 for i, (u, b) in enumerate(zip(src, tgt))]
        return self._system_text(), turns

    def prompt_text(self, src, tgt):
        system, turns = self.segment_texts(src[:-1], tgt)
        query = self._render(self._query, query=src[-1], index=len(src) - 1)
        return system + "".join(u + b for u, b in turns) + query


class _TemplateChatFormat(ChatFormat):
    def __init__(self, tokenizer, source: str):
        super().__init__(tokenizer, source)
        self._render([{"role": "user", "content": _PROBE_USER}], True)  # fails early on a broken template

    def _render(self, messages: list[dict], generation_prompt: bool) -> str:
        try:
            return self.tokenizer.apply_chat_template(messages, add_generation_prompt=generation_prompt)
        except ChatTemplateError as exc:  # names the template's source and line already
            raise DataError(str(exc)) from exc

    def _after(self, longer: str, shorter: str) -> str:
        if not longer.startswith(shorter):
            raise DataError(f"{self.source}: the template rewrites earlier turns when a conversation grows "
                            "(e.g. it drops the reasoning of old replies), so per-turn segments can't be "
                            "taken from it: use a chat_template.json")
        return longer[len(shorter):]

    def segment_texts(self, src, tgt):
        messages: list[dict] = []
        done = ""  # the text of the finished turns
        turns = []
        for u, b in zip(src, tgt):
            messages.append({"role": "user", "content": u})
            asked = self._render(messages, True)
            messages.append({"role": "assistant", "content": b})
            answered = self._render(messages, False)
            turns.append((self._after(asked, done), self._after(answered, asked)))
            done = answered
        if not turns:
            return "", []
        # The first user segment also holds what the template writes before any turn. The same user
        # message rendered after a finished turn shows the turn alone; what precedes it is the system.
        first_user = turns[0][0]
        probe = [{"role": "user", "content": _PROBE_USER}, {"role": "assistant", "content": _PROBE_BOT}]
        before = self._render(probe, False)
        later = self._after(self._render(probe + [{"role": "user", "content": src[0]}], True), before)
        if later and first_user.endswith(later):
            system = first_user[:len(first_user) - len(later)]
            turns[0] = (later, turns[0][1])
        else:  # the first turn is written differently from later ones: no separable system text
            system = ""
        return system, turns

    def prompt_text(self, src, tgt):
        messages = []
        for i, u in enumerate(src):
            messages.append({"role": "user", "content": u})
            if i < len(tgt):
                messages.append({"role": "assistant", "content": tgt[i]})
        return self._render(messages, True)


# ---- records -------------------------------------------------------------------------------------

def _turns(record) -> tuple[list[str], list[str]]:
    """src and tgt of a record as equal-length lists of strings, or DataError with the reason."""
    if not isinstance(record, dict):
        raise DataError(f"not a JSON object (a {type(record).__name__})")
    lists = []
    for key in ("src", "tgt"):
        if key not in record:
            raise DataError(f"missing key '{key}'")
        value = record[key]
        if isinstance(value, str):
            value = [value]
        elif not isinstance(value, list):
            raise DataError(f"'{key}' must be a string or a list of strings, not {type(value).__name__}")
        elif not value:
            raise DataError(f"'{key}' is an empty list")
        for i, item in enumerate(value):
            if not isinstance(item, str):
                raise DataError(f"'{key}'[{i}] must be a string, not {type(item).__name__}")
        lists.append(value)
    src, tgt = lists
    if len(src) != len(tgt):
        raise DataError(f"'src' has {len(src)} turns but 'tgt' has {len(tgt)}")
    for i, text in enumerate(tgt):
        if not text.strip():
            raise DataError("empty target" if len(tgt) == 1 else f"empty target in turn {i + 1}")
    return src, tgt


def tokenize_record(fmt: ChatFormat, record: dict, max_length: int, line: int) -> Example:
    """One record as an Example, truncated to ``max_length`` tokens (rules in the module doc).
    Raises DataError with the reason for a bad record."""
    src, tgt = _turns(record)
    system, turns = fmt.segments(src, tgt)
    if len(system) >= max_length:
        raise _FatalDataError(f"the system prompt is {len(system)} tokens, which leaves no room in "
                              f"max_length {max_length} (it is never truncated)")
    ids, mask = list(system), [False] * len(system)
    if len(turns) > 1:
        kept, total = [], len(system)
        for user, bot in reversed(turns):
            if total + len(user) + len(bot) > max_length:
                break
            kept.insert(0, (user, bot))
            total += len(user) + len(bot)
        if kept:
            turns = kept
        else:  # not even the newest turn fits: cut it as a one-turn record is cut
            turns = turns[-1:]
    for user, bot in turns:
        ids += user + bot
        mask += [False] * len(user) + [True] * len(bot)
    ids, mask = ids[:max_length], mask[:max_length]
    if not any(mask[1:]):  # a target token needs a token before it to be predicted from
        raise DataError(f"no target tokens left after truncation to max_length {max_length}")
    return Example(ids, mask, line)


# ---- files ----------------------------------------------------------------------------------------

def data_file(path, split: str = "train") -> Path:
    """The jsonl file of ``split``: ``path`` itself, or ``path/{split}.jsonl`` /
    ``path/{split}.json`` for a data folder (PaddleNLP's layout)."""
    path = Path(path)
    if path.is_dir():
        for name in (f"{split}.jsonl", f"{split}.json"):
            if (path / name).is_file():
                return path / name
        raise DataError(f"{path}: no {split}.jsonl or {split}.json in this folder")
    if not path.is_file():
        raise DataError(f"{path}: no such data file")
    return path


def load_sft_data(path, fmt: ChatFormat, max_length: int, on_bad: str = "skip",
                  split: str = "train") -> tuple[list[Example], list[BadRecord]]:
    """The Examples of a jsonl file (one JSON object per line; blank lines ignored) or of a data
    folder's ``{split}.jsonl``. Bad records (invalid JSON, not an object, missing or mistyped
    src/tgt, an empty target, unequal turn counts, nothing left to learn after truncation) are
    returned with their line numbers (``on_bad="skip"``) or make it raise DataError listing them
    (``on_bad="fail"``)."""
    if max_length < 2:
        raise ValueError(f"max_length must be at least 2, not {max_length}")
    return load_records(path, lambda record, line: tokenize_record(fmt, record, max_length, line), on_bad, split)


def load_records(path, tokenize, on_bad: str = "skip", split: str = "train") -> tuple[list, list[BadRecord]]:
    """``tokenize(record, line)`` of every record of a jsonl file or a data folder's ``{split}``
    file, with the bad records (DataError from ``tokenize`` or from reading them) as
    load_sft_data reports them."""
    if on_bad not in ("skip", "fail"):
        raise ValueError(f"on_bad must be 'skip' or 'fail', not {on_bad!r}")
    file = data_file(path, split)
    lines = file.read_bytes().splitlines()
    first = next((raw.strip() for raw in lines if raw.strip()), b"")
    if first.startswith(b"["):
        raise DataError(f"{file}: is a JSON array; the data format is one JSON object per line (jsonl)")

    numbered = enumerate(lines, start=1)
    if len(lines) > PROGRESS_LINES:
        from tqdm import tqdm
        numbered = tqdm(numbered, total=len(lines), desc=f"tokenizing {file.name}", unit=" lines")
    examples, bad = [], []
    for number, raw in numbered:
        if not raw.strip():
            continue
        try:
            try:
                record = json.loads(raw.decode("utf-8-sig" if number == 1 else "utf-8"))  # a BOM may open the file
            except UnicodeDecodeError as exc:
                raise DataError(f"not valid UTF-8 ({exc.reason} at byte {exc.start})") from None
            except json.JSONDecodeError as exc:
                raise DataError(f"invalid JSON ({exc.msg} at column {exc.colno})") from None
            examples.append(tokenize(record, number))
        except _FatalDataError as exc:
            raise DataError(f"{file}:{number}: {exc}") from None
        except DataError as exc:
            bad.append(BadRecord(number, str(exc)))
    if bad and on_bad == "fail":
        listed = "\n".join(f"  line {b.line}: {b.reason}" for b in bad[:LISTED_BAD])
        more = f"\n  ... and {len(bad) - LISTED_BAD} more" if len(bad) > LISTED_BAD else ""
        raise DataError(f"{file}: {len(bad)} bad record{'s' if len(bad) > 1 else ''}:\n{listed}{more}")
    return examples, bad


def format_bad_records(path, bad: list[BadRecord], limit: int = LISTED_BAD, split: str = "train") -> str:
    """Lines for a CLI to print: ``file:line: reason`` for the first ``limit`` bad records
    (``path`` as given to load_sft_data: a data folder names its ``split`` file)."""
    file = data_file(path, split) if Path(path).is_dir() else path
    out = [f"{file}:{b.line}: {b.reason}" for b in bad[:limit]]
    if len(bad) > limit:
        out.append(f"... and {len(bad) - limit} more bad records")
    return "\n".join(out)
