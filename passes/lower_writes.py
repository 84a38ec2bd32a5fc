"""Writes through views: ScatterND and ScatterElements as lazy element functions (see lower_ops)."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np

from evonnx import expr as E
from evonnx.expr import Const, Expr, IndexVal
from evonnx.index import Poly, Table, floordiv, is_nonneg, lookup, mod, pmin, product, var
from evonnx.passes import lazy as L
from evonnx.passes.lazy import Lazy, Reject
from evonnx.passes.lower_common import Args, Attrs, Handler, MapKind, OpDef, Vals, const_indices, norm_axis

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
    n = L.fresh_table_id()
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


def _grid_else_tables(grid: Handler, tables: Callable[[str, Attrs, Lazy, Lazy, np.ndarray, str], Lazy | None]
                      ) -> Handler:
    """A scatter lowered as an affine grid where its constant indices form one, else through tables of them
    (`tables`, given data, updates, the indices and the reduction; None where its shapes do not fit). Where
    neither applies, the grid's reason is the one reported."""

    def lower(op: str, attrs: Attrs, args: Args, vals: Vals, n_out: int) -> list[Lazy]:
        try:
            return grid(op, attrs, args, vals, n_out)
        except Reject as why:
            ind = vals[1].array() if vals[1] is not None else None
            reduction = str(attrs.get("reduction", "none"))
            if ind is None or reduction not in ("none", *_REDUCE):
                raise why from None
            out = tables(op, attrs, args[0], args[2], ind, reduction)
            if out is None:
                raise why from None
            return [out]

    return lower


def _scatter_nd_tables(op: str, attrs: Attrs, data: Lazy, upd: Lazy, ind: np.ndarray, reduction: str) -> Lazy | None:
    if ind.ndim < 1 or not 1 <= ind.shape[-1] <= data.rank:
        return None
    k = int(ind.shape[-1])
    rows = tuple(Poly.of(int(d)) for d in ind.shape[:-1])
    if upd.shape != rows + tuple(data.shape[k:]):
        return None
    targets = const_indices(ind, data, range(k), op)
    return _tabled_write(op, data, upd, targets, range(k), lambda p, idx: L._unflat(p, rows) + tuple(idx[k:]),
                         reduction)


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
                          f"{op} indices on axis {j}", product(ind.shape[:-1]))

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


def _require_in_range(off: Poly, step: int, extent: Poly | None, dim: Poly, what: str, count: Poly) -> None:
    """The written positions `off + step*p`, p in [0, extent) (or `off` alone), lie in [0, dim): onnxruntime fails
    the Run otherwise, so the kernel must fail it too rather than write out of bounds. Nothing is written, and
    nothing checked, where the indices hold `count` = 0 elements: an empty axis of theirs other than this one
    (fuzz case 2273 of seed 7000052: indices [1, 1, 0] into data of 0 rows) as well as this one."""
    if extent is None:
        lo = hi = off
    else:
        last = off + (extent - 1) * step
        lo, hi = (off, last) if step > 0 else (last, off)
    L.require_le(Poly(), lo, f"{what} must not be negative", unless=count)
    L.require_le(hi + 1, dim, f"{what} must be below the axis size", unless=count)


def _normalise_index(e: Expr, dim: Poly, op: str) -> Expr:
    p = E.as_integer(e)
    if p is None or is_nonneg(p):
        return e
    if p.const is not None:
        return E.index_val(p + dim)
    raise Reject(f"{op} index of unknown sign")


def _scatter_elements_tables(op: str, attrs: Attrs, data: Lazy, upd: Lazy, ind: np.ndarray, reduction: str
                             ) -> Lazy | None:
    if ind.ndim != data.rank or ind.ndim == 0 or tuple(Poly.of(int(d)) for d in ind.shape) != upd.shape:
        return None
    axis = norm_axis(int(attrs.get("axis", 0)), data.rank, op)
    shape = tuple(Poly.of(int(d)) for d in ind.shape)
    for n in range(data.rank):
        if n != axis:
            # onnxruntime checks the dims before it looks at any index, empty indices included
            L.require_le(shape[n], data.shape[n], f"{op} indices must not be larger than data on axis {n}")
    along = const_indices(ind, data, [axis], op)
    grid = np.indices(ind.shape).reshape(ind.ndim, -1).T.copy()  # each update's own coordinates ...
    grid[:, axis] = along[:, 0]  # ... with the scattered axis replaced by its index
    return _tabled_write(op, data, upd, grid, range(data.rank), lambda p, idx: L._unflat(p, shape), reduction)


def _scatter_elements_grid(op: str, attrs: Attrs, args: Args, vals: Vals, n_out: int) -> list[Lazy]:
    data, upd = args[0], args[2]
    axis = norm_axis(int(attrs.get("axis", 0)), data.rank, op)
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
                      f"{op} indices on axis {axis}", product(ind.shape))
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


DEFS = [
    OpDef("ScatterND", _grid_else_tables(_scatter_nd_grid, _scatter_nd_tables), MapKind.SHUFFLE, (1,), writes=True),
    OpDef("ScatterElements", _grid_else_tables(_scatter_elements_grid, _scatter_elements_tables), MapKind.SHUFFLE,
          (1,), writes=True),
]
