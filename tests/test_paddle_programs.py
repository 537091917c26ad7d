"""The held-out programs (tests/paddle_programs.py: an MLP classifier, GPT-2- and Bloom-style
decoders, each trained a few AdamW steps) on every simulated chip under ANYCHIP_STRICT=1, so
that any CPU fallback raises, with losses equal to the CPU's; and the decoders' forward against
an independent numpy forward of the same weights.

One fresh interpreter per device (Paddle registers devices once per process) runs all three
programs; they share this session's ANYCHIP_CACHE_DIR, so each chip's Paddle kernel library is
compiled once per session.
"""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest
from conftest import run_python

CHIPS = ("xpu", "npu", "gcu", "dcu")
HERE = Path(__file__).resolve().parent

_PROGRAM = """
    import json, sys
    sys.path.insert(0, {here!r})
    import anychip
    anychip.set_device({device!r})
    import paddle
    import paddle_programs
    from anychip.fallback import fallback_counts
    result = {{"losses": paddle_programs.all_losses(), "forward": paddle_programs.forward_errors(),
               "fallbacks": sum(fallback_counts().values())}}
    print(json.dumps(result))
"""


def run_programs(device: str) -> dict:
    env = {"ANYCHIP_STRICT": "1"} if device != "cpu" else {}
    result = run_python(textwrap.dedent(_PROGRAM.format(here=str(HERE), device=device)), env=env, timeout=600)
    assert result.returncode == 0, result.stderr[-4000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def on_cpu() -> dict:
    return run_programs("cpu")


def test_decoders_forward_match_numpy_on_the_cpu(on_cpu):
    """Paddle's own CPU forward of GPT2 and Bloom against the numpy forward: the programs are
    the models they claim to be (a wrong mask, slope or norm shows here, on any device)."""
    assert set(on_cpu["forward"]) == {"gpt2", "bloom"}
    assert all(err < 1e-5 for err in on_cpu["forward"].values()), on_cpu["forward"]


@pytest.mark.parametrize("chip", CHIPS)
def test_programs_train_on_the_chip_like_on_the_cpu(chip, on_cpu):
    got = run_programs(chip)
    assert got["fallbacks"] == 0  # strict mode raises on a fallback; none may be counted either
    assert all(err < 1e-5 for err in got["forward"].values()), got["forward"]
    for name, want in on_cpu["losses"].items():
        losses = got["losses"][name]
        assert len(losses) == len(want) and all(l == l for l in losses), (name, losses)
        assert max(abs(a - b) for a, b in zip(losses, want)) <= 1e-5, (chip, name, losses, want)
    # training moved: the losses fall (a frozen model would match the CPU's too)
    assert all(v[-1] < v[0] for v in got["losses"].values()), got["losses"]
