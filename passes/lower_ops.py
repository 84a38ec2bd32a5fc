"""ONNX op semantics (opsets 13 to 26, see evonnx.model.REVIEWED_OPSET) as lazy element functions.

`lower_node(op, attrs, args, vals, out_count)` returns one `Lazy` per output, or raises `Reject` with the
reason evonnx leaves the node to onnxruntime. `args[k]` is the lazy of input k (None when omitted); `vals[k]` is
its value when known at plan time (constants and shape arithmetic such as `Shape -> Gather -> Concat`), which
the shape-like inputs (Reshape's shape, Slice's starts, ...) must have.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from evonnx import expr as E
from evonnx.expr import FROM_ONNX_CODE, Const, Expr, IndexVal
from evonnx.index import Poly, Table, floordiv, is_nonneg, lookup, mod, pmax, pmin, product, var
from evonnx.passes import lazy as L
from evonnx.passes.lazy import Lazy, Reject

# A handler's (op, attrs, args, vals, n_out): attributes by name, the inputs as Lazy values (None for an absent
# optional input) and what is known of each at plan time. Loosely typed until the op registry (issue 13).
Attrs = dict[str, Any]
Args = list[Any]
Vals = list[Any]

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


def _axis(a: int, rank: int, what: str) -> int:
    if not -rank <= a < rank:
        raise Reject(f"{what} axis {a} is out of range for rank {rank}")
    return a + rank if a < 0 else a


def _attr_tensor(v: Any) -> np.ndarray:
    return np.asarray(getattr(v, "values", v))


# -- elementwise ------------------------------------------------------------------------------------------
_BINARY = {"Add": "add", "Sub": "sub", "Mul": "mul", "Div": "div", "Equal": "eq", "Less": "lt",
           "LessOrEqual": "le", "Greater": "gt", "GreaterOrEqual": "ge", "And": "and", "Or": "or", "Xor": "xor"}
_UNARY = {"Neg": "neg", "Abs": "abs", "Floor": "floor", "Ceil": "ceil", "Round": "round", "Sqrt": "sqrt",
          "Reciprocal": "reciprocal", "Relu": "relu", "Sign": "sign", "Not": "not", "Exp": "exp", "Log": "log",
          "Sigmoid": "sigmoid", "Tanh": "tanh", "Erf": "erf", "Sin": "sin", "Cos": "cos", "IsNaN": "isnan",
          "Softplus": "softplus"}
_FLOAT_ONLY = {"floor", "ceil", "round", "sqrt", "reciprocal", "exp", "log", "sigmoid", "tanh", "erf", "sin",
               "cos", "isnan", "softplus"}


def _check_dtype(x: Lazy, what: str) -> None:
    if x.dtype not in E.DTYPES:
        raise Reject(f"{what}: element type {x.dtype} is not supported")


def _binary(name: str) -> Callable[..., list[Lazy]]:
    def f(op: str, attrs: Attrs, args: Args, vals: Vals, n_out: int) -> list[Lazy]:
        a, b = args[0], args[1]
        dtype = "bool" if name in E.COMPARE | E.LOGIC else a.dtype
        return [L.elementwise([a, b], lambda x, y: E.binary(name, x, y), dtype, op)]
    return f


def _unary(name: str) -> Callable[..., list[Lazy]]:
    def f(op: str, attrs: Attrs, args: Args, vals: Vals, n_out: int) -> list[Lazy]:
        x = args[0]
        if name in _FLOAT_ONLY and x.dtype not in E.FLOATS:
            raise Reject(f"{op} on {x.dtype} is not supported")
        dtype = "bool" if name in ("not", "isnan") else x.dtype
        return [L.Lazy(dtype, x.shape, lambda idx: E.unary(name, x.fn(idx)), uniform=x.uniform)]
    return f


def _mod(op: str, attrs: Attrs, args: Args, vals: Vals, n_out: int) -> list[Lazy]:
    fmod = int(attrs.get("fmod", 0))
    if args[0].dtype in E.FLOATS and not fmod:
        raise Reject("Mod of floats needs fmod=1")
    return [L.elementwise(args[:2], lambda x, y: E.Op("mod", (x, y), x.dtype, fmod), args[0].dtype, op)]


def _pow(op: str, attrs: Attrs, args: Args, vals: Vals, n_out: int) -> list[Lazy]:
    x, y = args
    if x.dtype not in E.FLOATS:
        raise Reject(f"Pow of {x.dtype} is not supported")
    yk = vals[1].array() if vals[1] is not None else None
    if yk is not None and yk.size == 1 and float(yk.reshape(-1)[0]) in (1.0, 2.0, 3.0):
        # onnxruntime special-cases these exponents as repeated multiplication
        n = int(float(yk.reshape(-1)[0]))

        def powi(v: Expr) -> Expr:
            out = v
            for _ in range(n - 1):
                out = E.binary("mul", out, v)
            return out
        return [L.Lazy(x.dtype, x.shape, lambda idx: powi(x.fn(idx)), uniform=x.uniform)]
    return [L.elementwise([x, y], lambda a, b: E.Op("pow", (a, E.cast(b, a.dtype)), a.dtype), x.dtype, op)]


def _variadic(name: str) -> Callable[..., list[Lazy]]:
    def f(op: str, attrs: Attrs, args: Args, vals: Vals, n_out: int) -> list[Lazy]:
        xs = [a for a in args if a is not None]

        def comb(*es: Expr) -> Expr:
            out = es[0]
            for e in es[1:]:
                out = E.binary("add" if name in ("sum", "mean") else "n" + name if name in ("min", "max") else name,
                               out, e)
            if name == "mean":  # as onnxruntime: the sum times the reciprocal (not a division), bit for bit
                out = E.binary("mul", out, E.const(np.asarray(1, E.np_dtype(out.dtype)) / len(es), out.dtype))
            return out
        if name == "mean" and xs[0].dtype not in E.FLOATS:
            raise Reject("Mean of integers is not supported")
        if name in ("min", "max"):
            _int64_order(op, xs, [v for a, v in zip(args, vals) if a is not None])
        return [L.elementwise(xs, comb, xs[0].dtype, op)]
    return f


def _where(op: str, attrs: Attrs, args: Args, vals: Vals, n_out: int) -> list[Lazy]:
    dtype = args[1].dtype
    if dtype not in E.FLOATS:
        return [L.elementwise(args[:3], E.where, dtype, op)]
    zero = E.const(0.0, dtype)

    def where(c: Expr, a: Expr, b: Expr) -> Expr:
        # onnxruntime's float Where gives X + 0 where the condition holds and Y as it is elsewhere: a -0.0 taken
        # from X comes out as +0.0, one from Y stays -0.0 (measured on 1.31, float and double, every broadcast
        # form; fuzz seed 47192: Div(-1e30, Where(x == x, x, x)) is -inf at x = -0.0). x + 0 is x otherwise.
        return E.where(c, E.binary("add", a, zero), b)

    return [L.elementwise(args[:3], where, dtype, op)]


def _int64_order(op: str, xs: list[Lazy], vals: Vals) -> None:
    """onnxruntime 1.31's int64 Min, Max and Clip compare the low 32-bit halves as signed numbers whenever the
    output has two elements or more: Min(-2, -2**32) is -2 there; one element gets the right answer. So int64
    orderings of run-time data stay with onnxruntime unless every input is a single element; sizes known at plan
    time (shape arithmetic) are computed exactly."""
    if xs[0].dtype != "int64" or all(v is not None for v in vals):
        return
    if all(d.const == 1 for x in xs for d in x.shape):
        return
    raise Reject(f"int64 {op} of run-time data (onnxruntime's comparison of 32-bit halves is not reproduced)")


def _clip(op: str, attrs: Attrs, args: Args, vals: Vals, n_out: int) -> list[Lazy]:
    x = args[0]
    _int64_order(op, [a for a in args if a is not None], [v for a, v in zip(args, vals) if a is not None])
    lo = args[1] if len(args) > 1 else None
    hi = args[2] if len(args) > 2 else None
    for b in (lo, hi):
        if b is not None and b.shape != ():
            raise Reject("Clip bounds must be scalars")
    return [L.Lazy(x.dtype, x.shape, lambda idx: E.clip(x.fn(idx), lo.fn(()) if lo else None,
                                                         hi.fn(()) if hi else None), uniform=x.uniform)]


def _cast(op: str, attrs: Attrs, args: Args, vals: Vals, n_out: int) -> list[Lazy]:
    to = FROM_ONNX_CODE.get(int(attrs["to"]))
    if to is None:
        raise Reject(f"Cast to element type {attrs['to']} is not supported")
    x = args[0]
    if x.dtype in E.FLOATS and to in ("uint32", "uint64"):
        # onnxruntime 1.31 on x86-64 casts a float that is negative or too large for uint32 to 0 or to 2^31
        # depending on whether its loop reaches the element in a SIMD block or in the scalar tail (-3e38 gives
        # 2147483648 at position 0 of 24 and 0 at position 18 of 19): no kernel can reproduce that
        raise Reject(f"Cast from float to {to} (onnxruntime's out-of-range results depend on the element's position)")
    return [L.Lazy(to, x.shape, lambda idx: E.cast(x.fn(idx), to), uniform=x.uniform)]


def _leaky_relu(op: str, attrs: Attrs, args: Args, vals: Vals, n_out: int) -> list[Lazy]:
    x = args[0]
    # float attributes are float32 in ONNX, defaults included: onnxruntime's double kernels widen 0.01f, not 0.01
    alpha = E.const(float(np.float32(attrs.get("alpha", 0.01))), x.dtype)
    zero = E.const(0, x.dtype)
    return [L.Lazy(x.dtype, x.shape, lambda idx: E.where(E.binary("lt", x.fn(idx), zero),
                                                         E.binary("mul", x.fn(idx), alpha), x.fn(idx)),
                   uniform=x.uniform)]


def _hard_sigmoid(op: str, attrs: Attrs, args: Args, vals: Vals, n_out: int) -> list[Lazy]:
    x = args[0]
    alpha = E.const(float(np.float32(attrs.get("alpha", 0.2))), x.dtype)
    beta = E.const(float(np.float32(attrs.get("beta", 0.5))), x.dtype)
    zero, one = E.const(0, x.dtype), E.const(1, x.dtype)
    return [L.Lazy(x.dtype, x.shape, lambda idx: E.clip(
        E.binary("add", E.binary("mul", x.fn(idx), alpha), beta), zero, one), uniform=x.uniform)]


# -- views ------------------------------------------------------------------------------------------------
def _identity(op: str, attrs: Attrs, args: Args, vals: Vals, n_out: int) -> list[Lazy]:
    return [args[0]]


def _reshape(op: str, attrs: Attrs, args: Args, vals: Vals, n_out: int) -> list[Lazy]:
    x = args[0]
    target = ints(vals[1], "Reshape shape")
    allowzero = int(attrs.get("allowzero", 0))
    out: list[Poly | None] = []
    for k, t in enumerate(target):
        if t.const == 0 and not allowzero:
            if k >= x.rank:
                raise Reject("Reshape copies a dimension the input does not have")
            out.append(x.shape[k])
        elif t.const == -1:
            out.append(None)
        elif t.const is not None and t.const < 0:
            raise Reject(f"Reshape shape has {t.const}")
        else:
            if t.const is None and not allowzero and not (k < x.rank and t == x.shape[k]):
                # A size from the graph that is 0 at run time copies input dim k instead (allowzero=0); onnxruntime
                # then fails the node or reshapes to other sizes. The kernel relies on it being >= 1, or on input
                # dim k being 0 too (when the copy is that same 0).
                L.require_le(Poly.of(1), t, f"Reshape shape entry {k} ({t}) is 0, which copies input dim {k}",
                             unless=x.shape[k] if k < x.rank else None)
            out.append(t)
    total = L.numel(x)
    if out.count(None) > 1:
        raise Reject("Reshape shape has more than one -1")
    if None in out:
        known_part = product(d for d in out if d is not None)
        # onnxruntime cannot infer -1 when the other dims multiply to 0, and fails the Run
        L.require_le(Poly.of(1), known_part, "Reshape cannot infer -1 when the other dims multiply to 0")
        inferred = floordiv(total, known_part)
        if inferred * known_part != total:
            raise Reject("Reshape's inferred dimension is not provably exact")
        out[out.index(None)] = inferred
    dims = [d for d in out if d is not None]
    if product(dims) != total:
        raise Reject("Reshape does not provably keep the number of elements")
    return [L.reshape(x, dims)]


def _flatten(op: str, attrs: Attrs, args: Args, vals: Vals, n_out: int) -> list[Lazy]:
    x = args[0]
    axis = int(attrs.get("axis", 1))
    axis = axis + x.rank if axis < 0 else axis
    return [L.reshape(x, [product(x.shape[:axis]), product(x.shape[axis:])])]


def _squeeze(op: str, attrs: Attrs, args: Args, vals: Vals, n_out: int) -> list[Lazy]:
    x = args[0]
    if len(args) > 1 and args[1] is not None:
        axes = {_axis(a, x.rank, op) for a in const_ints(vals[1], "Squeeze axes")}
    else:
        if any(d.const is None for d in x.shape):
            raise Reject("Squeeze without axes on a symbolic shape")
        axes = {k for k, d in enumerate(x.shape) if d.const == 1}
    for a in axes:
        if x.shape[a].const != 1:
            raise Reject(f"Squeeze axis {a} has size {x.shape[a]}")
    return [L.reshape(x, [d for k, d in enumerate(x.shape) if k not in axes])]


def _unsqueeze(op: str, attrs: Attrs, args: Args, vals: Vals, n_out: int) -> list[Lazy]:
    x = args[0]
    rank = x.rank + len(const_ints(vals[1], "Unsqueeze axes"))
    axes = sorted(_axis(a, rank, op) for a in const_ints(vals[1], "Unsqueeze axes"))
    dims = list(x.shape)
    for a in axes:
        dims.insert(a, Poly.of(1))
    return [L.reshape(x, dims)]


def _transpose(op: str, attrs: Attrs, args: Args, vals: Vals, n_out: int) -> list[Lazy]:
    x = args[0]
    perm = [int(p) for p in attrs.get("perm", range(x.rank - 1, -1, -1))]
    return [L.transpose(x, perm)]


def _expand(op: str, attrs: Attrs, args: Args, vals: Vals, n_out: int) -> list[Lazy]:
    x = args[0]
    target = ints(vals[1], "Expand shape")
    shape = L.broadcast_shapes([x.shape, target], op)
    return [L.broadcast_to(x, shape)]


def _tile(op: str, attrs: Attrs, args: Args, vals: Vals, n_out: int) -> list[Lazy]:
    return [L.tile(args[0], ints(vals[1], "Tile repeats"))]


_HUGE_STEP = 1 << 40


def _slice_bounds(d: Poly, start: int | Poly, end: int | Poly, step: int) -> tuple[Poly, Poly]:
    """Normalised start and length of one Slice axis, as the ONNX spec clamps them."""
    def norm(v: int | Poly, lo: Poly, hi: Poly) -> Poly:
        p = Poly.of(v)
        if p.const is not None and p.const >= BIG:
            return hi
        if p.const is not None and p.const <= -BIG:
            return pmin(lo, hi)  # for a negative step on an empty axis hi is -1, below lo = 0
        if p.const is not None and p.const < 0:
            p = p + d
        elif p.const is None and not is_nonneg(p):
            raise Reject("Slice bound of unknown sign")
        return pmin(pmax(p, lo), hi)

    # A step beyond any axis size (INT64_MIN, say) takes at most one element: it is a step of +-1 taking at most
    # one, so no huge constant reaches the index arithmetic (the axis size is checked to stay below it).
    at_most_one = abs(step) >= _HUGE_STEP
    if at_most_one:
        if d.const is None:
            L.require_le(d, Poly.of(_HUGE_STEP), "Slice with a huge step needs the axis size below 2^40")
        elif d.const > _HUGE_STEP:
            raise Reject("Slice with a huge step on a huge axis")
        step = 1 if step > 0 else -1
    if step > 0:
        s, e = norm(start, Poly(), d), norm(end, Poly(), d)
        length = pmax(floordiv(e - s + (step - 1), step), Poly())
    else:
        s, e = norm(start, Poly(), d - 1), norm(end, Poly.of(-1), d - 1)
        if Poly.of(end).const == (1 << 63) - 1:
            # onnxruntime 1.31 reads an end of exactly INT64_MAX with a negative step as "through element 0"
            # (x[0:INT64_MAX:-1] is [x[0]]; the spec clamps it to dim - 1, giving nothing); 2**62 is clamped
            e = Poly.of(-1)
        length = pmax(floordiv(s - e + (-step - 1), -step), Poly())
    return s, (pmin(length, Poly.of(1)) if at_most_one else length)


def _slice(op: str, attrs: Attrs, args: Args, vals: Vals, n_out: int) -> list[Lazy]:
    x = args[0]
    starts = ints(vals[1], "Slice starts")
    ends = ints(vals[2], "Slice ends")
    axes = const_ints(vals[3], "Slice axes") if len(args) > 3 and args[3] is not None else list(
        range(len(starts)))
    steps = const_ints(vals[4], "Slice steps") if len(args) > 4 and args[4] is not None else [1] * len(starts)
    out = x
    for s, e, a, st in zip(starts, ends, axes, steps):
        if st == 0:
            raise Reject("Slice step is 0")
        a = _axis(a, x.rank, op)
        start, length = _slice_bounds(x.shape[a], s, e, st)
        if abs(st) >= _HUGE_STEP:
            st = 1 if st > 0 else -1  # at most one element: see _slice_bounds
        if length == x.shape[a] and st == 1 and start.const == 0:
            continue
        out = L.slice_axis(out, a, start, length, st)
    return [out]


def _constant_indices(op: str, attrs: Attrs, args: Args, vals: Vals) -> tuple[Lazy, int, np.ndarray]:
    """(data, axis, indices) of a Gather/GatherElements whose indices are known at plan time; Reject otherwise."""
    x = args[0]
    axis = _axis(int(attrs.get("axis", 0)), x.rank, op)
    ind = vals[1].array() if vals[1] is not None else None
    if ind is None:
        raise Reject(f"{op} indices are data-dependent")
    return x, axis, ind


def _gather(op: str, attrs: Attrs, args: Args, vals: Vals, n_out: int) -> list[Lazy]:
    x, axis, ind = _constant_indices(op, attrs, args, vals)
    d = x.shape[axis].const
    if d is None:
        # onnxruntime fails the Run when an index is out of range: the kernel checks the same at run time
        dim = x.shape[axis]
        lo, hi = (int(ind.min()), int(ind.max())) if ind.size else (0, -1)
        if lo >= 0:
            L.require_le(Poly.of(hi + 1), dim, f"Gather index {hi} must be below the size of axis {axis}")
        elif ind.ndim == 0:
            L.require_le(Poly.of(-lo), dim, f"Gather index {lo} must be within the size of axis {axis}")
            return [L.select(x, axis, dim + lo)]
        else:
            raise Reject("Gather with negative indices on a symbolic axis")
    else:
        if ((ind < -d) | (ind >= d)).any():
            raise Reject(f"Gather index out of range for axis size {d}")
        ind = np.where(ind < 0, ind + d, ind)
    if ind.ndim == 0:
        return [L.select(x, axis, Poly.of(int(ind)))]
    return [L.take(x, axis, ind)]


def _gather_elements(op: str, attrs: Attrs, args: Args, vals: Vals, n_out: int) -> list[Lazy]:
    x, axis, ind = _constant_indices(op, attrs, args, vals)
    if ind.ndim != x.rank:
        raise Reject("GatherElements indices of another rank than the data")  # onnxruntime fails too
    if ind.size == 0:
        raise Reject("GatherElements with no indices")
    # onnxruntime fails the Run when an index is out of the axis, or when an indices dim other than the axis
    # exceeds the data's: the kernel checks the same at run time where the data's dims are symbolic
    for k in range(x.rank):
        if k == axis:
            continue
        d = x.shape[k]
        if d.const is None:
            L.require_le(Poly.of(int(ind.shape[k])), d, f"GatherElements indices dim {k} must not exceed the data's")
        elif ind.shape[k] > d.const:
            raise Reject(f"GatherElements indices dim {k} exceeds the data's")
    along = _const_indices(ind, x, [axis], op).reshape(ind.shape)
    if x.shape[axis].const is None:
        hi = int(along.max())
        L.require_le(Poly.of(hi + 1), x.shape[axis], f"GatherElements index {hi} must be below the size of axis {axis}")
    return [L.take_along(x, axis, along)]


def _concat(op: str, attrs: Attrs, args: Args, vals: Vals, n_out: int) -> list[Lazy]:
    xs = [a for a in args if a is not None]
    axis = _axis(int(attrs["axis"]), xs[0].rank, op)
    for x in xs[1:]:
        if x.rank != xs[0].rank or any(x.shape[k] != xs[0].shape[k] for k in range(x.rank) if k != axis):
            raise Reject("Concat inputs do not provably agree off the concat axis")
    return [L.concat(xs, axis)]


def _split(op: str, attrs: Attrs, args: Args, vals: Vals, n_out: int) -> list[Lazy]:
    x = args[0]
    axis = _axis(int(attrs.get("axis", 0)), x.rank, op)
    d = x.shape[axis]
    if len(args) > 1 and args[1] is not None:
        sizes = ints(vals[1], "Split sizes")
    else:
        n = int(attrs.get("num_outputs", n_out))
        if d.const is None:
            raise Reject("Split of a symbolic axis without sizes")
        chunk = -(-d.const // n)
        sizes = [Poly.of(min(chunk, d.const - k * chunk)) for k in range(n)]
    outs = []
    start = Poly()
    for s in sizes:
        outs.append(L.slice_axis(x, axis, start, s, 1))
        start = start + s
    if start != d:
        raise Reject("Split sizes do not provably add up to the axis size")
    return outs


def _shape(op: str, attrs: Attrs, args: Args, vals: Vals, n_out: int) -> list[Lazy]:
    x = args[0]
    r = x.rank
    start = int(attrs.get("start", 0))
    end = int(attrs.get("end", r))
    start = min(max(start + r if start < 0 else start, 0), r)
    end = min(max(end + r if end < 0 else end, 0), r)
    dims = x.shape[start:end]
    return [L.known([E.index_val(d) for d in dims], [len(dims)], "int64")]


def _size(op: str, attrs: Attrs, args: Args, vals: Vals, n_out: int) -> list[Lazy]:
    return [L.known([E.index_val(L.numel(args[0]))], [], "int64")]


def _constant_of_shape(op: str, attrs: Attrs, args: Args, vals: Vals, n_out: int) -> list[Lazy]:
    shape = ints(vals[0], "ConstantOfShape shape")
    value = attrs.get("value")
    arr = _attr_tensor(value) if value is not None else np.zeros(1, np.float32)
    dtype = str(arr.dtype)
    if dtype not in E.DTYPES:
        raise Reject(f"ConstantOfShape of {dtype}")
    c = E.const(arr.reshape(-1)[0], dtype)
    return [L.Lazy(dtype, tuple(shape), lambda idx: c)]


def _range(op: str, attrs: Attrs, args: Args, vals: Vals, n_out: int) -> list[Lazy]:
    # onnxruntime computes float ranges by accumulation (`y = start; y += delta`). With integer-valued start,
    # delta and limit every partial sum is an integer below 2**24 and exact, so it equals start + i*delta.
    dtype = args[0].dtype
    if dtype not in ("int64", "int32", "int16", "float32", "float64"):
        raise Reject(f"Range of {dtype} is not supported")
    what = "Range bounds" if dtype not in E.FLOATS else "Range bounds (integer-valued floats)"
    start, limit, delta = (ints(vals[k], what)[0] for k in range(3))
    step = delta.const
    if step is None or step == 0:
        raise Reject("Range delta is not a non-zero constant")
    n = pmax(floordiv(limit - start + (step - 1 if step > 0 else step + 1), step), Poly())
    return [L.Lazy(dtype, (n,), lambda idx: E.cast(E.index_val(start + idx[0] * step), dtype))]


# -- reductions ---------------------------------------------------------------------------------------------

def _reduce_axes(op: str, attrs: Attrs, args: Args, vals: Vals, rank: int) -> tuple[list[int] | None, set[int]]:
    """The reduced axes (sorted), or None for "no reduction" (empty axes with noop_with_empty_axes); and the axes
    that onnxruntime keeps on an empty input (see `_empty_quirk`)."""
    if len(args) > 1 and args[1] is not None:
        axes = const_ints(vals[1], f"{op} axes")
    else:
        axes = [int(a) for a in attrs.get("axes", [])]
    if not axes:
        return (None if int(attrs.get("noop_with_empty_axes", 0)) else list(range(rank))), set()
    out = sorted({_axis(a, rank, op) for a in axes})
    return out, set(out) - {a for a in axes if a >= 0}


def _empty_quirk(op: str, x: Lazy, axes: Sequence[int], quirk: set[int], keep: int) -> dict[int, Poly]:
    """onnxruntime 1.31 departs from the spec on an empty input: its empty-set path looks for each axis in the axes
    as written, so an axis written negatively is not reduced but kept at its input size. ReduceMax(x[0, 5],
    axes=[-1], keepdims=1) is [0, 5], not [0, 1]; ArgMax(x[5, 0], axis=-1) is [5, 0], not an error (see
    tests/security/sec_models.py). With keepdims=1 that is an output size `numel == 0 ? d : 1` for each such axis
    (returned per axis); with keepdims=0 the rank changes, which a fused kernel cannot do, so the node stays with
    onnxruntime unless the input can never be empty."""
    if not quirk or all((d.const or 0) > 0 for d in x.shape):
        return {}
    if not keep:
        raise L.RankQuirk(f"{op} with negative axes keeps the input's shape on an empty input in onnxruntime")
    if all(x.shape[k].const is not None for k in range(x.rank) if k not in axes):
        # The spec's result shape is static, so onnxruntime's memory planner may have given the output a buffer of
        # that shape: with the other shape on an empty input it then fails ("Shape mismatch attempting to re-use
        # buffer"), or not, as its plan goes.
        raise Reject(f"{op} with negative axes of an input that can be empty: onnxruntime's result depends on its "
                     "memory plan")
    empty = Poly.of(1) - pmin(_numel(x.shape), Poly.of(1))
    return {a: Poly.of(1) + empty * (x.shape[a] - Poly.of(1)) for a in quirk}


# ReduceL1/L2/SumSquare/LogSum/LogSumExp: a sum of a transformed element, then a final transform (spec formulas)
_SUM_OF = {"l1": "abs", "l2": "square", "sumsquare": "square", "logsum": None, "logsumexp": None}


def _reducer(kind: str) -> Callable[..., list[Lazy]]:
    def f(op: str, attrs: Attrs, args: Args, vals: Vals, n_out: int) -> list[Lazy]:
        x = args[0]
        axes, quirk = _reduce_axes(op, attrs, args, vals, x.rank)
        if axes is None and kind not in _SUM_OF:
            return [x]
        if axes is None:
            axes = []  # noop_with_empty_axes: the transforms still apply to every element
        if kind in ("mean", "l2", "logsum", "logsumexp") and x.dtype not in E.FLOATS:
            raise Reject(f"{op} of integers is not supported")
        if kind in ("sum", "prod", "l1", "sumsquare") and x.dtype not in E.FLOATS:
            # onnxruntime 1.31 accumulates integer sums and products in double and saturates the result:
            # ReduceSum(int64 [2^53 + 1, 2]) is 2^53 + 2 and an overflowing sum is INT_MAX, not the wrapped value.
            # Exact wrapping arithmetic would differ from it, so these stay with onnxruntime.
            raise Reject(f"{op} of integers rounds through double in onnxruntime")
        keep = int(attrs.get("keepdims", 1))
        for a in axes:
            if x.shape[a].const == 0:
                raise Reject(f"{op} over an empty axis")
        kept = _empty_quirk(op, x, axes, quirk, keep)
        shape = tuple(kept.get(k, Poly.of(1)) if k in axes else d for k, d in enumerate(x.shape)
                      if keep or k not in axes)
        count = product(x.shape[a] for a in axes)

        def fn(idx: tuple[Poly, ...]) -> Expr:
            full: list[Poly] = []
            rvars: list[Poly] = []
            it = iter(idx)
            for k in range(x.rank):
                if k in axes:
                    if keep:
                        next(it)
                    v = L.fresh_var(x.shape[k])
                    rvars.append(v)
                    full.append(v)
                else:
                    full.append(next(it))
            def reduce(body: Expr, how: str, over: list[Poly] = rvars) -> Expr:
                for v in reversed(over):
                    if v.atom() is not None:
                        body = E.Reduce(how, v, body, x.dtype)
                return body

            elem = x.fn(tuple(full))
            if kind == "logsumexp":
                m = _logsumexp_shift(x, full, rvars, count, reduce) if rvars else elem
                return E.binary("add", E.unary("log", reduce(E.unary("exp", E.binary("sub", elem, m)), "sum")), m)
            if kind in _SUM_OF:
                pre = _SUM_OF[kind]
                body = E.binary("mul", elem, elem) if pre == "square" else E.unary(pre, elem) if pre else elem
                s = reduce(body, "sum")
                return E.unary("sqrt", s) if kind == "l2" else E.unary("log", s) if kind == "logsum" else s
            if kind in ("max", "min") and x.dtype in E.FLOATS and all(
                    (n := x.shape[a].const) is not None and n >= 1 for a in axes):
                # max(f(x)) = f(max(x)) for f nondecreasing that keeps NaN exactly where x is NaN (so the NaN rule
                # picks the same element): RetinaNet's max over 80 sigmoids per anchor becomes one sigmoid. Not over
                # an axis that may be empty, where the start value -inf/+inf would go through f.
                outer: list[str] = []
                while isinstance(elem, E.Op) and elem.op in _MONOTONE and elem.args[0].dtype == x.dtype:
                    outer.append(elem.op)
                    elem = elem.args[0]
                out = reduce(elem, kind)
                for name in reversed(outer):
                    out = E.unary(name, out)
                return out
            out = reduce(elem, "sum" if kind == "mean" else kind)
            if kind == "mean":
                # onnxruntime's mean of an empty set is 0 (the spec's 0/0 would be NaN): the sum 0 over max(n, 1)
                out = E.binary("div", out, E.cast(E.index_val(pmax(count, Poly.of(1))), x.dtype))
            return out

        return [Lazy(x.dtype, shape, fn, uniform=frozenset(kept))]
    return f


# Unary ops that are nondecreasing and NaN exactly where their argument is (`_reducer`'s max/min rewrite). Not
# Relu, Floor or Ceil: they map unequal inputs to +0 and -0, and the max of [ceil(-0.5), ceil(0)] is the first
# zero, -0, where ceil(max) is +0.
_MONOTONE = frozenset({"sigmoid", "exp", "tanh"})


def _logsumexp_shift(x: Lazy, full: list[Poly], rvars: list[Poly], count: Poly,
                     reduce: Callable[[Expr, str, list[Poly]], Expr]) -> Expr:
    """The shift m of onnxruntime's log(sum(exp(x - m))) + m (its ReduceAggregatorLogSumExp): the largest
    finite element, starting from the row's first element, or from 0 where that one is +-inf. So a row holding
    +inf gives +inf (m finite), not NaN (inf - inf), and [-inf, -1000] gives -inf (m = 0: exp(-1000) is 0), as
    onnxruntime does. The first element is read only where the row is not empty."""
    full2, rvars2 = _fresh_copy(full, rvars)
    x2 = x.fn(full2)
    inf = E.const(float("inf"), x.dtype)
    finite = E.binary("lt", E.unary("abs", x2), inf)  # false for NaN
    top = reduce(E.where(finite, x2, E.const(float("-inf"), x.dtype)), "max", rvars2)
    first = x.fn(tuple(Poly.of(0) if p in rvars else p for p in full))
    from_zero = E.binary("max", E.const(0.0, x.dtype), top)  # top is never NaN
    first_inf = E.binary("eq", E.unary("abs", first), inf)
    if count.const is None or count.const < 1:
        first_inf = E.guarded_where(E.binary("gt", E.index_val(count), E.const(0, "int64")), first_inf,
                                    E.Const(False, "bool"))
    return E.where(first_inf, from_zero, top)


def _fresh_copy(full: list[Poly], rvars: list[Poly]) -> tuple[tuple[Poly, ...], list[Poly]]:
    """`full` with each reduction variable replaced by a new one, and the new ones (a second, independent
    reduction over the same axes)."""
    swap = {v: L.fresh_var(v.atom().extent) for v in rvars if v.atom() is not None}  # type: ignore[union-attr]
    return tuple(swap.get(p, p) for p in full), [swap.get(v, v) for v in rvars]


def _arg_extreme(kind: str) -> Callable[..., list[Lazy]]:
    def f(op: str, attrs: Attrs, args: Args, vals: Vals, n_out: int) -> list[Lazy]:
        x = args[0]
        written = int(attrs.get("axis", 0))
        axis = _axis(written, x.rank, op)
        keep = int(attrs.get("keepdims", 1))
        last = int(attrs.get("select_last_index", 0))
        kept = _empty_quirk(op, x, [axis], {axis} if written < 0 else set(), keep)
        shape = tuple(kept.get(k, Poly.of(1)) if k == axis else d for k, d in enumerate(x.shape)
                      if keep or k != axis)
        # onnxruntime fails an arg-reduction over an empty axis when the result is not empty
        L.require_le(Poly.of(1), x.shape[axis], f"{op} over an empty axis {axis}",
                     unless=Poly() if kept else _numel(shape))

        def fn(idx: tuple[Poly, ...]) -> Expr:
            v = L.fresh_var(x.shape[axis])
            full = list(idx)
            if keep:
                full[axis] = v
            else:
                full.insert(axis, v)
            if v.atom() is None:
                return Const(0, "int64")
            return E.Reduce(kind, v, x.fn(tuple(full)), "int64", last)

        return [Lazy("int64", shape, fn, uniform=frozenset(kept))]
    return f


def _softmax(log: bool) -> Callable[..., list[Lazy]]:
    def f(op: str, attrs: Attrs, args: Args, vals: Vals, n_out: int) -> list[Lazy]:
        x: Lazy = args[0]
        if x.dtype not in E.FLOATS:
            raise Reject(f"{op} of {x.dtype}")
        if log and x.dtype == "float64":
            # onnxruntime 1.31's double LogSoftmax (Eigen) gives per-lane results on a row holding NaN or +-inf:
            # [1, 2, nan, 3, ...] -> [40.05, 41.05, nan, 42.05, ...]; its float one gives NaN, as evonnx does
            raise Reject("LogSoftmax of float64 (onnxruntime's results with NaN or inf in a row are not reproduced)")
        axis = _axis(int(attrs.get("axis", -1)), x.rank, op)
        n = x.shape[axis].const
        # Each output element is computed on its own: the max and sum are shared by the elements computed together
        # (the unrolled last axis). Over a longer last axis they are hoisted per row and vectorised too, yet the
        # fused softmax measured slower than onnxruntime's MLAS kernel: 403 vs 140 us for (2400, 92) with a Mul
        # fused in front, 1823 vs 1037 us for (33600, 17), 1 thread. Left to onnxruntime.
        if axis != x.rank - 1 or n is None or n > MAX_SOFTMAX_AXIS:
            raise Reject(f"{op} over an axis that is not a last axis of at most {MAX_SOFTMAX_AXIS} elements is "
                         "faster in onnxruntime")

        def fn(idx: tuple[Poly, ...]) -> Expr:
            def at(r: Poly) -> Expr:
                return x.fn(idx[:axis] + (r,) + idx[axis + 1:])

            r1, r2 = L.fresh_var(x.shape[axis]), L.fresh_var(x.shape[axis])
            m = E.Reduce("max", r1, at(r1), x.dtype)
            s = E.Reduce("sum", r2, E.unary("exp", E.binary("sub", at(r2), m)), x.dtype)
            shifted = E.binary("sub", x.fn(idx), m)
            if log:
                return E.binary("sub", shifted, E.unary("log", s))
            return E.binary("div", E.unary("exp", shifted), s)

        return [Lazy(x.dtype, x.shape, fn)]
    return f


MAX_SOFTMAX_AXIS = 8  # see _softmax


# -- writes through views -----------------------------------------------------------------------------------
_REDUCE = {"add": "add", "mul": "mul", "max": "max", "min": "min"}


def _affine_grid(es: Sequence[Expr], pvars: Sequence[Poly], what: str) -> list[tuple[Poly | None, Poly, int]]:
    """Per written coordinate: (update-position variable or None, offset, step) from index expressions that must be
    `offset + step * p` with each variable used once (an injective grid): otherwise Reject."""
    atoms = [p.atom() for p in pvars]
    out: list[tuple[Poly | None, Poly, int]] = []
    used: set[object] = set()
    for e in es:
        p = E.as_integer(e) if not isinstance(e, E.Op) else None
        if p is None or e.dtype not in E.INTS:
            raise Reject(f"{what} indices are data-dependent")
        vs = [a for a in atoms if a is not None and a in p.atoms()]
        if not vs:
            out.append((None, p, 0))
            continue
        c = p.coefficient(vs[0]) if len(vs) == 1 else None
        if c is None or c.const is None or c.const == 0 or vs[0] in used:
            raise Reject(f"{what} indices are not an injective affine grid")
        rest = p - Poly.of(vs[0]) * c.const
        if rest.vars():
            raise Reject(f"{what} indices are not an injective affine grid")
        used.add(vs[0])
        out.append((Poly.of(vs[0]), rest, c.const))
    for a in atoms:
        if a is not None and a not in used:
            raise Reject(f"{what} writes some positions more than once (duplicate indices)")
    return out


def _solve(i: Poly, offset: Poly, step: int, extent: Poly, conds: list[Expr]) -> Poly:
    """The update position p with i == offset + step*p, appending the conditions that such a p exists."""
    d = i - offset
    if step < 0:
        d, step = -d, -step
    conds.append(E.binary("ge", IndexVal(d), IndexVal(Poly())))
    conds.append(E.binary("lt", IndexVal(d), IndexVal(extent * step - (step - 1))))
    if step != 1:
        conds.append(E.binary("eq", IndexVal(mod(d, step)), IndexVal(Poly())))
    return floordiv(d, step)


def _all(conds: Sequence[Expr]) -> Expr:
    out: Expr = Const(True, "bool")
    for c in conds:
        out = E.binary("and", out, c)
    return out


WriteMap = Callable[[tuple[Poly, ...]], tuple[Expr, tuple[Poly, ...]]]  # index -> (written here?, update index)


def _write(data: Lazy, upd_at: Callable[[tuple[Poly, ...]], Expr], conds_of: WriteMap, reduction: str) -> Lazy:
    def fn(idx: tuple[Poly, ...]) -> Expr:
        cond, upd_idx = conds_of(idx)
        old = data.fn(idx)
        if isinstance(cond, Const) and not cond.value:
            return old
        return L.guarded(cond, _combine(reduction, old, upd_at(upd_idx)), old)

    return Lazy(data.dtype, data.shape, fn)


# A scatter whose constant indices are no affine grid (or write a position twice, with a reduction) is lowered
# through tables over the written positions' bounding box: at most this many slots (times the writes per slot).
MAX_SCATTER_TABLE = 1 << 16
MAX_SCATTER_WRITES = 16  # one select per write to a position: more would make every element pay for them
_tables = iter(range(1 << 62))


def _combine(reduction: str, old: Expr, new: Expr) -> Expr:
    if reduction in ("max", "min"):
        # onnxruntime's ScatterND/ScatterElements take std::max(update, data): a NaN update wins, a NaN data
        # element is replaced (evo_max(a, b) is `a < b ? b : a`, std::max's order)
        return E.binary(_REDUCE[reduction], new, old)
    if reduction != "none":
        return E.binary(_REDUCE[reduction], old, new)
    return new


def _tabled_write(op: str, data: Lazy, upd: Lazy, targets: np.ndarray, axes: Sequence[int],
                  upd_index: Callable[[Poly, tuple[Poly, ...]], tuple[Poly, ...]], reduction: str) -> Lazy:
    """`data` with update p (in the indices' row-major order) written at data coordinates `targets[p]` on `axes`
    (non-negative constants), its element at idx being upd[upd_index(p, idx)]. Positions written more than once
    take the updates in index order, as onnxruntime's loop does: f(f(data, u_first), u_next)."""
    if targets.shape[0] == 0:
        return data
    ext = [int(targets[:, j].max()) + 1 for j in range(len(axes))]
    size = math.prod(ext)  # Python ints: a huge index must not wrap to a small table
    if size > MAX_SCATTER_TABLE:
        raise Reject(f"{op} indices span more than {MAX_SCATTER_TABLE} positions (no affine grid)")
    flat = np.ravel_multi_index(tuple(targets.T), ext)
    counts = np.bincount(flat, minlength=size)
    writes = int(counts.max())
    if writes > 1 and (reduction == "none" or op == "ScatterND"):
        # the spec leaves the order; onnxruntime's ScatterND spreads index rows over threads, so a position
        # written twice gets its updates in no fixed order (ScatterElements runs one loop in index order)
        raise Reject(f"{op} writes some positions more than once (duplicate indices)")
    if writes > MAX_SCATTER_WRITES or writes * size > MAX_SCATTER_TABLE:
        raise Reject(f"{op} writes a position {writes} times")
    tables = [[0] * size for _ in range(writes)]
    seen = [0] * size
    for pos, slot in enumerate(flat.tolist()):
        tables[seen[slot]][slot] = pos
        seen[slot] += 1
    n = next(_tables)
    count_t = Table(f"scount{n}", tuple(int(c) for c in counts))
    write_t = [Table(f"swrite{n}_{r}", tuple(t)) for r, t in enumerate(tables)]
    for j, a in enumerate(axes):
        L.require_le(Poly.of(ext[j]), data.shape[a], f"{op} index {ext[j] - 1} on axis {a} must be below its size")
    ext_p = [Poly.of(e) for e in ext]

    def fn(idx: tuple[Poly, ...]) -> Expr:
        value = data.fn(idx)
        coords = [idx[a] for a in axes]
        inside = _all([E.binary("lt", IndexVal(c), IndexVal(e)) for c, e in zip(coords, ext_p)])
        slot = pmin(L._flat(tuple(coords), ext_p), Poly.of(size - 1))  # every table read in range, written or not
        count = lookup(count_t, slot)
        for r, t in enumerate(write_t):
            cond = E.binary("and", inside, E.binary("gt", IndexVal(count), IndexVal(Poly.of(r))))
            # not a guarded select: every table entry names a real update (0 where the slot is not written) and
            # the slot is clamped, so both sides are in range and the reads need no mask (see schedule.temporaries)
            value = E.where(cond, _combine(reduction, value, upd.fn(upd_index(lookup(t, slot), idx))), value)
        return value

    return Lazy(data.dtype, data.shape, fn)


def _const_indices(ind: np.ndarray, data: Lazy, axes: Sequence[int], op: str) -> np.ndarray:
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


def _scatter_nd(op: str, attrs: Attrs, args: Args, vals: Vals, n_out: int) -> list[Lazy]:
    try:
        return _scatter_nd_grid(op, attrs, args, vals, n_out)
    except Reject as why:
        data, upd = args[0], args[2]
        ind = vals[1].array() if vals[1] is not None else None
        reduction = str(attrs.get("reduction", "none"))
        if ind is None or reduction not in ("none", *_REDUCE) or ind.ndim < 1 or not 1 <= ind.shape[-1] <= data.rank:
            raise why from None
        k = int(ind.shape[-1])
        rows = tuple(Poly.of(int(d)) for d in ind.shape[:-1])
        if upd.shape != rows + tuple(data.shape[k:]):
            raise why from None
        targets = _const_indices(ind, data, range(k), op)
        return [_tabled_write(op, data, upd, targets, range(k),
                              lambda p, idx: L._unflat(p, rows) + tuple(idx[k:]), reduction)]


def _scatter_nd_grid(op: str, attrs: Attrs, args: Args, vals: Vals, n_out: int) -> list[Lazy]:
    data, upd = args[0], args[2]
    reduction = str(attrs.get("reduction", "none"))
    if reduction not in ("none", *_REDUCE):
        raise Reject(f"ScatterND reduction '{reduction}'")
    if vals[1] is None:
        raise Reject("ScatterND indices are data-dependent")
    ind = vals[1].lazy()
    k = ind.shape[-1].const
    if k is None or k > data.rank:
        raise Reject("ScatterND index depth is not a constant within the data rank")
    pvars = [var(f"_p{n}", d) for n, d in enumerate(ind.shape[:-1])]
    es = [ind.fn(tuple(pvars) + (Poly.of(j),)) for j in range(k)]
    es = [_normalise_index(e, data.shape[j], op) for j, e in enumerate(es)]
    grid = _affine_grid(es, pvars, op)
    if upd.shape != tuple(ind.shape[:-1]) + tuple(data.shape[k:]):
        raise Reject("ScatterND updates shape does not match indices and data")
    for j, (pv, off, step) in enumerate(grid):
        _require_in_range(off, step, ind.shape[pvars.index(pv)] if pv is not None else None, data.shape[j],
                          f"{op} indices on axis {j}")

    def conds_of(idx: tuple[Poly, ...]) -> tuple[Expr, tuple[Poly, ...]]:
        conds: list[Expr] = []
        pos = {pv: Poly() for pv in pvars}
        for j, (pv, off, step) in enumerate(grid):
            if pv is None:
                conds.append(E.binary("eq", IndexVal(idx[j]), IndexVal(off)))
            else:
                pos[pv] = _solve(idx[j], off, step, ind.shape[pvars.index(pv)], conds)
        return _all(conds), tuple(pos[pv] for pv in pvars) + tuple(idx[k:])

    return [_write(data, upd.fn, conds_of, reduction)]


def _numel(shape: Sequence[Poly]) -> Poly:
    out = Poly.of(1)
    for d in shape:
        out = out * d
    return out


def _require_in_range(off: Poly, step: int, extent: Poly | None, dim: Poly, what: str) -> None:
    """The written positions `off + step*p`, p in [0, extent) (or `off` alone), lie in [0, dim): onnxruntime fails
    the Run otherwise, so the kernel must fail it too rather than write out of bounds."""
    if extent is None:
        lo = hi = off
    else:
        last = off + (extent - 1) * step
        lo, hi = (off, last) if step > 0 else (last, off)
    L.require_le(Poly(), lo, f"{what} must not be negative", unless=extent)
    L.require_le(hi + 1, dim, f"{what} must be below the axis size", unless=extent)


def _normalise_index(e: Expr, dim: Poly, op: str) -> Expr:
    p = E.as_integer(e)
    if p is None or is_nonneg(p):
        return e
    if p.const is not None:
        return E.index_val(p + dim)
    raise Reject(f"{op} index of unknown sign")


def _scatter_elements(op: str, attrs: Attrs, args: Args, vals: Vals, n_out: int) -> list[Lazy]:
    try:
        return _scatter_elements_grid(op, attrs, args, vals, n_out)
    except Reject as why:
        data, upd = args[0], args[2]
        ind = vals[1].array() if vals[1] is not None else None
        reduction = str(attrs.get("reduction", "none"))
        axis = int(attrs.get("axis", 0))
        if ind is None or reduction not in ("none", *_REDUCE) or ind.ndim != data.rank or ind.ndim == 0 \
                or tuple(Poly.of(int(d)) for d in ind.shape) != upd.shape:
            raise why from None
        axis = _axis(axis, data.rank, op)
        shape = tuple(Poly.of(int(d)) for d in ind.shape)
        for n in range(data.rank):
            if n != axis:
                # onnxruntime checks the dims before it looks at any index, empty indices included
                L.require_le(shape[n], data.shape[n], f"{op} indices must not be larger than data on axis {n}")
        along = _const_indices(ind, data, [axis], op)
        grid = np.indices(ind.shape).reshape(ind.ndim, -1).T.copy()  # each update's own coordinates ...
        grid[:, axis] = along[:, 0]  # ... with the scattered axis replaced by its index
        return [_tabled_write(op, data, upd, grid, range(data.rank), lambda p, idx: L._unflat(p, shape), reduction)]


def _scatter_elements_grid(op: str, attrs: Attrs, args: Args, vals: Vals, n_out: int) -> list[Lazy]:
    data, upd = args[0], args[2]
    axis = _axis(int(attrs.get("axis", 0)), data.rank, op)
    reduction = str(attrs.get("reduction", "none"))
    if reduction not in ("none", *_REDUCE):
        raise Reject(f"ScatterElements reduction '{reduction}'")
    if vals[1] is None:
        raise Reject("ScatterElements indices are data-dependent")
    ind = vals[1].lazy()
    if ind.shape != upd.shape or ind.rank != data.rank:
        raise Reject("ScatterElements indices and updates shapes differ")
    pvars = [var(f"_p{n}", d) for n, d in enumerate(ind.shape)]
    e = _normalise_index(ind.fn(tuple(pvars)), data.shape[axis], op)
    others = [pv for n, pv in enumerate(pvars) if n != axis]
    (pv, off, step), = _affine_grid([e], [pvars[axis]], op)
    if any(a in (E.as_integer(e) or Poly()).atoms() for o in others if (a := o.atom()) is not None):
        raise Reject("ScatterElements indices depend on other axes")
    _require_in_range(off, step, ind.shape[axis] if pv is not None else None, data.shape[axis],
                      f"{op} indices on axis {axis}")
    for n in range(data.rank):
        if n != axis:
            # onnxruntime checks the dims before it looks at any index, empty indices included
            L.require_le(ind.shape[n], data.shape[n], f"{op} indices must not be larger than data on axis {n}")

    def conds_of(idx: tuple[Poly, ...]) -> tuple[Expr, tuple[Poly, ...]]:
        conds: list[Expr] = []
        pos = list(idx)
        for n in range(data.rank):
            if n == axis:
                if pv is None:
                    conds.append(E.binary("eq", IndexVal(idx[n]), IndexVal(off)))
                    pos[n] = Poly()
                else:
                    pos[n] = _solve(idx[n], off, step, ind.shape[axis], conds)
            elif ind.shape[n] != data.shape[n]:
                conds.append(E.binary("lt", IndexVal(idx[n]), IndexVal(ind.shape[n])))
        return _all(conds), tuple(pos)

    return [_write(data, upd.fn, conds_of, reduction)]


LOWER: dict[str, Callable[..., list[Lazy]]] = {
    **{op: _binary(name) for op, name in _BINARY.items()},
    **{op: _unary(name) for op, name in _UNARY.items()},
    "Mod": _mod, "Pow": _pow, "Where": _where, "Clip": _clip, "Cast": _cast, "LeakyRelu": _leaky_relu,
    "HardSigmoid": _hard_sigmoid, "Max": _variadic("max"), "Min": _variadic("min"), "Sum": _variadic("sum"),
    "Mean": _variadic("mean"),
    "Identity": _identity, "Reshape": _reshape, "Flatten": _flatten, "Squeeze": _squeeze,
    "Unsqueeze": _unsqueeze, "Transpose": _transpose, "Expand": _expand, "Tile": _tile, "Slice": _slice,
    "Gather": _gather, "GatherElements": _gather_elements, "Concat": _concat, "Split": _split, "Shape": _shape,
    "Size": _size,
    "ConstantOfShape": _constant_of_shape, "Range": _range, "ScatterND": _scatter_nd,
    "ScatterElements": _scatter_elements,
    "ReduceSum": _reducer("sum"), "ReduceMean": _reducer("mean"), "ReduceMax": _reducer("max"),
    "ReduceMin": _reducer("min"), "ReduceProd": _reducer("prod"), "ReduceL1": _reducer("l1"),
    "ReduceL2": _reducer("l2"), "ReduceSumSquare": _reducer("sumsquare"), "ReduceLogSum": _reducer("logsum"),
    "ReduceLogSumExp": _reducer("logsumexp"), "ArgMax": _arg_extreme("argmax"),
    "ArgMin": _arg_extreme("argmin"), "Softmax": _softmax(False), "LogSoftmax": _softmax(True),
}

# Inputs read only for their value at plan time (never loaded by a kernel): these edges do not tie a node to
# its producer in a fused group.
VALUE_INPUTS: dict[str, tuple[int, ...]] = {
    "Reshape": (1,), "Squeeze": (1,), "Unsqueeze": (1,), "Expand": (1,), "Tile": (1,), "Slice": (1, 2, 3, 4),
    "Gather": (1,), "GatherElements": (1,), "Split": (1,), "ConstantOfShape": (0,), "Range": (0, 1, 2), "Shape": (0,),
    "Size": (0,),
    "ScatterND": (1,), "ScatterElements": (1,), "ReduceSum": (1,), "ReduceMean": (1,), "ReduceMax": (1,),
    "ReduceMin": (1,), "ReduceProd": (1,), "ReduceL1": (1,), "ReduceL2": (1,), "ReduceSumSquare": (1,),
    "ReduceLogSum": (1,), "ReduceLogSumExp": (1,),
}

# Ops whose output elements each read many input elements (a group that recomputes them per consumer element
# pays that many times over).
REDUCTIONS = frozenset({"ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1", "ReduceL2",
                        "ReduceSumSquare", "ReduceLogSum", "ReduceLogSumExp", "ArgMax", "ArgMin", "Softmax",
                        "LogSoftmax"})

# Ops that onnxruntime runs without touching the data (aliases); a group made only of these gains nothing.
FREE_OPS = frozenset({"Identity", "Reshape", "Flatten", "Squeeze", "Unsqueeze", "Shape", "Size"})


def lower_node(op: str, attrs: Attrs, args: Sequence[Lazy | None], vals: Sequence[Value | None],
               n_out: int) -> list[Lazy]:
    f = LOWER.get(op)
    if f is None:
        raise Reject(f"{op} is not handled by evonnx")
    value_slots = VALUE_INPUTS.get(op, ())
    for k, a in enumerate(args):
        if a is not None and k not in value_slots:
            _check_dtype(a, op)
    if any(a is None for k, a in enumerate(args[:1])) and op not in ("ConstantOfShape",):
        raise Reject(f"{op} has no data input")
    try:
        return f(op, attrs, list(args), list(vals), n_out)
    except (ValueError, TypeError, KeyError, IndexError, ZeroDivisionError) as e:
        raise Reject(f"{op}: {e}") from e
