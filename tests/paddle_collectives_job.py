"""One rank of a job that test_paddle_collectives starts under ``python -m paddle.distributed.launch``:
Paddle's own collectives and DataParallel on anychip device $CHIP (rank r on $CHIP:r), each dtype of
$DTYPES; the rank writes what it got to $OUT/rank<r>.json."""

import json
import os

import numpy as np

import anychip
from anychip.frontends.paddle import import_paddle, place

paddle = import_paddle()
import paddle.distributed as dist  # noqa: E402  (after anychip has chosen Paddle's device folder)

chip = os.environ["CHIP"]
dist.init_parallel_env()
rank, nranks = dist.get_rank(), dist.get_world_size()
anychip.set_device(f"{chip}:{rank}")
where = place(chip, rank)
got = {"place": str(paddle.to_tensor([0.0], place=where).place)}


def tensor(values, dtype="float32"):
    return paddle.to_tensor(np.asarray(values), dtype=dtype, place=where)


def values(t) -> list:
    if t.dtype in (paddle.bfloat16, paddle.float16):
        t = t.astype("float32")
    return t.numpy().astype("float64").tolist()


for dtype in os.environ["DTYPES"].split(","):
    x = tensor(np.arange(7) % 2 if dtype == "bool" else np.arange(7) + 1 + rank, dtype)
    dist.all_reduce(x)
    got[f"sum_{dtype}"] = values(x)
for op in ("MAX", "MIN", "PROD"):  # AVG: Paddle's all_reduce asks for nccl_version, absent from its CPU wheel
    x = tensor(np.arange(5) + 1 + 3 * rank)
    dist.all_reduce(x, op=getattr(dist.ReduceOp, op))
    got[op] = values(x)
gathered = []
dist.all_gather(gathered, tensor([float(rank)] * 3))
got["all_gather"] = [values(t) for t in gathered]
x = tensor([10.0 * (rank + 1)] * 4)
dist.broadcast(x, src=nranks - 1)
got["broadcast"] = values(x)
x = tensor(np.arange(4) * (rank + 1))
dist.reduce(x, dst=0)
got["reduce"] = values(x) if rank == 0 else None
x = tensor([0.0] * 2)
dist.reduce_scatter(x, [tensor(np.arange(2) + 10 * j + rank) for j in range(nranks)])
got["reduce_scatter"] = values(x)
# separate tensors of sizes differing per peer: the bridge's send/recv path
received = [tensor(np.zeros(rank + 1)) for _ in range(nranks)]
dist.alltoall(received, [tensor(np.full(j + 1, 100 * rank + j)) for j in range(nranks)])
got["alltoall"] = [values(t) for t in received]
if rank == 0:
    dist.send(tensor([1.5, 2.5, 3.5]), dst=1)
elif rank == 1:
    x = tensor([0.0] * 3)
    dist.recv(x, src=0)
    got["recv"] = values(x)
# Paddle's DataParallel averages the gradients across ranks with its own reducer
paddle.seed(1)
linear = paddle.nn.Linear(4, 3)
linear.to(where)
model = paddle.DataParallel(linear)  # kept: its reducer runs in backward
model(tensor(np.full((2, 4), rank + 1.0))).sum().backward()
got["data_parallel_grad"] = values(linear.weight.grad)
with open(os.path.join(os.environ["OUT"], f"rank{rank}.json"), "w") as f:
    json.dump(got, f)
