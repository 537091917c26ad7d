"""The model commands as a user runs them: `anychip generate`, `anychip chat`, `anychip models`,
on a tiny GGUF written by the test (and the real model for the chat)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from gguf import GGMLQuantizationType as T

from loader_helpers import random_weights, write_gguf
from model_helpers import CONFIG, TOKENIZER_META


def anychip(*args, stdin: str | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "anychip.cli.main", *args], capture_output=True, text=True,
                          input=stdin, timeout=timeout)


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny") / "tiny-q4_1.gguf"
    return write_gguf(path, CONFIG, random_weights(CONFIG, seed=0), TOKENIZER_META, qtype=T.Q4_1,
                      types={"embed_tokens": T.Q8_0})


def test_generate_json_on_cpu_and_a_simulated_chip(tiny_gguf):
    runs = {}
    for device in ("cpu", "npu"):
        proc = anychip("generate", "--device", device, "--model", str(tiny_gguf), "--json", "--max-new-tokens", "6",
                       "hello", "a longer prompt")
        assert proc.returncode == 0, proc.stderr
        runs[device] = out = json.loads(proc.stdout)
        assert out["weights"] == "native" and len(out["completions"]) == 2
        for c in out["completions"]:
            assert 1 <= c["completion_tokens"] <= 6 and c["finish_reason"] in ("stop", "length")
        assert out["timings"]["prefill_tokens"] == sum(c["prompt_tokens"] for c in out["completions"])
    assert runs["cpu"]["simulated"] is False
    assert runs["npu"]["simulated"] is True and runs["npu"]["device"] == "npu:0"
    assert [c["text"] for c in runs["npu"]["completions"]] == [c["text"] for c in runs["cpu"]["completions"]]


def test_generate_streams_plain_text_and_labels_simulated_timings(tiny_gguf):
    proc = anychip("generate", "--device", "xpu", "--model", str(tiny_gguf), "--max-new-tokens", "4",
                   "--weights", "float", "--temperature", "0.8", "--seed", "3", "hi")
    assert proc.returncode == 0, proc.stderr
    assert "xpu:0 is simulated" in proc.stderr
    assert "(simulated device: host speed)" in proc.stderr and "decode" in proc.stderr


def test_generate_with_a_16bit_kv_cache(tiny_gguf):
    """--kv-cache bfloat16 on the cpu and a simulated chip: the same tokens on both, the run
    labelled with its cache."""
    texts = []
    for device in ("cpu", "xpu"):
        proc = anychip("generate", "--device", device, "--model", str(tiny_gguf), "--json", "--max-new-tokens", "6",
                       "--kv-cache", "bfloat16", "--report-fallbacks", "hello")
        assert proc.returncode == 0, proc.stderr
        out = json.loads(proc.stdout)
        assert out["weights"] == "native, bfloat16 KV cache"
        assert "decoder_step" not in proc.stderr  # the fused step ran: no fallback reported
        texts.append(out["completions"][0]["text"])
    assert texts[0] == texts[1]


@pytest.mark.parametrize("args,message", [
    (["--device", "tpu"], "tpu"),
    (["--device", "dcu", "--kv-cache", "bfloat16"], "device dcu has no bfloat16 tensors for a bfloat16 KV cache"),
    (["--kv-cache", "int8"], "invalid choice: 'int8'"),
    (["--model", "/nonexistent/model.gguf"], "/nonexistent/model.gguf"),
    (["--model", "no-such-model"], "known: smollm2"),
    (["--top-p", "1.5"], "top_p must be in (0, 1]"),
    (["--max-new-tokens", "0"], "max_new_tokens must be >= 1"),
])
def test_generate_bad_input_is_a_clear_error(tiny_gguf, args, message):
    argv = ["generate", "--model", str(tiny_gguf), *args, "hi"]
    if "--model" in args:
        argv = ["generate", *args, "hi"]
    proc = anychip(*argv)
    assert proc.returncode != 0
    assert message in proc.stderr
    assert "Traceback" not in proc.stderr


def test_corrupt_model_file_names_the_file(tmp_path):
    bad = tmp_path / "broken.gguf"
    bad.write_bytes(b"GGUF" + b"\x03\x00\x00\x00" + b"\xff" * 10)
    proc = anychip("generate", "--model", str(bad), "hi")
    assert proc.returncode == 1 and str(bad) in proc.stderr and "Traceback" not in proc.stderr


def test_models_list_and_help():
    listing = anychip("models", "list")
    assert listing.returncode == 0 and listing.stdout.startswith("NAME") and "smollm2" in listing.stdout
    for cmd in ("generate", "chat", "models"):
        helped = anychip(cmd, "--help")
        assert helped.returncode == 0 and "--device" in helped.stdout


def test_chat_answers_follow_up_questions_with_the_real_model():
    """The second question only makes sense with the first turn in the prompt."""
    proc = anychip("chat", "--max-new-tokens", "16",
                   stdin="What is the capital of France?\nAnd of Italy?\n/reset\nSay hello.\n/exit\n")
    assert proc.returncode == 0, proc.stderr
    answers = [line for line in proc.stdout.splitlines() if line.strip()]
    assert len(answers) == 3, proc.stdout
    assert "Paris" in answers[0] and "Rome" in answers[1], proc.stdout


def test_chat_turns_carry_the_history():
    """Each turn's prompt is the whole conversation in the chat template."""
    from anychip_models.loader import load_checkpoint
    from anychip_models.cli.session import prompt_ids
    from anychip_models.hub import resolve

    tok = load_checkpoint(resolve("smollm2"), weights="native").tokenizer
    history = [{"role": "user", "content": "My name is Ada."}, {"role": "assistant", "content": "Hello Ada!"}]
    text = tok.decode(prompt_ids(tok, "What is my name?", raw=False, system="Be brief.", history=history),
                      skip_special=False)
    order = [text.find(part) for part in ("Be brief.", "My name is Ada.", "Hello Ada!", "What is my name?")]
    assert -1 not in order and order == sorted(order), text
    assert text.endswith("<|im_start|>assistant\n")
