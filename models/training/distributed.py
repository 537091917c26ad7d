"""Data-parallel training on Paddle's own engine: ``anychip finetune|pretrain|dpo --nproc N``
starts N ranks through ``python -m paddle.distributed.launch``, each running the same command on
its own device (``--device npu --nproc 2``: npu:0 and npu:1; on ``cpu`` every rank shares the
host, with the host's threads divided between them). Each rank joins Paddle's process group
(``paddle.distributed.init_parallel_env``: gloo on the host, the device's own collectives,
``xccl``, on a chip), and the Trainer gives every rank its share of each optimizer step's
micro-batches and sums the gradients and the step's figures across ranks with
``paddle.distributed.all_reduce``. Every rank knows the whole data order (it is drawn from the
seed), so each divides its losses by the whole step's target tokens and the summed gradient is
the one a single device computes for the same global batch.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # importing it imports Paddle, which a launching process never needs
    from ..tensor_parallel import TensorParallel

WORLD_ENV = "PADDLE_TRAINERS_NUM"  # set by paddle.distributed.launch in every rank
RANK_ENV = "PADDLE_TRAINER_ID"
# Fault injection (for tests): "R@STEP" makes rank R SIGKILL itself as it starts summing the
# gradients of optimizer step STEP; "R@STEP:hang" makes it wait forever there instead, so that
# the others wait for it in their collectives until ANYCHIP_COLLECTIVE_TIMEOUT.
FAULT_ENV = "ANYCHIP_FAULT_RANK"


def launched() -> bool:
    """Whether this process is one rank of a launched job of several."""
    return int(os.environ.get(WORLD_ENV, "1")) > 1 and RANK_ENV in os.environ


def rank() -> int:
    return int(os.environ.get(RANK_ENV, "0")) if launched() else 0


def fault_point(rank_: int, step: int) -> None:
    """Dies here if $ANYCHIP_FAULT_RANK names this rank and step."""
    value = os.environ.get(FAULT_ENV)
    if not value:
        return
    who, _, at = value.partition("@")
    at, _, how = at.partition(":")
    if not (who.isdigit() and at.isdigit() and how in ("", "hang")):
        raise ValueError(f"{FAULT_ENV}={value!r} is not RANK@STEP or RANK@STEP:hang")
    if int(who) != rank_ or int(at) != step:
        return
    sys.stdout.flush()
    sys.stderr.flush()
    if how == "hang":
        import threading

        threading.Event().wait()
    import signal

    os.kill(os.getpid(), signal.SIGKILL)


def without_nproc(argv: list[str]) -> list[str]:
    """``argv`` less its ``--nproc N`` (or ``--nproc=N``)."""
    out, skip = [], False
    for arg in argv:
        if skip:
            skip = False
        elif arg == "--nproc":
            skip = True
        elif not arg.startswith("--nproc="):
            out.append(arg)
    return out


def launch(argv: list[str], nproc: int, chip: str) -> int:
    """Runs ``anychip ARGV`` (less --nproc) as ``nproc`` ranks on ``chip`` under
    paddle.distributed.launch and returns its exit status. The ranks' logs go to a temporary
    folder, named on failure; rank 0's output is shown as it runs (Paddle's launcher does that)."""
    logs = tempfile.mkdtemp(prefix="anychip-ranks-")
    env = dict(os.environ)
    from anychip.frontends.paddle.root import job_env

    env.update(job_env(chip))
    if "ANYCHIP_NUM_THREADS" not in env:  # N ranks on one host share its CPUs
        env["ANYCHIP_NUM_THREADS"] = str(max(1, (os.cpu_count() or 1) // nproc))
    command = [sys.executable, "-m", "paddle.distributed.launch", "--nproc_per_node", str(nproc), "--log_dir", logs,
               # not a .py file: the launcher runs it as given, the anychip command line
               sys.executable, "-m", "anychip.cli.main", *without_nproc(argv)]
    # Paddle's launcher ends its ranks when it gets SIGTERM or SIGINT: pass ours on, so that
    # stopping this process (a server's supervisor does) never leaves ranks behind.
    launcher = subprocess.Popen(command, env=env)
    forward = {sig: signal.signal(sig, lambda number, _frame: launcher.send_signal(number))
               for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        status = launcher.wait()
    finally:
        for sig, handler in forward.items():
            signal.signal(sig, handler)
    if status != 0:
        print(f"anychip: a rank failed (exit {status}); every rank's log is in {logs}", file=sys.stderr)
    return status


@dataclass
class World:
    """This process's place in the job: ``rank`` of ``size`` (one rank: no communication).

    With tensor parallelism of degree ``tp.size`` (K), ranks g*K .. g*K + K-1 hold one model
    split K ways (``tp``) and compute the same micro-batches; the size / K groups are the
    data-parallel ranks (``dp_rank`` of ``dp_size``), which sum their gradients and figures over
    ``dp_group`` (the ranks of the same tensor-parallel index)."""

    rank: int = 0
    size: int = 1
    device: tuple[str, int] = ("cpu", 0)
    tp: "TensorParallel | None" = None
    dp_group: object = None

    @property
    def main(self) -> bool:
        """Whether this rank writes the run's files (checkpoints, metrics, the plot)."""
        return self.rank == 0

    @property
    def tp_size(self) -> int:
        return 1 if self.tp is None else self.tp.size

    @property
    def dp_rank(self) -> int:
        return self.rank // self.tp_size

    @property
    def dp_size(self) -> int:
        return self.size // self.tp_size

    def all_reduce(self, tensors) -> None:
        """Sums each tensor across the data-parallel ranks, in place (the same order on every
        rank)."""
        if self.dp_size == 1:
            return
        import paddle.distributed as dist

        for tensor in tensors:
            dist.all_reduce(tensor, group=self.dp_group)

    def totals(self, values: list[float]) -> list[float]:
        """The sums across the data-parallel ranks of ``values`` (float32, in one collective)."""
        if self.dp_size == 1:
            return list(values)
        import numpy as np

        from anychip.ops.dispatch import place
        from anychip.frontends.paddle import import_paddle

        paddle = import_paddle()
        tensor = paddle.to_tensor(np.asarray(values, dtype=np.float32), place=place(self.device))
        self.all_reduce([tensor])
        return [float(v) for v in tensor.numpy()]


def join(device: tuple[str, int], tensor_parallel: int = 1) -> World:
    """This rank's World once it has joined Paddle's process group (a lone process: World()),
    with its tensor-parallel group of ``tensor_parallel`` ranks and its data-parallel group."""
    if not launched():
        if tensor_parallel != 1:
            raise ValueError(f"--tensor-parallel {tensor_parallel} splits the model across ranks: pass --nproc "
                             f"{tensor_parallel} (or a multiple)")
        return World(device=device)
    from anychip.frontends.paddle import import_paddle

    # Paddle's launcher asks for its custom-device collectives whenever custom devices are
    # registered; the host's ranks talk through gloo instead.
    os.environ["PADDLE_DISTRI_BACKEND"] = "gloo" if device[0] == "cpu" else "xccl"
    import_paddle()
    import paddle.distributed as dist

    dist.init_parallel_env()
    rank, size, k = dist.get_rank(), dist.get_world_size(), tensor_parallel
    if k == 1:
        return World(rank=rank, size=size, device=device)
    from ..tensor_parallel import TensorParallel

    if size % k:
        raise ValueError(f"--tensor-parallel {k} must divide --nproc {size}")
    tp = dp = None
    # every rank creates every group, in the same order (paddle.distributed's rule)
    for g in range(size // k):
        group = dist.new_group(list(range(g * k, (g + 1) * k)))
        if rank // k == g:
            tp = TensorParallel(rank=rank % k, size=k, group=group)
    if size > k:
        for j in range(k):
            group = dist.new_group(list(range(j, size, k)))
            if rank % k == j:
                dp = group
    return World(rank=rank, size=size, device=device, tp=tp, dp_group=dp)
