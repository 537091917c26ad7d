"""One definition per op (anychip/ops/defs): what is derived from it stays in step, and an op a
plugin defines (one definition file plus its kernel) reaches conformance, ``anychip ops`` and
the Paddle bridge with nothing else written."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import sysconfig
import textwrap
from pathlib import Path

from dataclasses import replace

import numpy as np
import pytest

from anychip.ops import BASE_OPS, OPS, definitions
from anychip.ops.definition import Attr
from anychip.ops.c_header import HEADER, render

INCLUDE = Path(__file__).resolve().parents[1] / "core" / "include"


def test_the_generated_ops_header_is_up_to_date():
    assert HEADER.read_text() == render(), "anychip/ops.h is stale: run python -m anychip.ops.c_header"


def test_the_header_names_every_attr_at_its_place():
    text = HEADER.read_text()
    for op in definitions().values():
        for i, attr in enumerate(op.attrs):
            assert f"#define ANYCHIP_ATTR_{op.name.upper()}_{attr.name.upper()} {i} " in text, (op.name, attr.name)
    assert "#define ANYCHIP_ATTR_DECODER_STEP_X_INT8 23 " in text
    assert "#define ANYCHIP_ATTR_LINEAR_GRAD_NEEDS_DWEIGHT 1 " in text


def test_attrs_are_built_by_name_in_the_definitions_order():
    wol = OPS["weight_only_linear"]
    assert wol.attr_values(bits=4, group_size=32, has_offsets=1) == [4.0, 32.0, 1.0]
    # a later attr given: the ones before it take their defaults; trailing defaults stay off
    assert wol.attr_values(bits=8, group_size=-1, bf16_products=1) == [8.0, -1.0, 0.0, 0.0, 1.0]
    assert wol.attr_values(grad=True, bits=4, group_size=64, has_offsets=0) == [4.0, 64.0, 0.0]
    assert BASE_OPS["sum"].attr_values(keepdim=1, n=2, axes=[0, 2]) == [1.0, 2.0, 0.0, 2.0]
    with pytest.raises(ValueError, match="weight_only_linear: attr 'group_size' is required"):
        wol.attr_values(bits=4)
    with pytest.raises(ValueError, match=r"unknown attr\(s\) \['bias'\] \(its attrs: bits, group_size"):
        wol.attr_values(bits=4, group_size=32, bias=1)
    with pytest.raises(ValueError, match=r"linear_grad: unknown attr\(s\) \['scale'\]"):
        OPS["linear"].attr_values(grad=True, needs_dx=0, scale=2)
    assert OPS["linear"].attr_values(grad=True, needs_dweight=0) == [1.0, 0.0]
    op = replace(OPS["swiglu"], attrs=(Attr("a", "optional, no default", optional=True), Attr("b", "", default=1.0)))
    assert op.attr_values() == []
    with pytest.raises(ValueError, match="swiglu: attr 'a' has no default, so it must be given to give 'b'"):
        op.attr_values(b=2.0)


def test_every_paddle_row_serves_a_definition_and_every_named_paddle_kernel_is_served():
    from anychip.frontends.paddle.kernel_table import PADDLE_KERNELS, SLOT_KINDS
    from anychip.frontends.paddle.kernels import rows, unserved

    named = [pk for op in definitions().values() for pk in op.paddle]
    assert len(named) == len(set(named)), "a Paddle kernel is named by two definitions"
    launches, _slots = rows()
    for pk in PADDLE_KERNELS:
        if not pk.name.startswith(tuple(f"anychip_{k}_slot_" for k in SLOT_KINDS)):
            assert pk.name in launches, f"row {pk.name} has no base ops and no definition names it"
    assert unserved() == {}


def test_codegen_and_the_host_kernels_follow_the_definitions():
    from anychip_codegen.ops import all_kernels
    from anychip.plugins import registry

    generated = {k.name: k.dtypes for k in all_kernels()}
    for name, op in BASE_OPS.items():
        assert generated[name] == op.dtypes, name
    kernels = registry().kernels
    for name, op in OPS.items():
        for dtype in op.dtypes:
            kernel = kernels.find(name, "cpu", dtype)
            assert kernel is not None and (kernel.backward is not None) == op.backward, (name, dtype)


# ---- an op a plugin defines ------------------------------------------------------------------

DEFINITION = '''
"""log1p: log(1 + x), elementwise: the whole definition of a new op."""
import numpy as np

from anychip.conformance.case import elementwise_cases
from anychip.ops.base import same, unary_reference
from anychip.ops.definition import Attr, OpDef

LOG1P = OpDef(
    "log1p", "unary", "log(1 + x)", ("x",), ("out",), ("float32",), {"float32": (1e-5, 1e-6)},
    lambda op, dtype, rng: elementwise_cases(op, dtype, rng, low=0.0),
    shape=same, reference_fn=unary_reference(lambda v, a: np.log1p(v)), paddle=("log1p",))

# an op with an attr: no slot wrapper passes one, so `anychip ops --paddle` says why Paddle's
# softplus is not served
SOFTPLUS = OpDef(
    "softplus", "unary", "log(1 + e^(beta x)) / beta", ("x",), ("out",), ("float32",), {"float32": (1e-5, 1e-6)},
    lambda op, dtype, rng: elementwise_cases(op, dtype, rng), attrs=(Attr("beta", "the sharpness"),),
    shape=same, reference_fn=unary_reference(lambda v, a: np.log1p(np.exp(a[0] * v)) / a[0]), paddle=("softplus",))
'''

KERNEL = r'''
#include <math.h>
#include <stdio.h>
#include "anychip/kernel.h"

int64_t gen_calls = 0;

/* out = log1p(x) for float32, x any strides (stride 0 where it broadcasts), as base ops are called */
AnychipStatus gen_log1p(const AnychipKernelCall* call) {
  const AnychipTensor* x = &call->inputs[0];
  const AnychipTensor* o = &call->outputs[0];
  if (x->dtype != ANYCHIP_DTYPE_FLOAT32) {
    snprintf(call->error, call->error_size, "log1p: float32 only");
    return ANYCHIP_ERROR_UNSUPPORTED;
  }
  int64_t n = 1, idx[ANYCHIP_MAX_RANK] = {0};
  for (int i = 0; i < o->rank; ++i) n *= o->shape[i];
  for (int64_t e = 0; e < n; ++e) {
    int64_t xo = 0, oo = 0;
    for (int i = 0; i < o->rank; ++i) {
      xo += idx[i] * x->strides[i];
      oo += idx[i] * o->strides[i];
    }
    ((float*)o->data)[oo] = log1pf(((const float*)x->data)[xo]);
    for (int i = o->rank - 1; i >= 0 && ++idx[i] == o->shape[i]; --i) idx[i] = 0;
  }
  ++gen_calls;
  return ANYCHIP_OK;
}
'''

PLUGIN = '''
"""A chip with one op of its own: a simulated device, the op's definition and its kernel."""
from dataclasses import replace
from pathlib import Path

import anychip
from anychip.kernels import NativeKernel
from anychip.ops import OPS

from .log1p import LOG1P, SOFTPLUS

LIBRARY = str(Path(__file__).with_name("libgen_kernels.so"))


@anychip.hookimpl
def anychip_register_devices():
    return [anychip.simulated_device("gen", anychip.ChipTraits(
        model="Gen", vendor="Test", memory_bytes=1 << 30, dtypes=("float32",)),
        description="a chip with an op of its own", paddle_type="anychip_gen")]


@anychip.hookimpl
def anychip_register_ops():
    return [LOG1P, SOFTPLUS, replace(OPS["swiglu"])]  # swiglu is anychip's: refused, the others kept


@anychip.hookimpl
def anychip_register_kernels(registry):
    registry.register("log1p", "gen", ["float32"], NativeKernel(LIBRARY, "gen_log1p"))
'''


@pytest.fixture(scope="module")
def gen_site(tmp_path_factory):
    site = tmp_path_factory.mktemp("gen_site")
    package = site / "gen_chip"
    package.mkdir()
    (package / "__init__.py").write_text(PLUGIN)
    (package / "log1p.py").write_text(DEFINITION)
    (package / "kernels.c").write_text(KERNEL)
    cc = sysconfig.get_config_var("CC") or "cc"
    subprocess.run([*cc.split()[:1], "-O2", "-shared", "-fPIC", f"-I{INCLUDE}", "-o", str(package / "libgen_kernels.so"),
                    str(package / "kernels.c"), "-lm"], check=True)
    dist = site / "gen_chip-0.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: gen-chip\nVersion: 0.0\n")
    (dist / "entry_points.txt").write_text("[anychip.plugins]\ngen = gen_chip\n")
    return site


def _env(site, **extra):
    env = dict(os.environ, PYTHONPATH=f"{site}{os.pathsep}{os.environ.get('PYTHONPATH', '')}", **extra)
    for name in ("ANYCHIP_SIM_CHECK", "CUSTOM_DEVICE_ROOT"):
        env.pop(name, None)
    return env


def _anychip(site, *argv, check=True):
    result = subprocess.run([sys.executable, "-m", "anychip.cli.main", *argv], capture_output=True, text=True,
                            env=_env(site), timeout=300)
    if check:
        assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return result


def test_a_new_op_is_one_definition_file_plus_its_kernel(gen_site, tmp_path):
    # conformance: the op's own cases, against its reference, on the plugin's device
    _anychip(gen_site, "conformance", "--device", "gen", "--ops", "log1p", "--skip", "runtime,e2e",
             "--out", str(tmp_path))
    report = json.loads((tmp_path / "conformance.json").read_text())
    checked = [r for r in report["results"] if r["section"] == "op"]
    assert [(r["name"], r["dtype"], r["direction"], r["status"]) for r in checked] == [
        ("log1p", "float32", "fwd", "pass")]

    # anychip ops: a row of its own, the device's kernel in it
    table = _anychip(gen_site, "ops").stdout
    row = next(line for line in table.splitlines() if line.startswith("| `log1p` |"))
    header = table.splitlines()[0].split(" | ")
    assert row.split(" | ")[header.index("gen (simulated)")] == "fp32"

    # anychip devices: the plugin's clash with anychip's own swiglu named, the rest working
    devices = {d["name"]: d for d in json.loads(_anychip(gen_site, "devices", "--json").stdout)}
    assert devices["gen"]["status"] == "simulated"
    assert "anychip_register_ops: op 'swiglu' is already defined by anychip" in devices["gen"]["reason"]

    # the Paddle bridge: Paddle's own log1p on the device runs the plugin's kernel, no CPU fallback
    listing = _anychip(gen_site, "ops", "--paddle", "--device", "gen").stdout
    assert "log1p  float32" in listing
    assert "softplus: softplus has attrs, and the slot wrappers pass none" in listing
    script = textwrap.dedent(f"""
        import ctypes, json
        import numpy as np
        import anychip
        anychip.set_device("gen")
        import paddle
        x = np.linspace(0.0, 3.0, 24, dtype=np.float32).reshape(4, 6)
        y = paddle.log1p(paddle.to_tensor(x)[:, ::2])
        calls = ctypes.c_int64.in_dll(ctypes.CDLL({str(gen_site / 'gen_chip' / 'libgen_kernels.so')!r}), "gen_calls")
        fell = [k for k in anychip.fallback_counts() if k[1] == "log1p"]
        print(json.dumps({{"place": str(y.place), "y": y.numpy().tolist(), "calls": calls.value, "fell": fell}}))
    """)
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=_env(gen_site),
                            timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    got = json.loads(result.stdout.strip().splitlines()[-1])
    assert "anychip_gen" in got["place"] and got["calls"] >= 1 and got["fell"] == []
    np.testing.assert_allclose(got["y"], np.log1p(np.linspace(0.0, 3.0, 24, dtype=np.float32).reshape(4, 6)[:, ::2]),
                               rtol=1e-6)
