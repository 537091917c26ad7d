"""Training: one LoRA step (forward, backward, AdamW) of SmolLM2-135M-Instruct on `cpu`, one
512-token sequence of the shipped sample data packed with zero padding (FlashMask keeps its
examples apart), adapters of rank 8 on all seven projections of every layer.

anychip: the model of ``anychip_models`` (anychip ops: RMSNorm, RoPE, FlashMask attention,
SwiGLU, linear, fused AdamW), its matmuls in float32 and in bfloat16 (AMX). Peer: the same model
and the same step built from plain Paddle ops (composed RMSNorm and RoPE, dense masked
attention through ``scaled_dot_product_attention``, ``paddle.matmul``, Paddle's AdamW), float32
since Paddle's CPU wheel has no bfloat16 matmul. Both compute the output head only for the
positions with a loss. FLOPs: 4 x (layer matmul weights x tokens + head weights x loss
positions), the forward and the input gradient of every frozen matmul (adapters and attention
excluded). The zero-padding figure (share of real tokens, packs against plain padding to the
longest of a batch) is in the case notes.

DPO: one LoRA step (both responses' log-probabilities, the sigmoid loss against precomputed
reference log-probabilities, backward, AdamW) on the sample preference pairs that fill two
512-token rows, shared-prompt packed (each prompt once, a shared-question FlashMask) against the
same pairs unpacked (prompt + chosen and prompt + rejected rows, padded to the longest).
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from benchlib import THREADS, Case, FasterThan

MAX_LENGTH = 512
RANK = 8
PAD_BATCH = 8  # the plain-padding batch the zero-padding figure compares with


@pytest.fixture(scope="module")
def setup(pd):
    from pathlib import Path

    from anychip_models.loader import load_checkpoint
    from anychip_models.hub import resolve
    from anychip_models.training.data import ChatFormat, load_sft_data
    from anychip_models.training.packing import packed_batches, padding_efficiency

    ckpt = load_checkpoint(resolve("smollm2"), weights="float")
    data = Path(__file__).resolve().parents[1] / "models" / "training" / "sample_data"
    examples, _ = load_sft_data(data, ChatFormat.from_tokenizer(ckpt.tokenizer), MAX_LENGTH)
    batch = max(packed_batches(examples, MAX_LENGTH, 1), key=lambda b: b.real_tokens)
    return ckpt, batch, padding_efficiency(examples, MAX_LENGTH, PAD_BATCH)


def step_flops(ckpt, batch) -> float:
    c = ckpt.config
    layer = c.hidden_size * (c.num_heads + 2 * c.num_kv_heads) * c.head_dim + c.num_heads * c.head_dim * c.hidden_size \
        + 3 * c.hidden_size * c.intermediate_size
    return 4.0 * (layer * c.num_layers * MAX_LENGTH + c.vocab_size * c.hidden_size * batch.loss_tokens)


def case(ckpt, batch, efficiency, compute: str) -> Case:
    return Case(f"SmolLM2-135M LoRA r{RANK} train step, {MAX_LENGTH} tokens packed, {compute} matmuls", "compute",
                step_flops(ckpt, batch), peak="bf16" if compute == "bf16" else "fp32",
                targets=(FasterThan("paddle", 1.5, "plain Paddle (fp32)"),),
                note=f"{batch.real_tokens} real tokens of {MAX_LENGTH} ({len(batch.examples)} examples); zero padding "
                     f"keeps {efficiency['zero_padding']:.0%} of sequence tokens real on the sample data vs "
                     f"{efficiency['padding']:.0%} padded to the longest of {PAD_BATCH}")


# ---- anychip -------------------------------------------------------------------------------

class AnychipStep:
    def __init__(self, ckpt, batch, compute_dtype: str):
        from anychip_models.lora import LoraConfig
        from anychip_models.training.model import TrainableModel
        from anychip_models.training.optimizer import AdamW

        self.model = TrainableModel(ckpt, ("cpu", 0), lora=LoraConfig(rank=RANK), compute_dtype=compute_dtype)
        self.optimizer = AdamW(self.model.params)
        self.batch, self.step = batch, 0

    def loss(self):
        return self.model.batch_loss(self.batch, self.batch.loss_tokens)[0]

    def __call__(self):
        self.step += 1
        loss = self.loss()
        loss.backward()
        self.optimizer.clip_grad_norm(1.0)
        self.optimizer.step(1e-4, self.step)
        self.optimizer.zero_grad()
        return loss


@pytest.mark.parametrize("compute", ["fp32", "bf16"])
def test_anychip_lora_step(benchmark, bench, setup, compute):
    ckpt, batch, efficiency = setup
    run = AnychipStep(ckpt, batch, "bfloat16" if compute == "bf16" else "float32")
    bench.run(benchmark, case(ckpt, batch, efficiency, compute), "anychip", run, label=f"anychip ({compute} matmuls)",
              min_rounds=3, max_rounds=10, warmup=1, notes=f"{THREADS} threads")


# ---- plain Paddle ------------------------------------------------------------------------------

class PlainPaddleStep:
    """The same LoRA step with Paddle's own ops only."""

    def __init__(self, pd, ckpt, batch):
        self.pd, self.c = pd, ckpt.config
        c = self.c
        rng = np.random.default_rng(0)
        place = pd.CPUPlace()

        def frozen(a):
            t = pd.to_tensor(np.ascontiguousarray(a, dtype=np.float32), place=place)
            t.stop_gradient = True
            return t

        self.w = {name: frozen(t) for name, t in ckpt.tensors.items()}
        self.adapters = {}
        for i in range(c.num_layers):
            for target in ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"):
                n, k = ckpt.tensors[f"layers.{i}.{target}"].shape
                a = pd.to_tensor(rng.uniform(-1 / math.sqrt(k), 1 / math.sqrt(k), (RANK, k)).astype(np.float32), place=place)
                b = pd.to_tensor(np.zeros((n, RANK), np.float32), place=place)
                a.stop_gradient = b.stop_gradient = False
                self.adapters[f"layers.{i}.{target}"] = (a, b)
        self.optimizer = pd.optimizer.AdamW(learning_rate=1e-4, weight_decay=0.0, grad_clip=pd.nn.ClipGradByGlobalNorm(1.0),
                                            parameters=[t for pair in self.adapters.values() for t in pair])
        self.ids = pd.to_tensor(batch.input_ids, place=place)
        pos = batch.position_ids[0]
        self.cos, self.sin = self._rope(pos)
        labels = batch.labels.reshape(-1)
        self.rows = pd.to_tensor(np.flatnonzero(labels != -100), place=place)
        self.targets = pd.to_tensor(labels[labels != -100].reshape(-1, 1), place=place)
        # the packs' causal-document mask, dense: a query sees earlier keys of its own example
        doc = np.cumsum(pos == 0)
        visible = (doc[:, None] == doc[None, :]) & (np.arange(len(pos))[:, None] >= np.arange(len(pos))[None, :])
        self.mask = pd.to_tensor(np.where(visible, 0.0, -np.inf).astype(np.float32)[None, None], place=place)

    def _rope(self, pos):
        d = self.c.head_dim
        inv = 1.0 / (self.c.rope_theta ** (np.arange(0, d, 2, dtype=np.float64) / d))
        ang = pos[:, None].astype(np.float64) * inv[None]
        ang = np.concatenate([ang, ang], axis=-1)
        place = self.pd.CPUPlace()
        return (self.pd.to_tensor(np.cos(ang).astype(np.float32)[None, :, None], place=place),
                self.pd.to_tensor(np.sin(ang).astype(np.float32)[None, :, None], place=place))

    def _norm(self, x, w):
        pd = self.pd
        return x * pd.rsqrt((x * x).mean(axis=-1, keepdim=True) + self.c.rms_eps) * w

    def _rotate(self, x):
        half = x.shape[-1] // 2
        rotated = self.pd.concat([-x[..., half:], x[..., :half]], axis=-1)
        return x * self.cos + rotated * self.sin

    def _linear(self, x, name):
        pd = self.pd
        y = pd.matmul(x, self.w[name], transpose_y=True)
        if name in self.adapters:
            a, b = self.adapters[name]
            y = y + pd.matmul(pd.matmul(x, a, transpose_y=True), b, transpose_y=True) * (16.0 / RANK)
        return y

    def loss(self):
        pd, c = self.pd, self.c
        f = pd.nn.functional
        t = MAX_LENGTH
        h = f.embedding(self.ids, self.w["embed_tokens"])
        for i in range(c.num_layers):
            p = f"layers.{i}."
            a = self._norm(h, self.w[p + "attn_norm"])
            q = self._rotate(self._linear(a, p + "q_proj").reshape([1, t, c.num_heads, c.head_dim]))
            k = self._rotate(self._linear(a, p + "k_proj").reshape([1, t, c.num_kv_heads, c.head_dim]))
            v = self._linear(a, p + "v_proj").reshape([1, t, c.num_kv_heads, c.head_dim])
            groups = c.num_heads // c.num_kv_heads
            k = pd.repeat_interleave(k, groups, axis=2)
            v = pd.repeat_interleave(v, groups, axis=2)
            o = f.scaled_dot_product_attention(q, k, v, attn_mask=self.mask)
            h = h + self._linear(o.reshape([1, t, c.num_heads * c.head_dim]), p + "o_proj")
            m = self._norm(h, self.w[p + "ffn_norm"])
            h = h + self._linear(f.silu(self._linear(m, p + "gate_proj")) * self._linear(m, p + "up_proj"),
                                 p + "down_proj")
        h = pd.gather(self._norm(h, self.w["norm"]).reshape([t, c.hidden_size]), self.rows)
        logits = pd.matmul(h, self.w["embed_tokens" if c.tie_embeddings else "lm_head"], transpose_y=True)
        return f.cross_entropy(logits, self.targets)

    def __call__(self):
        loss = self.loss()
        loss.backward()
        self.optimizer.step()
        self.optimizer.clear_grad()
        return loss


def test_plain_paddle_lora_step(benchmark, bench, setup, pd):
    ckpt, batch, efficiency = setup
    run = PlainPaddleStep(pd, ckpt, batch)
    fp32, bf16 = case(ckpt, batch, efficiency, "fp32"), case(ckpt, batch, efficiency, "bf16")
    bench.run(benchmark, fp32, "paddle", run, label="plain Paddle ops (fp32)", min_rounds=3, max_rounds=10, warmup=1,
              notes="Paddle's CPU wheel has no bf16 matmul", also=(bf16,))


def test_same_loss(setup, pd):
    """The peer computes the same thing: its first loss equals anychip's (adapters start at B = 0)."""
    ckpt, batch, _ = setup
    ours = float(AnychipStep(ckpt, batch, "float32").loss())
    theirs = float(PlainPaddleStep(pd, ckpt, batch).loss())
    assert ours == pytest.approx(theirs, rel=1e-4)


# ---- DPO: shared-prompt packing against unpacked pairs --------------------------------------------

DPO_ROWS = 2  # 512-token packed rows of preference pairs


@pytest.fixture(scope="module")
def dpo_setup(setup):
    """SmolLM2 and the first sample preference pairs that fill DPO_ROWS packed rows, with their
    reference log-probabilities (the model before any step)."""
    from pathlib import Path

    from anychip_models.training.data import ChatFormat
    from anychip_models.training.preference import load_preference_data, packed_pair_batches, unpacked_pair_batches

    ckpt = setup[0]
    data = Path(__file__).resolve().parents[1] / "models" / "training" / "sample_preferences"
    pairs, _ = load_preference_data(data, ChatFormat.from_tokenizer(ckpt.tokenizer), MAX_LENGTH)
    first = packed_pair_batches(pairs, range(len(pairs)), MAX_LENGTH, DPO_ROWS)[0]
    pairs = [pairs[i] for i in first.pairs]
    packed = packed_pair_batches(pairs, range(len(pairs)), MAX_LENGTH, DPO_ROWS)[0]
    assert packed.num_pairs == len(pairs)
    unpacked = unpacked_pair_batches(pairs, range(len(pairs)), len(pairs))[0]
    return ckpt, packed, unpacked


def dpo_case(ckpt, packed, unpacked) -> Case:
    c = ckpt.config
    layer = c.hidden_size * (c.num_heads + 2 * c.num_kv_heads) * c.head_dim + c.num_heads * c.head_dim * c.hidden_size \
        + 3 * c.hidden_size * c.intermediate_size
    flops = 4.0 * (layer * c.num_layers * packed.real_tokens + c.vocab_size * c.hidden_size * len(packed.rows))
    return Case(f"SmolLM2-135M DPO LoRA r{RANK} step, {packed.num_pairs} preference pairs", "compute", flops,
                peak="fp32", targets=(FasterThan("unpacked", 1.4, "the same pairs unpacked"),),
                note=f"packed: {packed.input_ids.shape[0]} rows of {MAX_LENGTH}, {packed.real_tokens} tokens; unpacked: "
                     f"{unpacked.input_ids.shape[0]} rows of {unpacked.input_ids.shape[1]}, {unpacked.real_tokens} tokens "
                     "before padding; FLOPs counted for the packed tokens (the work both do)")


class DpoStep(AnychipStep):
    """AnychipStep with DPO's loss, against the reference log-probabilities of its start."""

    def __init__(self, ckpt, batch):
        from anychip.frontends.paddle import import_paddle
        from anychip_models.training.dpo import sequence_logps

        super().__init__(ckpt, batch, "float32")
        self.paddle = import_paddle()
        with self.paddle.no_grad():
            self.ref = [t.numpy() for t in sequence_logps(self.model, batch)]

    def loss(self):
        from anychip_models.training.dpo import preference_loss, sequence_logps

        chosen, rejected = sequence_logps(self.model, self.batch)
        h = (chosen - self.paddle.to_tensor(self.ref[0])) - (rejected - self.paddle.to_tensor(self.ref[1]))
        return preference_loss(h, beta=0.1).sum() / self.batch.num_pairs


@pytest.mark.parametrize("packing", ["packed", "unpacked"])
def test_dpo_step(benchmark, bench, dpo_setup, packing):
    ckpt, packed, unpacked = dpo_setup
    run = DpoStep(ckpt, packed if packing == "packed" else unpacked)
    impl = "anychip" if packing == "packed" else "unpacked"
    label = "anychip, shared-prompt packing" if packing == "packed" else "anychip, unpacked pairs"
    bench.run(benchmark, dpo_case(ckpt, packed, unpacked), impl, run, label=label, min_rounds=3, max_rounds=10,
              warmup=1, notes=f"{THREADS} threads")


# ---- data parallelism -----------------------------------------------------------------------
# The whole `anychip finetune --lora` command, as a user runs it, on the host's THREADS cores: one
# process using all of them against THREADS ranks (`--nproc`, paddle.distributed.launch, gloo)
# of one thread each, for the same global batch (THREADS sequences of 512 tokens per step). The
# time of a step is the trainer's own (metrics.jsonl), the first DP_WARMUP steps left out;
# the ranks' figure includes their gradient all-reduce.

DP_STEPS, DP_WARMUP = 8, 2


def dp_case(ckpt) -> Case:
    c = ckpt.config
    layer = c.hidden_size * (c.num_heads + 2 * c.num_kv_heads) * c.head_dim + c.num_heads * c.head_dim * c.hidden_size \
        + 3 * c.hidden_size * c.intermediate_size
    flops = 4.0 * layer * c.num_layers * MAX_LENGTH * THREADS  # the head's share left out: it varies per pack
    return Case(f"SmolLM2-135M LoRA r{RANK} step, data parallel: {THREADS} x {MAX_LENGTH} tokens per step", "compute",
                flops, peak="fp32", targets=(FasterThan("one-process", 0.85, f"one process of {THREADS} threads"),),
                note=f"whole `anychip finetune` runs; step times from metrics.jsonl, the first {DP_WARMUP} left out")


def _finetune_step_seconds(tmp_path, nproc: int) -> list[float]:
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    data = Path(__file__).resolve().parents[1] / "models" / "training" / "sample_data"
    out = tmp_path / f"nproc{nproc}"
    env = {**os.environ, "ANYCHIP_NUM_THREADS": str(THREADS // nproc)}
    command = [sys.executable, "-m", "anychip.cli.main", "finetune", "--model", "smollm2", "--data", str(data), "--lora",
               "--zero-padding", "--max-length", str(MAX_LENGTH), "--max-steps", str(DP_STEPS), "--lr", "1e-4",
               "--grad-accum", str(THREADS // nproc), "--nproc", str(nproc), "--output", str(out)]
    run = subprocess.run(command, env=env, capture_output=True, text=True, timeout=1800)
    assert run.returncode == 0, run.stderr[-3000:]
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if line.strip()]
    return [r["seconds"] for r in records if "seconds" in r][DP_WARMUP:]


@pytest.mark.parametrize("ranks", ["one-process", "ranks"])
def test_data_parallel_lora_step(benchmark, bench, setup, tmp_path, ranks):
    if THREADS < 2:
        pytest.skip("data parallelism needs 2 host threads to divide")
    ckpt = setup[0]
    nproc = THREADS if ranks == "ranks" else 1
    samples = _finetune_step_seconds(tmp_path, nproc)
    impl = "anychip" if ranks == "ranks" else "one-process"
    label = (f"anychip, {nproc} ranks x 1 thread (--nproc {nproc})" if ranks == "ranks"
             else f"anychip, 1 process x {THREADS} threads")
    benchmark.extra_info["steps"] = len(samples)
    bench.collector.record(dp_case(ckpt), impl, samples, extra_info=benchmark.extra_info, label=label,
                           notes=f"median of {len(samples)} steps")
