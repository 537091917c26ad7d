"""The collectives of ``anychip/device.h`` (ABI 1.2) as conformance checks: ``run("npu")`` gives
one Result per collective and dtype (section "collectives"), plus groups, send/recv order and
a missing rank's timeout.

Each collective (all_reduce, broadcast, reduce, all_gather, reduce_scatter, all_to_all) runs on
every dtype the device declares (AnychipDeviceProperties.dtypes), with world sizes 2 and 3, at
counts 1, 7 and one larger than the simulator's staging slot (so a collective moves in several
chunks), out of place (every reduction op, and the send buffer must come back unchanged) and in
place as device.h allows it (all_reduce, broadcast, reduce: send == recv; all_gather: send ==
recv + rank * count; reduce_scatter: recv == send + rank * count). A world runs as devices of
this process, one thread per rank, when the chip has that many devices, else as one process per
rank (simulated chips get ANYCHIP_SIM_DEVICES = the world size there, so rank r is device r).
Every rank checks its own output against numpy: data movement bit for bit, integer reductions
exactly (avg: truncated toward zero, as C), float reductions within 2 * nranks * eps of the dtype,
scaled by the sum of the inputs' magnitudes (any summation order passes).

A plugin without collectives (ABI <= 1.1, or NULL functions) gives one SKIPPED result
"no collectives (ABI x.y)": not a failure. While the checks run, ANYCHIP_COLLECTIVE_TIMEOUT (the
simulator's bound on every wait) is at most RUN_TIMEOUT_S, so a broken plugin fails in seconds
rather than hanging; the missing-rank check sets it to MISSING_TIMEOUT_S.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
import time
from contextlib import contextmanager

import numpy as np

from .result import FAIL, PASS, SKIPPED, Result

SECTION = "collectives"
COLLECTIVES = ("all_reduce", "broadcast", "reduce", "all_gather", "reduce_scatter", "all_to_all")
REDUCING = ("all_reduce", "reduce", "reduce_scatter")
IN_PLACE = ("all_reduce", "broadcast", "reduce", "all_gather", "reduce_scatter")  # device.h
OPS = ("sum", "prod", "max", "min", "avg")
WORLD_SIZES = (2, 3)
# The simulator's staging slot per rank (kSlotBytes, core/src/sim/collectives.cc): the large
# count is a quarter more than that, and odd, so a collective runs whole chunks and a tail.
SLOT_BYTES = 1 << 20
LARGE_BYTES = SLOT_BYTES + SLOT_BYTES // 4
RUN_TIMEOUT_S = 10.0      # ANYCHIP_COLLECTIVE_TIMEOUT while the checks run (a lower one is kept)
MISSING_TIMEOUT_S = 1.5   # ... while a rank is missing on purpose
WORLD_TIMEOUT_S = 120.0   # a world whose ranks have not all finished by then is a FAIL
RESULT_MARK = "ANYCHIP-CONFORMANCE-COLLECTIVES "

STORAGE = {"float32": np.float32, "float16": np.float16, "bfloat16": np.uint16, "float64": np.float64,
           "int8": np.int8, "uint8": np.uint8, "int16": np.int16, "int32": np.int32, "int64": np.int64,
           "bool": np.uint8}
EPS = {"float32": 2.0 ** -23, "float16": 2.0 ** -10, "bfloat16": 2.0 ** -7, "float64": 2.0 ** -52}


# ---- data and references -------------------------------------------------------------------------

def _bf16_to_f64(bits: np.ndarray) -> np.ndarray:
    return (bits.astype(np.uint32) << 16).view(np.float32).astype(np.float64)


def _f32_to_bf16(x: np.ndarray) -> np.ndarray:
    u = x.astype(np.float32).view(np.uint32).astype(np.uint64)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def _as_f64(dtype: str, raw: np.ndarray) -> np.ndarray:
    return _bf16_to_f64(raw) if dtype == "bfloat16" else raw.astype(np.float64)


def counts(dtype: str) -> tuple[int, ...]:
    """1, 7 and an odd count of more than LARGE_BYTES."""
    return 1, 7, (LARGE_BYTES // np.dtype(STORAGE[dtype]).itemsize) | 1


def _make(dtype: str, length: int, rank: int, variant: int = 0) -> np.ndarray:
    """Rank ``rank``'s input: the same on every rank that makes it. Integers stay within
    [-4, 4] ([0, 4] unsigned), so a product over 3 ranks fits int8 and nothing wraps."""
    rng = np.random.default_rng([sorted(STORAGE).index(dtype), length, rank, variant])
    if dtype == "bool":
        return rng.integers(0, 2, length).astype(np.uint8)
    if dtype == "bfloat16":
        return _f32_to_bf16(rng.standard_normal(length, dtype=np.float32))
    if dtype in EPS:
        return rng.standard_normal(length).astype(STORAGE[dtype])
    low = 0 if np.iinfo(STORAGE[dtype]).min == 0 else -4
    return rng.integers(low, 5, length).astype(STORAGE[dtype])


class _Data:
    """Every rank's inputs, made once per (dtype, length)."""

    def __init__(self, n: int):
        self.n, self._cache = n, {}

    def __call__(self, dtype: str, length: int) -> list[np.ndarray]:
        key = (dtype, length)
        if key not in self._cache:
            self._cache = {k: v for k, v in self._cache.items() if k[0] == dtype}  # bounded memory
            self._cache[key] = [_make(dtype, length, q) for q in range(self.n)]
        return self._cache[key]


def _reduce(dtype: str, op: str, arrays: list[np.ndarray]):
    """(want, scale): op over ranks; floats in float64 (with the magnitude a rounding error is
    relative to), integers exactly (avg truncated toward zero), bool as logical or / and."""
    n = len(arrays)
    if dtype == "bool":
        stack = np.stack(arrays) != 0
        return (stack.any(0) if op in ("sum", "max") else stack.all(0)).astype(np.uint8), None
    if dtype in EPS:
        vals = np.stack([_as_f64(dtype, a) for a in arrays])
        if op in ("sum", "avg"):
            want, scale = vals.sum(0), np.abs(vals).sum(0)
            if op == "avg":
                want, scale = want / n, scale / n
        elif op == "prod":
            want = vals.prod(0)
            scale = np.abs(want)
        else:
            want = vals.max(0) if op == "max" else vals.min(0)
            scale = np.abs(want)
        return want, scale
    vals = np.stack(arrays).astype(np.int64)
    if op in ("sum", "avg"):
        want = vals.sum(0)
        if op == "avg":
            want = np.sign(want) * (np.abs(want) // n)
    elif op == "prod":
        want = vals.prod(0)
    else:
        want = vals.max(0) if op == "max" else vals.min(0)
    return want.astype(STORAGE[dtype]), None


def _compare(dtype: str, got: np.ndarray, want: np.ndarray, scale, n: int) -> tuple[float, str | None]:
    """(max |error|, None) when ``got`` is right, else (max |error|, what differs)."""
    if scale is None:  # exact: bits (data movement, integers, bool)
        bad = np.flatnonzero(got != want)
        if not len(bad):
            return 0.0, None
        i = int(bad[0])
        as_f64 = _bf16_to_f64 if dtype == "bfloat16" else (lambda a: a.astype(np.float64))
        g, w = (got[i], want[i]) if dtype != "bfloat16" else (as_f64(got[i:i + 1])[0], as_f64(want[i:i + 1])[0])
        error = float(np.max(np.abs(as_f64(got) - as_f64(want))))
        return error, f"element {i} is {g.item()!r}, expected {w.item()!r} ({len(bad)} of {len(got)} differ)"
    values = _as_f64(dtype, got)
    with np.errstate(invalid="ignore"):
        err = np.abs(values - want)
        tol = 2 * n * EPS[dtype] * scale
        bad = np.flatnonzero(~(err <= tol))
    error = float(np.nanmax(err)) if len(err) and not np.isnan(err).all() else float("nan")
    if len(bad) and np.isnan(err[bad]).any():
        error = float("nan")
    if not len(bad):
        return error, None
    i = int(bad[0])
    return error, (f"element {i} is {values[i]!r}, expected {want[i]!r} within {tol[i]:.2g} "
                   f"({len(bad)} of {len(got)} out of tolerance)")


# ---- the cases -----------------------------------------------------------------------------------

def plan(dtypes, n: int) -> list[tuple]:
    """(collective, dtype, count, op, root, in_place) of every data check of a world of ``n``:
    every op out of place; in place with one op; the large count with sum and max only."""
    cases = []
    for dtype in dtypes:
        ops = [op for op in OPS if not (dtype == "bool" and op == "avg")]
        for collective in COLLECTIVES:
            for count in counts(dtype):
                large = count > 7
                root = count % n
                if collective in REDUCING:
                    for op in (("sum", "max") if large else ops):
                        cases.append((collective, dtype, count, op, root, False))
                    cases.append((collective, dtype, count, "min" if large else "avg" if "avg" in ops else "sum",
                                  root, True))
                else:
                    cases.append((collective, dtype, count, None, root, False))
                    if collective in IN_PLACE:
                        cases.append((collective, dtype, count, None, root, True))
    return cases


def _describe_case(case, n: int, mode: str) -> str:
    collective, dtype, count, op, root, in_place = case
    parts = [collective, dtype, f"world {n} ({mode})", f"count {count}"]
    if op:
        parts.append(f"op {op}")
    if collective in ("broadcast", "reduce"):
        parts.append(f"root {root}")
    parts.append("in place" if in_place else "out of place")
    return ", ".join(parts)


class _Prepared:
    """One case on one rank: its buffers, and how to call and check it."""

    def __init__(self, case, dev, rank: int, n: int, data: _Data):
        collective, dtype, count, op, root, in_place = case
        self.case, self.rank, self.n = case, rank, n
        es = np.dtype(STORAGE[dtype]).itemsize
        self.es = es
        full = collective in ("reduce_scatter", "all_to_all")
        inputs = data(dtype, n * count if full else count)
        self.inputs = inputs
        mine = inputs[rank]
        out_elems = n * count if collective in ("all_gather", "all_to_all") else count
        self.keep = []
        if in_place:
            if collective == "all_gather":
                init = np.zeros(n * count, STORAGE[dtype])
                init[rank * count:(rank + 1) * count] = mine
                buf = dev.upload(init)
                self.send, self.recv, self.out_offset = buf.ptr + rank * count * es, buf.ptr, 0
            elif collective == "reduce_scatter":
                buf = dev.upload(mine)
                self.send, self.recv, self.out_offset = buf.ptr, buf.ptr + rank * count * es, rank * count * es
            else:
                buf = dev.upload(mine)
                self.send, self.recv, self.out_offset = buf.ptr, buf.ptr, 0
            self.keep, self.out, self.src = [buf], buf, None
        else:
            src = dev.upload(mine)
            out = dev.allocate(out_elems * es)
            out.fill(0xA5)  # never a right answer left over
            self.send, self.recv, self.out_offset = src.ptr, out.ptr, 0
            self.keep, self.out, self.src = [src, out], out, src
        self.out_elems = out_elems

    def enqueue(self, comm, stream) -> None:
        collective, dtype, count, op, root, _ = self.case
        if collective == "all_reduce":
            comm.all_reduce(self.send, self.recv, count, dtype, op, stream)
        elif collective == "broadcast":
            comm.broadcast(self.send, self.recv, count, dtype, root, stream)
        elif collective == "reduce":
            comm.reduce(self.send, self.recv, count, dtype, op, root, stream)
        elif collective == "all_gather":
            comm.all_gather(self.send, self.recv, count, dtype, stream)
        elif collective == "reduce_scatter":
            comm.reduce_scatter(self.send, self.recv, count, dtype, op, stream)
        else:
            comm.all_to_all(self.send, self.recv, count, dtype, stream)

    def check(self) -> tuple[float, str | None]:
        collective, dtype, count, op, root, in_place = self.case
        n, r, x = self.n, self.rank, self.inputs
        scale = None
        if collective == "all_reduce" or (collective == "reduce" and r == root):
            want, scale = _reduce(dtype, op, x)
        elif collective == "reduce_scatter":
            want, scale = _reduce(dtype, op, x)
            want = want[r * count:(r + 1) * count]
            scale = None if scale is None else scale[r * count:(r + 1) * count]
        elif collective == "broadcast":
            want = x[root]
        elif collective == "all_gather":
            want = np.concatenate(x)
        elif collective == "all_to_all":
            want = np.concatenate([x[q][r * count:(r + 1) * count] for q in range(n)])
        else:  # reduce on a rank other than root: recv is ignored
            want = None
        error, problem = 0.0, None
        if want is not None:
            raw = self.out.to_numpy(STORAGE[dtype])
            got = raw[self.out_offset // self.es:self.out_offset // self.es + len(want)]
            error, problem = _compare(dtype, got, want, scale, n)
            if problem:
                problem = f"rank {r}: recv {problem}"
        if problem is None and self.src is not None:
            sent = self.src.to_numpy(STORAGE[dtype])
            if not np.array_equal(sent, x[r]):
                problem = (f"rank {r}: the send buffer changed (out of place): "
                           + _compare(dtype, sent, x[r], None, n)[1])
        return error, problem

    def free(self) -> None:
        for b in self.keep:
            b.free()


# ---- what one rank runs ----------------------------------------------------------------------------

def _program_data(dev, comm, stream, rank: int, n: int, params: dict) -> list:
    """Every data check, one group (collective, dtype) at a time: prepare, enqueue all,
    synchronize once, check. [index, max_error, problem or None] per case."""
    cases = plan(params["dtypes"], n)
    data, out, failed = _Data(n), [], None
    groups: dict[tuple, list[int]] = {}
    for i, case in enumerate(cases):
        groups.setdefault((case[0], case[1]), []).append(i)
    for indices in groups.values():
        if failed is not None:
            out += [[i, None, failed] for i in indices]
            continue
        prepared = []
        try:
            for i in indices:
                prepared.append(_Prepared(cases[i], dev, rank, n, data))
            for p in prepared:
                p.enqueue(comm, stream)
            stream.synchronize()
        except Exception as exc:  # noqa: BLE001 - the plugin's error is the finding
            failed = f"rank {rank}: {type(exc).__name__}: {exc}"
            out += [[i, None, failed] for i in indices]
            continue
        for i, p in zip(indices, prepared):
            try:
                error, problem = p.check()
            except Exception as exc:  # noqa: BLE001
                error, problem = None, f"rank {rank}: checking raised {type(exc).__name__}: {exc}"
            out.append([i, error, problem])
            p.free()
    return out


def _message(dtype: str, src: int, dst: int, k: int, count: int) -> np.ndarray:
    return _make(dtype, count, 100 + src * 10 + dst, k)


def _program_p2p(dev, comm, stream, rank: int, n: int, params: dict) -> dict:
    """"send_recv_order": rank 0 sends counts 7, 1 and a large count to rank 1 outside a group,
    which receives them in that order; then in one group every rank sends two messages to every
    other rank and receives them posted in the opposite peer order: a pair's messages must
    arrive in the order they were sent. "group": a ring (send, then recv: it deadlocks outside
    a group) and two all_reduces in one group."""
    dtype = "int32"
    big = (LARGE_BYTES // 4) | 1
    problems = {"send_recv_order": [], "group": []}

    def expect(name, buf, want, what):
        got = buf.to_numpy(np.int32)
        if not np.array_equal(got, want):
            problems[name].append(f"rank {rank}: {what}: " + _compare(dtype, got, want, None, n)[1])

    def step(name, fn):
        try:
            fn()
        except Exception as exc:  # noqa: BLE001
            problems[name].append(f"rank {rank}: {type(exc).__name__}: {exc}")
            return False
        return True

    # plain pair, in order
    sizes = (7, 1, big)

    def plain():
        bufs = []
        if rank == 0:
            for k, c in enumerate(sizes):
                b = dev.upload(_message(dtype, 0, 1, k, c))
                bufs.append(b)
                comm.send(b.ptr, c, dtype, 1, stream)
        elif rank == 1:
            for c in sizes:
                bufs.append(dev.allocate(c * 4))
                comm.recv(bufs[-1].ptr, c, dtype, 0, stream)
        stream.synchronize()
        if rank == 1:
            for k, (b, c) in enumerate(zip(bufs, sizes)):
                expect("send_recv_order", b, _message(dtype, 0, 1, k, c), f"message {k} ({c} elements) from rank 0")

    ok = step("send_recv_order", plain)

    # every pair, two messages each, in one group; receives posted in the other peer order
    def pairs():
        count = 4099
        peers = [p for p in range(n) if p != rank]
        sends = {(p, k): dev.upload(_message(dtype, rank, p, k, count)) for p in peers for k in (0, 1)}
        recvs = {(p, k): dev.allocate(count * 4) for p in peers for k in (0, 1)}
        comm.group_start()
        for p in peers:
            for k in (0, 1):
                comm.send(sends[p, k].ptr, count, dtype, p, stream)
        for p in reversed(peers):
            for k in (0, 1):
                comm.recv(recvs[p, k].ptr, count, dtype, p, stream)
        comm.group_end()
        stream.synchronize()
        for (p, k), b in recvs.items():
            expect("send_recv_order", b, _message(dtype, p, rank, k, count), f"message {k} from rank {p} (grouped)")

    if ok:
        ok = step("send_recv_order", pairs)

    def ring():
        count = big
        src = dev.upload(_message(dtype, rank, (rank + 1) % n, 7, count))
        dst = dev.allocate(count * 4)
        a = dev.upload(np.full(1001, rank + 1, np.int32))
        b = dev.upload(np.arange(5, dtype=np.int32) * (rank + 1))
        comm.group_start()
        comm.send(src.ptr, count, dtype, (rank + 1) % n, stream)
        comm.recv(dst.ptr, count, dtype, (rank - 1) % n, stream)
        comm.group_end()
        comm.group_start()
        comm.all_reduce(a.ptr, a.ptr, 1001, "int32", "sum", stream)
        comm.all_reduce(b.ptr, b.ptr, 5, "int32", "max", stream)
        comm.group_end()
        stream.synchronize()
        expect("group", dst, _message(dtype, (rank - 1) % n, rank, 7, count),
               f"ring message from rank {(rank - 1) % n}")
        expect("group", a, np.full(1001, n * (n + 1) // 2, np.int32), "grouped all_reduce sum")
        expect("group", b, np.arange(5, dtype=np.int32) * n, "grouped all_reduce max")

    if ok:
        step("group", ring)
    else:
        problems["group"].append("not run: the send/recv check before it failed")
    return problems


def _program_missing(dev, comm, stream, rank: int, n: int, params: dict) -> dict:
    """The last rank never calls; the others' all_reduce must fail within the timeout, naming it."""
    if rank == n - 1:  # holds its communicator open until the others have given up
        time.sleep(params.get("hold_s", 0))
        return {"skipped": True}
    buf = dev.upload(np.ones(4, np.float32))
    start = time.monotonic()
    comm.all_reduce(buf.ptr, buf.ptr, 4, "float32", "sum", stream)
    try:
        stream.synchronize()
    except Exception as exc:  # noqa: BLE001 - the error is what is checked
        return {"error": f"{type(exc).__name__}: {exc}", "elapsed": time.monotonic() - start}
    return {"error": None, "elapsed": time.monotonic() - start}


PROGRAMS = {"data": _program_data, "p2p": _program_p2p, "missing": _program_missing}


def _rank(chip: str, index: int, uid: bytes, rank: int, n: int, program: str, params: dict, device=None):
    from ..runtime import open_device
    from ..runtime.collectives import Communicator

    dev = device if device is not None else open_device(f"{chip}:{index}")
    comm = Communicator.init(dev, uid, rank, n)
    stream = dev.stream()
    try:
        return PROGRAMS[program](dev, comm, stream, rank, n, params)
    finally:
        try:
            comm.destroy()
        except Exception:  # noqa: BLE001 - a failed communicator may refuse; its result says why
            pass


def _child_main(argv1: str) -> int:
    """A rank in its own process (``python -c``): prints its outcome as JSON on one line."""
    spec = json.loads(argv1)
    try:
        outcome = {"result": _rank(spec["chip"], spec["index"], bytes.fromhex(spec["uid"]), spec["rank"],
                                   spec["n"], spec["program"], spec["params"])}
    except Exception as exc:  # noqa: BLE001
        outcome = {"error": f"{type(exc).__name__}: {exc}"}
    print(RESULT_MARK + json.dumps(outcome), flush=True)
    return 0


# ---- running a world -------------------------------------------------------------------------------

@contextmanager
def _collective_timeout(seconds: float, lower_only: bool = True):
    old = os.environ.get("ANYCHIP_COLLECTIVE_TIMEOUT")
    try:
        current = float(old) if old else None
    except ValueError:
        current = None
    if not (lower_only and current is not None and 0 < current <= seconds):
        os.environ["ANYCHIP_COLLECTIVE_TIMEOUT"] = f"{seconds:g}"
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("ANYCHIP_COLLECTIVE_TIMEOUT", None)
        else:
            os.environ["ANYCHIP_COLLECTIVE_TIMEOUT"] = old


class World:
    """How ``n`` ranks of ``chip`` run here: ``mode`` "devices" (threads of this process, rank r
    on device r) or "processes" (one process per rank)."""

    def __init__(self, chip: str, n: int, device_count: int, simulated: bool, device=None):
        self.chip, self.n, self.simulated, self.device = chip, n, simulated, device
        self.device_count = device_count
        self.mode = "devices" if device_count >= n else "processes"

    def describe(self) -> str:
        if self.mode == "devices":
            return f"{self.n} ranks on devices 0..{self.n - 1} of one process"
        return f"{self.n} ranks as processes"

    def run(self, program: str, params: dict, timeout_s: float) -> list[dict]:
        """Per rank {"result": ...} or {"error": "..."}."""
        from ..runtime import open_device
        from ..runtime.collectives import unique_id

        first = self.device if self.device is not None else open_device(f"{self.chip}:0")
        uid = unique_id(first)
        with _collective_timeout(timeout_s, lower_only=program != "missing"):
            if self.mode == "devices":
                return self._threads(uid, program, params, first)
            return self._processes(uid, program, params, timeout_s)

    def _threads(self, uid, program, params, first) -> list[dict]:
        outcomes: list[dict] = [{"error": "did not finish within "
                                          f"{WORLD_TIMEOUT_S:g} s (a collective that never completes?)"}
                                for _ in range(self.n)]

        def target(r):
            try:
                outcomes[r] = {"result": _rank(self.chip, r, uid, r, self.n, program, params,
                                               device=first if r == 0 else None)}
            except Exception as exc:  # noqa: BLE001
                outcomes[r] = {"error": f"{type(exc).__name__}: {exc}"}

        threads = [threading.Thread(target=target, args=(r,), daemon=True, name=f"anychip-coll-rank{r}")
                   for r in range(self.n)]
        for t in threads:
            t.start()
        deadline = time.monotonic() + WORLD_TIMEOUT_S
        for t in threads:
            t.join(max(0.0, deadline - time.monotonic()))
        return outcomes

    def _processes(self, uid, program, params, timeout_s) -> list[dict]:
        env = dict(os.environ)
        env["ANYCHIP_COLLECTIVE_TIMEOUT"] = os.environ["ANYCHIP_COLLECTIVE_TIMEOUT"]
        if self.simulated:
            env["ANYCHIP_SIM_DEVICES"] = str(max(self.n, self.device_count))
        count = max(self.n, self.device_count) if self.simulated else self.device_count
        code = "import sys; from anychip.conformance.collectives import _child_main; sys.exit(_child_main(sys.argv[1]))"
        procs = []
        for r in range(self.n):
            spec = {"chip": self.chip, "index": r % count, "uid": uid.hex(), "rank": r, "n": self.n,
                    "program": program, "params": params}
            procs.append(subprocess.Popen([sys.executable, "-c", code, json.dumps(spec)], stdout=subprocess.PIPE,
                                          stderr=subprocess.STDOUT, text=True, env=env))
        outcomes = []
        deadline = time.monotonic() + WORLD_TIMEOUT_S
        for r, p in enumerate(procs):
            try:
                text, _ = p.communicate(timeout=max(1.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                for q in procs:
                    q.kill()
                text = ""
                outcomes.append({"error": f"rank {r}'s process did not finish within {WORLD_TIMEOUT_S:g} s"})
                continue
            lines = [ln for ln in text.splitlines() if ln.startswith(RESULT_MARK)]
            if lines:
                outcomes.append(json.loads(lines[-1][len(RESULT_MARK):]))
            else:
                outcomes.append({"error": f"rank {r}'s process exited {p.returncode} without a result: "
                                          + (text.strip().splitlines() or ["(no output)"])[-1][-500:]})
        return outcomes


# ---- the section -------------------------------------------------------------------------------------

def _abi(runtime) -> str:
    version = runtime._iface.abi_version
    return f"{version >> 16}.{version & 0xFFFF}"


def _open(device):
    from ..runtime import Device, open_device

    if isinstance(device, Device):
        return device
    return open_device(device if ":" in device else f"{device}:0")


def run(device, world_sizes=WORLD_SIZES) -> list[Result]:
    """Every collectives check on ``device`` ("npu", "npu:0", or an open
    ``anychip.runtime.Device``: then worlds that need processes are checked only if the device's
    chip can be opened by name there). One SKIPPED result for a plugin without collectives."""
    from ..runtime.collectives import _FUNCTIONS, _null

    try:
        dev = _open(device)
    except Exception as e:  # noqa: BLE001
        return [Result(SECTION, "open_device", FAIL, detail=f"{type(e).__name__}: {e}")]
    runtime = dev.runtime
    missing = [name for name in _FUNCTIONS if _null(getattr(runtime._iface, name))]
    if len(missing) == len(_FUNCTIONS):
        return [Result(SECTION, "plugin", SKIPPED,
                       detail=f"no collectives (ABI {_abi(runtime)}): {runtime.name}'s plugin leaves the "
                              "collective functions of device.h NULL")]
    if missing:
        return [Result(SECTION, "plugin", FAIL,
                       detail=f"the plugin (ABI {_abi(runtime)}) fills only some collective functions; NULL: "
                              f"{', '.join(missing)} (device.h: all of them or none)")]
    props = dev.properties
    chip = runtime.name
    worlds = [World(chip, n, runtime.device_count, bool(props.simulated),
                    device=dev if dev.index == 0 else None) for n in world_sizes]
    results = _data_results(worlds, list(props.dtypes))
    results += _p2p_results(worlds)
    results.append(_missing_result(chip, runtime.device_count, bool(props.simulated), dev if dev.index == 0 else None))
    return results


def _first(problems: list[str], shown: int = 3) -> str:
    more = f"\n... and {len(problems) - shown} more" if len(problems) > shown else ""
    return "\n".join(problems[:shown]) + more


def _data_results(worlds, dtypes) -> list[Result]:
    found: dict[tuple, dict] = {}  # (collective, dtype) -> {"error": float, "problems": []}
    for c in COLLECTIVES:
        for d in dtypes:
            found[c, d] = {"error": 0.0, "problems": []}
    for world in worlds:
        cases = plan(dtypes, world.n)
        outcomes = world.run("data", {"dtypes": dtypes}, RUN_TIMEOUT_S)
        for r, outcome in enumerate(outcomes):
            if "error" in outcome:
                for key in found:
                    found[key]["problems"].append(f"world {world.n} ({world.mode}): rank {r}: {outcome['error']}")
                continue
            for i, error, problem in outcome["result"]:
                case = cases[i]
                entry = found[case[0], case[1]]
                if error is not None:
                    entry["error"] = max(entry["error"], error) if error == error else float("nan")
                if problem:
                    entry["problems"].append(f"{_describe_case(case, world.n, world.mode)}: {problem}")
    how = "; ".join(w.describe() for w in worlds)
    results = []
    for (collective, dtype), entry in found.items():
        sizes = ", ".join(map(str, counts(dtype)))
        problems = list(dict.fromkeys(entry["problems"]))
        if problems:
            results.append(Result(SECTION, collective, FAIL, dtype, max_error=entry["error"], detail=_first(problems)))
        else:
            results.append(Result(SECTION, collective, PASS, dtype, max_error=entry["error"],
                                  detail=f"{how}; counts {sizes}; in place and not"))
    return results


def _p2p_results(worlds) -> list[Result]:
    problems = {"send_recv_order": [], "group": []}
    for world in worlds:
        for r, outcome in enumerate(world.run("p2p", {}, RUN_TIMEOUT_S)):
            if "error" in outcome:
                for name in problems:
                    problems[name].append(f"world {world.n} ({world.mode}): rank {r}: {outcome['error']}")
                continue
            for name, found in outcome["result"].items():
                problems[name] += [f"world {world.n} ({world.mode}): {p}" for p in found]
    how = "; ".join(w.describe() for w in worlds)
    return [Result(SECTION, name, FAIL, detail=_first(p)) if p else Result(SECTION, name, PASS, detail=how)
            for name, p in problems.items()]


def _missing_result(chip: str, device_count: int, simulated: bool, device) -> Result:
    """World 2, rank 1 never calls: rank 0's all_reduce must fail within the timeout, naming rank 1."""
    name, n = "missing_rank_times_out", 2
    world = World(chip, n, device_count, simulated, device=device)
    limit = MISSING_TIMEOUT_S + 10.0 if simulated else 120.0
    start = time.monotonic()
    outcomes = world.run("missing", {"hold_s": MISSING_TIMEOUT_S + 1.0}, MISSING_TIMEOUT_S)
    wall = time.monotonic() - start
    if "error" in outcomes[0]:
        return Result(SECTION, name, FAIL, detail=f"rank 0: {outcomes[0]['error']}")
    got = outcomes[0]["result"]
    if got.get("error") is None:
        return Result(SECTION, name, FAIL, detail=f"rank 0's all_reduce succeeded after {got['elapsed']:.1f} s "
                                                  f"although rank {n - 1} of {n} never called it")
    message = got["error"]
    if got["elapsed"] > limit:
        return Result(SECTION, name, FAIL, detail=f"rank 0 waited {got['elapsed']:.1f} s for the missing rank "
                                                  f"(ANYCHIP_COLLECTIVE_TIMEOUT={MISSING_TIMEOUT_S:g}): {message}")
    names_it = rf"(not arrived|never arrived|did not arrive|missing|absent|waiting for|rank)\D{{0,16}}\b{n - 1}\b"
    if not re.search(names_it, message, re.IGNORECASE):
        return Result(SECTION, name, FAIL, detail=f"the error does not name the missing rank {n - 1}: {message}")
    return Result(SECTION, name, PASS, detail=f"{world.describe()}; after {got['elapsed']:.1f} s "
                                              f"(timeout {MISSING_TIMEOUT_S:g} s, {wall:.1f} s in all): {message}")
