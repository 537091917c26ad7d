"""The Llama-family model and generation on tiny random checkpoints: the forward pass against an
independent numpy implementation, prefill with padding, fused and op-by-op decode, sampling,
and the same greedy tokens on every device."""

from __future__ import annotations

import numpy as np
import pytest

from conftest import SIMULATED
from model_helpers import oracle_logits, tiny_checkpoint
from ops_helpers import host, paddle

WEIGHTS = ["float", "int8", "int4", "int4-sym"]


def model_for(checkpoint, device="cpu"):
    paddle()
    from anychip_models.llama import LlamaForCausalLM

    return LlamaForCausalLM(checkpoint, (device, 0))


def generator(checkpoint, device="cpu", fused=True):
    from anychip_models.generate import Generator

    return Generator(model_for(checkpoint, device), checkpoint.tokenizer, fused=fused)


def ids_tensor(array, device="cpu"):
    from anychip.frontends.paddle import place

    return paddle().to_tensor(np.asarray(array, dtype=np.int64), place=place(device, 0))


@pytest.mark.parametrize("weights", WEIGHTS)
@pytest.mark.parametrize("tie,bias", [(True, False), (False, True)])
def test_forward_matches_numpy(weights, tie, bias):
    ckpt = tiny_checkpoint(weights, tie=tie, qkv_bias=bias)
    model = model_for(ckpt)
    ids = np.random.default_rng(1).integers(0, 95, size=(2, 11))
    pos = np.broadcast_to(np.arange(11), ids.shape)
    logits = host(model(ids_tensor(ids), ids_tensor(pos)))
    for b in range(2):
        want = oracle_logits(ckpt, list(ids[b]))
        np.testing.assert_allclose(logits[b], want, rtol=2e-4, atol=2e-4)


def test_prefill_with_right_padding_equals_each_prompt_alone():
    from anychip_models.llama import KVCache

    ckpt = tiny_checkpoint("int4")
    model = model_for(ckpt)
    prompts = [[5, 9, 2], [7, 1, 3, 3, 8, 4, 6], [11]]
    width = max(map(len, prompts))
    ids = np.zeros((3, width), dtype=np.int64)
    for i, p in enumerate(prompts):
        ids[i, :len(p)] = p
    pos = np.broadcast_to(np.arange(width), ids.shape)
    cache = KVCache(ckpt.config, 3, width + 4, ("cpu", 0))
    last = host(model(ids_tensor(ids), ids_tensor(pos), cache, last_index=ids_tensor([len(p) - 1 for p in prompts])))
    for i, p in enumerate(prompts):
        np.testing.assert_allclose(last[i], oracle_logits(ckpt, p)[-1], rtol=2e-4, atol=2e-4)


@pytest.mark.parametrize("weights", WEIGHTS)
@pytest.mark.parametrize("fused", [True, False])
def test_decode_steps_match_numpy(weights, fused):
    """Prefill two prompts of different lengths, then decode tokens through the cache: each
    step's logits equal the oracle's over the whole sequence so far."""
    from anychip_models.llama import KVCache

    ckpt = tiny_checkpoint(weights, tie=False, qkv_bias=True)
    model = model_for(ckpt)
    seqs = [[3, 14, 15, 92, 65], [35, 89]]
    ids = np.zeros((2, 5), dtype=np.int64)
    for i, s in enumerate(seqs):
        ids[i, :len(s)] = s
    cache = KVCache(ckpt.config, 2, 12, ("cpu", 0))
    model(ids_tensor(ids), ids_tensor(np.broadcast_to(np.arange(5), ids.shape)), cache,
          last_index=ids_tensor([4, 1]))
    rng = np.random.default_rng(3)
    for _step in range(4):
        new = rng.integers(0, 95, size=2)
        positions = [len(s) for s in seqs]
        logits = host(model.decode(ids_tensor(new), ids_tensor(positions), cache, fused=fused))
        for i, s in enumerate(seqs):
            s.append(int(new[i]))
            np.testing.assert_allclose(logits[i], oracle_logits(ckpt, s)[-1], rtol=3e-4, atol=3e-4)


@pytest.mark.parametrize("kv,tol", [("bfloat16", 4e-2), ("float16", 6e-3)])
def test_16bit_kv_cache_decodes_the_same_fused_and_op_by_op(kv, tol):
    """A 16-bit KV cache: prefill stores the prompt's keys and values rounded, and each decode
    step, fused or op by op, attends over the rounded cache (its own slot included): the two paths
    agree closely, both near the float64 oracle, and the cache holds half the bytes."""
    from anychip_models.llama import LlamaForCausalLM

    ckpt = tiny_checkpoint("int4", tie=False, qkv_bias=True)
    paddle()
    model = LlamaForCausalLM(ckpt, ("cpu", 0), kv_dtype=kv)
    seqs = [[3, 14, 15, 92, 65], [35, 89]]
    ids = np.zeros((2, 5), dtype=np.int64)
    for i, seq in enumerate(seqs):
        ids[i, :len(seq)] = seq
    caches = [model.new_cache(2, 12) for _ in range(2)]
    assert caches[0].k.dtype == getattr(paddle(), kv) and caches[0].nbytes == model.new_cache(2, 12).nbytes
    for cache in caches:
        model(ids_tensor(ids), ids_tensor(np.broadcast_to(np.arange(5), ids.shape)), cache, last_index=ids_tensor([4, 1]))
    rng = np.random.default_rng(4)
    for _step in range(4):
        new = rng.integers(0, 95, size=2)
        positions = ids_tensor([len(seq) for seq in seqs])
        fused = host(model.decode(ids_tensor(new), positions, caches[0], fused=True))
        plain = host(model.decode(ids_tensor(new), positions, caches[1], fused=False))
        np.testing.assert_allclose(fused, plain, rtol=1e-4, atol=1e-4 * np.abs(plain).max())
        for i, seq in enumerate(seqs):
            seq.append(int(new[i]))
            want = oracle_logits(ckpt, seq)[-1]
            np.testing.assert_allclose(fused[i], want, rtol=tol, atol=tol * np.abs(want).max())
    # the same slots written, a value now and then one step of the dtype apart (rounded from float32 sums
    # made in another order)
    np.testing.assert_allclose(host(caches[0].k), host(caches[1].k), rtol=2**-7, atol=1e-3)
    wide = model_for(ckpt).new_cache(2, 12)
    assert wide.k.dtype == paddle().float32 and wide.nbytes == 2 * caches[0].nbytes


def test_kv_cache_dtype_must_suit_the_device():
    from anychip_models.llama import KVCache, LlamaForCausalLM

    ckpt = tiny_checkpoint("float")
    paddle()
    with pytest.raises(ValueError, match="device dcu has no bfloat16 tensors for a bfloat16 KV cache"):
        KVCache(ckpt.config, 1, 8, ("dcu", 0), "bfloat16")
    with pytest.raises(ValueError, match="KV cache dtype must be one of float32, bfloat16, float16, got 'int8'"):
        LlamaForCausalLM(ckpt, ("cpu", 0), kv_dtype="int8")
    assert KVCache(ckpt.config, 1, 8, ("dcu", 0), "float16").nbytes == 2 * 8 * ckpt.config.num_layers * \
        ckpt.config.num_kv_heads * ckpt.config.head_dim * 2


def test_fused_decode_is_used_and_fallback_is_counted():
    import anychip

    ckpt = tiny_checkpoint("int8")
    gen = generator(ckpt)
    assert gen.model.has_fused_decode()
    from anychip_models.sampling import SamplingParams

    anychip.reset_fallbacks()
    gen.generate([[1, 2, 3]], SamplingParams(max_new_tokens=4, ignore_eos=True))
    assert not any(op == "anychip.decoder_step" for (_dev, op, _dt) in anychip.fallback_counts())
    gen.fused = False
    gen.generate([[1, 2, 3]], SamplingParams(max_new_tokens=4, ignore_eos=True))
    assert not any(op == "anychip.decoder_step" for (_dev, op, _dt) in anychip.fallback_counts()), \
        "choosing the op-by-op path is not a fallback"


def greedy(checkpoint, device, prompts, n=16, fused=True):
    from anychip_models.sampling import SamplingParams

    outs, _stats = generator(checkpoint, device, fused).generate(
        prompts, SamplingParams(max_new_tokens=n, ignore_eos=True))
    return [o.tokens for o in outs]


def test_greedy_batch_equals_each_prompt_alone():
    ckpt = tiny_checkpoint("int4")
    prompts = [[5, 9, 2], [7, 1, 3, 3, 8, 4, 6]]
    batched = greedy(ckpt, "cpu", prompts)
    assert batched == [greedy(ckpt, "cpu", [p])[0] for p in prompts]


@pytest.mark.parametrize("device", SIMULATED)
def test_greedy_tokens_identical_on_simulated_devices(device):
    ckpt = tiny_checkpoint("int4", tie=False, qkv_bias=True)
    prompts = [[5, 9, 2], [7, 1, 3, 3, 8]]
    assert greedy(ckpt, device, prompts) == greedy(ckpt, "cpu", prompts)


def test_sampling_is_reproducible_from_the_seed():
    from anychip_models.sampling import SamplingParams

    ckpt = tiny_checkpoint("float")
    gen = generator(ckpt)

    def run(seed, **kw):
        outs, _ = gen.generate([[4, 5, 6]], SamplingParams(max_new_tokens=12, temperature=1.5, seed=seed,
                                                           ignore_eos=True, **kw))
        return outs[0].tokens

    assert run(7) == run(7)
    assert run(7) != run(8)
    assert run(7, top_k=1) == greedy(ckpt, "cpu", [[4, 5, 6]], n=12)[0]


def test_stop_strings_and_streaming():
    from anychip_models.sampling import SamplingParams

    ckpt = tiny_checkpoint("float")
    gen = generator(ckpt)
    full, _ = gen.generate([[4, 5, 6]], SamplingParams(max_new_tokens=12, ignore_eos=True))
    text = full[0].text
    stop = text[5:7]
    pieces = []
    outs, _ = gen.generate([[4, 5, 6]], SamplingParams(max_new_tokens=12, ignore_eos=True, stop=[stop]),
                           on_text=lambda i, piece: pieces.append(piece))
    assert outs[0].text == text[:text.find(stop)]
    assert outs[0].finish_reason == "stop"
    assert "".join(pieces) == outs[0].text
    assert full[0].finish_reason == "length" and len(full[0].tokens) == 12


def test_bad_generation_arguments():
    from anychip_models.sampling import SamplingParams

    gen = generator(tiny_checkpoint("float"))
    with pytest.raises(ValueError, match="top_p"):
        gen.generate([[1]], SamplingParams(top_p=0))
    with pytest.raises(ValueError, match="temperature"):
        gen.generate([[1]], SamplingParams(temperature=-1))
    with pytest.raises(ValueError, match="outside the vocabulary"):
        gen.generate([[1, 500]], SamplingParams())
    with pytest.raises(ValueError, match="at least one token"):
        gen.generate([[]], SamplingParams())
    with pytest.raises(ValueError, match="context"):
        gen.generate([[1] * 250], SamplingParams(max_new_tokens=10))


def test_device_without_the_fused_kernel_decodes_op_by_op_as_a_counted_fallback(monkeypatch):
    import anychip
    from anychip.fallback import KernelFallbackError
    from anychip.plugins import registry

    kernels = registry().kernels
    real_find = kernels.find
    monkeypatch.setattr(kernels, "find", lambda op, device, dtype: None if (op, device) == ("decoder_step", "npu")
                        else real_find(op, device, dtype))
    ckpt = tiny_checkpoint("int4")
    anychip.reset_fallbacks()
    assert greedy(ckpt, "npu", [[5, 9, 2]], n=6) == greedy(ckpt, "cpu", [[5, 9, 2]], n=6, fused=False)
    counts = anychip.fallback_counts()
    assert counts.get(("npu", "anychip.decoder_step", "float32")) == 5  # every decode step after the first token
    monkeypatch.setenv("ANYCHIP_STRICT", "1")
    with pytest.raises(KernelFallbackError, match="decoder_step"):
        greedy(ckpt, "npu", [[5, 9, 2]], n=3)


@pytest.mark.parametrize("device", ["cpu", "npu"])
def test_forward_continues_from_the_cache(device):
    """A second chunk of tokens (start > 0) attends to the first chunk through the cache."""
    from anychip_models.llama import KVCache

    ckpt = tiny_checkpoint("int8", tie=False, qkv_bias=True)
    model = model_for(ckpt, device)
    seqs = np.random.default_rng(5).integers(0, 95, size=(2, 7))
    cache = KVCache(ckpt.config, 2, 8, (device, 0))
    model(ids_tensor(seqs[:, :4], device), ids_tensor(np.broadcast_to(np.arange(4), (2, 4)), device), cache)
    logits = host(model(ids_tensor(seqs[:, 4:], device), ids_tensor(np.broadcast_to(np.arange(4, 7), (2, 3)), device),
                        cache, start=4))
    for b in range(2):
        np.testing.assert_allclose(logits[b], oracle_logits(ckpt, list(seqs[b]))[4:], rtol=3e-4, atol=3e-4)


@pytest.mark.parametrize("weights", ["int8", "int4"])
def test_int8_activation_decode_stays_close_and_device_independent(weights):
    """x_int8 decoding approximates the exact logits (activations quantized per 32 to 128 values) and,
    being the same kernel everywhere, gives the same tokens on a simulated chip."""
    from anychip_models.llama import KVCache, LlamaForCausalLM

    ckpt = tiny_checkpoint(weights)
    paddle()
    model = LlamaForCausalLM(ckpt, ("cpu", 0), x_int8=True)
    seq = [3, 14, 15, 92]
    cache = KVCache(ckpt.config, 1, 8, ("cpu", 0))
    model(ids_tensor([seq[:3]]), ids_tensor([[0, 1, 2]]), cache)
    got = host(model.decode(ids_tensor([seq[3]]), ids_tensor([3]), cache))[0]
    want = oracle_logits(ckpt, seq)[-1]
    err = np.abs(got - want).max() / np.abs(want).max()
    assert 0 < err < 3e-2, err

    from anychip_models.generate import Generator
    from anychip_models.sampling import SamplingParams

    def tokens(device):
        gen = Generator(LlamaForCausalLM(ckpt, (device, 0), x_int8=True), ckpt.tokenizer)
        return gen.generate([[5, 9, 2]], SamplingParams(max_new_tokens=8, ignore_eos=True))[0][0].tokens

    assert tokens("npu") == tokens("cpu")


@pytest.mark.parametrize("weights", ["int4", "float"])
def test_bf16_stays_close_and_is_batch_invariant(weights):
    """bf16: the fused step's linears as bfloat16 copies approximate the exact logits, and a
    sequence's logits are the same bit for bit alone or decoding among others (what serving's
    equal answers rest on)."""
    from anychip_models.llama import KVCache, LlamaForCausalLM

    ckpt = tiny_checkpoint(weights)
    paddle()
    model = LlamaForCausalLM(ckpt, ("cpu", 0), bf16=True)
    seqs = [[3, 14, 15, 92], [6, 5, 35, 8], [9, 7, 9, 3]]
    cache = KVCache(ckpt.config, 3, 8, ("cpu", 0))
    model(ids_tensor([s[:3] for s in seqs]), ids_tensor([[0, 1, 2]] * 3), cache)
    together = host(model.decode(ids_tensor([s[3] for s in seqs]), ids_tensor([3, 3, 3]), cache, cache_rows=[0, 1, 2]))
    for b, seq in enumerate(seqs):
        alone = host(model.decode(ids_tensor([seq[3]]), ids_tensor([3]), cache, cache_rows=[b]))[0]
        np.testing.assert_array_equal(alone, together[b])
        want = oracle_logits(ckpt, seq)[-1]
        err = np.abs(alone - want).max() / np.abs(want).max()
        assert 0 < err < 3e-2, err
    with pytest.raises(ValueError, match="bf16 and x_int8 exclude each other"):
        LlamaForCausalLM(ckpt, ("cpu", 0), x_int8=True, bf16=True)


@pytest.mark.parametrize("device", ["cpu", "npu"])
def test_batch_int8_takes_int8_for_batches_and_stays_exact_alone(device):
    """batch_int8 (serving's default): a step of fewer than BATCH_INT8_MIN sequences is the exact
    model's bit for bit; a step of more takes the x_int8 products (4-bit weights: the
    small-GEMM kernel), close to the exact logits. The same windows decoded side by side by the
    exact model give the same perplexity as one at a time; with batch_int8, close to it."""
    from anychip_models.evaluate import decode_perplexity
    from anychip_models.llama import BATCH_INT8_MIN, KVCache, LlamaForCausalLM

    ckpt = tiny_checkpoint("int4")
    paddle()
    exact, batched = (LlamaForCausalLM(ckpt, (device, 0), batch_int8=b) for b in (False, True))
    assert BATCH_INT8_MIN == 4 and batched.batches_int8() and not exact.batches_int8()
    assert batched.int8_step(4) and not batched.int8_step(3) and not exact.int8_step(4)
    seqs = [[3, 14, 15, 92], [6, 5, 35, 8], [9, 7, 9, 3], [2, 71, 82, 8]]
    rows = list(range(len(seqs)))
    logits = {}
    for name, model in (("exact", exact), ("batched", batched)):
        cache = KVCache(ckpt.config, 4, 8, (device, 0))
        model(ids_tensor([s[:3] for s in seqs], device), ids_tensor([[0, 1, 2]] * 4, device), cache)
        together = host(model.decode(ids_tensor([s[3] for s in seqs], device), ids_tensor([3] * 4, device), cache,
                                     cache_rows=rows))
        few = host(model.decode(ids_tensor([s[3] for s in seqs[:3]], device), ids_tensor([3] * 3, device), cache,
                                cache_rows=rows[:3]))
        logits[name] = together, few
    np.testing.assert_array_equal(logits["batched"][1], logits["exact"][1])  # 3 sequences: exact
    for b, seq in enumerate(seqs):
        want = oracle_logits(ckpt, seq)[-1]
        assert np.abs(logits["exact"][0][b] - want).max() / np.abs(want).max() < 1e-4
        err = np.abs(logits["batched"][0][b] - want).max() / np.abs(want).max()
        assert 0 < err < 3e-2, err
    ids = list(np.random.default_rng(3).integers(0, 95, size=49))
    one = decode_perplexity(exact, ids, window=12)
    assert decode_perplexity(exact, ids, window=12, batch=4) == pytest.approx(one, rel=1e-5)
    int8 = decode_perplexity(batched, ids, window=12, batch=4)
    assert int8 != one and int8 == pytest.approx(one, rel=3e-2)
    with pytest.raises(ValueError, match="batch must be >= 1"):
        decode_perplexity(exact, ids, batch=0)


def test_decode_perplexity_scores_as_the_forward_does():
    """Perplexity through the decode step (one token at a time through the cache, as generation
    sees it) equals the one-pass forward's for an exact model, in two windows; bf16 moves it a
    little."""
    from anychip_models.evaluate import decode_perplexity, perplexity
    from anychip_models.llama import LlamaForCausalLM

    ckpt = tiny_checkpoint("int4")
    paddle()
    ids = list(np.random.default_rng(3).integers(0, 95, size=21))
    exact = LlamaForCausalLM(ckpt, ("cpu", 0))
    want = perplexity(exact, ids, window=12)
    assert decode_perplexity(exact, ids, window=12) == pytest.approx(want, rel=1e-4)
    bf16 = decode_perplexity(LlamaForCausalLM(ckpt, ("cpu", 0), bf16=True), ids, window=12)
    assert bf16 != want and bf16 == pytest.approx(want, rel=2e-2)
    with pytest.raises(ValueError, match="at least 2 tokens"):
        decode_perplexity(exact, ids[:1])
