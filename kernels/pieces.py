"""The pieces an output's iteration space splits into (`pieces`), shared by the CPU and CUDA printers through
`schedule.piece_loops`: intervals of each axis between the loop positions where a select of the element expression
changes branch (Concat boundaries, YOLO's x/y against w/h, objectness against classes), refined once each piece's
own bounds simplify its conditions, and merged again where a split changed nothing inside the union."""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from evonnx.errors import InternalError
from evonnx.expr import COMPARE, Const, Expr, IndexVal, Op, substitute, walk
from evonnx.index import Atom, Mod, Poly, Var, is_le, subs, var
from evonnx.kernels.periodic import MAX_UNROLL, divides, periods
from evonnx.records import KernelOutput

MAX_PIECES = 64


def _split_points(e: Expr, vars_: Sequence[Var], unrolled: Sequence[Var] = (),
                  period: Mapping[Var, int] | None = None) -> dict[Var, set[Poly]]:
    """Loop positions where a select on a single loop index changes branch.

    A condition may also name the `unrolled` axes (the small last axis, unrolled per element): it is taken at each
    of their values. And its loop index may sit inside a remainder, `fmod(v + k, n)` with constants k and n (a
    Concat of coordinates read through a flattened index): the wrap points (v + k crossing 0 or n) split too, and
    the comparison's point is taken on each side of the wrap."""
    out: dict[Var, set[Poly]] = {}
    comparisons: list[Op] = []
    for x in walk(e):
        if isinstance(x, Op) and x.op == "where" and isinstance(x.args[0], Op):
            stack: list[Expr] = [x.args[0]]
            while stack:
                c = stack.pop()
                if isinstance(c, Op) and c.op == "and":
                    stack.extend(c.args)
                elif isinstance(c, Op):
                    comparisons.append(c)
    small = [u for u in unrolled if u.extent.const is not None]
    values = list(itertools.product(*(range(int(u.extent.const or 0)) for u in small)))
    if len(values) > MAX_UNROLL_COMBOS:
        values = [()]
        small = []
    for cond in comparisons:
        if cond.op not in COMPARE or not all(isinstance(a, IndexVal | Const) for a in cond.args):
            continue
        diff0 = _index(cond.args[0]) - _index(cond.args[1])
        for vals in values:
            try:
                diff = subs(diff0, dict(zip(small, (Poly.of(c) for c in vals)))) if small else diff0
            except (InternalError, ZeroDivisionError):
                # the condition reads out of range at this value (a table position, a divisor of 0): it sits in a
                # branch not taken there, and says nothing about where to split
                continue
            for v, point, coeff in _linear_points(diff, vars_):
                shift = {"lt": 0, "ge": 0, "le": 1, "gt": 1, "eq": 0}[cond.op] if coeff == 1 else (
                    {"lt": 1, "ge": 1, "le": 0, "gt": 0, "eq": 0}[cond.op])
                found = {point + shift} | ({point + 1} if cond.op == "eq" else set())
                if period and v in period and v is vars_[-1]:
                    # only points in phase with v's period, never a remainder's wrap points (`periodic.periods`):
                    # the innermost v's remainder is unrolled; an outer one's is a loop, whose selects are split
                    if any(isinstance(a, Mod) for a in diff.atoms()):
                        continue
                    found = {p for p in found if divides(period[v], p)}
                out.setdefault(v, set()).update(found)
    return out


# Combinations of unrolled values a select's condition is taken at (`_split_points`).
MAX_UNROLL_COMBOS = 64


def _linear_points(diff: Poly, vars_: Sequence[Var]) -> list[tuple[Var, Poly, int]]:
    """(v, point, coefficient) where `diff`, linear in one loop variable v with coefficient +-1 (or with v inside
    one `fmod(v + k, n)` of constants, either side of its wrap), is zero; [] otherwise."""
    vs = [v for v in vars_ if v in diff.atoms()]
    if len(vs) != 1:
        return []
    v = vs[0]
    coeff = diff.coefficient(v)
    if coeff is not None and coeff.const in (1, -1):
        rest = diff - Poly.of(v) * coeff.const
        if rest.vars():
            return []
        return [(v, -rest if coeff.const == 1 else rest, coeff.const)]
    mods = [a for a in diff.atoms() if isinstance(a, Mod) and v in a.num.atoms()]
    if len(mods) != 1 or mods[0].den.const is None or mods[0].den.const <= 0:
        return []
    m = mods[0]
    n = m.den.const
    inner = m.num.coefficient(v)
    k = m.num - Poly.of(v) * (inner.const if inner is not None and inner.const is not None else 0)
    c = diff.coefficient(m)
    if n is None or inner is None or inner.const != 1 or k.const is None or c is None or c.const not in (1, -1):
        return []
    rest = diff - Poly.of(m) * c.const
    if rest.vars() or rest.const is None:
        return []
    kc, cc, rc = k.const, int(c.const), rest.const
    out: list[tuple[Var, Poly, int]] = []
    for wrap in range(-1, 2):  # fmod(v + k, n) = v + k - wrap*n between the wrap points
        # c*(v + k - wrap*n) + rest == 0
        out.append((v, Poly.of(wrap * n - kc - cc * rc), cc))
        out.append((v, Poly.of(wrap * n - kc), 1))  # where v + k crosses wrap*n (a boundary, "ge" side)
    return out


def _index(e: Expr) -> Poly:
    return e.poly if isinstance(e, IndexVal) else Poly.of(int(e.value))  # type: ignore[attr-defined]


def _intervals(v: Var, points: set[Poly]) -> list[tuple[Poly, Poly]]:
    inside = [p for p in points if is_le(0, p) and is_le(p, v.extent) and p.const != 0 and p != v.extent]
    try:
        ordered = sorted(set(inside), key=lambda p: _Order(p))
    except _Unordered:
        return [(Poly(), v.extent)]
    bounds = [Poly()] + ordered + [v.extent]
    return [(a, b) for a, b in zip(bounds, bounds[1:]) if a != b]


class _Unordered(Exception):
    pass


class _Order:
    def __init__(self, p: Poly):
        self.p = p

    def __lt__(self, other: _Order) -> bool:
        # Not strictly: Concat parts can be empty (sizes may be 0), and an empty piece runs no iteration. (Asking
        # for p + 1 <= q kept every symbolic Concat in one piece since proofs take sizes >= 0: yolo_decode then
        # divided per element, 8x slower.)
        if self.p != other.p and is_le(self.p, other.p):
            return True
        if is_le(other.p, self.p):
            return False
        raise _Unordered


@dataclass
class Piece:
    ranges: tuple[tuple[Poly, Poly], ...]  # per original axis: [lo, hi)


def _trailing_unrolled(axes: Sequence[Var]) -> list[Var]:
    """Of loops `axes` (outermost first), the trailing ones code generation unrolls (codegen_c._add_task): constant
    extents whose product is at most MAX_UNROLL. A small axis before a long one is a loop: a select on it is split
    into pieces, not left to each element (ultralytics' box rows, x/y against w/h, over 8400 anchors)."""
    out: list[Var] = []
    width = 1
    for a in reversed(axes):
        n = a.extent.const
        if n is None or width * n > MAX_UNROLL:
            break
        out.append(a)
        width *= n
    return out


def pieces(o: KernelOutput) -> list[Piece]:
    vars_ = [a for p in o.index if (a := p.atom()) is not None and isinstance(a, Var)]
    unrolled = _trailing_unrolled([a for a in vars_ if a.extent.const != 1])
    points = _split_points(o.expr, vars_, unrolled, periods(o.expr, vars_))
    per_axis: list[list[tuple[Poly, Poly]]] = []
    for k, p in enumerate(o.index):
        v = p.atom()
        small = v in unrolled  # unrolled instead
        if isinstance(v, Var) and v in points and not small:
            per_axis.append(_intervals(v, points[v]))
        else:
            per_axis.append([(Poly(), o.shape[k])])
    combos = list(itertools.product(*per_axis))
    if len(combos) > MAX_PIECES:
        combos = [tuple((Poly(), d) for d in o.shape)]
    refined = [r for c in combos for r in _refine(o, tuple(c), REFINE_DEPTH)]
    return [Piece(c) for c in _merge_neighbours(o, refined if len(refined) <= MAX_PIECES else combos)]


def _merge_neighbours(o: KernelOutput, ranges: list[tuple[tuple[Poly, Poly], ...]]
                      ) -> list[tuple[tuple[Poly, Poly], ...]]:
    """`ranges` with two pieces that meet along one axis (the same ranges on every other) made one wherever no
    select of the element expression changes branch inside the union. A condition inside a branch splits the axis
    everywhere, also where that branch is never taken: ultralytics' pose head reads the keypoints' (x, y, visible)
    period of 3 as `fmod(c - 5, 3) < 2` only past channel 5, and its points cut the box rows [0:2] into [0:1] and
    [1:2]; as single rows they joined the visibility rows' task, apart from [2:4], and the DFL Softmax each box row
    reads ran in two tasks (2x its work)."""
    out = list(ranges)
    whole: dict[tuple[tuple[tuple[Poly, Poly], ...], int], bool] = {}  # a union refused is not substituted again
    merged = True
    while merged:
        merged = False
        for i, a in enumerate(out):
            for j, b in enumerate(out):
                axes = [k for k in range(len(a)) if a[k] != b[k]]
                if i == j or len(axes) != 1 or a[axes[0]][1] != b[axes[0]][0]:
                    continue
                k = axes[0]
                union = a[:k] + ((a[k][0], b[k][1]),) + a[k + 1:]
                if (union, k) not in whole:
                    whole[union, k] = _whole(o, union, k)
                if whole[union, k]:
                    out[i] = union
                    del out[j]
                    merged = True
                    break
            if merged:
                break
    return out


def _whole(o: KernelOutput, ranges: tuple[tuple[Poly, Poly], ...], axis: int) -> bool:
    """Whether no select of `o`'s expression, over the piece `ranges`, changes branch inside it along `axis`."""
    mapping, local = piece_vars(o, ranges)
    a = local.get(axis)
    if a is None:
        return True
    try:
        expr = substitute(o.expr, mapping)
    except (InternalError, ZeroDivisionError):
        return False
    new_vars = list(local.values())
    # `axis` split as it was before: taken as a loop, its conditions at each value of the unrolled axes after it
    unrolled = [u for u in _trailing_unrolled([local[k] for k in sorted(local)]) if u is not a]
    points = _split_points(expr, new_vars, unrolled, periods(expr, new_vars))
    return a not in points or len(_intervals(a, points[a])) == 1


# Rounds of `_refine` per piece.
REFINE_DEPTH = 2


def _refine(o: KernelOutput, ranges: tuple[tuple[Poly, Poly], ...], depth: int
            ) -> list[tuple[tuple[Poly, Poly], ...]]:
    """`ranges` split again where a select changes branch once the piece's own bounds simplify its conditions: a
    Concat of a YOLOX head reads `fmod(fdiv(i1, 6400) + i2, 85) < 5`, which is `i2 < 5` only where i1 < 6400, so
    the first split (at the levels along i1) makes the second (objectness against classes along i2) visible."""
    if depth <= 0:
        return [ranges]
    mapping, local = piece_vars(o, ranges)
    try:
        expr = substitute(o.expr, mapping)
    except (InternalError, ZeroDivisionError):
        return [ranges]
    unrolled = _trailing_unrolled([local[k] for k in sorted(local)])
    points = _split_points(expr, list(local.values()), unrolled, periods(expr, list(local.values())))
    per_axis: list[list[tuple[Poly, Poly]]] = []
    split = False
    for k, (lo, hi) in enumerate(ranges):
        a = local.get(k)
        if a is None or a not in points or a in unrolled:
            per_axis.append([(lo, hi)])
            continue
        parts = [(lo + x, lo + y) for x, y in _intervals(a, points[a])]
        split = split or len(parts) > 1
        per_axis.append(parts)
    if not split:
        return [ranges]
    return [r for c in itertools.product(*per_axis) for r in _refine(o, tuple(c), depth - 1)]


def piece_vars(o: KernelOutput, ranges: Sequence[tuple[Poly, Poly]]) -> tuple[dict[Atom, Poly], dict[int, Var]]:
    """Each axis variable of `o` as `a<k> + lo` over its piece's range [lo, hi), and the new variables of the axes
    whose range is longer than one element, by axis."""
    mapping: dict[Atom, Poly] = {}
    local: dict[int, Var] = {}
    for k, p in enumerate(o.index):
        v = p.atom()
        if not isinstance(v, Var):
            continue
        lo, hi = ranges[k]
        nv = var(f"a{k}", hi - lo)
        mapping[v] = nv + lo
        if isinstance(a := nv.atom(), Var):
            local[k] = a
    return mapping, local

