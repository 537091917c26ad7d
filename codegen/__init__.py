"""anychip CodeGen: kernels described once (:mod:`.ir`), rendered by a backend (``c``,
``cuda`` or a vendor's through the ``anychip_register_codegen_backends`` hook), built with ninja
into a content-hash cache, optionally autotuned, and registered as a device's kernels.

    from anychip_codegen import generate, ops
    library = generate("npu_base", ops.library(dtypes), "c")      # cached after the first time
    anychip_codegen.register(registry, "npu", library)
"""

from __future__ import annotations

from . import ir, ops
from .backends import backend as find_backend
from .build import CodeGenBuildError, Library, cache_root
from .build import build as build_library
from .load import register
from .tune import tune, tuned


def generate(name: str, kernels, backend="c", tune_now: bool = False) -> Library:
    """Builds ``kernels`` with ``backend`` (a name or a backend object) into ``lib<name>.so``,
    each kernel with its tuned schedule if one is cached (``tune_now``: measure those without
    one first). A second call with the same kernels is a cache hit."""
    target = find_backend(backend) if isinstance(backend, str) else backend
    chosen = []
    for kernel in kernels:
        if tune_now:
            tune(kernel, target)
        chosen.append(tuned(kernel, target))
    return build_library(name, chosen, target)


__all__ = ["CodeGenBuildError", "Library", "build_library", "cache_root", "find_backend", "generate", "ir", "ops",
           "register", "tune", "tuned"]
