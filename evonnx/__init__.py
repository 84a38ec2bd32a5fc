"""evonnx: a graph-level optimizer for ONNX models with view-aware fusion.

`optimize(src, dst)` writes an optimized model and its onnxruntime custom-op library (`dst` -> `*.evonnx.so`);
`load_session(path)` opens an optimized model with its library registered.
"""

from __future__ import annotations

from typing import Any

from evonnx.errors import (
    BuildError,
    EvonnxError,
    InternalError,
    InvalidModelError,
    UnsupportedError,
    UsageError,
    VerificationError,
)

_API = ("optimize", "load_session", "library_path", "OptimizeResult")


def __getattr__(name: str) -> Any:
    # The API (onnx, numpy) is imported on first use, so `evonnx` on the command line installs its Ctrl-C
    # handling before anything slow is imported.
    if name in _API:
        import evonnx.api

        return getattr(evonnx.api, name)
    raise AttributeError(f"module 'evonnx' has no attribute {name!r}")

__version__ = "0.1.0"

__all__ = ["optimize", "load_session", "library_path", "OptimizeResult", "EvonnxError", "InvalidModelError",
           "UnsupportedError", "InternalError", "BuildError", "UsageError", "VerificationError", "__version__"]
