"""Freed host memory stays in the heap for reuse once anychip has set Paddle up, instead of
going back to the kernel (and being faulted in again by the next large tensor)."""

import textwrap

import pytest

from conftest import run_python

CODE = textwrap.dedent("""
    import ctypes, numpy as np
    from anychip.host_memory import keep_freed_host_memory

    class Mallinfo2(ctypes.Structure):
        _fields_ = [(name, ctypes.c_size_t) for name in
                    ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks",
                     "fordblks", "keepcost")]

    print("POLICY", keep_freed_host_memory())
    mallinfo2 = ctypes.CDLL("libc.so.6").mallinfo2
    mallinfo2.restype = Mallinfo2
    a = np.ones(16 << 20, np.float32)  # 64 MB
    del a
    print("FREE_MB_KEPT", mallinfo2().fordblks >> 20)
""")


@pytest.mark.parametrize("mode,kept", [("cache", True), ("system", False)])
def test_freed_large_blocks_stay_for_reuse(mode, kept):
    result = run_python(CODE, env={"ANYCHIP_HOST_MALLOC": mode})
    assert result.returncode == 0, result.stderr
    lines = dict(line.split() for line in result.stdout.splitlines())
    assert lines["POLICY"] == str(kept)
    assert (int(lines["FREE_MB_KEPT"]) >= 64) == kept, lines
