"""Analysis products passed between passes and to code generation: plain frozen records."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

from evonnx.expr import Const, Expr, IndexVal, Load, Op, Reduce, TableLoad, walk
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
    # The shape onnxruntime gives this output where it has no element, when that one differs (its rank too): a
    # ReduceMax(axes=[-1], keepdims=0) of an empty input keeps the input's shape (lazy.Lazy.empty_shape)
    empty_shape: tuple[Poly, ...] | None = None


@dataclass(frozen=True)
class SizeCheck:
    """A fact about run-time sizes that a kernel's plan relies on; the kernel checks it before it touches memory
    and fails the Run, naming it, when it does not hold: `lhs` and `rhs` broadcast (kind "bcast": equal, or one
    of them 1) or `lhs <= rhs` (kind "le", e.g. a constant Gather index within a symbolic axis). A check
    with `unless` holds trivially when `unless` is 0 at run time (an empty index grid)."""

    kind: str
    lhs: Poly
    rhs: Poly
    why: str
    unless: Poly | None = None


@dataclass(frozen=True)
class KernelSpec:
    name: str
    inputs: tuple[KernelInput, ...]
    outputs: tuple[KernelOutput, ...]
    source_nodes: tuple[str, ...]
    source_ops: tuple[str, ...]
    exact: bool  # every operation rounds exactly as onnxruntime does: outputs must match bit for bit
    checks: tuple[SizeCheck, ...] = ()  # size facts the plan relies on, checked at run time


def kernel_fingerprint(spec: KernelSpec) -> str:
    """A digest of everything a kernel computes: its name, input and output types and shapes, every element
    expression, and the run-time checks. The rewritten node and the library's kernel both carry it, and the
    library refuses a node whose digest differs, so a model is never run with another model's kernels.

    Expressions are DAGs; each node is hashed once, named by its position in a children-first walk."""
    h = hashlib.sha256()

    def put(*parts: object) -> None:
        h.update(repr(parts).encode())
        h.update(b"\n")

    put("kernel", spec.name, spec.exact)
    for i in spec.inputs:
        put("in", i.name, i.dtype, tuple(map(str, i.shape)))
    for c in spec.checks:
        put("check", c.kind, str(c.lhs), str(c.rhs), str(c.unless))
    for o in spec.outputs:
        put("out", o.name, o.dtype, tuple(map(str, o.shape)), tuple(map(str, o.index)))
        if o.empty_shape is not None:
            put("empty", tuple(map(str, o.empty_shape)))
        ids: dict[Expr, int] = {}
        for x in walk(o.expr):
            ids[x] = len(ids)
            if isinstance(x, Const):
                put("c", type(x.value).__name__, repr(x.value), x.dtype)
            elif isinstance(x, Load):
                put("ld", x.slot, str(x.index), x.dtype)
            elif isinstance(x, TableLoad):
                put("tl", x.table.dtype, x.table.values, str(x.index), x.dtype)
            elif isinstance(x, IndexVal):
                put("iv", str(x.poly), x.dtype)
            elif isinstance(x, Op):
                put("op", x.op, x.dtype, repr(x.attr), tuple(ids[a] for a in x.args))
            elif isinstance(x, Reduce):
                put("red", x.op, str(x.var), x.dtype, x.attr, ids[x.body])
            else:
                put("?", type(x).__name__, str(x))
    return h.hexdigest()[:32]
