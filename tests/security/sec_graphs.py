"""Hypothesis strategies for small ONNX graphs made of the ops evonnx fuses, with adversarial text and sizes.

`cases(canary)` draws a `Case`: a model of 2 to 8 op steps (Add/Sub/Mul/Div/Min/Max/Neg/Abs/Exp/Sigmoid/Where/
Cast/compare, Slice with negative and huge bounds and steps, Gather with constant (negative, scalar) indices,
Transpose, Reshape with 0/-1, Unsqueeze/Squeeze, Concat, Expand, ScatterND with constant indices, ReduceSum/Max,
Range, Shape) over float32/int64/int32 inputs with symbolic and static dims (0, 1, large), int64/int32 extremes in
constants, plus the sizes each symbolic dim takes at run time (0, 1, 2 and a larger one; pairs of symbols also at
unequal sizes, one of them 1). With `adversarial`, most names (tensors, nodes, initializers, dim_params, graph,
doc strings, attribute doc strings, metadata, the output file name) are payloads from `sec_payloads`.

Shapes are tracked symbolically while building (a dim is an int, a symbol, or an opaque token for a size only
known at run time) so that most graphs run; those that do not at some size are still cases: then onnxruntime's
error is the expected behaviour.
"""

from __future__ import annotations

import ast
import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper
from sec_payloads import PLAIN_ODD, TEMPLATES, Canary, file_name_templates, payload

I64_MAX, I64_MIN = 2**63 - 1, -(2**63)
I32_MAX, I32_MIN = 2**31 - 1, -(2**31)

DTYPES = {"float32": TensorProto.FLOAT, "int64": TensorProto.INT64, "int32": TensorProto.INT32,
          "bool": TensorProto.BOOL}
INT_EXTREMES = {
    "int64": (0, 1, -1, 2, -2, 7, I64_MAX, I64_MIN, I64_MAX - 1, I64_MIN + 1, 2**62, -(2**32)),
    "int32": (0, 1, -1, 2, -2, 7, I32_MAX, I32_MIN, I32_MAX - 1, I32_MIN + 1, 2**30, -(2**16)),
}
FLOAT_VALUES = (0.0, -0.0, 1.0, -1.5, 0.5, 3.0, 1e30, -1e30, float("inf"), float("-inf"), 1e-40, 65504.0)
SLICE_STARTS = (0, 1, -1, 2, -2, -3, 5, 100, I64_MAX, I64_MIN, -I64_MAX, -100)
SLICE_ENDS = (I64_MAX, -1, 1, 2, 3, 0, -100, I64_MIN, 100, -I64_MAX, -2)
SLICE_STEPS = (1, 1, 2, -1, -2, 3, I64_MIN, I64_MAX, -I64_MAX, -3)
# Exact in IEEE arithmetic as onnxruntime and evonnx compute them: results must match bit for bit.
INEXACT_OPS = {"Exp", "Sigmoid", "ReduceSum", "ReduceMean"}

Dim = int | str  # an int, a symbol (an input's dim_param) or "?k", a size known only at run time


@dataclass
class Tensor:
    name: str
    dtype: str
    shape: tuple[Dim, ...]

    @property
    def rank(self) -> int:
        return len(self.shape)


@dataclass
class Case:
    """One fuzz case: the model and how to run it."""

    model: onnx.ModelProto
    inputs: list[Tensor]  # graph inputs, shapes with symbols
    symbols: list[str]
    plans: list[dict[str, int]]  # symbol sizes of each run
    value_regime: str
    seed: int
    exact: bool  # every float output must match bit for bit
    file_name: str  # base name of the optimized model (the library is named after it)
    canaries: list[str] = field(default_factory=list)  # canary identifiers placed in the model's text
    steps: list[str] = field(default_factory=list)  # one word per op step, for summaries

    def describe(self) -> str:
        ins = ", ".join(f"{_short(i.name)}:{i.dtype}[{','.join(_short(str(d)) for d in i.shape)}]" for i in self.inputs)
        ops = " ".join(n.op_type for n in self.model.graph.node)
        return (f"inputs {ins}; nodes {ops}; sizes {[{_short(k): v for k, v in p.items()} for p in self.plans]}; "
                f"values {self.value_regime}")


def _short(text: str, limit: int = 24) -> str:
    r = repr(text)[1:-1]
    return r if len(r) <= limit else r[: limit - 3] + "..."


# -- names ------------------------------------------------------------------------------------------------------
class Names:
    """Unique names: plain (`t3`) or, for adversarial cases, a payload with a unique suffix."""

    def __init__(self, draw: Callable, canary: Canary, adversarial: bool):
        self.draw, self.canary, self.adversarial = draw, canary, adversarial
        self.count = 0
        self.canaries: list[str] = []

    def __call__(self, kind: str, *, allow_nul: bool = False) -> str:
        self.count += 1
        k = self.count
        plain = f"{kind}{k}"
        if not self.adversarial or not self.draw(st.booleans()):
            return plain
        choice = self.draw(st.integers(0, len(TEMPLATES) + len(PLAIN_ODD) - 1 + int(allow_nul)))
        if choice < len(TEMPLATES):
            self.canaries.append(self.canary.identifier(k))
            return payload(self.canary, TEMPLATES[choice][1], k) + f"#{kind}{k}"
        if choice < len(TEMPLATES) + len(PLAIN_ODD):
            return PLAIN_ODD[choice - len(TEMPLATES)] + f"#{kind}{k}"
        self.canaries.append(self.canary.identifier(k))
        return f"a\0{payload(self.canary, TEMPLATES[0][1], k)}#{kind}{k}"


# -- shape helpers ----------------------------------------------------------------------------------------------
def _bcast_dim(a: Dim, b: Dim, allow_symbols: bool) -> Dim | None:
    if a == b:
        return a
    if a == 1:
        return b
    if b == 1:
        return a
    # Two input symbols may broadcast (onnxruntime accepts either being 1); sizes known only at run time ("?k",
    # from a Slice or a Concat) would almost never agree with anything, so they do not.
    if isinstance(a, str) and isinstance(b, str) and allow_symbols and not (a + b).startswith("?") and "?" != b[:1]:
        return f"?bcast({a},{b})"
    return None


def broadcast(a: Sequence[Dim], b: Sequence[Dim], allow_symbols: bool = False) -> tuple[Dim, ...] | None:
    n = max(len(a), len(b))
    pa, pb = [1] * (n - len(a)) + list(a), [1] * (n - len(b)) + list(b)
    out = []
    for x, y in zip(pa, pb):
        d = _bcast_dim(x, y, allow_symbols)
        if d is None:
            return None
        out.append(d)
    return tuple(out)


def _static(shape: Sequence[Dim]) -> bool:
    return all(isinstance(d, int) for d in shape)


def _numel(shape: Sequence[Dim]) -> int | None:
    return math.prod(shape) if _static(shape) else None  # type: ignore[arg-type]


# -- the builder --------------------------------------------------------------------------------------------------
class Builder:
    def __init__(self, draw: Callable, names: Names, opset: int):
        self.draw, self.names, self.opset = draw, names, opset
        self.nodes: list[onnx.NodeProto] = []
        self.initializers: list[onnx.TensorProto] = []
        self.inputs: list[Tensor] = []
        self.pool: list[Tensor] = []
        self.unknown = 0
        self.ops_used: set[str] = set()

    # basic pieces
    def fresh_dim(self) -> str:
        self.unknown += 1
        return f"?{self.unknown}"

    def node(self, op: str, inputs: Sequence[str], n_out: int = 1, **attrs: object) -> list[str]:
        outs = [self.names("t") for _ in range(n_out)]
        node = helper.make_node(op, list(inputs), outs, name=self.names("n", allow_nul=True), **attrs)
        if self.names.adversarial and self.draw(st.booleans()):
            node.doc_string = self.names("doc", allow_nul=True)
            for a in node.attribute:
                a.doc_string = self.names("attrdoc", allow_nul=True)
        self.nodes.append(node)
        self.ops_used.add(op)
        return outs

    def add(self, name: str, dtype: str, shape: Sequence[Dim]) -> Tensor:
        t = Tensor(name, dtype, tuple(shape))
        self.pool.append(t)
        return t

    def const(self, array: np.ndarray) -> str:
        """A constant: an initializer or a Constant node (drawn)."""
        name = self.names("c")
        tensor = numpy_helper.from_array(array, name)
        if self.names.adversarial and self.draw(st.booleans()):
            tensor.doc_string = self.names("cdoc", allow_nul=True)
        if self.draw(st.booleans()):
            self.nodes.append(helper.make_node("Constant", [], [name], name=self.names("n", allow_nul=True),
                                               value=tensor))
        else:
            self.initializers.append(tensor)
        return name

    def i64(self, values: Sequence[int]) -> str:
        return self.const(np.array(values, dtype=np.int64))

    def values(self, dtype: str, shape: Sequence[int]) -> np.ndarray:
        """Constant values with extremes (int) or special floats."""
        n = math.prod(shape)
        if dtype == "float32":
            vals = self.draw(st.lists(st.one_of(st.sampled_from(FLOAT_VALUES),
                                                st.floats(-8, 8, width=32, allow_nan=False)), min_size=n, max_size=n))
            return np.array(vals, dtype=np.float32).reshape(shape)
        if dtype == "bool":
            return np.array(self.draw(st.lists(st.booleans(), min_size=n, max_size=n)), dtype=bool).reshape(shape)
        vals = self.draw(st.lists(st.one_of(st.sampled_from(INT_EXTREMES[dtype]), st.integers(-9, 9)),
                                  min_size=n, max_size=n))
        return np.array(vals, dtype=dtype).reshape(shape)

    def pick(self, pred: Callable[[Tensor], bool], what: str) -> Tensor | None:
        """A pool tensor satisfying `pred` (`what` names the operand, for a reader): often the latest one, so that
        chains form and fuse."""
        cands = [t for t in reversed(self.pool) if pred(t)]
        if not cands:
            return None
        if self.draw(st.booleans()):  # chains fuse
            return cands[0]
        return self.draw(st.sampled_from(cands))

    def numeric(self, t: Tensor) -> bool:
        return t.dtype != "bool"

    def small(self, t: Tensor) -> bool:
        return t.rank <= 4

    # op steps: each returns False when the pool has nothing it applies to
    def step_unary(self) -> bool:
        x = self.pick(lambda t: True, "unary x")
        assert x is not None
        if x.dtype == "bool":
            op = self.draw(st.sampled_from(["Not", "Cast"]))
        elif x.dtype == "float32":
            op = self.draw(st.sampled_from(["Neg", "Abs", "Exp", "Sigmoid", "Cast"]
                                           + (["HardSwish"] if self.opset >= 14 else [])))
        else:
            op = self.draw(st.sampled_from(["Neg", "Abs", "Cast"]))
        if op == "Cast":
            to = self.draw(st.sampled_from(["float32", "int64", "int32"]))
            (y,) = self.node("Cast", [x.name], to=DTYPES[to])
            self.add(y, to, x.shape)
            return True
        (y,) = self.node(op, [x.name])
        self.add(y, x.dtype, x.shape)
        return True

    def partner(self, x: Tensor, *, nonzero: bool = False) -> tuple[str, tuple[Dim, ...]]:
        """A second operand broadcasting with `x`: a pool tensor or a constant."""
        allow_sym = self.draw(st.integers(0, 3)) == 0
        if not nonzero and self.draw(st.booleans()):
            y = self.pick(lambda t: t.dtype == x.dtype and broadcast(x.shape, t.shape, allow_sym) is not None
                          and t.rank <= 4, "partner")
            if y is not None:
                out = broadcast(x.shape, y.shape, allow_sym)
                assert out is not None
                return y.name, out
        form = self.draw(st.sampled_from(["scalar", "suffix", "lead"]))
        if form == "scalar" or x.rank == 0:
            shape: list[int] = []
        else:
            k = self.draw(st.integers(1, x.rank))
            shape = [d if isinstance(d, int) and d <= 8 else 1 for d in x.shape[x.rank - k:]]
            if form == "lead" and k == x.rank and len(shape) < 4:
                shape = [self.draw(st.sampled_from([1, 2]))] + shape
        if nonzero:
            n = math.prod(shape)
            choices = [1, 2, 3, 7, -2, -3, I32_MAX] + ([I64_MAX, I64_MIN] if x.dtype == "int64" else [I32_MIN])
            vals = self.draw(st.lists(st.sampled_from(choices), min_size=n, max_size=n))
            arr = np.array(vals, dtype=x.dtype).reshape(shape)
        else:
            arr = self.values(x.dtype, shape)
        out = broadcast(x.shape, shape)
        assert out is not None
        return self.const(arr), out

    def step_binary(self) -> bool:
        x = self.pick(lambda t: self.numeric(t) and self.small(t), "binary x")
        if x is None:
            return False
        op = self.draw(st.sampled_from(["Add", "Sub", "Mul", "Div", "Min", "Max", "Mod"]))
        attrs = {"fmod": 1} if op == "Mod" and x.dtype == "float32" else {}  # fmod=0 is for integers only
        divides = op in ("Div", "Mod") and x.dtype != "float32"
        # an integer divisor that is a run-time tensor may hold 0 (onnxruntime fails the Run: issue 16)
        runtime_divisor = divides and self.draw(st.booleans())
        other, shape = self.partner(x, nonzero=divides and not runtime_divisor)
        if runtime_divisor:
            ins = [other, x.name]
        else:
            ins = [x.name, other] if divides or self.draw(st.booleans()) else [other, x.name]
        (y,) = self.node(op, ins, **attrs)
        self.add(y, x.dtype, shape)
        return True

    def step_symbol_broadcast(self) -> bool:
        """A binary op between two tensors whose dims are different symbols on some axis (onnxruntime accepts
        either being 1, or both equal)."""
        pairs = [(x, y) for x in reversed(self.pool) for y in reversed(self.pool)
                 if x.dtype == y.dtype and x.dtype != "bool" and broadcast(x.shape, y.shape) is None
                 and broadcast(x.shape, y.shape, True) is not None]
        if not pairs:
            return False
        x, y = self.draw(st.sampled_from(pairs[:8]))
        op = self.draw(st.sampled_from(["Add", "Mul", "Max", "Sub"]))
        (out,) = self.node(op, [x.name, y.name])
        shape = broadcast(x.shape, y.shape, True)
        assert shape is not None
        self.add(out, x.dtype, shape)
        return True

    def step_compare_where(self) -> bool:
        x = self.pick(lambda t: self.numeric(t) and self.small(t), "where x")
        if x is None:
            return False
        op = self.draw(st.sampled_from(["Greater", "Less", "Equal", "GreaterOrEqual"]))
        other, cshape = self.partner(x)
        (c,) = self.node(op, [x.name, other])
        cond = self.add(c, "bool", cshape)
        if not self.draw(st.booleans()):
            return True
        other2, shape2 = self.partner(x)
        shape = broadcast(cond.shape, shape2, True)
        if shape is None:
            return True
        ins = [c, x.name, other2] if self.draw(st.booleans()) else [c, other2, x.name]
        (y,) = self.node("Where", ins)
        self.add(y, x.dtype, shape)
        return True

    def step_slice(self) -> bool:
        x = self.pick(lambda t: t.rank >= 1, "slice x")
        if x is None:
            return False
        axes = self.draw(st.lists(st.integers(0, x.rank - 1), min_size=1, max_size=x.rank, unique=True))
        starts, ends, steps = [], [], []
        shape = list(x.shape)
        for a in axes:
            s = self.draw(st.sampled_from(SLICE_STARTS))
            e = self.draw(st.sampled_from(SLICE_ENDS))
            k = self.draw(st.sampled_from(SLICE_STEPS))
            starts.append(s)
            ends.append(e)
            steps.append(k)
            d = x.shape[a]
            if isinstance(d, int):
                shape[a] = len(range(d)[slice(s, e, k)])
            elif (k == 1 and s in (0, I64_MIN, -I64_MAX) and e == I64_MAX) or (
                    k == -1 and s in (-1, I64_MAX) and e in (I64_MIN, -I64_MAX)):
                shape[a] = d
            else:
                shape[a] = self.fresh_dim()
        neg = self.draw(st.booleans())
        axes_v = [a - x.rank if neg else a for a in axes]
        ins = [x.name, self.i64(starts), self.i64(ends)]
        if axes != list(range(len(axes))) or any(k != 1 for k in steps) or self.draw(st.booleans()):
            ins.append(self.i64(axes_v))
            if any(k != 1 for k in steps) or self.draw(st.booleans()):
                ins.append(self.i64(steps))
        (y,) = self.node("Slice", ins)
        self.add(y, x.dtype, shape)
        return True

    def step_gather(self) -> bool:
        x = self.pick(lambda t: t.rank >= 1, "gather x")
        if x is None:
            return False
        axis = self.draw(st.integers(0, x.rank - 1))
        d = x.shape[axis]
        if isinstance(d, int) and d > 0 and self.draw(st.integers(0, 5)) > 0:
            idx_values = st.integers(-d, d - 1)
        else:
            idx_values = st.one_of(st.sampled_from([0, 1, -1, 2, -2, 3, 7, 0, 1, -1]),
                                   st.sampled_from([I64_MAX, I64_MIN]))
            if self.draw(st.integers(0, 7)):
                idx_values = st.sampled_from([0, 1, -1, 2, -2, 3, 7])
        form = self.draw(st.sampled_from(["scalar", "1d", "2d"]))
        ishape: tuple[int, ...] = {"scalar": (), "1d": (self.draw(st.integers(1, 4)),),
                                   "2d": (2, 2)}[form]
        vals = self.draw(st.lists(idx_values, min_size=math.prod(ishape), max_size=math.prod(ishape)))
        dtype = self.draw(st.sampled_from(["int64", "int32"]))
        if dtype == "int32":
            vals = [min(max(v, I32_MIN), I32_MAX) for v in vals]
        idx = self.const(np.array(vals, dtype=dtype).reshape(ishape))
        neg = self.draw(st.booleans())
        (y,) = self.node("Gather", [x.name, idx], axis=axis - x.rank if neg else axis)
        self.add(y, x.dtype, x.shape[:axis] + ishape + x.shape[axis + 1:])
        return True

    def step_transpose(self) -> bool:
        x = self.pick(lambda t: t.rank >= 2, "transpose x")
        if x is None:
            return False
        perm = self.draw(st.permutations(list(range(x.rank))))
        if self.draw(st.booleans()):
            (y,) = self.node("Transpose", [x.name], perm=perm)
        else:
            perm = list(reversed(range(x.rank)))
            (y,) = self.node("Transpose", [x.name])
        self.add(y, x.dtype, tuple(x.shape[p] for p in perm))
        return True

    def step_reshape(self) -> bool:
        x = self.pick(lambda t: True, "reshape x")
        assert x is not None
        forms = ["flatten", "keep0", "unit"]
        if x.rank >= 2:
            forms.append("merge")
        if x.rank >= 1 and isinstance(x.shape[-1], int) and x.shape[-1] % 2 == 0 and x.shape[-1] > 0:
            forms.append("split")
        if _static(x.shape):
            forms.append("static")
        form = self.draw(st.sampled_from(forms))
        allowzero = 0
        n = _numel(x.shape)
        if n == 0 or 0 in x.shape:  # -1 next to a product of 0 is invalid at session creation: copy dims
            (y0,) = self.node("Reshape", [x.name, self.i64([0] * x.rank)])
            self.add(y0, x.dtype, x.shape)
            return True
        if form == "flatten":
            target, shape = [-1], [n if n is not None else self.fresh_dim()]
        elif form == "keep0":
            target = [0] * x.rank + [-1]
            shape = list(x.shape) + [1 if n is None or n else self.fresh_dim()]
            if n == 0:  # -1 next to a 0 copied from an empty dim: onnxruntime decides
                shape = list(x.shape) + [self.fresh_dim()]
        elif form == "unit":
            target = [1, -1] if self.draw(st.booleans()) else [-1, 1]
            shape = [1, n if n is not None else self.fresh_dim()] if target[0] == 1 else [
                n if n is not None else self.fresh_dim(), 1]
        elif form == "merge":
            target = [0] * (x.rank - 2) + [-1]
            last = x.shape[-2:]
            shape = list(x.shape[:-2]) + [_numel(last) if _static(last) else self.fresh_dim()]
        elif form == "split":
            d = x.shape[-1]
            assert isinstance(d, int)
            target = [0] * (x.rank - 1) + [2, -1]
            shape = list(x.shape[:-1]) + [2, d // 2]
        else:
            assert n is not None
            k = self.draw(st.sampled_from([f for f in range(1, max(n, 1) + 1) if n % f == 0] or [1]))
            target = [k, -1] if n else [k, 0]
            if n == 0 and self.draw(st.booleans()):
                allowzero = 1
            shape = [k, n // k] if n else [k, 0 if allowzero else self.fresh_dim()]
        if self.opset < 14:
            allowzero = 0
            if form == "static" and n == 0:
                shape = [k, self.fresh_dim()]
        attrs = {"allowzero": allowzero} if self.opset >= 14 and (
            allowzero or self.draw(st.booleans())) else {}
        if not allowzero and attrs and 0 in target and self.draw(st.booleans()):
            attrs = {"allowzero": 1}
            shape = [0 if t == 0 else self.fresh_dim() for t in target]
        (y,) = self.node("Reshape", [x.name, self.i64(target)], **attrs)
        self.add(y, x.dtype, shape)
        return True

    def step_unsqueeze_squeeze(self) -> bool:
        x = self.pick(self.small, "squeeze x")
        assert x is not None
        ones = [i for i, d in enumerate(x.shape) if d == 1]
        symbolic = [i for i, d in enumerate(x.shape) if isinstance(d, str)]
        if (ones or symbolic) and self.draw(st.booleans()):
            pool = ones if ones and self.draw(st.integers(0, 4)) else ones + symbolic
            axes = self.draw(st.lists(st.sampled_from(pool), min_size=1, max_size=len(pool), unique=True))
            shape = tuple(d for i, d in enumerate(x.shape) if i not in axes)
            neg = self.draw(st.booleans())
            (y,) = self.node("Squeeze", [x.name, self.i64([a - x.rank if neg else a for a in axes])])
            self.add(y, x.dtype, shape)
            return True
        k = self.draw(st.integers(1, 2))
        r = x.rank + k
        axes = self.draw(st.lists(st.integers(0, r - 1), min_size=k, max_size=k, unique=True))
        shape_l: list[Dim] = list(x.shape)
        for a in sorted(axes):
            shape_l.insert(a, 1)
        neg = self.draw(st.booleans())
        (y,) = self.node("Unsqueeze", [x.name, self.i64([a - r if neg else a for a in axes])])
        self.add(y, x.dtype, shape_l)
        return True

    def step_concat(self) -> bool:
        x = self.pick(lambda t: t.rank >= 1 and self.small(t), "concat x")
        if x is None:
            return False
        axis = self.draw(st.integers(0, x.rank - 1))

        def fits(t: Tensor) -> bool:
            return t.dtype == x.dtype and t.rank == x.rank and all(
                a == b for i, (a, b) in enumerate(zip(t.shape, x.shape)) if i != axis)

        parts = [x]
        for _ in range(self.draw(st.integers(1, 2))):
            other = self.pick(fits, "concat other")
            rest_static = all(isinstance(d, int) for i, d in enumerate(x.shape) if i != axis)
            if rest_static and self.draw(st.booleans()):
                k = self.draw(st.sampled_from([0, 1, 2]))
                cshape = [k if i == axis else d for i, d in enumerate(x.shape)]
                if math.prod(cshape) <= 64:
                    name = self.const(self.values(x.dtype, cshape))
                    parts.append(Tensor(name, x.dtype, tuple(cshape)))
                    continue
            if other is not None:
                parts.append(other)
        if len(parts) == 1:
            parts.append(x)
        dims = [p.shape[axis] for p in parts]
        out_d: Dim = sum(dims) if all(isinstance(d, int) for d in dims) else self.fresh_dim()  # type: ignore[misc]
        order = self.draw(st.permutations(parts))
        neg = self.draw(st.booleans())
        (y,) = self.node("Concat", [p.name for p in order], axis=axis - x.rank if neg else axis)
        self.add(y, x.dtype, x.shape[:axis] + (out_d,) + x.shape[axis + 1:])
        return True

    def step_expand(self) -> bool:
        x = self.pick(self.small, "expand x")
        assert x is not None
        if self.draw(st.booleans()):
            y = self.pick(lambda t: broadcast(x.shape, t.shape) == t.shape and t.rank >= 1, "expand like")
            if y is not None:
                (s,) = self.node("Shape", [y.name])
                (out,) = self.node("Expand", [x.name, s])
                self.add(out, x.dtype, y.shape)
                return True
        target, shape = [], []
        for d in x.shape:
            if d == 1:
                k = self.draw(st.sampled_from([1, 2, 3, 0]))
                target.append(k)
                shape.append(k)
            else:
                target.append(1)
                shape.append(d)
        lead = self.draw(st.lists(st.sampled_from([1, 2]), max_size=1 if x.rank < 4 else 0))
        (y2,) = self.node("Expand", [x.name, self.i64(lead + target)])
        self.add(y2, x.dtype, lead + shape)
        return True

    def step_scatternd(self) -> bool:
        x = self.pick(lambda t: t.rank >= 1 and self.numeric(t) and self.small(t), "scatter x")
        if x is None:
            return False
        depth = 2 if x.rank >= 2 and self.draw(st.integers(0, 3)) == 0 else 1
        rows = self.draw(st.sampled_from([[1, 2, 3], [0], [0, 1], [-1], [2, 0, 1], [0, 2, 4], [3, 2, 1], [5], [1, 2],
                                          [-2, -1], [1, 2, 3], [0, 1], [I64_MAX], [I64_MIN]]))
        d0 = x.shape[0]
        if isinstance(d0, int) and self.draw(st.integers(0, 4)):
            rows = [r for r in rows if -d0 <= r < d0] or ([0] if d0 else [])
            if not rows:
                return False
        if depth == 2:
            cols = self.draw(st.sampled_from([[0] * len(rows), list(range(len(rows))), [1] * len(rows)]))
            indices = [[r, c] for r, c in zip(rows, cols)]
        else:
            indices = [[r] for r in rows]
        k = len(rows)
        tail = x.shape[depth:]
        if _static(tail) and math.prod(tail) * k <= 256 and self.draw(st.booleans()):
            updates = self.const(self.values(x.dtype, [k, *tail]))  # type: ignore[list-item]
        else:
            # rows 0..k of x (depth 1) or of x[:, 0] (depth 2), negated: the updates depend on the data
            src = x.name
            if depth == 2:
                (src,) = self.node("Gather", [x.name, self.i64([0])], axis=1)
                (src,) = self.node("Squeeze", [src, self.i64([1])])
            (sl,) = self.node("Slice", [src, self.i64([0]), self.i64([k]), self.i64([0])])
            (updates,) = self.node("Neg", [sl])
        reductions = ["none", "none", "none"] + (["add", "mul"] if self.opset >= 16 else []) + (
            ["max", "min"] if self.opset >= 18 else [])
        reduction = self.draw(st.sampled_from(reductions))
        attrs = {"reduction": reduction} if self.opset >= 16 and (
            reduction != "none" or self.draw(st.booleans())) else {}
        (y,) = self.node("ScatterND", [x.name, self.const(np.array(indices, dtype=np.int64)), updates], **attrs)
        self.add(y, x.dtype, x.shape)
        return True

    def step_reduce(self) -> bool:
        x = self.pick(lambda t: t.rank >= 1 and self.numeric(t) and self.small(t), "reduce x")
        if x is None:
            return False
        op = self.draw(st.sampled_from(["ReduceSum", "ReduceMax", "ReduceMin", "ReduceMean"]))
        axes = self.draw(st.lists(st.integers(0, x.rank - 1), min_size=0, max_size=x.rank, unique=True))
        keep = self.draw(st.sampled_from([0, 1]))
        red = set(axes) if axes else set(range(x.rank))
        shape = [1 if i in red else d for i, d in enumerate(x.shape)] if keep else [
            d for i, d in enumerate(x.shape) if i not in red]
        neg = self.draw(st.booleans())
        axes_v = [a - x.rank if neg else a for a in axes]
        if op == "ReduceSum" or self.opset >= 18:
            ins = [x.name] + ([self.i64(axes_v)] if axes else [])
            (y,) = self.node(op, ins, keepdims=keep)
        elif axes:
            (y,) = self.node(op, [x.name], axes=axes_v, keepdims=keep)
        else:
            (y,) = self.node(op, [x.name], keepdims=keep)
        self.add(y, x.dtype, shape)
        return True

    def step_range(self) -> bool:
        x = self.pick(lambda t: t.rank >= 1, "range like")
        if x is not None and self.draw(st.booleans()):
            axis = self.draw(st.integers(0, x.rank - 1))
            (s,) = self.node("Shape", [x.name])
            (n,) = self.node("Gather", [s, self.const(np.array(axis, dtype=np.int64))], axis=0)
            start, delta = self.draw(st.sampled_from([(0, 1), (0, 2), (1, 1), (-3, 1), (0, I64_MAX)]))
            (r,) = self.node("Range", [self.const(np.array(start, np.int64)), n, self.const(np.array(delta, np.int64))])
            self.add(r, "int64", (x.shape[axis] if (start, delta) == (0, 1) else self.fresh_dim(),))
            return True
        dtype = self.draw(st.sampled_from(["int64", "int32", "float32"]))
        length = self.draw(st.integers(0, 6))
        if dtype == "float32":
            start = self.draw(st.sampled_from([0.0, -2.5, 1e7, 0.1]))
            delta = self.draw(st.sampled_from([1.0, 0.5, -1.0, 3.0]))
            limit = start + delta * length
        else:
            hi, lo = (I64_MAX, I64_MIN) if dtype == "int64" else (I32_MAX, I32_MIN)
            start = self.draw(st.sampled_from([0, 1, -5, hi - 6, lo, lo + 3, hi - 1]))
            delta = self.draw(st.sampled_from([1, 2, -1, -3, 7]))
            limit = start + delta * length
            if not lo <= limit <= hi:
                limit = hi if delta > 0 else lo
            length = max(0, -(-(limit - start) // delta))
        npt = np.dtype(dtype)
        (r,) = self.node("Range", [self.const(np.array(start, npt)), self.const(np.array(limit, npt)),
                                   self.const(np.array(delta, npt))])
        self.add(r, dtype, (length,))
        return True

    def step_shape(self) -> bool:
        x = self.pick(lambda t: t.rank >= 1, "shape x")
        if x is None:
            return False
        if self.opset >= 15 and self.draw(st.booleans()):
            start = self.draw(st.integers(-x.rank, x.rank))
            (s,) = self.node("Shape", [x.name], start=start)
            lo = start + x.rank if start < 0 else start
            n = max(0, x.rank - min(max(lo, 0), x.rank))
        else:
            (s,) = self.node("Shape", [x.name])
            n = x.rank
        self.add(s, "int64", (n,))
        return True


STEPS = ("unary", "binary", "binary", "compare_where", "symbol_broadcast", "slice", "slice", "gather", "gather",
         "transpose", "reshape", "unsqueeze_squeeze", "concat", "expand", "scatternd", "scatternd", "reduce", "range",
         "shape")


@st.composite
def cases(draw: Callable, canary: Canary, adversarial: bool | None = None, max_steps: int = 8) -> Case:
    adv = draw(st.integers(0, 3)) > 0 if adversarial is None else adversarial
    names = Names(draw, canary, adv)
    opset = draw(st.sampled_from([18, 18, 13, 17]))
    b = Builder(draw, names, opset)
    symbols = [names("N"), names("M")][: draw(st.integers(1, 2))]
    dim_st = st.one_of(st.sampled_from(symbols), st.sampled_from([4, 1, 2, 3, 8, 1000, 0]))
    n_inputs = draw(st.integers(1, 3))
    for _ in range(n_inputs):
        rank = draw(st.sampled_from([2, 1, 3, 2, 1, 2, 1, 3, 2, 0]))
        shape = draw(st.lists(dim_st, min_size=rank, max_size=rank))
        if rank and not any(isinstance(d, str) for d in shape) and draw(st.booleans()):
            shape[0] = symbols[0]
        # evonnx's own check tries symbolic sizes up to 1024: keep every input below about 2**23 elements there
        if sum(isinstance(d, str) for d in shape) > 2:
            shape[-1] = 4
        if sum(isinstance(d, str) for d in shape) == 2 or _static(shape):
            shape = [d if d != 1000 else 8 for d in shape]
        dtype = draw(st.sampled_from(["float32", "float32", "int64", "int32"]))
        t = Tensor(names("x"), dtype, tuple(shape))
        b.inputs.append(t)
        b.pool.append(t)
        if len(symbols) == 2 and symbols[0] in shape and draw(st.integers(0, 3)) == 0:
            # the same shape over the other symbol: broadcasting two symbolic dims against each other
            twin = Tensor(names("x"), dtype, tuple(symbols[1] if d == symbols[0] else d for d in shape))
            b.inputs.append(twin)
            b.pool.append(twin)
            op = draw(st.sampled_from(["Add", "Mul", "Max", "Sub"]))
            (out,) = b.node(op, [t.name, twin.name])
            # (built here, not by broadcast(): an adversarial symbol name may start with "?", the builder's mark
            # for sizes known only at run time)
            joint = tuple(d if d == e else f"?bcast({d},{e})" for d, e in zip(t.shape, twin.shape))
            b.add(out, dtype, joint)
    steps = []
    for _ in range(draw(st.integers(2, max_steps))):
        step = draw(st.sampled_from(STEPS))
        if not getattr(b, f"step_{step}")():
            step = "unary"
            b.step_unary()
        steps.append(step)
    # Outputs: the last tensor and up to two other unconsumed ones, so that (nearly) every node is live.
    consumed = {i for n in b.nodes for i in n.input}
    produced = [t for t in b.pool if t not in b.inputs and all(t.name != i.name for i in b.initializers)]
    outputs = [produced[-1]] + [t for t in produced[:-1] if t.name not in consumed][-2:]
    used = {i for n in b.nodes for i in n.input} | {o.name for o in outputs}
    inputs = [t for t in b.inputs if t.name in used] or b.inputs[:1]
    symbols_used = [s for s in symbols if any(s in t.shape for t in inputs)]
    graph = helper.make_graph(
        b.nodes, names("graph"),
        [helper.make_tensor_value_info(t.name, DTYPES[t.dtype], list(t.shape)) for t in inputs],
        [helper.make_tensor_value_info(t.name, DTYPES[t.dtype], [None] * t.rank) for t in outputs],
        b.initializers)
    if adv:
        graph.doc_string = names("gdoc", allow_nul=True)
        for vi in list(graph.input) + list(graph.output):
            if draw(st.booleans()):
                vi.doc_string = names("vdoc", allow_nul=True)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=8)
    if adv:
        model.doc_string = names("mdoc", allow_nul=True)
        model.producer_name = names("producer")
        helper.set_model_props(model, {names("key"): names("value", allow_nul=True)})
    large = draw(st.sampled_from([7, 37, 300, 4099]))
    plans = [{s: 0 for s in symbols_used}, {s: 1 for s in symbols_used}, {s: 2 for s in symbols_used},
             {s: large for s in symbols_used}]
    if len(symbols_used) == 2:
        a, c = symbols_used
        plans += [{a: 1, c: 3}, {a: 3, c: 1}, {a: 0, c: 3}, {a: 3, c: 0}]
    if not symbols_used:
        plans = [{}]
    else:  # a plan whose sizes make more than 2**16 elements is cut to keep a run short
        plans = [p for p in plans if _plan_elements(inputs, p) <= 2**21] or plans[:3]
    file_name = "model.opt.onnx"
    if adv and draw(st.integers(0, 3)) == 0:
        k = names.count = names.count + 1
        template = draw(st.sampled_from(file_name_templates()))
        names.canaries.append(canary.identifier(k))
        file_name = payload(canary, template, k).replace("/", "_").replace("\0", "_")[:150] + ".onnx"
    return Case(model=model, inputs=inputs, symbols=symbols_used, plans=plans,
                value_regime=draw(st.sampled_from(["small", "small", "wide", "extreme", "special"])),
                seed=draw(st.integers(0, 2**16)), exact=not (b.ops_used & INEXACT_OPS),
                file_name=file_name, canaries=list(names.canaries), steps=steps)


def _plan_elements(inputs: Sequence[Tensor], plan: dict[str, int]) -> int:
    return sum(math.prod(plan.get(d, 1) if isinstance(d, str) else d for d in t.shape) for t in inputs)


# -- inputs -------------------------------------------------------------------------------------------------------
def concrete_shape(t: Tensor, plan: dict[str, int]) -> list[int]:
    return [plan[d] if isinstance(d, str) else d for d in t.shape]


# The "grid" regime: input k of n elements holds GRID[(i // len**k) % len] at flat position i, so that inputs of
# len**count elements meet every combination of these values.
_F32 = np.finfo(np.float32)
_F64 = np.finfo(np.float64)
GRID = {"float32": [np.nan, np.inf, -np.inf, -0.0, 0.0, 1.0, -1.0, 2.5, -3.5, 1e-40, _F32.max, _F32.min],
        "float64": [np.nan, np.inf, -np.inf, -0.0, 0.0, 1.0, -1.0, 2.5, -3.5, 5e-324, _F64.max, _F64.min],
        **{t: [np.iinfo(t).min, np.iinfo(t).max, 0, 1, -1, 2, -2, 7, np.iinfo(t).min + 1, np.iinfo(t).max - 1]
           for t in ("int64", "int32", "int16", "int8")},
        **{t: [0, 1, 2, 7, np.iinfo(t).max, np.iinfo(t).max - 1] for t in ("uint8", "uint16", "uint32", "uint64")},
        "bool": [False, True]}


def make_feeds(inputs: Sequence[Tensor], plan: dict[str, int], regime: str, seed: int) -> dict[str, np.ndarray]:
    """Seeded inputs: small values, wide ones, integer extremes, or floats with inf/nan/-0/denormals mixed in."""
    rng = np.random.default_rng(seed)
    feeds = {}
    for k, t in enumerate(inputs):
        shape = concrete_shape(t, plan)
        if regime == "grid":  # every combination of special values over the inputs (see GRID)
            g = np.asarray(GRID[t.dtype], dtype=t.dtype)
            n = int(np.prod(shape))
            feeds[t.name] = g[(np.arange(n) // len(g) ** k) % len(g)].reshape(shape)
            continue
        if t.dtype in ("float32", "float64"):
            scale = {"small": 2.0, "wide": 400.0, "extreme": 1e30, "special": 3.0}[regime]
            arr = np.asarray(rng.standard_normal(shape) * scale, dtype=t.dtype)
            if regime == "special" and arr.size:
                specials = np.array([np.inf, -np.inf, np.nan, -0.0, 1e-40, 0.0], t.dtype)
                mask = rng.random(shape) < 0.3
                arr[mask] = rng.choice(specials, size=int(mask.sum()))
        elif t.dtype == "bool":
            arr = np.asarray(rng.random(shape) < 0.5)
        else:
            info = np.iinfo(t.dtype)
            if regime in ("small", "special"):
                arr = np.asarray(rng.integers(-8, 8, size=shape), dtype=t.dtype)
            elif regime == "wide":
                arr = np.asarray(rng.integers(-2000, 2000, size=shape), dtype=t.dtype)
            else:
                arr = np.asarray(rng.integers(info.min, info.max, size=shape, dtype=t.dtype, endpoint=True))
                ext = np.array([info.min, info.max, 0, -1, 1], dtype=t.dtype)
                mask = rng.random(shape) < 0.3
                arr[mask] = rng.choice(ext, size=int(mask.sum()))
        feeds[t.name] = np.array(arr, dtype=t.dtype, copy=True)
    return feeds


def case_from_model(model: onnx.ModelProto, plans: Sequence[dict[str, int]], *, exact: bool = True,
                    value_regime: str = "small", seed: int = 0, file_name: str = "model.opt.onnx") -> Case:
    """A `Case` for a hand-built model (the regression tests): its inputs read from the graph."""
    init = {t.name for t in model.graph.initializer}
    inputs = []
    for vi in model.graph.input:
        if vi.name in init:
            continue
        tt = vi.type.tensor_type
        dtype = np.dtype(helper.tensor_dtype_to_np_dtype(tt.elem_type)).name
        shape = tuple(d.dim_param if d.HasField("dim_param") else d.dim_value for d in tt.shape.dim)
        inputs.append(Tensor(vi.name, dtype, shape))
    symbols = list(dict.fromkeys(d for t in inputs for d in t.shape if isinstance(d, str)))
    return Case(model=model, inputs=inputs, symbols=symbols, plans=[dict(p) for p in plans],
                value_regime=value_regime, seed=seed, exact=exact, file_name=file_name)


def case_from_finding(path: Path) -> Case:
    """The `Case` of a finding kept by the fuzzer (`sec_oracle.save_finding`): `<key>.onnx` and the first two lines
    of `<key>.txt` (sizes, value regime, exactness, file name and seed), as it was drawn."""
    text = path.with_suffix(".txt").read_text()
    plans = ast.literal_eval(re.search(r"; sizes (\[.*?\]); values ", text).group(1))  # type: ignore[union-attr]
    regime = re.search(r"; values (\w+)\n", text).group(1)  # type: ignore[union-attr]
    match = re.search(r"\nexact: (True|False); file name (.*); seed (\d+)\n", text)
    assert match is not None, f"{path}: not a finding's summary"
    model = onnx.load(str(path))
    symbols = case_from_model(model, []).symbols  # in the order the summary printed them (shortened there)
    return case_from_model(model, [dict(zip(symbols, p.values())) for p in plans], exact=match.group(1) == "True",
                           value_regime=regime, seed=int(match.group(3)), file_name=ast.literal_eval(match.group(2)))
