"""What every op lowering shares: plan-time values (`Known`, `Derived`), the handler's argument types, and the
checks on axes and element types."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Any

import numpy as np

from evonnx import expr as E
from evonnx.expr import Const, Expr
from evonnx.index import Poly
from evonnx.passes import lazy as L
from evonnx.passes.lazy import Lazy, Reject

# A handler's (op, attrs, args, vals, n_out): attributes by name, the inputs as Lazy values (None for an absent
# optional input) and what is known of each at plan time (None when nothing is).
Attrs = dict[str, Any]
Args = list[Any]
Vals = list[Any]
Handler = Callable[[str, Attrs, Args, Vals, int], list[Lazy]]

BIG = 1 << 31  # Slice bounds at or above this are "to the end" for any real dimension


@dataclass(frozen=True)
class Known:
    """A small tensor whose every element is known at plan time: constants or size expressions."""

    dtype: str
    shape: tuple[int, ...]
    elems: tuple[Expr, ...]

    def array(self) -> np.ndarray | None:
        consts = [e for e in self.elems if isinstance(e, Const)]
        if len(consts) != len(self.elems):
            return None
        try:
            return np.array([e.value for e in consts], dtype=E.np_dtype(self.dtype)).reshape(self.shape)
        except OverflowError:  # a value outside its type (exact plan-time arithmetic at a position onnxruntime
            return None  # rejects, such as Range element 3 of a one-element Range): not folded, checked at run time

    def polys(self) -> list[Poly] | None:
        """The elements as integers (sizes), when every one is an integer; floats only when integer-valued."""
        out: list[Poly] = []
        for e in self.elems:
            p = E.as_integer(e)
            if p is None or (isinstance(e, Const) and self.dtype == "bool"):
                return None
            out.append(p)
        return out

    def lazy(self) -> Lazy:
        return L.known(self.elems, self.shape, self.dtype)


@dataclass(frozen=True)
class Derived:
    """A tensor computed from sizes alone (Range, Expand, Concat of shape values, ...) of any size: its element
    function reads no tensor. ScatterND indices built by exporters are such tensors."""

    lz: Lazy

    def array(self) -> None:
        return None

    def polys(self) -> None:
        return None

    def lazy(self) -> Lazy:
        return self.lz


Value = Known | Derived


def may_hold_zero(val: Value | None) -> bool:
    """Whether a tensor whose plan-time value is `val` (None: unknown) may hold a 0: an integer divisor that
    onnxruntime checks at every element (lower_math._whole_divisor, analyze.computed_whole)."""
    arr = val.array() if val is not None else None
    return arr is None or not bool(np.all(arr != 0))


def ints(val: Value | None, what: str) -> list[Poly]:
    ps = val.polys() if val is not None else None
    if ps is None:
        raise Reject(f"{what} is not known at plan time")
    return ps


def const_ints(val: Value | None, what: str) -> list[int]:
    out = []
    for p in ints(val, what):
        if p.const is None:
            raise Reject(f"{what} is not a constant")
        out.append(p.const)
    return out


def norm_axis(a: int, rank: int, what: str) -> int:
    if not -rank <= a < rank:
        raise Reject(f"{what} axis {a} is out of range for rank {rank}")
    return a + rank if a < 0 else a


def attr_tensor(v: Any) -> np.ndarray:
    return np.asarray(getattr(v, "values", v))



def check_dtype(x: Lazy, what: str) -> None:
    if x.dtype not in E.STORED:
        raise Reject(f"{what}: element type {x.dtype} is not supported")


def const_indices(ind: np.ndarray, data: Lazy, axes: Sequence[int], op: str) -> np.ndarray:
    """The plan-time index array as rows over `axes` (its last axis runs over them), normalised non-negative."""
    ind = ind.astype(np.int64).reshape(-1, len(axes)).copy()
    for j, a in enumerate(axes):
        d = data.shape[a].const
        col = ind[:, j]
        if d is None:
            if (col < 0).any():
                raise Reject(f"{op} negative index on a symbolic axis")
        else:
            if ((col < -d) | (col >= d)).any():
                raise Reject(f"{op} index out of range for axis size {d}")
            ind[:, j] = np.where(col < 0, col + d, col)
    return ind


class MapKind(Enum):
    """How an op maps input elements to output elements (after DNNFusion and the DP-fusion paper); see classify."""

    ONE_TO_ONE = "one-to-one"
    BROADCAST = "broadcast"
    REDUCTION = "reduction"
    REORGANIZE = "reorganize"
    SHUFFLE = "shuffle"
    OPAQUE = "opaque"


@dataclass(frozen=True)
class OpDef:
    """Everything evonnx knows of one ONNX op, in one place: adding an op is adding its OpDef (lower_ops.OPS).

    Which opset's definition evonnx implements is checked for every op alike: a node whose definition at the
    model's opset is newer than `evonnx.model.REVIEWED_OPSET` is left to onnxruntime (analyze)."""

    op: str
    lower: Handler  # raises Reject (left to onnxruntime, with the reason) or returns one Lazy per output
    kind: MapKind
    value_inputs: tuple[int, ...] = ()  # read only for their value at plan time, never loaded by a kernel
    dtypes: tuple[str, ...] = E.DTYPES  # element types its loaded inputs may have
    free: bool = False  # onnxruntime runs it as an alias, without touching the data
    writes: bool = False  # writes through a view of input 0 (ScatterND): the dependence analysis orders it
    shape_only: bool = False  # reads only its input's shape (no data dependence)
    needs_data: bool = True  # input 0 must be present

    @property
    def reduction(self) -> bool:
        """Each output element reads many input elements: a group that recomputes it per consumer element pays
        that many times over."""
        return self.kind is MapKind.REDUCTION
