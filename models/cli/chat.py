"""``anychip chat``: a multi-turn conversation in the terminal."""

from __future__ import annotations

import sys

from .session import add_model_flags, add_sampling_flags, open_session, prompt_ids, sampling_params, utf8_text

HELP = "Type a message and press Enter. /reset starts over, /exit (or Ctrl-D) quits."


def add_parser(sub, common):
    p = sub.add_parser("chat", parents=[common], help="chat with a model in the terminal",
                       description="A multi-turn chat with an instruct model on any device; answers "
                                   "stream as they are generated. " + HELP)
    p.add_argument("--system", metavar="TEXT", help="a system message that opens the conversation")
    add_model_flags(p)
    add_sampling_flags(p, max_new_tokens=256)


def run(args) -> int:
    params = sampling_params(args)
    if args.system is not None:
        utf8_text("--system", args.system)
    session = open_session(args)
    if not session.tokenizer.has_chat_template:
        raise ValueError(f"{session.model_name} has no chat template; use `anychip generate --raw` instead")
    history: list[dict] = []
    interactive = sys.stdin.isatty()
    # Bytes that are not UTF-8 become lone surrogates instead of a UnicodeDecodeError that would
    # end the chat: such a line is refused by itself, and the conversation goes on.
    sys.stdin.reconfigure(errors="surrogateescape")
    if interactive:
        print(f"{session.model_name} on {session.device}. {HELP}")
    number = 0
    while True:
        if interactive:
            print("> ", end="", flush=True)
        line = sys.stdin.readline()
        if not line:
            break
        number += 1
        try:
            text = utf8_text(f"input line {number}", line).strip()
        except ValueError as exc:
            print(f"anychip chat: error: {exc}", file=sys.stderr)
            continue
        if text in ("/exit", "/quit"):
            break
        if text == "/reset":
            history.clear()
            continue
        if not text:
            continue
        ids = prompt_ids(session.tokenizer, text, raw=False, system=args.system, history=history)

        def show(_index: int, piece: str) -> None:
            sys.stdout.write(piece)
            sys.stdout.flush()

        completions, _stats = session.generator.generate([ids], params, on_text=show)
        print()
        history += [{"role": "user", "content": text}, {"role": "assistant", "content": completions[0].text}]
    return 0
