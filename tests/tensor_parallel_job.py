"""One rank of a job that test_tensor_parallel starts under ``python -m paddle.distributed.launch``:
the model of $MODEL split across the ranks on $CHIP, its logits for a fixed batch (prefill and
one cached decode step, fused by parts and op by op) written by rank 0 to $OUT/logits.npz."""

import os

import numpy as np

import anychip
from anychip.ops.dispatch import place
from anychip.frontends.paddle import import_paddle
from anychip_models.loader import load_checkpoint
from anychip_models.llama import LlamaForCausalLM
from anychip_models.training.distributed import join, rank

paddle = import_paddle()
chip = os.environ["CHIP"]
device = (chip, 0 if chip == "cpu" else rank())
anychip.set_device(f"{device[0]}:{device[1]}")
world = join(device, int(os.environ["TP"]))
model = LlamaForCausalLM(load_checkpoint(os.environ["MODEL"]), device, tp=world.tp)
tokens = np.random.default_rng(0).integers(0, model.config.vocab_size, size=(2, 7))
dev = place(device)
steps = {}
with paddle.no_grad():
    for fused in (True, False):
        cache = model.new_cache(2, 16)
        prefill = model(paddle.to_tensor(tokens, place=dev),
                        paddle.to_tensor(np.tile(np.arange(7), (2, 1)), place=dev), cache)
        steps[fused] = model.decode(paddle.to_tensor(tokens[:, 0], place=dev),
                                    paddle.to_tensor(np.array([7, 7]), place=dev), cache, fused=fused).numpy()
if world.main:
    np.savez(os.path.join(os.environ["OUT"], "logits.npz"), prefill=prefill.numpy(), decode=steps[True],
             decode_op_by_op=steps[False], tokens=tokens, fused=model.has_fused_decode())
