"""Collectives (device.h ABI 1.2) on the simulator: every op and dtype against numpy, odd sizes,
in place, stream ordering, ranks as devices of one process and as processes, timeouts,
send/recv and groups, and a plugin built against ABI 1.1."""

import ctypes
import os
import shutil
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

import anychip.runtime as rt
from anychip.runtime import abi
from anychip.runtime.collectives import Communicator, has_collectives, unique_id
from collective_helpers import old_abi_runtime, run_ranks

OPS = ["sum", "prod", "max", "min", "avg"]
NP = {"float32": np.float32, "float16": np.float16, "bfloat16": np.uint16, "float64": np.float64,
      "int8": np.int8, "uint8": np.uint8, "int16": np.int16, "int32": np.int32, "int64": np.int64,
      "bool": np.uint8}


@pytest.fixture(autouse=True)
def short_timeout(monkeypatch):
    monkeypatch.setenv("ANYCHIP_COLLECTIVE_TIMEOUT", "3")


def bf16_to_f32(bits):
    return (bits.astype(np.uint32) << 16).view(np.float32)


def f32_to_bf16(x):
    u = x.astype(np.float32).view(np.uint32).astype(np.uint64)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def make_data(dtype, n, rng):
    if dtype == "bool":
        return rng.integers(0, 2, n).astype(np.uint8)
    if dtype == "bfloat16":
        return f32_to_bf16(rng.standard_normal(n).astype(np.float32))
    if dtype.startswith("float"):
        return rng.standard_normal(n).astype(NP[dtype])
    info = np.iinfo(NP[dtype])
    return rng.integers(max(info.min, -9), min(info.max, 9) + 1, n).astype(NP[dtype])


def reference(dtype, op, arrays):
    """op over ranks in rank order; 16-bit floats in float32, rounded once; ints wrap."""
    n = len(arrays)
    if dtype == "bool":
        stack = np.stack(arrays) != 0
        out = stack.any(0) if op in ("sum", "max") else stack.all(0)
        return out.astype(np.uint8)
    if dtype in ("float16", "bfloat16"):
        vals = [bf16_to_f32(a) if dtype == "bfloat16" else a.astype(np.float32) for a in arrays]
    else:
        vals = [a.copy() for a in arrays]
    acc = vals[0].copy()
    with np.errstate(over="ignore"):
        for v in vals[1:]:
            acc = {"sum": np.add, "avg": np.add, "prod": np.multiply, "max": np.maximum,
                   "min": np.minimum}[op](acc, v).astype(acc.dtype)
    if op == "avg":
        if np.issubdtype(acc.dtype, np.integer):
            wide = acc.astype(np.int64)
            acc = (np.sign(wide) * (np.abs(wide) // n)).astype(acc.dtype)
        else:
            acc = (acc / acc.dtype.type(n)).astype(acc.dtype)
    if dtype == "float16":
        return acc.astype(np.float16)
    if dtype == "bfloat16":
        return f32_to_bf16(acc)
    return acc


class Ranks:
    """`nranks` ranks of one communicator on the devices of one process (round robin)."""

    def __init__(self, chip, nranks):
        self.devices = [rt.open_device(f"{chip}:{r % 2}") for r in range(nranks)]
        uid = unique_id(self.devices[0])
        self.comms = [Communicator.init(d, uid, r, nranks) for r, d in enumerate(self.devices)]
        self.streams = [d.stream() for d in self.devices]
        self.n = nranks

    def upload(self, r, array):
        return self.devices[r].upload(np.ascontiguousarray(array))

    def alloc(self, r, nbytes):
        return self.devices[r].allocate(max(nbytes, 1))

    def sync(self):
        for s in self.streams:
            s.synchronize()

    def close(self):
        for c in self.comms:
            c.destroy()


def chip_dtypes(chip):
    return rt.open_device(f"{chip}:0").properties.dtypes


CASES = [("npu", d) for d in chip_dtypes("npu")] + [("dcu", "float64")]


@pytest.mark.parametrize("chip,dtype", CASES, ids=[f"{c}-{d}" for c, d in CASES])
def test_every_collective_and_op_matches_numpy(chip, dtype):
    rng = np.random.default_rng(abs(hash(dtype)) % 1000)
    n, count = 3, 7
    g = Ranks(chip, n)
    es = np.dtype(NP[dtype]).itemsize
    ops = [op for op in OPS if not (dtype == "bool" and op == "avg")]
    # all_reduce, reduce (root 2), with every op
    for op in ops:
        data = [make_data(dtype, count, rng) for _ in range(n)]
        sends = [g.upload(r, data[r]) for r in range(n)]
        recvs = [g.alloc(r, count * es) for r in range(n)]
        roots = [g.alloc(r, count * es) for r in range(n)]
        for r in range(n):
            g.comms[r].all_reduce(sends[r].ptr, recvs[r].ptr, count, dtype, op, g.streams[r])
            g.comms[r].reduce(sends[r].ptr, roots[r].ptr, count, dtype, op, 2, g.streams[r])
        g.sync()
        want = reference(dtype, op, data)
        for r in range(n):
            np.testing.assert_array_equal(recvs[r].to_numpy(NP[dtype]), want, err_msg=f"all_reduce {op} rank {r}")
        np.testing.assert_array_equal(roots[2].to_numpy(NP[dtype]), want, err_msg=f"reduce {op}")
        # reduce_scatter: each rank sends n * count
        data = [make_data(dtype, n * count, rng) for _ in range(n)]
        sends = [g.upload(r, data[r]) for r in range(n)]
        recvs = [g.alloc(r, count * es) for r in range(n)]
        for r in range(n):
            g.comms[r].reduce_scatter(sends[r].ptr, recvs[r].ptr, count, dtype, op, g.streams[r])
        g.sync()
        want = reference(dtype, op, data)
        for r in range(n):
            np.testing.assert_array_equal(recvs[r].to_numpy(NP[dtype]), want[r * count:(r + 1) * count],
                                          err_msg=f"reduce_scatter {op} rank {r}")
    # broadcast from 1, all_gather, all_to_all
    data = [make_data(dtype, n * count, rng) for _ in range(n)]
    sends = [g.upload(r, data[r]) for r in range(n)]
    bc = [g.alloc(r, count * es) for r in range(n)]
    ag = [g.alloc(r, n * count * es) for r in range(n)]
    a2a = [g.alloc(r, n * count * es) for r in range(n)]
    for r in range(n):
        g.comms[r].broadcast(sends[r].ptr, bc[r].ptr, count, dtype, 1, g.streams[r])
        g.comms[r].all_gather(sends[r].ptr, ag[r].ptr, count, dtype, g.streams[r])
        g.comms[r].all_to_all(sends[r].ptr, a2a[r].ptr, count, dtype, g.streams[r])
    g.sync()
    for r in range(n):
        np.testing.assert_array_equal(bc[r].to_numpy(NP[dtype]), data[1][:count])
        np.testing.assert_array_equal(ag[r].to_numpy(NP[dtype]), np.concatenate([d[:count] for d in data]))
        np.testing.assert_array_equal(a2a[r].to_numpy(NP[dtype]),
                                      np.concatenate([d[r * count:(r + 1) * count] for d in data]))
    g.close()


def test_odd_sizes_larger_than_the_staging_slots_and_in_place():
    rng = np.random.default_rng(1)
    g = Ranks("npu", 2)
    for count in (1, 1000003):
        data = [rng.standard_normal(count).astype(np.float32) for _ in range(2)]
        bufs = [g.upload(r, data[r]) for r in range(2)]
        for r in range(2):  # in place
            g.comms[r].all_reduce(bufs[r].ptr, bufs[r].ptr, count, "float32", "sum", g.streams[r])
        g.sync()
        for r in range(2):
            np.testing.assert_array_equal(bufs[r].to_numpy(np.float32), data[0] + data[1])
        # all_gather in place: each rank's contribution already at its slice of recv
        gathered = [g.upload(r, np.concatenate([data[r] if q == r else np.zeros(count, np.float32)
                                                 for q in range(2)])) for r in range(2)]
        for r in range(2):
            g.comms[r].all_gather(gathered[r].ptr + r * count * 4, gathered[r].ptr, count, "float32", g.streams[r])
        g.sync()
        for r in range(2):
            np.testing.assert_array_equal(gathered[r].to_numpy(np.float32), np.concatenate(data))
        # reduce_scatter in place: recv is the rank's slice of send
        full = [rng.integers(-5, 5, 2 * count).astype(np.int64) for _ in range(2)]
        rs = [g.upload(r, full[r]) for r in range(2)]
        for r in range(2):
            g.comms[r].reduce_scatter(rs[r].ptr, rs[r].ptr + r * count * 8, count, "int64", "max", g.streams[r])
        g.sync()
        for r in range(2):
            got = rs[r].to_numpy(np.int64)[r * count:(r + 1) * count]
            np.testing.assert_array_equal(got, np.maximum(full[0], full[1])[r * count:(r + 1) * count])
        # broadcast in place
        bb = [g.upload(r, data[r]) for r in range(2)]
        for r in range(2):
            g.comms[r].broadcast(bb[r].ptr, bb[r].ptr, count, "float32", 0, g.streams[r])
        g.sync()
        np.testing.assert_array_equal(bb[1].to_numpy(np.float32), data[0])
    g.close()


def test_collective_is_ordered_on_its_stream():
    g = Ranks("npu", 2)
    count = 300001
    bufs = [g.alloc(r, count * 4) for r in range(2)]
    hosts = [np.full(count, r + 1, np.float32) for r in range(2)]
    outs = [np.zeros(count, np.float32) for _ in range(2)]
    for r in range(2):  # copy in, collective, copy out: all enqueued before anything runs
        bufs[r].copy_from_host(hosts[r], stream=g.streams[r])
        g.comms[r].all_reduce(bufs[r].ptr, bufs[r].ptr, count, "float32", "sum", g.streams[r])
        bufs[r].copy_to_host(outs[r], stream=g.streams[r])
    g.sync()
    for r in range(2):
        assert (outs[r] == 3).all()
    g.close()


def test_send_recv_and_groups():
    rng = np.random.default_rng(2)
    g = Ranks("npu", 3)
    count = 100003  # several mailbox chunks
    data = [rng.integers(0, 1000, count).astype(np.int32) for _ in range(3)]
    src = [g.upload(r, data[r]) for r in range(3)]
    dst = [g.alloc(r, count * 4) for r in range(3)]
    # a plain pair: 0 -> 2
    g.comms[2].recv(dst[2].ptr, count, "int32", 0, g.streams[2])
    g.comms[0].send(src[0].ptr, count, "int32", 2, g.streams[0])
    g.sync()
    np.testing.assert_array_equal(dst[2].to_numpy(np.int32), data[0])
    # a ring inside groups: every rank sends first, then receives (would deadlock without a group)
    got = [g.alloc(r, count * 4) for r in range(3)]
    for r in range(3):
        g.comms[r].group_start()
        g.comms[r].send(src[r].ptr, count, "int32", (r + 1) % 3, g.streams[r])
        g.comms[r].recv(got[r].ptr, count, "int32", (r - 1) % 3, g.streams[r])
        g.comms[r].group_end()
    g.sync()
    for r in range(3):
        np.testing.assert_array_equal(got[r].to_numpy(np.int32), data[(r - 1) % 3])
    g.close()


def test_a_rank_that_never_arrives_is_an_error_within_the_timeout(monkeypatch):
    monkeypatch.setenv("ANYCHIP_COLLECTIVE_TIMEOUT", "1.5")
    g = Ranks("npu", 3)
    bufs = [g.alloc(r, 16) for r in range(3)]
    start = time.monotonic()
    for r in (0, 1):  # rank 2 never calls
        g.comms[r].all_reduce(bufs[r].ptr, bufs[r].ptr, 4, "float32", "sum", g.streams[r])
    for r in (0, 1):
        with pytest.raises(rt.AnychipError) as err:
            g.streams[r].synchronize()
        msg = str(err.value)
        assert "all_reduce" in msg and "ranks arrived: 0, 1; not arrived: 2" in msg, msg
        assert "ANYCHIP_COLLECTIVE_TIMEOUT=1.5 s" in msg, msg
        assert err.value.status == "DEVICE"
    assert time.monotonic() - start < 8
    # the communicator stays failed, with the first message
    g.comms[0].all_reduce(bufs[0].ptr, bufs[0].ptr, 4, "float32", "sum", g.streams[0])
    with pytest.raises(rt.AnychipError, match="already failed"):
        g.streams[0].synchronize()


CHILD = textwrap.dedent("""
    import os, sys, numpy as np
    import anychip.runtime as rt
    from anychip.runtime.collectives import Communicator
    uid, rank, n, mode = bytes.fromhex(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    if mode == "die" and rank == n - 1:
        os._exit(0)
    dev = rt.open_device("npu:0")
    comm = Communicator.init(dev, uid, rank, n)
    stream = dev.stream()
    count = 5003
    buf = dev.upload(np.arange(count, dtype=np.float32) * (rank + 1))
    out = dev.allocate(n * count * 4)
    comm.all_reduce(buf.ptr, buf.ptr, count, "float32", "avg", stream)
    comm.all_gather(buf.ptr, out.ptr, count, "float32", stream)
    try:
        stream.synchronize()
    except rt.AnychipError as exc:
        print("ERROR", exc)
        sys.exit(3)
    want = np.arange(count, dtype=np.float32) * np.float32(sum(range(1, n + 1))) / np.float32(n)
    got = out.to_numpy(np.float32).reshape(n, count)
    assert (got == want).all(), (got[:, :4], want[:4])
    comm.destroy()
    print("OK", rank)
""")


def _spawn(n, mode):
    return run_ranks(CHILD, n, [mode], 30, {"ANYCHIP_COLLECTIVE_TIMEOUT": "2"})


def test_a_failed_collective_reaches_the_streams_and_events_ordered_after_it(monkeypatch):
    """As CUDA's sticky errors: an event recorded after failed work fails its synchronize, and a
    stream that waits on it takes the error as its own (Paddle orders its compute stream after
    the collective stream only so), instead of computing on with wrong data."""
    monkeypatch.setenv("ANYCHIP_COLLECTIVE_TIMEOUT", "1")
    g = Ranks("npu", 2)
    buf = g.alloc(0, 16)
    g.comms[0].all_reduce(buf.ptr, buf.ptr, 4, "float32", "sum", g.streams[0])  # rank 1 never calls
    after = g.devices[0].event().record(g.streams[0])
    compute = g.devices[0].stream()
    compute.wait_event(after)
    with pytest.raises(rt.AnychipError, match="event recorded after failed work: .*not arrived: 1"):
        after.synchronize()
    with pytest.raises(rt.AnychipError, match="all_reduce on rank 0 of 2 timed out"):
        compute.synchronize()
    compute.synchronize()  # reported once, as every stream error
    with pytest.raises(rt.AnychipError, match="timed out"):
        g.streams[0].synchronize()


def test_ranks_as_processes():
    uid, outs = _spawn(3, "ok")
    assert [rc for rc, _ in outs] == [0, 0, 0], outs
    assert not os.path.exists("/dev/shm/" + uid.rstrip(b"\0").decode().lstrip("/"))


def test_a_rank_that_died_is_an_error_on_the_others():
    start = time.monotonic()
    uid, outs = _spawn(3, "die")
    assert [rc for rc, _ in outs] == [3, 3, 0], outs
    for _rc, text in outs[:2]:
        assert "not arrived: 2" in text and "ANYCHIP_COLLECTIVE_TIMEOUT=2 s" in text, text
    assert time.monotonic() - start < 20
    assert not os.path.exists("/dev/shm/" + uid.rstrip(b"\0").decode().lstrip("/"))


def test_bad_arguments_are_named():
    g = Ranks("npu", 2)
    buf = g.alloc(0, 16)
    with pytest.raises(rt.InvalidArgumentError, match="op must be one of sum, prod, max, min, avg, got 'mean'"):
        g.comms[0].all_reduce(buf.ptr, buf.ptr, 4, "float32", "mean", g.streams[0])
    with pytest.raises(rt.InvalidArgumentError, match="root must be a rank in 0..1, got 2"):
        g.comms[0].broadcast(buf.ptr, buf.ptr, 4, "float32", 2, g.streams[0])
    with pytest.raises(rt.InvalidArgumentError, match="float64 .* not a dtype this device declares|dtype 3 is not"):
        g.comms[0].all_reduce(buf.ptr, buf.ptr, 2, "float64", "sum", g.streams[0])
    with pytest.raises(rt.InvalidArgumentError, match="npu:0: all_reduce send"):
        g.comms[0].all_reduce(buf.ptr, buf.ptr + 8, 1 << 24, "float32", "sum", g.streams[0])
    with pytest.raises(rt.InvalidArgumentError, match="rank must be an int in 0..1, got 2"):
        Communicator.init(g.devices[0], unique_id(g.devices[0]), 2, 2)
    g.close()


@pytest.mark.skipif(shutil.which("cc") is None, reason="needs a C compiler")
def test_a_plugin_built_against_abi_1_1_has_no_collectives(tmp_path):
    old = old_abi_runtime(tmp_path)
    dev = rt.Device(old, 0)
    assert not has_collectives(old)
    with pytest.raises(rt.AnychipError, match=r"^oldchip has no collectives \(its plugin implements "
                                              r"device ABI 1\.1 and leaves the collective functions NULL\)$"):
        unique_id(dev)
    assert has_collectives(rt.open_device("npu:0").runtime)


def test_the_interface_keeps_its_size_and_offsets():
    assert ctypes.sizeof(abi.DeviceInterface) == (3 + 36 + 31) * ctypes.sizeof(ctypes.c_void_p)
    assert abi.DeviceInterface.comm_get_unique_id_size.offset == (3 + 36) * ctypes.sizeof(ctypes.c_void_p)
    assert (abi.ABI_MAJOR, abi.ABI_MINOR) == (1, 2)


def test_ranks_as_python_threads_of_one_process():
    import threading
    n, count = 4, 1001
    devices = [rt.open_device(f"npu:{r % 2}") for r in range(n)]
    uid = unique_id(devices[0])
    results, errors = [None] * n, []
    # Two ranks share each device: a synchronous upload waits for every stream of its device
    # (device.h), so all uploads happen before any rank enqueues its collective.
    uploaded = threading.Barrier(n, timeout=20)

    def rank(r):
        try:
            comm = Communicator.init(devices[r], uid, r, n)
            stream = devices[r].stream()
            buf = devices[r].upload(np.full(count, r, np.int64))
            uploaded.wait()
            comm.all_reduce(buf.ptr, buf.ptr, count, "int64", "sum", stream)
            stream.synchronize()
            results[r] = buf.to_numpy(np.int64)
            comm.destroy()
        except Exception as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=rank, args=(r,)) for r in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=20)
    assert not any(t.is_alive() for t in threads), "a rank hung"
    assert not errors, errors
    for r in range(n):
        assert (results[r] == sum(range(n))).all()


# ---- large messages: the direct path (process_vm_readv between the ranks' buffers) ------------

LARGE_CHILD = textwrap.dedent("""
    import os, sys, numpy as np
    sys.path.insert(0, sys.argv[5])
    from test_collectives import NP, make_data, reference
    import anychip.runtime as rt
    from anychip.runtime.collectives import Communicator
    uid, rank, n, dtypes = bytes.fromhex(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4].split(",")
    dev = rt.open_device("npu:0")
    comm = Communicator.init(dev, uid, rank, n)
    if os.environ.get("TEST_UNPRIVILEGED_RANK") == str(rank):  # process_vm_readv fails: EPERM
        if os.getuid() == 0:  # root may read anyone: become another user, which may read no one
            np.random.default_rng(0)  # imports done while the files are still readable
            os.setuid(65534)
        else:
            import ctypes
            assert ctypes.CDLL(None).prctl(4, 0, 0, 0, 0) == 0  # PR_SET_DUMPABLE 0: peers may not read it
    stream = dev.stream()
    for dtype in dtypes:
        es = np.dtype(NP[dtype]).itemsize
        count = (5 << 20) // es + 3  # 5 MiB and odd: shares and pieces of unequal sizes
        data = [make_data(dtype, n * count, np.random.default_rng(100 * q + len(dtype))) for q in range(n)]
        mine = data[rank]
        ops = ["sum", "max"] + (["avg"] if dtype != "bool" else ["min"])
        for op in ops:
            want = reference(dtype, op, [d[:count] for d in data])
            src = dev.upload(mine[:count])
            out = dev.allocate(count * es)
            comm.all_reduce(src.ptr, out.ptr, count, dtype, op, stream)            # out of place
            comm.all_reduce(src.ptr, src.ptr, count, dtype, op, stream)            # in place
            stream.synchronize()
            assert (out.to_numpy(NP[dtype]) == want).all(), (dtype, op, "out of place")
            assert (src.to_numpy(NP[dtype]) == want).all(), (dtype, op, "in place")
        # reduce_scatter in place (recv is the rank's slice of send) and not
        want = reference(dtype, "sum", data)[rank * count:(rank + 1) * count]
        full = dev.upload(mine)
        rs = dev.allocate(count * es)
        comm.reduce_scatter(full.ptr, rs.ptr, count, dtype, "sum", stream)
        comm.reduce_scatter(full.ptr, full.ptr + rank * count * es, count, dtype, "sum", stream)
        stream.synchronize()
        assert (rs.to_numpy(NP[dtype]) == want).all(), (dtype, "reduce_scatter")
        assert (full.to_numpy(NP[dtype])[rank * count:(rank + 1) * count] == want).all(), (dtype, "rs in place")
        # all_gather in place (send is the rank's slice of recv) and not
        want = np.concatenate([d[:count] for d in data])
        gathered = dev.allocate(n * count * es)
        src = dev.upload(mine[:count])
        comm.all_gather(src.ptr, gathered.ptr, count, dtype, stream)
        inplace = dev.upload(np.concatenate([mine[:count] if q == rank else np.zeros(count, NP[dtype]) for q in range(n)]))
        comm.all_gather(inplace.ptr + rank * count * es, inplace.ptr, count, dtype, stream)
        # broadcast from the last rank, in place; reduce (max) to rank 0; all_to_all
        bb = dev.upload(mine[:count])
        comm.broadcast(bb.ptr, bb.ptr, count, dtype, n - 1, stream)
        red = dev.allocate(count * es)
        comm.reduce(src.ptr, red.ptr, count, dtype, "max", 0, stream)
        a2a = dev.allocate(n * count * es)
        comm.all_to_all(full.ptr, a2a.ptr, count, dtype, stream)
        stream.synchronize()
        assert (gathered.to_numpy(NP[dtype]) == want).all(), (dtype, "all_gather")
        assert (inplace.to_numpy(NP[dtype]) == want).all(), (dtype, "all_gather in place")
        assert (bb.to_numpy(NP[dtype]) == data[n - 1][:count]).all(), (dtype, "broadcast")
        if rank == 0:
            assert (red.to_numpy(NP[dtype]) == reference(dtype, "max", [d[:count] for d in data])).all(), (dtype, "reduce")
        # all_to_all read `full` after the in-place reduce_scatter changed its slice `rank`
        sent = [d.copy() for d in data]
        for q in range(n):
            sent[q][q * count:(q + 1) * count] = reference(dtype, "sum", data)[q * count:(q + 1) * count]
        want = np.concatenate([sent[q][rank * count:(rank + 1) * count] for q in range(n)])
        assert (a2a.to_numpy(NP[dtype]) == want).all(), (dtype, "all_to_all")
    comm.destroy()
    print("OK", rank)
""")


def _spawn_large(n, dtypes, env=None):
    tests = os.path.dirname(os.path.abspath(__file__))
    uid, outs = run_ranks(LARGE_CHILD, n, [dtypes, tests], 120, {"ANYCHIP_COLLECTIVE_TIMEOUT": "20", **(env or {})})
    assert [rc for rc, _ in outs] == [0] * n, outs
    assert not os.path.exists("/dev/shm/" + uid.rstrip(b"\0").decode().lstrip("/"))


@pytest.mark.parametrize("n,dtypes", [(2, "float32,bfloat16,int64,bool"), (3, "float16,int8,float32")])
def test_large_messages_across_processes_match_numpy(n, dtypes):
    _spawn_large(n, dtypes)


def test_large_messages_with_device_memory_checking_and_with_the_staged_path():
    # checking mode: the buffers are PROT_NONE but while the collective runs (peers read them)
    _spawn_large(2, "float32", {"ANYCHIP_SIM_CHECK": "1"})
    # ANYCHIP_COLLECTIVE_DIRECT=0: every large message through the staging slots, same results
    _spawn_large(2, "float32", {"ANYCHIP_COLLECTIVE_DIRECT": "0"})
    # a rank whose memory the others may not read (process_vm_readv: EPERM): all fall back
    _spawn_large(3, "int32", {"TEST_UNPRIVILEGED_RANK": "1"})


def test_large_messages_between_ranks_of_one_process_and_direct_equals_staged(monkeypatch):
    rng = np.random.default_rng(5)
    count = (3 << 20) // 4 + 1
    data = [rng.standard_normal(count).astype(np.float32) for _ in range(3)]
    results = []
    for direct in ("1", "0"):  # decided at a communicator's first large collective
        monkeypatch.setenv("ANYCHIP_COLLECTIVE_DIRECT", direct)
        g = Ranks("npu", 3)
        bufs = [g.upload(r, data[r]) for r in range(3)]
        for r in range(3):
            g.comms[r].all_reduce(bufs[r].ptr, bufs[r].ptr, count, "float32", "avg", g.streams[r])
        g.sync()
        results.append([b.to_numpy(np.float32) for b in bufs])
        g.close()
    want = reference("float32", "avg", data)
    for r in range(3):
        assert results[0][r].tobytes() == results[1][r].tobytes() == want.tobytes()


DIE_CHILD = textwrap.dedent("""
    import os, sys, threading, numpy as np
    import anychip.runtime as rt
    from anychip.runtime.collectives import Communicator
    uid, rank, n = bytes.fromhex(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
    dev = rt.open_device("npu:0")
    comm = Communicator.init(dev, uid, rank, n)
    stream = dev.stream()
    count = (16 << 20) // 4
    buf = dev.upload(np.ones(count, np.float32))
    comm.all_reduce(buf.ptr, buf.ptr, count, "float32", "sum", stream)
    stream.synchronize()
    if rank == n - 1:  # dies while the others are in the middle of large all_reduces
        threading.Timer(0.3, lambda: os._exit(0)).start()
    try:
        for _ in range(2000):
            comm.all_reduce(buf.ptr, buf.ptr, count, "float32", "max", stream)
            stream.synchronize()
    except rt.AnychipError as exc:
        print("ERROR", exc)
        sys.exit(3)
    print("OK", rank)
""")


def test_a_rank_that_dies_during_a_large_all_reduce_is_named_on_the_others():
    n = 3
    uid = unique_id(rt.open_device("npu:0"))
    env = dict(os.environ, ANYCHIP_COLLECTIVE_TIMEOUT="2")
    start = time.monotonic()
    procs = [subprocess.Popen([sys.executable, "-c", DIE_CHILD, uid.hex(), str(r), str(n)],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
             for r in range(n)]
    outs = []
    for p in procs:
        try:
            outs.append((p.wait(timeout=60), p.stdout.read()))
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            pytest.fail("a rank hung")
    assert [rc for rc, _ in outs] == [3, 3, 0], outs
    for _rc, text in outs[:2]:
        # the rank that read from it first: "rank 2 died"; the others: it never arrived
        assert "all_reduce" in text and ("rank 2 died" in text or "not arrived: 2" in text), text
        assert "ANYCHIP_COLLECTIVE_TIMEOUT=2 s" in text, text
    assert time.monotonic() - start < 40
    assert not os.path.exists("/dev/shm/" + uid.rstrip(b"\0").decode().lstrip("/"))
