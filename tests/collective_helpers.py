"""What the collectives tests share: ranks started as processes of one communicator, and a plugin
as built against device ABI 1.1 (the simulator with the collective slots left NULL)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

import anychip.runtime as rt
from anychip.native import include_dir
from anychip.runtime.collectives import unique_id

OLD_ABI_PLUGIN = r"""
#include <stddef.h>
#include <string.h>
#include <dlfcn.h>
#include "anychip/device.h"
/* A plugin as built against ABI 1.1: the simulator with the collective slots left NULL. */
AnychipStatus anychip_device_init(AnychipDeviceInterface* iface, const char* options) {
  void* lib = dlopen(SIM_PATH, RTLD_NOW | RTLD_LOCAL);
  if (!lib) return ANYCHIP_ERROR_UNAVAILABLE;
  AnychipDeviceInitFn init = (AnychipDeviceInitFn)dlsym(lib, "anychip_device_init");
  AnychipStatus s = init(iface, options);
  size_t start = offsetof(AnychipDeviceInterface, comm_get_unique_id_size);
  memset((char*)iface + start, 0, sizeof(*iface) - start);
  iface->abi_version = (1 << 16) | 1;
  return s;
}
"""


def old_abi_runtime(folder, name: str = "oldchip") -> rt.Runtime:
    """A runtime of one device whose plugin implements ABI 1.1 (compiled into ``folder``; needs cc)."""
    sim = rt.open_device("npu:0").runtime._lib._name
    src = folder / "old.c"
    src.write_text(OLD_ABI_PLUGIN)
    lib = folder / "libold.so"
    subprocess.run(["cc", "-shared", "-fPIC", f"-I{include_dir()}", f'-DSIM_PATH="{sim}"', str(src),
                    "-o", str(lib), "-ldl"], check=True)
    return rt.Runtime(name, str(lib), options=f"name={name};devices=1")


def run_ranks(child: str, n: int, args: list[str], timeout_s: float, env: dict[str, str]) -> tuple[bytes, list]:
    """Runs ``python -c child UID RANK N *args`` as ranks 0..n-1 of a new communicator on npu,
    each with ``env`` over this process's environment; returns the unique id and each rank's
    (exit status, output). A rank still running after ``timeout_s`` fails the test (all killed)."""
    uid = unique_id(rt.open_device("npu:0"))
    full = dict(os.environ, **env)
    procs = [subprocess.Popen([sys.executable, "-c", child, uid.hex(), str(r), str(n), *args],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=full)
             for r in range(n)]
    outs = []
    for p in procs:
        try:
            outs.append((p.wait(timeout=timeout_s), p.stdout.read()))
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            pytest.fail("a rank hung")
    return uid, outs
