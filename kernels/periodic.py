"""Periodic loop variables (issue 12): an element read through `fmod(v + k, n)` or `fdiv(v + k, n)` with small
constant n repeats with period n along v. `schedule` splits such a v into (q, r) with r < n unrolled, where the
remainders are constants, instead of splitting it into pieces at the remainders' wrap points."""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from evonnx.expr import Expr, IndexVal, Load, TableLoad, walk
from evonnx.index import Atom, FloorDiv, Max, Min, Mod, Poly, Var, floordiv

# Loops of at most this many iterations are unrolled (a box's 4 coordinates, 3 anchors), and so periods up to it.
MAX_UNROLL = 8


def periods(e: Expr, vars_: Sequence[Var]) -> dict[Var, int]:
    """Loop variables `v` that `e` reads through `fmod(v + k, n)` or `fdiv(v + k, n)` (constants k and n, 2 <= n
    <= MAX_UNROLL) where n divides v's extent: the element is periodic in v, as in a strided slice assignment
    (`boxes[:, 1::4] = ...`, a ScatterND at index grids of step 4) or coordinates interleaved by a flattening
    Reshape. Such a v is split into pieces only at points in phase with n (a Concat of levels whose sizes n
    divides), not at its remainders' wrap points or a strided slice's first and last element (single elements near
    the ends, then one piece with a select per element): `schedule._split_axes` splits each piece's v into (q, r) with
    r < n unrolled, where every such condition is a constant and folds."""
    found: dict[Var, set[int]] = {}
    seen: set[Atom] = set()  # an atom nested in many places is looked at once
    for x in walk(e):
        for p in _polys(x):
            for a in _nested(p, seen):
                if not isinstance(a, (FloorDiv, Mod)) or (n := a.den.const) is None or not 2 <= n <= MAX_UNROLL:
                    continue
                vs = [v for v in vars_ if v in a.num.atoms()]
                if len(vs) != 1 or (a.num - Poly.of(vs[0])).const is None:
                    continue
                found.setdefault(vs[0], set()).add(n)
    out: dict[Var, int] = {}
    for v, ns in found.items():
        n = max(ns)
        if all(n % m == 0 for m in ns) and divides(n, v.extent):
            out[v] = n
    return out


def divides(n: int, extent: Poly) -> bool:
    """Whether n divides `extent` (a size or a split point) for every value of its symbols."""
    q = floordiv(extent, n)
    return q * n == extent and not isinstance(q.atom(), FloorDiv)


def _nested(p: Poly, seen: set[Atom]) -> Iterator[Atom]:
    """The atoms of `p`, and those inside its divisions, remainders, minima and maxima, but those in `seen` (which
    it adds to)."""
    stack = list(p.atoms())
    while stack:
        a = stack.pop()
        if a in seen:
            continue
        seen.add(a)
        yield a
        if isinstance(a, (FloorDiv, Mod)):
            stack.extend(a.num.atoms())
            stack.extend(a.den.atoms())
        elif isinstance(a, (Min, Max)):
            stack.extend(a.a.atoms())
            stack.extend(a.b.atoms())


def offset_var(num: Poly, loops: Sequence[Poly]) -> Var | None:
    """The loop variable v when `num` is v or v + k for a constant k (fdiv(v + k, D) with v = q*D + r is
    q + fdiv(r + k, D)), else None."""
    v = num.atom()
    if v is None:
        vs = [a for a in num.atoms() if isinstance(a, Var) and Poly.of(a) in loops]
        if len(vs) != 1 or (num - Poly.of(vs[0])).const is None:
            return None
        v = vs[0]
    return v if isinstance(v, Var) and Poly.of(v) in loops else None


def _polys(x: Expr) -> list[Poly]:
    if isinstance(x, (Load, TableLoad)):
        return [x.index]
    if isinstance(x, IndexVal):
        return [x.poly]
    return []
