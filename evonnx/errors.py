"""The one exception family of evonnx.

Every error a user can see is an `EvonnxError` whose message is one line that names what was wrong: the file,
the node (name and op type), the input slot, the expected and found values.
"""

from __future__ import annotations

import os


class EvonnxError(Exception):
    """Base of every error evonnx raises on purpose."""


class InvalidModelError(EvonnxError):
    """The input is not a valid model: unreadable file, failed checker, bad attribute, unsupported opset."""


class UnsupportedError(EvonnxError):
    """Valid ONNX that evonnx leaves to onnxruntime; raised only when the user asked for `--strict`."""


class InternalError(EvonnxError):
    """A broken invariant inside evonnx: a bug, never the user's fault."""


def debug_checks() -> bool:
    """Whether evonnx checks its own invariants as it goes (`EVONNX_DEBUG=1`; the test suite and the fuzzer set
    it): each pass's postconditions (passes/contracts.py), and a lowering that fails other than by Reject."""
    return os.environ.get("EVONNX_DEBUG", "0") != "0"


class UsageError(EvonnxError):
    """The request cannot be carried out as given: an output path that is a folder, lies in a missing or
    read-only folder, or would overwrite the input; an option value outside its choices."""


class BuildError(EvonnxError):
    """The kernel library could not be built (compiler missing or failing, headers unavailable)."""


class VerificationError(EvonnxError):
    """The optimized model does not reproduce onnxruntime's outputs on the original model."""


class OutputMismatch(VerificationError):
    """An output's values differ from onnxruntime's beyond what the check excuses; `output` names it, `kernel` the
    Fused node the difference starts in where the check found one (`evonnx.blame`), `nodes` that kernel's source
    nodes (`optimize` leaves them to onnxruntime and tries again)."""

    def __init__(self, message: str, output: str | None = None) -> None:
        super().__init__(message)
        self.output = output
        self.kernel = ""
        self.nodes: tuple[str, ...] = ()


class UnloadableModel(VerificationError):
    """onnxruntime cannot load the optimized model (while it loads the original). `nodes`: the source nodes of the
    kernel its message names, if it names one (`optimize` leaves them to onnxruntime)."""

    nodes: tuple[str, ...] = ()


class KernelFailure(VerificationError):
    """The optimized model failed in a fused kernel's run-time check of a node's sizes or indices (one that
    onnxruntime's kernel for that node makes too), where the original ran: onnxruntime's graph optimizations
    changed the original's behaviour there (fuzz case 10455: a Gather of an empty Range fails without them and
    returns an empty tensor with them). `kernel` names the Fused node; `nodes` the source nodes of its kernel
    (`optimize` leaves them to onnxruntime)."""

    def __init__(self, message: str, kernel: str = "") -> None:  # a default: unpickled as cls(message)
        super().__init__(message)
        self.kernel = kernel
        self.nodes: tuple[str, ...] = ()


class NodeFailure(KernelFailure):
    """The optimized model failed in a node that onnxruntime runs, where the original ran only through onnxruntime's
    graph optimizations (it fails without them too): those optimizations do something else to the node beside a
    fused kernel (fuzz case 1676: a float16 ScatterND with reduction runs once onnxruntime's float16 Casts surround
    it, and they did not reach across the Fused nodes next to it). `text` is onnxruntime's error, which names the
    node; `nodes` the source nodes of the kernels next to it (`optimize` leaves them to onnxruntime)."""

    def __init__(self, message: str, text: str = "") -> None:
        super().__init__(message)
        self.text = text


class VariantError(VerificationError):
    """Only the x86-64-v3 variant of the CPU kernels differs from onnxruntime; the baseline variant matches on every
    run. That is a compiler bug in the v3 build (gcc 12.2, as Debian 12 ships it, drops the permutation of
    SLP-vectorised masked loads, its PR 114375), and `optimize` then builds the baseline variant alone."""


def node_label(node: object) -> str:
    """`'name' (OpType)` for messages; works on graphsurgeon and onnx nodes alike."""
    name = getattr(node, "name", "") or "<unnamed>"
    op = getattr(node, "op", None) or getattr(node, "op_type", "?")
    return f"node '{name}' ({op})"
