"""CodeGen targets: the built-in ``c`` and ``cuda`` backends and those plugins add through the
``anychip_register_codegen_backends`` hook (the contract is in :mod:`anychip.hookspecs`)."""

from __future__ import annotations


def builtin() -> dict:
    from .c import CBackend
    from .cuda import CudaBackend

    return {"c": CBackend(), "cuda": CudaBackend()}


def backend(name: str):
    """The backend called ``name``: a built-in one or one a plugin registered."""
    found = builtin()
    if name in found:
        return found[name]
    from anychip.plugins import registry

    plugged = registry().codegen_backends
    if name in plugged:
        return plugged[name]
    known = ", ".join(sorted(set(found) | set(plugged)))
    raise LookupError(f"no CodeGen backend {name!r}; known: {known}")
