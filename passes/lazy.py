"""Lazy tensors: a tensor inside a fused group as a function from a multi-index to an element expression.

A `Lazy` either is a strided `View` of a kernel input (then reading it is one `Load` at `view.index(idx)`), or a
computed function. View ops on a viewed lazy try the `View` method first and fall back to composing index maps
(an index expression with floor-div/mod terms) when strides cannot express the result. Both give the same
elements; the view path keeps the record that kernels print and that `explain` shows.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, replace

import numpy as np

from evonnx.expr import (
    Const,
    Expr,
    IndexVal,
    Load,
    TableLoad,
    ValueTable,
    binary,
    const,
    guarded_where,
    index_val,
    where,
)
from evonnx.index import Poly, PolyLike, Table, floordiv, is_le, lookup, mod, pmax, pmin, product, var
from evonnx.records import SizeCheck
from evonnx.view import View

Index = tuple[Poly, ...]
ElementFn = Callable[[Index], Expr]

# Constants up to this many elements are baked into kernels; larger ones are passed as kernel inputs.
MAX_INLINE_CONST = 4096


class Reject(Exception):
    """A node evonnx leaves to onnxruntime, with the reason (shown by `evonnx explain`)."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


class RankQuirk(Reject):
    """A node left to onnxruntime whose result can have another rank than the model says at run time (a
    reduction with keepdims=0 and negative axes of an empty input): nothing downstream of it is fused."""


@dataclass(frozen=True)
class Lazy:
    dtype: str
    shape: tuple[Poly, ...]
    fn: ElementFn
    view: tuple[int, View] | None = None  # (input slot, view) when this is a strided view of an input
    # Axes along which every element is the same value, so that a broadcast may read them at 0: a reduced axis of
    # size 1, or of onnxruntime's input size on an empty input (see lower_reduce._empty_quirk).
    uniform: frozenset[int] = frozenset()
    # The shape onnxruntime gives this tensor where it has no element, when that one differs, rank included: a
    # reduction with keepdims=0 of axes written negatively and of static sizes keeps an empty input's shape
    # (lower_reduce._empty_shape). Nothing is fused after such a tensor (analyze: rank_quirk); a kernel gives the
    # shape as its output.
    empty_shape: tuple[Poly, ...] | None = None

    def __post_init__(self) -> None:
        # Element functions compose along chains that reconverge (a tensor read by two branches); memoizing by
        # index keeps evaluation linear in the graph size instead of exponential.
        inner = self.fn
        memo: dict[Index, Expr] = {}

        def fn(idx: Index) -> Expr:
            e = memo.get(idx)
            if e is None:
                e = memo[idx] = inner(idx)
            return e

        object.__setattr__(self, "fn", fn)

    @property
    def rank(self) -> int:
        return len(self.shape)

    def at(self, idx: Sequence[PolyLike]) -> Expr:
        return self.fn(tuple(Poly.of(i) for i in idx))


def source(slot: int, dtype: str, shape: Sequence[PolyLike], uniform: frozenset[int] = frozenset()) -> Lazy:
    """A kernel input read in row-major order (`uniform`: axes along which its values are all the same)."""
    x = from_view(slot, dtype, View.dense(shape))
    return replace(x, uniform=uniform) if uniform else x


def from_view(slot: int, dtype: str, view: View) -> Lazy:
    return Lazy(dtype, view.shape, lambda idx: Load(slot, view.index(idx), dtype), (slot, view))


def _flat(idx: Index, shape: Sequence[Poly]) -> Poly:
    out = Poly()
    for i, d in zip(idx, shape):
        out = out * d + i
    return out


def _unflat(flat: Poly, shape: Sequence[Poly]) -> Index:
    if any(d.const == 0 for d in shape):
        # A tensor with no elements: no index into it is ever evaluated (and dividing by its 0 would fail)
        return tuple(Poly() for _ in shape)
    out: list[Poly] = []
    rest = flat
    for k in range(len(shape) - 1, -1, -1):
        if k == 0:
            out.append(rest)
        else:
            out.append(mod(rest, shape[k]))
            rest = floordiv(rest, shape[k])
    return tuple(reversed(out))


@dataclass
class _Naming:
    tables: Iterator[int]
    vars: Iterator[int]


# The numbering of tables and reduction variables. A pipeline run (`naming()`, in `run_pipeline`) numbers from 0,
# so one model's kernels come out the same in every run of one process, and runs in two threads never share a
# counter. Lowering outside a run (a test or benchmark calling one pass alone) draws from one process-wide
# numbering: its names are unique, not reproducible.
_unscoped = _Naming(itertools.count(), itertools.count())
_naming: ContextVar[_Naming] = ContextVar("naming", default=_unscoped)


@contextmanager
def naming() -> Iterator[None]:
    """A numbering of its own for everything lowered inside (one pipeline run)."""
    token = _naming.set(_Naming(itertools.count(), itertools.count()))
    try:
        yield
    finally:
        _naming.reset(token)


def fresh_table_id() -> int:
    """A number for a new table's name, unique within one pipeline run."""
    return next(_naming.get().tables)


def fresh_var(extent: Poly) -> Poly:
    """A new loop variable for a reduction over `extent` elements."""
    return var(f"_r{next(_naming.get().vars)}", extent)


def constant(array: np.ndarray, dtype: str) -> Lazy:
    """A small constant: literals at constant indices, a baked-in table otherwise."""
    arr = np.array(array, order="C")
    shape = tuple(Poly.of(int(d)) for d in arr.shape)
    flat = arr.reshape(-1)
    if flat.size == 0:
        zero = const(0, dtype)  # no element is ever read
        return Lazy(dtype, shape, lambda idx: zero)
    if flat.size == 1:
        c = const(flat[0], dtype)
        return Lazy(dtype, shape, lambda idx: c)
    values = tuple(v.item() if isinstance(v, np.generic) else v for v in flat)
    if dtype == "int64" and _small_ints(values):
        # an arithmetic progression (e.g. the columns 0, 2 of a `[:, 0::2]` write) is an index expression;
        # differences in Python ints, so [INT64_MAX, INT64_MIN] is not taken for a step of 1 that wrapped
        steps = {int(b) - int(a) for a, b in zip(values, values[1:])}
        if len(steps) == 1:
            start, step = int(values[0]), steps.pop()
            return Lazy(dtype, shape, lambda idx: index_val(start + _flat(idx, shape) * step))
    grid = affine_constant(arr) if dtype == "int64" else None
    if grid is not None:
        return grid
    table = ValueTable(f"tab{fresh_table_id()}", dtype, values)

    def fn(idx: Index) -> Expr:
        pos = _flat(idx, shape)
        if pos.const is not None:
            return const(values[pos.const] if 0 <= pos.const < len(values) else 0, dtype)
        return TableLoad(table, pos, dtype)

    return Lazy(dtype, shape, fn)


# Index arithmetic on constants stays symbolic (Python ints) only well inside int64, so that no sum or product of
# it the kernel computes can overflow; larger constants are read from a table and computed with wrap-around.
INDEX_LIMIT = 1 << 40


def _small_ints(values: Sequence[object]) -> bool:
    return all(isinstance(v, int) and -INDEX_LIMIT < v < INDEX_LIMIT for v in values)


def affine_constant(array: np.ndarray) -> Lazy | None:
    """An integer constant whose every slice along the last axis is affine in the other indices (the index grids
    of static-shape slice-assignment exports, e.g. ScatterND indices [[i, 2*j] ...]) as index expressions, or None.
    Checked exactly against the array, whatever its size."""
    a = np.asarray(array)
    if a.dtype != np.int64 or a.ndim < 1 or a.size == 0 or not _small_ints((int(a.min()), int(a.max()))):
        return None
    lead = a.shape[:-1]
    fits: list[tuple[int, list[int]]] = []
    for j in range(a.shape[-1]):
        sub = a[..., j]
        base = int(sub[(0,) * len(lead)]) if lead else int(sub)
        coeffs = []
        grid = np.full(lead, base, dtype=np.int64)
        for k, n in enumerate(lead):
            step = 0
            if n > 1:
                at = [0] * len(lead)
                at[k] = 1
                step = int(sub[tuple(at)]) - base
            coeffs.append(step)
            shape_k = [1] * len(lead)
            shape_k[k] = n
            grid = grid + step * np.arange(n, dtype=np.int64).reshape(shape_k)
        if not np.array_equal(grid, sub):
            return None
        fits.append((base, coeffs))
    shape = tuple(Poly.of(int(d)) for d in a.shape)

    def fn(idx: Index) -> Expr:
        def value(j: int) -> Expr:
            base, coeffs = fits[j]
            return index_val(base + sum((c * i for c, i in zip(coeffs, idx[:-1])), Poly()))

        last = idx[-1]
        if last.const is not None:
            return value(last.const) if 0 <= last.const < len(fits) else const(0, "int64")
        out = value(len(fits) - 1)
        for j in range(len(fits) - 2, -1, -1):
            out = where(binary("eq", IndexVal(last), IndexVal(Poly.of(j))), value(j), out)
        return out

    return Lazy("int64", shape, fn)


def known(elements: Sequence[Expr], shape: Sequence[int], dtype: str) -> Lazy:
    """A small tensor whose elements are known expressions (constants or index values such as sizes)."""
    elems = tuple(elements)
    dims = tuple(Poly.of(d) for d in shape)
    if not elems:
        zero = const(0, dtype)  # an empty tensor: no element is ever read
        return Lazy(dtype, dims, lambda idx: zero)
    consts = [e for e in elems if isinstance(e, Const)]
    if len(consts) == len(elems) > 1:
        return constant(np.array([const(e.value, dtype).value for e in consts]).reshape(shape), dtype)

    def fn(idx: Index) -> Expr:
        pos = _flat(idx, dims)
        if pos.const is not None:
            # out of range only on a guarded branch that is never taken (see `guarded`)
            return elems[pos.const] if 0 <= pos.const < len(elems) else const(0, dtype)
        out = elems[-1]
        for k in range(len(elems) - 2, -1, -1):
            out = where(binary("eq", IndexVal(pos), IndexVal(Poly.of(k))), elems[k], out)
        return out

    return Lazy(dtype, dims, fn)


def guarded(cond: Expr, taken: Expr, other: Expr) -> Expr:
    """`cond ? taken : other` where `taken` may read out of range when `cond` is false (Concat's parts): code
    generation must evaluate it only under the condition, never hoist it."""
    return guarded_where(cond, taken, other)


# -- view-like transformations ----------------------------------------------------------------------------
def remap(x: Lazy, shape: Sequence[Poly], index_map: Callable[[Index], Index],
          view: tuple[int, View] | None = None) -> Lazy:
    """A lazy whose element at idx is x's element at index_map(idx)."""
    if view is not None:
        slot, v = view
        return from_view(slot, x.dtype, v)
    return Lazy(x.dtype, tuple(shape), lambda idx: x.fn(index_map(idx)))


def transpose(x: Lazy, perm: Sequence[int]) -> Lazy:
    inv = [0] * len(perm)
    for i, p in enumerate(perm):
        inv[p] = i
    v = (x.view[0], x.view[1].transpose(perm)) if x.view else None
    return remap(x, [x.shape[p] for p in perm], lambda idx: tuple(idx[inv[k]] for k in range(len(perm))), v)


def reshape(x: Lazy, shape: Sequence[Poly]) -> Lazy:
    shape = tuple(shape)
    if shape == x.shape:
        return x
    v = None
    if x.view:
        nv = x.view[1].reshape(shape)
        v = (x.view[0], nv) if nv is not None else None
    return remap(x, shape, lambda idx: _unflat(_flat(idx, shape), x.shape), v)


def slice_axis(x: Lazy, axis: int, start: Poly, length: Poly, step: int) -> Lazy:
    shape = list(x.shape)
    shape[axis] = length
    v = (x.view[0], x.view[1].slice(axis, start, length, step)) if x.view else None

    def m(idx: Index) -> Index:
        return idx[:axis] + (start + idx[axis] * step,) + idx[axis + 1:]

    return remap(x, shape, m, v)


def select(x: Lazy, axis: int, i: Poly) -> Lazy:
    v = (x.view[0], x.view[1].select(axis, i)) if x.view else None
    return remap(x, x.shape[:axis] + x.shape[axis + 1:], lambda idx: idx[:axis] + (i,) + idx[axis:], v)


def take(x: Lazy, axis: int, indices: np.ndarray) -> Lazy:
    """Gather along `axis` with constant, already normalised (non-negative, in-range) indices."""
    ind = indices.astype(np.int64)
    flat = ind.reshape(-1)
    out_shape = x.shape[:axis] + tuple(Poly.of(int(d)) for d in ind.shape) + x.shape[axis + 1:]
    r = ind.ndim
    ind_shape = tuple(Poly.of(int(d)) for d in ind.shape)
    steps = np.diff(flat)
    if flat.size >= 2 and np.all(steps == steps[0]):
        start, step = int(flat[0]), int(steps[0])

        def pick(pos: Poly) -> Poly:
            return start + pos * step
    else:
        table = Table(f"idx{fresh_table_id()}", tuple(int(v) for v in flat))

        def pick(pos: Poly) -> Poly:
            return lookup(table, pos)

    def m(idx: Index) -> Index:
        if flat.size == 0:  # no indices: an empty result, whose elements are never computed (fuzz case 2097)
            return idx[:axis] + (Poly(),) + idx[axis + r:]
        pos = _flat(idx[axis:axis + r], ind_shape) if r else Poly()
        return idx[:axis] + (pick(pos) if flat.size > 1 else Poly.of(int(flat[0])),) + idx[axis + r:]

    return remap(x, out_shape, m)


def take_along(x: Lazy, axis: int, indices: np.ndarray) -> Lazy:
    """GatherElements along `axis` with constant, already normalised (non-negative, in-range) indices of x's rank:
    out[i] = x[i with axis k replaced by indices[i]], of the indices' shape."""
    ind = indices.astype(np.int64)
    out_shape = tuple(Poly.of(int(d)) for d in ind.shape)
    table = Table(f"idx{fresh_table_id()}", tuple(int(v) for v in ind.reshape(-1)))

    def m(idx: Index) -> Index:
        pick = Poly.of(int(ind.reshape(-1)[0])) if ind.size == 1 else lookup(table, _flat(idx, out_shape))
        return idx[:axis] + (pick,) + idx[axis + 1:]

    return remap(x, out_shape, m)


def broadcast_to(x: Lazy, shape: Sequence[Poly]) -> Lazy:
    """numpy broadcasting of x to `shape` (right-aligned; size-1 axes repeat)."""
    shape = tuple(shape)
    if shape == x.shape:
        return x
    lead = len(shape) - x.rank
    # A size 1 repeats; a size equal to the target's is read as is; any other size broadcasts at run time (the
    # kernel checked that it is the target's or 1), and is read at min(i, size - 1): i, or 0 when it is 1.
    keep = [x.shape[k].const != 1 and k not in x.uniform for k in range(x.rank)]
    same = [x.shape[k] == shape[lead + k] for k in range(x.rank)]
    v = None
    if x.view and all(same[k] or x.shape[k].const == 1 for k in range(x.rank)):
        v = (x.view[0], x.view[1].expand(shape))

    def m(idx: Index) -> Index:
        return tuple(idx[lead + k] if same[k] else pmin(idx[lead + k], x.shape[k] - 1) if keep[k] else Poly()
                     for k in range(x.rank))

    return remap(x, shape, m, v)


# Size facts a kernel relies on and checks at run time (numpy broadcasting of two symbolic sizes neither of which
# is provably 1; constant indices within symbolic axes). `lower_groups` collects them per group; analysis alone
# discards them.
_checks: ContextVar[list[SizeCheck] | None] = ContextVar("checks", default=None)


@contextmanager
def collect_checks() -> Iterator[list[SizeCheck]]:
    found: list[SizeCheck] = []
    token = _checks.set(found)
    try:
        yield found
    finally:
        _checks.reset(token)


def require_le(lhs: Poly, rhs: Poly, why: str, unless: Poly | None = None) -> None:
    """Rely on `lhs <= rhs` (unless `unless` is 0): nothing when proven, a run-time check when it depends on
    sizes, and Reject when it is false for every size (onnxruntime fails that node on every run)."""
    lhs, rhs = Poly.of(lhs), Poly.of(rhs)
    if is_le(lhs, rhs) or (unless is not None and unless.const == 0):
        return
    diff = rhs - lhs
    if diff.const is not None and (unless is None or unless.const is not None):
        raise Reject(f"{why}: never holds")
    if diff.vars() or (unless is not None and unless.vars()):
        raise Reject(f"{why}: cannot be checked at run time")
    collected = _checks.get()
    if collected is not None:
        collected.append(SizeCheck("le", lhs, rhs, why, unless))


def broadcast_dim(a: Poly, b: Poly, what: str) -> Poly:
    """The ONNX (numpy) broadcast of two sizes: equal, or one of them 1. Sizes that are not provably 1 or equal
    broadcast at run time, as onnxruntime does: the result is `b` when `a` is 1, else `a` (written
    `max(a, b) * min(a, b, 1)`, which is that for every pair that broadcasts), and the kernel checks that the
    pair broadcasts before it touches memory."""
    if a == b or b.const == 1:
        return a
    if a.const == 1:
        return b
    if a.const is not None and b.const is not None:
        raise Reject(f"{what}: sizes {a.const} and {b.const} do not broadcast")
    collected = _checks.get()
    if collected is not None:
        collected.append(SizeCheck("bcast", a, b, what))
    if b in _BROADCAST_OF.get(a, ()):
        return a
    if a in _BROADCAST_OF.get(b, ()):
        return b
    if b.const is not None:
        a, b = b, a
    if a.const is not None:
        # a constant c != 1 against a size that must be c or 1: the result is c
        return a
    out = pmax(a, b) * pmin(pmin(a, b), Poly.of(1))
    # broadcasting the result against a or b again gives the result (the pair was checked): chains of elementwise
    # ops over the same two sizes keep one size instead of nesting
    _BROADCAST_OF[out] = _BROADCAST_OF.get(a, frozenset()) | _BROADCAST_OF.get(b, frozenset()) | {a, b}
    return out


_BROADCAST_OF: dict[Poly, frozenset[Poly]] = {}  # broadcast size -> the sizes it is the broadcast of


def broadcast_shapes(shapes: Sequence[Sequence[Poly]], what: str) -> tuple[Poly, ...]:
    rank = max(len(s) for s in shapes)
    out: list[Poly] = []
    for k in range(rank):
        dims = list(dict.fromkeys(s[len(s) - rank + k] for s in shapes if len(s) - rank + k >= 0))
        dims = [d for d in dims if d.const != 1]
        consts = {d.const for d in dims if d.const is not None}
        if len(consts) > 1:
            raise Reject(f"{what}: sizes {sorted(consts)} do not broadcast")
        # a constant first, so that symbolic sizes are checked against it and the result stays constant
        dims.sort(key=lambda d: d.const is None)
        result = dims[0] if dims else Poly.of(1)
        for d in dims[1:]:
            result = broadcast_dim(result, d, what)
        out.append(result)
    return tuple(out)


def concat(xs: Sequence[Lazy], axis: int) -> Lazy:
    parts = [x for x in xs if x.shape[axis].const != 0]
    if not parts:
        parts = [xs[0]]
    offsets = [Poly()]
    for x in parts:
        offsets.append(offsets[-1] + x.shape[axis])
    shape = parts[0].shape[:axis] + (offsets[-1],) + parts[0].shape[axis + 1:]

    def fn(idx: Index) -> Expr:
        i = idx[axis]
        pending: list[tuple[Expr, Expr]] = []
        out: Expr | None = None
        for k, part in enumerate(parts):
            local = idx[:axis] + (i - offsets[k],) + idx[axis + 1:]
            if k == len(parts) - 1:
                out = part.fn(local)
                break
            cond = binary("lt", IndexVal(i), IndexVal(offsets[k + 1]))
            if isinstance(cond, Const):
                if cond.value:
                    out = part.fn(local)
                    break
                continue
            pending.append((cond, part.fn(local)))
        assert out is not None
        for cond, here in reversed(pending):
            out = guarded(cond, here, out)
        return out

    return Lazy(parts[0].dtype, shape, fn)


def tile(x: Lazy, repeats: Sequence[Poly]) -> Lazy:
    shape = tuple(d * r for d, r in zip(x.shape, repeats))
    # along an axis of size 0 the result is empty too, and its index is read only by loops that run no iteration
    # (an ArgMax over it; fuzz case 1954 of the long run on 3aea3f4 divided by 0 at plan time): index 0 there
    return remap(x, shape, lambda idx: tuple(Poly() if d.const == 0 else mod(i, d) for i, d in zip(idx, x.shape)))


def elementwise(xs: Sequence[Lazy], combine: Callable[..., Expr], dtype: str, what: str) -> Lazy:
    shape = broadcast_shapes([x.shape for x in xs], what)
    bs = [broadcast_to(x, shape) for x in xs]
    # an output axis along which every input is uniform (or of size 1) is uniform too
    uniform = frozenset(k for k in range(len(shape)) if all(
        (j := k - len(shape) + x.rank) < 0 or j in x.uniform or x.shape[j].const == 1 for x in xs)
        and any((j := k - len(shape) + x.rank) >= 0 and j in x.uniform for x in xs))
    return Lazy(dtype, shape, lambda idx: combine(*(b.fn(idx) for b in bs)), uniform=uniform)


def numel(x: Lazy) -> Poly:
    return product(x.shape)
