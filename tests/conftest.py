import atexit
import os
import shutil
import subprocess
import sys
import tempfile

# Before anything opens a device: guard simulated memory, and keep caches out of $HOME.
os.environ["ANYCHIP_SIM_CHECK"] = "1"
if "ANYCHIP_CACHE_DIR" not in os.environ:  # one per session, shared by its workers and subprocesses
    os.environ["ANYCHIP_CACHE_DIR"] = tempfile.mkdtemp(prefix="anychip-test-cache-")
    atexit.register(shutil.rmtree, os.environ["ANYCHIP_CACHE_DIR"], ignore_errors=True)
# ...except the models: pulled once (verified, written atomically) and shared with the user's cache.
os.environ.setdefault("ANYCHIP_MODELS_DIR", os.path.join(os.path.expanduser("~"), ".cache", "anychip", "models"))
# ...and CodeGen's libraries, which are keyed by the hash of everything that goes into them.
os.environ.setdefault("ANYCHIP_CODEGEN_CACHE", os.path.join(os.path.expanduser("~"), ".cache", "anychip", "codegen"))

import pytest  # noqa: E402

from anychip.devices import describe_all  # noqa: E402

AVAILABLE = [i.name for i in describe_all() if i.status != "unavailable"]
if os.environ.get("ANYCHIP_TEST_DEVICES"):  # e.g. a vendor's plugin alone
    AVAILABLE = [d for d in os.environ["ANYCHIP_TEST_DEVICES"].split(",") if d in AVAILABLE]
SIMULATED = [i.name for i in describe_all() if i.status == "simulated"]


def run_python(code: str, env: dict | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    """Runs ``code`` in a fresh interpreter (Paddle registers devices once per process)."""
    full_env = dict(os.environ)
    full_env.pop("ANYCHIP_SIM_CHECK", None)
    # the folder this test process's Paddle loaded (with the simulator checking, not what pip
    # install wrote): a fresh interpreter chooses its own, as a user's script does
    full_env.pop("CUSTOM_DEVICE_ROOT", None)
    full_env.update(env or {})
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=full_env,
                          timeout=timeout)


def pytest_report_header(config):
    """Which host-kernel tiers this run covers: the tier tests rerun cases capped to each tier
    up to the best this CPU has, and skip the others."""
    from anychip_plugins.host import ISAS, kernel_isa

    best = kernel_isa()
    covered = ISAS[:ISAS.index(best) + 1]
    missing = ISAS[len(covered):]
    return (f"anychip host kernels: {best} in-process; ISA tiers covered: {', '.join(covered)}"
            + (f" (this CPU lacks {', '.join(missing)}: their tier tests skip)" if missing else ""))


@pytest.fixture(params=AVAILABLE, scope="session")
def device(request):
    import anychip.runtime as rt

    return rt.open_device(f"{request.param}:0")


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory):
    """A tiny random Llama chat model folder (ChatML template), for training and quantization."""
    from training_helpers import chat_model

    return chat_model(tmp_path_factory.mktemp("tiny") / "model")


@pytest.fixture(scope="session")
def base(model_dir):
    """The checkpoint of ``model_dir``."""
    from anychip_models.loader import load_checkpoint

    return load_checkpoint(model_dir)
