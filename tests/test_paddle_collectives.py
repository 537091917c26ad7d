"""The Paddle bridge routes Paddle's collectives (device_ext.h's xccl_*) to the device's own
(device.h ABI 1.2): a job of 2 ranks under ``python -m paddle.distributed.launch``, set up by
``python -m anychip.frontends.paddle.root --job CHIP``, runs paddle.distributed's collectives and
paddle.DataParallel on simulated chips in strict mode (no CPU fallback)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

JOB = Path(__file__).with_name("paddle_collectives_job.py")


def job_env(chip: str) -> dict[str, str]:
    """The environment `eval "$(python -m anychip.frontends.paddle.root --job CHIP)"` gives, as a README user would."""
    out = subprocess.run([sys.executable, "-m", "anychip.frontends.paddle.root", "--job", chip], capture_output=True, text=True,
                         check=True).stdout
    env = {}
    for line in out.splitlines():
        key, _, value = line.removeprefix("export ").partition("=")
        env[key] = value.strip("'")
    return env


@pytest.mark.parametrize("chip", ["npu", "dcu"])
def test_paddle_collectives_and_data_parallel_on_two_ranks_of_a_simulated_chip(tmp_path, chip):
    from anychip.devices import describe

    dtypes = describe(chip).dtypes
    env = {**os.environ, **job_env(chip), "CHIP": chip, "OUT": str(tmp_path), "DTYPES": ",".join(dtypes),
           "ANYCHIP_STRICT": "1", "ANYCHIP_COLLECTIVE_TIMEOUT": "60"}
    run = subprocess.run([sys.executable, "-m", "paddle.distributed.launch", "--nproc_per_node", "2",
                          "--log_dir", str(tmp_path / "logs"), str(JOB)], env=env, capture_output=True, text=True,
                         timeout=300)
    logs = "".join(p.read_text(errors="replace") for p in sorted((tmp_path / "logs").glob("workerlog.*")))
    assert run.returncode == 0, logs[-4000:]
    got = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    paddle_type = {"npu": "anychip_ascend", "dcu": "anychip_hygon"}[chip]
    assert [g["place"] for g in got] == [f"Place({paddle_type}:{r})" for r in range(2)]
    for r, g in enumerate(got):
        for dtype in dtypes:
            want = [1.0] * 7 if dtype == "bool" else [float(2 * i + 3) for i in range(7)]
            want = [float(i % 2) for i in range(7)] if dtype == "bool" else want
            assert g[f"sum_{dtype}"] == want, dtype
        assert g["MAX"] == [4.0, 5.0, 6.0, 7.0, 8.0]
        assert g["MIN"] == [1.0, 2.0, 3.0, 4.0, 5.0]
        assert g["PROD"] == [4.0, 10.0, 18.0, 28.0, 40.0]
        assert g["all_gather"] == [[0.0] * 3, [1.0] * 3]
        assert g["broadcast"] == [20.0] * 4
        assert g["reduce_scatter"] == [[1.0, 3.0], [21.0, 23.0]][r]
        assert g["alltoall"] == [[[0.0], [100.0]], [[1.0, 1.0], [101.0, 101.0]]][r]
        assert g["data_parallel_grad"] == [[3.0] * 3] * 4  # the mean of 2 (rank 0) and 4 (rank 1)
    assert got[0]["reduce"] == [0.0, 3.0, 6.0, 9.0]
    assert got[1]["recv"] == [1.5, 2.5, 3.5]


def test_job_env_names_one_chip_and_none_for_the_host():
    env = job_env("npu")
    assert env["ANYCHIP_PADDLE_DEVICES"] == "npu"
    folder = Path(env["CUSTOM_DEVICE_ROOT"])
    assert sorted(p.name for p in folder.glob("libanychip_*.so")) == ["libanychip_npu.so"]
    cpu = job_env("cpu")  # host ranks: Paddle sees no CustomDevice, whose device count would cap --nproc
    assert cpu["ANYCHIP_PADDLE_DEVICES"] == ""
    assert not list(Path(cpu["CUSTOM_DEVICE_ROOT"]).glob("libanychip_*.so"))
