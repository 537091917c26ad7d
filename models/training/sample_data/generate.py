"""Writes the sample fine-tuning data set next to this file: ``train.jsonl`` (300 records) and
``dev.jsonl`` (40 records), in PaddleNLP's format (one ``{"src": ..., "tgt": ...}`` object a line;
lists of strings for multi-turn conversations).

The data teaches a small chat model (SmolLM2-135M-Instruct knows nothing about it) facts about
anychip, as questions and answers. Each fact has one concise answer, asked in many phrasings:
train questions are the fact's train phrasings, each possibly wrapped in a lead-in ("Quick
question: ...") or a follow-up ("... Please keep it short."); dev questions are separate
phrasings that never occur in train, so dev measures whether the fact was learned rather than
the question memorised. About 15% of the records are conversations of two or three turns.

The output is fully determined by SEED: ``python models/training/sample_data/generate.py``
rewrites the same files byte for byte.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

SEED = 20240607
TRAIN_RECORDS, DEV_RECORDS = 300, 40
MULTI_TURN_SHARE = 0.15

# (name, answer, train phrasings, dev phrasings)
FACTS = [
    ("what",
     "anychip is a plugin-based hardware abstraction framework for LLM work on PaddlePaddle. Each chip is "
     "supported by a plugin, so the same training and inference code runs on all of them.",
     ["What is anychip?", "What does anychip do?", "Can you explain what anychip is?", "Tell me about anychip.",
      "Describe anychip in a sentence or two.", "What kind of software is anychip?", "I keep hearing about "
      "anychip. What is it?", "Give me a short overview of anychip.", "What is the anychip framework?",
      "Explain anychip to a new developer."],
     ["In plain words, what is this anychip thing?", "How would you summarize anychip?"]),
    ("switch",
     "Pass --device with the chip's name, for example --device npu. Nothing else in the command changes; in "
     "Python, anychip.set_device(\"npu\") does the same.",
     ["How do I switch hardware in anychip?", "How can I run anychip on an NPU?", "How do I change the device "
      "anychip uses?", "Which flag selects the chip in anychip?", "How do I move my anychip job to another chip?",
      "How do I tell anychip to use the npu?", "What option picks the hardware in anychip?", "How do I target a "
      "different accelerator with anychip?", "How do I choose which chip anychip runs on?", "What do I change "
      "to run the same anychip command on an NPU?"],
     ["My anychip job runs on the CPU. How do I get it onto an NPU instead?",
      "Is there a command-line switch for the accelerator in anychip?"]),
    ("chips",
     "anychip supports gpu, xpu, npu, gcu and dcu, plus cpu. Here xpu, npu, gcu and dcu are simulated, while "
     "gpu and cpu run on real hardware.",
     ["Which chips does anychip support?", "What hardware can anychip run on?", "List the devices anychip "
      "supports.", "Which accelerators work with anychip?", "Does anychip support more than GPUs?", "What "
      "device types does anychip know about?", "Name the chips anychip can use.", "Which backends does anychip "
      "have?", "What chips are available in anychip?", "Which processors can run anychip?"],
     ["Can you enumerate every kind of chip that anychip handles?", "Tell me all the device names I can pass "
      "to anychip."]),
    ("simulated",
     "A simulated chip runs on anychip's simulator when the vendor's runtime is missing: it has the chip's "
     "memory size and data types but runs at the host CPU's speed, and it is always labeled as simulated.",
     ["What is a simulated chip in anychip?", "What does simulated mean for an anychip device?", "How does "
      "anychip simulate a chip?", "Why is my npu shown as simulated?", "Are the simulated devices in anychip "
      "real hardware?", "What happens when the vendor runtime is missing in anychip?", "Is a simulated chip as "
      "fast as the real one?", "What is the anychip simulator?", "How can anychip run on an NPU I don't have?",
      "Explain simulated devices in anychip."],
     ["My xpu says simulated. Does that mean it is slow hardware?", "How is it possible to use a gcu on a "
      "laptop with anychip?"]),
    ("conformance",
     "A conformance kit is the test suite a chip plugin must pass: it checks the plugin's device functions "
     "and kernels against reference results, so a plugin that passes it can run anychip's models unchanged.",
     ["What is a conformance kit?", "What does the anychip conformance kit check?", "Why does a plugin need "
      "the conformance kit?", "Explain the conformance kit in anychip.", "What is the purpose of the "
      "conformance kit?", "How do I know my chip plugin is correct?", "What tests must a chip plugin pass?",
      "What does passing the conformance kit mean?", "Tell me about anychip's conformance kit.", "How is a "
      "new plugin validated in anychip?"],
     ["Before I ship my plugin, what should I run to prove it works?", "Describe the test suite that "
      "certifies an anychip plugin."]),
    ("kernels",
     "The four key kernels are fused attention, FlashMask attention, RMSNorm and quantized matmul.",
     ["What are the four key kernels in anychip?", "Which kernels matter most in anychip?", "Name the key "
      "kernels of anychip.", "What kernels should a new chip implement first?", "List anychip's four key "
      "kernels.", "Which four kernels does anychip rely on?", "What are the core kernels for LLM work in "
      "anychip?", "Which kernels does a chip plugin need most?", "Tell me the main kernels of anychip.",
      "What are the most important kernels in anychip?"],
     ["If I only had time for four kernels on my chip, which ones should they be?", "Which kernels make up "
      "the heart of anychip?"]),
    ("plugin",
     "A plugin adds one chip to anychip. It implements two small C contracts, device.h for memory, streams "
     "and events and kernel.h for the kernels, and registers through a Python entry point.",
     ["What is an anychip plugin?", "What does a plugin do in anychip?", "How are chips added to anychip?",
      "What goes into an anychip plugin?", "Explain anychip plugins.", "What does a chip vendor implement "
      "for anychip?", "Which C contracts does an anychip plugin implement?", "How does anychip find its "
      "plugins?", "What is inside a chip plugin?", "What are device.h and kernel.h for?"],
     ["As a chip vendor, what exactly do I have to write for anychip?", "How is support for one accelerator "
      "packaged in anychip?"]),
    ("port",
     "Write a plugin for it: implement device.h and the key kernels of kernel.h, then run the conformance kit "
     "until it passes.",
     ["How do I add a new chip to anychip?", "How do I port anychip to my accelerator?", "What are the steps "
      "to support a new chip?", "I built a new AI chip. How do I make anychip use it?", "How do I bring up a "
      "new device in anychip?", "What is the process for adding hardware to anychip?", "How do I write "
      "support for another chip?", "Can I add my own chip to anychip?", "How does a vendor add a device to "
      "anychip?", "Where do I start when porting anychip?"],
     ["Our team designed an accelerator. What is the path to running anychip on it?", "Walk me through "
      "supporting a brand new processor in anychip."]),
    ("paddle",
     "anychip is built on PaddlePaddle: each anychip device is registered as a Paddle CustomDevice.",
     ["Which deep learning framework does anychip use?", "Is anychip built on PyTorch or PaddlePaddle?",
      "What framework is anychip based on?", "Does anychip work with PaddlePaddle?", "How does anychip connect "
      "to Paddle?", "What does anychip run on top of?", "How do anychip devices appear in Paddle?", "Which "
      "framework do I need for anychip?", "What is anychip's relationship to PaddlePaddle?", "Is anychip a "
      "Paddle extension?"],
     ["Under the hood, which ML library powers anychip?", "Do I need Paddle installed to use anychip devices?"]),
    ("flashmask",
     "FlashMask attention is attention with a sparse mask given as start and end row indices for each key "
     "column. Packed sequences then attend only within their own document, and only the visible part is "
     "computed.",
     ["What is FlashMask attention?", "Explain FlashMask.", "What does FlashMask attention do in anychip?",
      "How does FlashMask describe a mask?", "Why use FlashMask attention?", "What are startend row indices?",
      "How do packed sequences avoid attending to each other?", "What is special about FlashMask?", "How "
      "does anychip mask packed documents?", "Tell me about the FlashMask kernel."],
     ["Is there a cheap way to keep concatenated examples from seeing each other in attention?",
      "What does the column-sparse attention kernel of anychip compute?"]),
    ("rmsnorm",
     "RMSNorm scales each hidden vector by the inverse of its root mean square and multiplies it by a learned "
     "weight. anychip's kernel also fuses the residual add.",
     ["What is RMSNorm?", "What does the RMSNorm kernel do?", "Explain RMSNorm in anychip.", "How does "
      "RMSNorm normalize a vector?", "What is the RMSNorm kernel for?", "How is RMSNorm different from "
      "LayerNorm?", "Does anychip's RMSNorm fuse anything?", "Tell me about the RMSNorm kernel.", "What does "
      "RMSNorm compute?", "Why do LLMs use RMSNorm?"],
     ["Describe the normalization kernel anychip ships.", "How does root-mean-square normalization work in "
      "anychip?"]),
    ("quant",
     "Quantized matmul multiplies activations by int8 or int4 weights that are dequantized group by group "
     "inside the kernel, which saves memory and bandwidth.",
     ["What is quantized matmul?", "How does anychip's quantized matmul work?", "What does the quantized "
      "matmul kernel do?", "Why use quantized matmul?", "Which weight types does quantized matmul take?",
      "Explain weight-only quantized matmul.", "How does anychip multiply by int4 weights?", "What is the "
      "benefit of quantized matmul?", "Tell me about the quantized matmul kernel.", "How are quantized "
      "weights used in anychip?"],
     ["Can anychip do matrix products with 4-bit weights, and how?", "Describe the low-bit matrix "
      "multiplication kernel."]),
    ("fallback",
     "When a chip has no kernel for an op, the op runs on the CPU with copies and is counted as a fallback. "
     "--report-fallbacks lists them, and ANYCHIP_STRICT=1 turns them into errors.",
     ["What is a fallback in anychip?", "What happens when a chip lacks a kernel?", "How do I see which ops "
      "fell back to the CPU?", "What does --report-fallbacks do?", "How can I make fallbacks an error?",
      "What does ANYCHIP_STRICT do?", "Why did an op run on the CPU?", "How does anychip handle missing "
      "kernels?", "Explain CPU fallbacks in anychip.", "How do I find ops my chip does not accelerate?"],
     ["An operator is missing on my device. What does anychip do then?", "Is there a way to list the ops "
      "that were not run on the accelerator?"]),
    ("devices",
     "Run anychip devices. It lists every chip with its status (hardware, simulated or unavailable), count, "
     "memory and kernels.",
     ["How do I list the devices anychip sees?", "Which command shows my chips?", "How can I check which "
      "devices are available?", "What does anychip devices print?", "How do I see if my npu is simulated?",
      "How do I find out why a device is unavailable?", "Which command shows device status in anychip?",
      "How do I inspect the hardware anychip found?", "How can I see device memory in anychip?", "What "
      "shows the kernels each chip has?"],
     ["Is there a command to print every accelerator together with its status?", "How do I tell whether "
      "anychip found real hardware on this machine?"]),
    ("default",
     "The default device is cpu. Choose another with --device or the ANYCHIP_DEVICE environment variable.",
     ["What is anychip's default device?", "Which device does anychip use if I don't pick one?", "Where do "
      "anychip commands run by default?", "How do I set a default device?", "What does ANYCHIP_DEVICE do?",
      "Does anychip use the GPU by default?", "Which chip is used when no flag is given?", "Can I set the "
      "device with an environment variable?", "What device is selected out of the box?", "How do I make npu "
      "the default?"],
     ["If I run a command with no device option, what hardware does it land on?", "Which environment "
      "setting decides the chip when I pass nothing?"]),
    ("workloads",
     "anychip is for LLM work: training, fine-tuning and inference of large language models.",
     ["What is anychip used for?", "Which workloads does anychip target?", "Can I train models with "
      "anychip?", "Is anychip only for inference?", "What kind of models is anychip for?", "Does anychip "
      "support fine-tuning?", "What tasks can anychip run?", "Who is anychip for?", "Is anychip meant for "
      "large language models?", "What jobs does anychip handle?"],
     ["Would anychip help me fine-tune a chat model, or is it only for serving?", "What sort of machine "
      "learning work was anychip designed around?"]),
    ("attention",
     "Fused attention computes softmax(QK^T)V in one kernel, flash-attention style, without storing the full "
     "score matrix, and it supports grouped-query heads.",
     ["What is fused attention?", "How does anychip's fused attention work?", "Why fuse attention into one "
      "kernel?", "Does fused attention support grouped-query attention?", "What does the attention kernel "
      "compute?", "Explain fused attention.", "Is anychip's attention flash-attention style?", "Tell me "
      "about the fused attention kernel.", "What does fused attention avoid storing?", "How is attention "
      "computed in anychip?"],
     ["Why doesn't anychip keep the whole attention score matrix in memory?", "Describe the single-kernel "
      "attention that anychip provides."]),
]

LEAD_INS = ["{q}", "Quick question: {q}", "Hi! {q}", "{q} Please keep it short.", "I have a question. {q}"]
FOLLOW_UPS = ["{q}", "Another thing: {q}", "Thanks. {q}", "One more: {q}"]


def _train_question(rng: random.Random, phrasings: list[str], follow_up: bool) -> str:
    wrappers = FOLLOW_UPS if follow_up else LEAD_INS
    return rng.choice(wrappers).format(q=rng.choice(phrasings))


def _records(rng: random.Random, count: int, split: str) -> list[dict]:
    """``count`` records of ``split``: single questions cycling over the facts, then conversations."""
    multi = round(count * MULTI_TURN_SHARE)
    records = []
    order = []
    while len(order) < count - multi:  # every fact equally often, in shuffled rounds
        names = list(range(len(FACTS)))
        rng.shuffle(names)
        order += names
    for f in order[:count - multi]:
        name, answer, train, dev = FACTS[f]
        question = _train_question(rng, train, False) if split == "train" else rng.choice(dev)
        records.append({"src": question, "tgt": answer})
    for _ in range(multi):
        facts = rng.sample(range(len(FACTS)), rng.choice([2, 2, 3]))
        src, tgt = [], []
        for turn, f in enumerate(facts):
            _, answer, train, dev = FACTS[f]
            src.append(_train_question(rng, train, turn > 0) if split == "train" else rng.choice(dev))
            tgt.append(answer)
        records.append({"src": src, "tgt": tgt})
    rng.shuffle(records)
    return records


def generate() -> dict[str, list[dict]]:
    rng = random.Random(SEED)
    data = {"train": _records(rng, TRAIN_RECORDS, "train"), "dev": _records(rng, DEV_RECORDS, "dev")}

    def questions(records):
        return {q for r in records for q in (r["src"] if isinstance(r["src"], list) else [r["src"]])}

    train_phrasings = {q for fact in FACTS for q in fact[2]}
    dev_questions = questions(data["dev"])
    assert not dev_questions & questions(data["train"]) and not dev_questions & train_phrasings
    return data


def main() -> None:
    here = Path(__file__).resolve().parent
    for split, records in generate().items():
        text = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records)
        (here / f"{split}.jsonl").write_text(text, encoding="utf-8")
        print(f"{here / f'{split}.jsonl'}: {len(records)} records")


if __name__ == "__main__":
    main()
