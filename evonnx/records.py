"""Analysis products passed between passes and to code generation: plain frozen records."""

from __future__ import annotations

from dataclasses import dataclass

from evonnx.expr import Expr
from evonnx.index import Poly


@dataclass(frozen=True)
class Rejection:
    """Why a node was left to onnxruntime."""

    node: str
    op: str
    reason: str

    def __str__(self) -> str:
        return f"{self.node} ({self.op}): {self.reason}"


@dataclass(frozen=True)
class FusionGroup:
    name: str  # the kernel name, deterministic
    nodes: tuple[str, ...]  # node names in topological order
    ops: tuple[str, ...]

    def __str__(self) -> str:
        return f"{self.name}: {' '.join(self.ops)}"


@dataclass(frozen=True)
class FusionPlan:
    groups: tuple[FusionGroup, ...]
    rejected: tuple[Rejection, ...]
    copies_removed: int = 0  # full-tensor copies of scatter writes that fused kernels no longer make


@dataclass(frozen=True)
class KernelInput:
    name: str  # the graph tensor the fused node reads
    dtype: str
    shape: tuple[Poly, ...]


@dataclass(frozen=True)
class KernelOutput:
    name: str
    dtype: str
    shape: tuple[Poly, ...]
    index: tuple[Poly, ...]  # the loop variables, one per axis (a size-1 axis has the constant 0)
    expr: Expr  # the element at `index`
    reads: tuple[str, ...]  # human-readable views it reads, for the kernel's header comment


@dataclass(frozen=True)
class KernelSpec:
    name: str
    inputs: tuple[KernelInput, ...]
    outputs: tuple[KernelOutput, ...]
    source_nodes: tuple[str, ...]
    source_ops: tuple[str, ...]
    exact: bool  # every operation rounds exactly as onnxruntime does: outputs must match bit for bit
    assumptions: tuple[tuple[Poly, Poly, str], ...] = ()  # sizes that must be equal at run time, and why
