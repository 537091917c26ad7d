"""`import paddle` just works: after `pip install`, anychip's devices are Paddle CustomDevices
whether or not (and in whichever order) a script imports anychip.

Each case runs in a fresh interpreter: Paddle loads CustomDevices once, at import.
"""

import importlib.util
import json
import textwrap

import pytest

from conftest import run_python

if importlib.util.find_spec("paddle") is None:
    pytest.skip("paddlepaddle is not installed", allow_module_level=True)

PADDLE_TYPES = {"anychip_ascend", "anychip_kunlun", "anychip_enflame", "anychip_hygon"}


def run(code: str, env: dict | None = None) -> dict:
    result = run_python(textwrap.dedent(code), env=env, timeout=180)
    assert result.returncode == 0, result.stderr[-3000:]
    return {**json.loads(result.stdout.strip().splitlines()[-1]), "stderr": result.stderr}


def test_plain_paddle_has_every_anychip_device_without_importing_anychip():
    out = run("""
        import json, sys
        import numpy as np
        import paddle
        types = paddle.device.get_all_custom_device_type()
        paddle.set_device("anychip_ascend:0")
        x = paddle.to_tensor(np.arange(6, dtype=np.float32).reshape(2, 3))
        y = paddle.exp(x) + x * 2
        gram = paddle.matmul(x, x.T)  # a strided view: Paddle's stride kernels are on by default
        print(json.dumps({"types": types, "place": str(y.place), "y": y.numpy().tolist(),
                          "gram": gram.numpy().tolist(),
                          "anychip_imported": any(m.startswith("anychip") for m in sys.modules)}))
    """)
    assert PADDLE_TYPES <= set(out["types"])
    assert out["place"] == "Place(anychip_ascend:0)"
    x = [[0, 1, 2], [3, 4, 5]]
    import numpy as np

    np.testing.assert_allclose(out["y"], np.exp(x) + np.array(x) * 2, rtol=1e-6)
    np.testing.assert_allclose(out["gram"], np.array(x) @ np.array(x).T)
    assert out["anychip_imported"] is False


@pytest.mark.parametrize("order", ["paddle first", "anychip first"])
def test_anychip_set_device_works_whatever_was_imported_first(order):
    imports = "import paddle\nimport anychip" if order == "paddle first" else "import anychip\nimport paddle"
    out = run(imports + """
import json
import numpy as np
from anychip.frontends import paddle as paddle_frontend
from anychip.frontends.paddle import root as paddle_root
from anychip.fallback import fallback_counts
anychip.set_device("npu")
x = paddle.to_tensor(np.arange(6, dtype=np.float32).reshape(2, 3))
y = paddle.nn.functional.softmax(paddle.exp(x) - x, axis=-1)
print(json.dumps({"place": str(y.place), "y": y.numpy().tolist(), "fallbacks": len(fallback_counts()),
                  "root": str(paddle_frontend._root), "default": str(paddle_root.default_root())}))
""")
    assert out["place"] == "Place(anychip_ascend:0)"
    assert out["fallbacks"] == 0
    assert out["root"] == out["default"]  # the folder pip install wrote is the one in use
    assert "does not match" not in out["stderr"]


def test_paddle_first_without_the_device_in_its_folder_names_the_way_out(tmp_path):
    # Paddle loaded from a folder without anychip's files: what a device installed after the
    # import looks like.
    out = run("""
        import json
        import paddle
        import anychip
        from anychip.errors import PaddleImportOrderError
        try:
            anychip.set_device("npu")
            print(json.dumps({"error": None}))
        except PaddleImportOrderError as e:
            print(json.dumps({"error": str(e)}))
    """, env={"CUSTOM_DEVICE_ROOT": str(tmp_path)})
    assert "device 'npu' (Paddle type anychip_ascend) is not among the CustomDevices" in out["error"]
    assert "python -m anychip.frontends.paddle.root" in out["error"]
    assert "does not match the anychip devices" in out["stderr"]


PADDLE_FIRST_FALLBACK = """
    import json
    import numpy as np
    import paddle
    import anychip
    from anychip.fallback import fallback_counts
    anychip.set_device("npu")
    x = paddle.to_tensor(np.arange(6, dtype=np.float32))
    try:
        y = paddle.lgamma(x + 1)  # no device kernel for it: Paddle runs it on the CPU
        error = None
    except Exception as e:
        error = str(e)
    print(json.dumps({"error": error, "fallbacks": [list(k) for k in fallback_counts()]}))
"""


def test_paddle_first_still_counts_fallbacks_and_strict_mode_forbids_them():
    counted = run(PADDLE_FIRST_FALLBACK)
    assert counted["error"] is None
    assert ["npu", "lgamma", "float32"] in counted["fallbacks"]
    strict = run(PADDLE_FIRST_FALLBACK, env={"ANYCHIP_STRICT": "1"})
    assert "kernel `lgamma` is not registered" in strict["error"]
