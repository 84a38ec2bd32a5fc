"""evonnx: a graph-level optimizer for ONNX models with view-aware fusion.

`optimize(src, dst)` writes an optimized model and its onnxruntime custom-op library (`dst` -> `*.evonnx.so`);
`load_session(path)` opens an optimized model with its library registered.
"""

from evonnx.api import OptimizeResult, library_path, load_session, optimize
from evonnx.errors import BuildError, EvonnxError, InternalError, InvalidModelError, UnsupportedError, VerificationError

__version__ = "0.1.0"

__all__ = ["optimize", "load_session", "library_path", "OptimizeResult", "EvonnxError", "InvalidModelError",
           "UnsupportedError", "InternalError", "BuildError", "VerificationError", "__version__"]
