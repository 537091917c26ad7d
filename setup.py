"""Builds anychip: the Python packages plus the native libraries from CMakeLists.txt.

Install with `pip install --no-build-isolation -e .` after `pip install -r requirements.txt`:
the Paddle bridge compiles against the headers of the Paddle that is installed.
"""

import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

ROOT = Path(__file__).resolve().parent

# Each native library, as (extension name, CMake variable naming its output directory).
LIBRARIES = [
    ("anychip._lib.libanychip_sim", "ANYCHIP_CORE_LIB_DIR"),
    ("anychip._lib.libanychip_paddle_bridge", "ANYCHIP_CORE_LIB_DIR"),
    ("anychip._lib.libanychip_paddle_kernels", "ANYCHIP_CORE_LIB_DIR"),
    ("anychip._lib.libanychip_torch_bridge", "ANYCHIP_CORE_LIB_DIR"),
    ("anychip._launcher", "ANYCHIP_LAUNCHER_DIR"),
    ("anychip_plugins.host.libanychip_host_kernels", "ANYCHIP_HOST_KERNELS_DIR"),
    ("anychip_plugins.gpu.libanychip_cuda", "ANYCHIP_GPU_PLUGIN_DIR"),
]


def torch_dir() -> tuple[str, int]:
    """(the installed torch's package folder, its _GLIBCXX_USE_CXX11_ABI), or ("", 0) without
    torch: the PyTorch bridge is then not built (anychip.torch says so when imported)."""
    if importlib.util.find_spec("torch") is None:
        return "", 0
    code = "import torch, os; print(os.path.dirname(torch.__file__)); print(int(torch._C._GLIBCXX_USE_CXX11_ABI))"
    try:
        folder, abi = subprocess.check_output([sys.executable, "-c", code], text=True).split()
    except (subprocess.CalledProcessError, ValueError) as exc:
        print(f"anychip: torch does not import ({exc}); building without the PyTorch bridge", file=sys.stderr)
        return "", 0
    return folder, int(abi)


def paddle_include_dir() -> str:
    spec = importlib.util.find_spec("paddle")
    if spec is None or not spec.submodule_search_locations:
        return ""
    inc = Path(list(spec.submodule_search_locations)[0]) / "include"
    return str(inc) if (inc / "paddle/phi/backends/device_ext.h").exists() else ""


# The packages as setup() maps them, and the entry points of anychip's own plugins: what a build
# step needs to run anychip from the source tree before pip has installed it.
PACKAGE_DIRS = {"anychip": "core", "anychip_plugins": "plugins", "anychip_models": "models", "anychip_bench": "bench",
                "anychip_codegen": "codegen"}
CHIPS = ("cpu", "gpu", "xpu", "npu", "gcu", "dcu")


# Run by install_paddle_devices: imports the packages from the source tree as setup() maps them,
# as pip's editable install will once it has finished (the paths stay the real ones).
_FROM_SOURCE = """
import importlib.abc, importlib.util, sys
dirs = {dirs!r}
class SourceTree(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name in dirs:
            return importlib.util.spec_from_file_location(
                name, dirs[name] + "/__init__.py", submodule_search_locations=[dirs[name]])
sys.meta_path.insert(0, SourceTree())
from anychip.frontends.paddle.root import main
sys.exit(main())
"""


def install_paddle_devices(build_dir: Path) -> None:
    """Writes anychip's devices into Paddle's CustomDevice folder (anychip.frontends.paddle.root.install),
    so that `import paddle` alone has them; the generated kernels of the built-in chips are
    compiled on the way, into the install, not at first use. Runs anychip from the source tree,
    beside a dist-info declaring the built-in plugins (pip has not installed them yet)."""
    meta = build_dir / "plugin-metadata"
    shutil.rmtree(meta, ignore_errors=True)
    info = meta / "anychip-0.1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: anychip\nVersion: 0.1.0\n")
    (info / "entry_points.txt").write_text(
        "[anychip.plugins]\n" + "".join(f"{chip} = anychip_plugins.{chip}\n" for chip in CHIPS))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(meta), os.environ.get("PYTHONPATH")])),
               ANYCHIP_CODEGEN_CACHE=str(ROOT / "codegen" / "_prebuilt"))
    print("anychip: building the built-in chips' generated kernels and installing their Paddle CustomDevices",
          file=sys.stderr, flush=True)
    dirs = {package: str(ROOT / folder) for package, folder in PACKAGE_DIRS.items()}
    if subprocess.call([sys.executable, "-c", _FROM_SOURCE.format(dirs=dirs)], env=env) != 0:
        # Not fatal: anychip still registers its devices when it imports Paddle itself.
        print("anychip: WARNING: Paddle's CustomDevice folder was not written (see above): `import paddle` "
              "before `import anychip` will not find anychip's devices; `python -m anychip.frontends.paddle.root` retries",
              file=sys.stderr, flush=True)


class CMakeBuild(build_ext):
    """Runs one CMake/Ninja build for all libraries instead of compiling per extension."""

    def get_ext_filename(self, fullname):
        return fullname.replace(".", os.sep) + ".so"

    def run(self):
        out_dirs = {}
        for ext in self.extensions:
            out_dirs[dict(LIBRARIES)[ext.name]] = str(Path(self.get_ext_fullpath(ext.name)).parent.resolve())
        build_dir = ROOT / "build" / "cmake"
        build_dir.mkdir(parents=True, exist_ok=True)
        paddle_inc = paddle_include_dir()
        if not paddle_inc:
            print("anychip: paddlepaddle is not installed; building without the Paddle bridge", file=sys.stderr)
        torch_folder, torch_abi = torch_dir()
        if not torch_folder:
            print("anychip: torch is not installed; building without the PyTorch bridge (anychip.torch)",
                  file=sys.stderr)
        configure = ["cmake", "-S", str(ROOT), "-B", str(build_dir), "-G", "Ninja",
                     f"-DANYCHIP_PADDLE_INCLUDE_DIR={paddle_inc}", f"-DPython_EXECUTABLE={sys.executable}",
                     f"-DANYCHIP_TORCH_DIR={torch_folder}", f"-DANYCHIP_TORCH_CXX11_ABI={torch_abi}"]
        configure += [f"-D{var}={path}" for var, path in out_dirs.items()]
        subprocess.check_call(configure)
        subprocess.check_call(["cmake", "--build", str(build_dir), "-j", str(os.cpu_count() or 2)])
        if paddle_inc and self.inplace:
            install_paddle_devices(build_dir)

    def get_outputs(self):
        return [p for p in super().get_outputs() if os.path.exists(p)]


setup(
    name="anychip",
    version="0.1.0",
    description="A plugin-based hardware abstraction layer for LLM work on PaddlePaddle",
    python_requires=">=3.10",
    package_dir=PACKAGE_DIRS,
    packages=["anychip", "anychip.runtime", "anychip.cli", "anychip.ops", "anychip.conformance", "anychip.frontends", "anychip.frontends.paddle",
              "anychip.frontends.torch", "anychip_bench",
              "anychip_codegen", "anychip_codegen.backends",
              "anychip_plugins", "anychip_plugins.host", "anychip_plugins.cpu", "anychip_plugins.gpu", "anychip_plugins.xpu",
              "anychip_plugins.npu", "anychip_plugins.gcu", "anychip_plugins.dcu", "anychip_models", "anychip_models.cli",
              "anychip_models.training", "anychip_models.quantization", "anychip_models.serving"],
    package_data={"anychip": ["include/anychip/*.h", "include/anychip/*.c", "frontends/paddle/csrc/kernels/*.h", "templates/plugin/*", "templates/plugin/*/*"],
                  "anychip_models": ["training/sample_data/*.jsonl", "training/sample_data/*.json", "training/sample_text/*.jsonl",
                                     "training/sample_preferences/*.jsonl",
                                     "training/configs/*.json", "eval_data/*.txt",
                                     "serving/static/*"]},
    ext_modules=[Extension(name, sources=[]) for name, _var in LIBRARIES],
    cmdclass={"build_ext": CMakeBuild},
    install_requires=["numpy", "pluggy>=1.3", "paddlepaddle==3.3.1", "gguf>=0.19,<0.20", "tokenizers>=0.15", "jinja2>=3.1",
                      "safetensors>=0.4", "tqdm>=4.60", "matplotlib>=3.5", "starlette>=0.40", "uvicorn>=0.30"],
    entry_points={
        "console_scripts": ["anychip = anychip.cli.main:main"],
        "anychip.commands": [
            "generate = anychip_models.cli.generate",
            "chat = anychip_models.cli.chat",
            "models = anychip_models.cli.manage",
            "finetune = anychip_models.cli.finetune",
            "pretrain = anychip_models.cli.pretrain",
            "dpo = anychip_models.cli.dpo",
            "lora = anychip_models.cli.lora",
            "eval = anychip_models.cli.eval",
            "quantize = anychip_models.cli.quantize",
            "serve = anychip_models.cli.serve",
            "bench = anychip_bench.cli",
        ],
        # checks beyond the core's that `anychip conformance` runs: a module with run(device) -> [Result]
        "anychip.conformance": ["llama = anychip_models.conformance"],
        "pytest11": ["anychip_conformance = anychip.conformance.pytest_plugin"],
        "anychip.plugins": [
            f"{chip} = anychip_plugins.{chip}" for chip in CHIPS
        ],
    },
)
