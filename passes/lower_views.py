"""Views and generators: ops that move or make elements without arithmetic on them (see lower_ops)."""

from __future__ import annotations

import math

import numpy as np

from evonnx import expr as E
from evonnx.index import Poly, floordiv, is_nonneg, pmax, pmin, product
from evonnx.passes import lazy as L
from evonnx.passes import lower_gathers as G
from evonnx.passes.lazy import Lazy, Reject
from evonnx.passes.lower_common import (
    BIG,
    Args,
    Attrs,
    MapKind,
    OpDef,
    Vals,
    attr_tensor,
    const_indices,
    const_ints,
    ints,
    norm_axis,
)


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
        axes = {norm_axis(a, x.rank, op) for a in const_ints(vals[1], "Squeeze axes")}
    elif "axes" in attrs:  # Squeeze-1 and -11: an attribute
        axes = {norm_axis(int(a), x.rank, op) for a in attrs["axes"]}
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
    given = (const_ints(vals[1], "Unsqueeze axes") if len(args) > 1 and args[1] is not None
             else [int(a) for a in attrs.get("axes", [])])  # Unsqueeze-1 and -11: an attribute
    rank = x.rank + len(given)
    axes = sorted(norm_axis(a, rank, op) for a in given)
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
        a = norm_axis(a, x.rank, op)
        start, length = _slice_bounds(x.shape[a], s, e, st)
        if abs(st) >= _HUGE_STEP:
            st = 1 if st > 0 else -1  # at most one element: see _slice_bounds
        if length == x.shape[a] and st == 1 and start.const == 0:
            continue
        out = L.slice_axis(out, a, start, length, st)
    return [out]


def _gather(op: str, attrs: Attrs, args: Args, vals: Vals, n_out: int) -> list[Lazy]:
    x = args[0]
    axis = norm_axis(int(attrs.get("axis", 0)), x.rank, op)
    ind = vals[1].array() if vals[1] is not None else None
    if ind is None:
        return [G.gather(op, x, axis, args[1])]
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
    x = args[0]
    axis = norm_axis(int(attrs.get("axis", 0)), x.rank, op)
    ind = vals[1].array() if vals[1] is not None else None
    if ind is None:
        return [G.gather_elements(op, x, axis, args[1])]
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
    along = const_indices(ind, x, [axis], op).reshape(ind.shape)
    if x.shape[axis].const is None:
        hi = int(along.max())
        L.require_le(Poly.of(hi + 1), x.shape[axis], f"GatherElements index {hi} must be below the size of axis {axis}")
    return [L.take_along(x, axis, along)]


def _concat(op: str, attrs: Attrs, args: Args, vals: Vals, n_out: int) -> list[Lazy]:
    xs = [a for a in args if a is not None]
    axis = norm_axis(int(attrs["axis"]), xs[0].rank, op)
    for x in xs[1:]:
        if x.rank != xs[0].rank or any(x.shape[k] != xs[0].shape[k] for k in range(x.rank) if k != axis):
            raise Reject("Concat inputs do not provably agree off the concat axis")
    return [L.concat(xs, axis)]


def _split(op: str, attrs: Attrs, args: Args, vals: Vals, n_out: int) -> list[Lazy]:
    x = args[0]
    axis = norm_axis(int(attrs.get("axis", 0)), x.rank, op)
    d = x.shape[axis]
    if len(args) > 1 and args[1] is not None:
        sizes = ints(vals[1], "Split sizes")
    elif "split" in attrs:  # Split-2 and -11: an attribute
        sizes = [Poly.of(int(v)) for v in attrs["split"]]
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
    arr = attr_tensor(value) if value is not None else np.zeros(1, np.float32)
    dtype = str(arr.dtype)
    if dtype not in E.STORED:
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
    # onnxruntime 1.31 counts the elements in double, ceil((double(limit) - double(start)) / delta): Range(-2^63,
    # 3 - 2^63) has no element there (the two bounds round to one double), Range(2^53, 2^53 + 3) has 4 (fuzz case
    # 71, seed 4245), and a count beyond int64 fails the Run. Exact integers agree with that wherever every bound
    # stays below 2^52 in magnitude at sizes up to 2^40.
    if start.const is not None and limit.const is not None:
        counted = math.ceil((float(limit.const) - float(start.const)) / float(step))
        if counted > 2**40:
            raise Reject("Range of more than 2^40 elements (onnxruntime fails it beyond int64)")
        n = Poly.of(max(0, counted))
    elif sum(abs(c) * 2 ** (40 * len(m)) for p in (start, limit) for m, c in p.terms) >= 2**52:
        raise Reject("Range bounds near 2^63 over a symbolic size (onnxruntime counts the elements in double)")
    return [L.Lazy(dtype, (n,), lambda idx: E.cast(E.index_val(start + idx[0] * step), dtype))]


_R, _B, _S = MapKind.REORGANIZE, MapKind.BROADCAST, MapKind.SHUFFLE
DEFS = [
    OpDef("Identity", _identity, _R, free=True), OpDef("Reshape", _reshape, _R, (1,), free=True),
    OpDef("Flatten", _flatten, _R, free=True), OpDef("Squeeze", _squeeze, _R, (1,), free=True),
    OpDef("Unsqueeze", _unsqueeze, _R, (1,), free=True), OpDef("Transpose", _transpose, _R),
    OpDef("Slice", _slice, _R, (1, 2, 3, 4)), OpDef("Concat", _concat, _R), OpDef("Split", _split, _R, (1,)),
    OpDef("Shape", _shape, _R, (0,), free=True, shape_only=True),
    OpDef("Size", _size, _R, (0,), free=True, shape_only=True),
    OpDef("Expand", _expand, _B, (1,)), OpDef("Tile", _tile, _B, (1,)), OpDef("Range", _range, _B, (0, 1, 2)),
    OpDef("ConstantOfShape", _constant_of_shape, _B, (0,), needs_data=False),
    # a Gather of one scalar index is a view (classify); indices of any other shape move elements
    OpDef("Gather", _gather, _S), OpDef("GatherElements", _gather_elements, _S),
]
