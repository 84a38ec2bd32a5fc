"""The loop schedule both kernel printers share (issue 13): for each output, the pieces its iteration space
splits into at Concat boundaries, each piece's loops with the element expression in their terms, the
subexpressions that become temporaries, and the tables an expression reads. `codegen_c` and `codegen_cuda`
only print them."""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, replace

from evonnx.errors import InternalError
from evonnx.expr import (
    COMPARE,
    Const,
    Expr,
    IndexVal,
    Load,
    Op,
    Picked,
    Reduce,
    TableLoad,
    ValueTable,
    children,
    free_vars,
    substitute,
    walk,
)
from evonnx.index import (
    Atom,
    FloorDiv,
    Lookup,
    Max,
    Min,
    Mod,
    Poly,
    PolyLike,
    Sym,
    Table,
    Var,
    floordiv,
    is_le,
    subs,
    var,
)
from evonnx.kernels.periodic import MAX_UNROLL, divides, offset_var, periods
from evonnx.records import KernelOutput
from evonnx.view import View

MAX_PIECES = 64


_MAX_DEPTH = 12  # operations in one C expression before a temporary


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
    return [Piece(c) for c in (refined if len(refined) <= MAX_PIECES else combos)]


# Rounds of `_refine` per piece.
REFINE_DEPTH = 2


def _refine(o: KernelOutput, ranges: tuple[tuple[Poly, Poly], ...], depth: int
            ) -> list[tuple[tuple[Poly, Poly], ...]]:
    """`ranges` split again where a select changes branch once the piece's own bounds simplify its conditions: a
    Concat of a YOLOX head reads `fmod(fdiv(i1, 6400) + i2, 85) < 5`, which is `i2 < 5` only where i1 < 6400, so
    the first split (at the levels along i1) makes the second (objectness against classes along i2) visible."""
    if depth <= 0:
        return [ranges]
    mapping, local = _piece_vars(o, ranges)
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


def _piece_vars(o: KernelOutput, ranges: Sequence[tuple[Poly, Poly]]) -> tuple[dict[Atom, Poly], dict[int, Var]]:
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


def piece_loops(o: KernelOutput, ranges: Sequence[tuple[Poly, Poly]],
                out_view: View) -> tuple[list[Poly], Expr, Poly]:
    """The loops of one piece, outermost first, with the element expression and the store position in their
    terms: one loop per axis of extent > 1, then split where the expression divides them (`_split_axes`).
    Shared by the CPU and CUDA generators."""
    mapping, local = _piece_vars(o, ranges)
    loops = [Poly.of(a) for _, a in sorted(local.items())]
    expr = substitute(o.expr, mapping)
    pos = subs(out_view.index(o.index), mapping)
    return _split_axes(loops, expr, pos)


def nonempty_view(o: KernelOutput) -> KernelOutput:
    """`o` as its loops see it: with the `_nonempty_facts` folded into its shape and expression. Where every size
    symbol among its dims is at least 1 these are its real shape and values; where one is 0, so is the product of
    the folded dims (that symbol is one of them), and no loop runs."""
    facts = _nonempty_facts(o, o.expr, Poly())
    if not facts:
        return o
    shape = tuple(subs(d, facts) for d in o.shape)
    # the loop variables get the folded extents too (their bounds simplify the reads: min(i, 5) with i < 6 is i)
    index = tuple(var(f"i{k}", d) if isinstance(p.atom(), Var) else p for k, (p, d) in enumerate(zip(o.index, shape)))
    renamed: dict[Atom, PolyLike] = {a: q for p, q in zip(o.index, index) if isinstance(a := p.atom(), Var)}
    return replace(o, shape=shape, index=index, expr=substitute(substitute(o.expr, facts), renamed))


def _nonempty_facts(o: KernelOutput, expr: Expr, pos: Poly) -> dict[Atom, Poly]:
    """`min(P, 1)` atoms that are 1 wherever an element of `o` is computed: a piece runs only when the output is
    not empty, so each symbol that is an output dim is at least 1 there, and so is a sum of products of them with
    coefficients >= 1. (onnxruntime's shapes for empty reductions, lower_reduce._empty_quirk, hold such atoms; in the
    loops they fold away and leave the plain index.)"""
    positive = {a for d in o.shape if isinstance(a := d.atom(), Sym)}
    if not positive:
        return {}
    found: dict[Atom, Poly] = {}
    seen: set[Atom] = set()

    def at_least_one(p: Poly) -> bool:
        return bool(p.terms) and all(c >= 1 and all(a in positive for a in mono) for mono, c in p.terms)

    def visit(p: Poly) -> None:
        for mono, _ in p.terms:
            for a in mono:
                if a in seen:
                    continue
                seen.add(a)
                if isinstance(a, (Min, Max)):
                    if isinstance(a, Min) and ((a.b.const == 1 and at_least_one(a.a)) or
                                               (a.a.const == 1 and at_least_one(a.b))):
                        found[a] = Poly.of(1)
                    visit(a.a)
                    visit(a.b)
                elif isinstance(a, (FloorDiv, Mod)):
                    visit(a.num)
                    visit(a.den)
                elif isinstance(a, Var):
                    visit(a.extent)
                elif isinstance(a, Lookup):
                    visit(a.index)

    for x in walk(expr):
        for p in polys(x):  # a Reduce's var (its extent) among them
            visit(p)
    visit(pos)
    for d in o.shape:
        visit(d)
    return found


def deep_walk(e: Expr) -> list[Expr]:
    """Every subexpression of `e` and of the run-time positions its indices read (`Picked` values, at any depth),
    each once: what a kernel computes for `e`. A float16 Cast inside a GatherND's index computation is one (fuzz
    case 7719: the prelude left evo_f2h undefined, and the library did not link)."""
    out: dict[Expr, None] = {}
    stack = [e]
    while stack:
        for x in walk(stack.pop()):
            if x not in out:
                out[x] = None
                stack.extend(a.value for p in polys(x) for a in p.atoms() if isinstance(a, Picked))
    return list(out)


def tables_in(e: Expr) -> Iterator[Table | ValueTable]:
    """The constant tables `e` reads: value tables and index lookup tables (shared by both generators)."""
    for x in walk(e):
        if isinstance(x, TableLoad):
            yield x.table
        for p in polys(x):
            for a in p.atoms():
                if isinstance(a, Lookup):
                    yield a.table
                elif isinstance(a, Picked):  # an index read at run time, perhaps from a table
                    yield from tables_in(a.value)


def loop_var(p: Poly) -> Var:
    v = p.atom()
    assert isinstance(v, Var), p
    return v


def polys(x: Expr) -> list[Poly]:
    if isinstance(x, (Load, TableLoad)):
        return [x.index]
    if isinstance(x, IndexVal):
        return [x.poly]
    if isinstance(x, Reduce):
        return [x.var]  # its extent
    return []


def _split_axes(loops: list[Poly], expr: Expr, pos: Poly) -> tuple[list[Poly], Expr, Poly]:
    """Split a loop variable v into (q, r) with v = q*D + r wherever the expression takes fdiv(v, D) or
    fmod(v, D) and D divides v's extent: the division disappears from the inner loop, and a small r (3 anchors,
    4 coordinates) can be unrolled. This undoes the flattening of Reshape/Flatten back into nested loops."""
    for _ in range(16):
        found = None
        for x in walk(expr):
            for p in polys(x):
                for a in p.atoms():
                    if isinstance(a, (FloorDiv, Mod)):
                        v = offset_var(a.num, loops)
                        if v is not None and a.den.const != 1:
                            q = floordiv(v.extent, a.den)
                            if q * a.den == v.extent and not isinstance(q.atom(), FloorDiv):
                                found = (v, a.den, q)
                                break
                if found:
                    break
            if found:
                break
        if found is None:
            return loops, expr, pos
        v, d, q = found
        k = loops.index(Poly.of(v))
        qv, rv = var(f"{v.name}q", q), var(f"{v.name}r", d)
        m: dict[Atom, Poly] = {v: qv * d + rv}
        expr, pos = substitute(expr, m), subs(pos, m)
        loops = loops[:k] + [x for x in (qv, rv) if x.atom() is not None] + loops[k + 1:]
    return loops, expr, pos


# the element types the 8 x 8 register transposes move (tiles, box blocks): 4 bytes, bits moved as they are
FOUR_BYTE_DTYPES = frozenset({"float32", "int32", "uint32"})
# the 2-byte ones that box blocks move as well (prelude.c's evo_boxes_in2)
TWO_BYTE_DTYPES = frozenset({"float16", "int16", "uint16"})


def unguarded_reductions(exprs: Sequence[Expr]) -> list[Reduce]:
    """The reductions of `exprs` that are computed whatever the selects choose (not inside a guarded select
    branch, whose reads must not run unless taken), each once, every reduction after those in its body."""
    out: dict[Reduce, None] = {}
    seen: set[Expr] = set()
    for e in exprs:
        stack: list[tuple[Expr, bool]] = [(e, False)]
        while stack:
            x, done = stack.pop()
            if done:
                if isinstance(x, Reduce):
                    out[x] = None
                continue
            if x in seen:
                continue
            seen.add(x)
            stack.append((x, True))
            if isinstance(x, Op):
                args = x.args[:1] if x.attr == "guard" else x.args
                stack.extend((a, False) for a in reversed(args))
            elif isinstance(x, Reduce):
                stack.append((x.body, False))
    return list(out)


LANES = 8
MAX_LANE_BODY = 400  # nodes of a lane reduction's body, printed as one expression (its subexpressions inline)


def lane_axis(outer: Sequence[Poly], inner: Poly, exprs: Sequence[Expr]) -> Var | None:
    """The loop along which to compute reductions for LANES adjacent elements at once, or None.

    A reduction is printed inside the element's loops, its own loop innermost. Where its body reads along the
    reduced axis with a stride (RetinaNet's max over 80 classes, 6400 floats apart; a softmax over YOLOv8's 16 DFL
    bins), that loop gathers. Where those reads are contiguous along a loop `L` of the element instead, the
    reduction pays computed for LANES consecutive values of `L` at once: its loop outside, a vectorised loop over
    the lanes inside, one accumulator per lane. `L` is the inner loop where it qualifies (its stores stay
    contiguous), else the innermost outer loop that does. It qualifies when every load in the bodies of the
    reductions that depend on it is linear in it with stride 0 or 1, and one of them reads with stride 1 but
    strides along the reduced axis; and it is not known to be shorter than LANES."""
    reds = unguarded_reductions(exprs)
    if not reds:
        return None
    fv: dict[Expr, frozenset[Atom]] = {}
    candidates = [inner, *reversed(outer)]
    loops = {lp.atom() for lp in candidates}
    if any(not free_vars(red, fv) <= loops for red in reds):
        # a reduction inside another that reads the outer one's variable (ReduceMin over two axes) is computed
        # within the outer's loop, not ahead of it for a block of lanes (fuzz seed 170011)
        return None
    for lp in candidates:
        lane = lp.atom()
        if not isinstance(lane, Var) or ((n := lane.extent.const) is not None and n < LANES):
            continue
        pays = False
        fits = True
        for red in reds:
            if lane not in free_vars(red, fv):
                continue
            r = red.bound()
            for x in walk(red.body):
                if not isinstance(x, Load):
                    continue
                c = x.index.coefficient(lane)
                if c is None or c.const not in (0, 1):
                    fits = False
                    break
                cr = x.index.coefficient(r)
                pays = pays or (c.const == 1 and (cr is None or cr.const not in (0, 1)))
            if not fits or _tree_size(red.body, set(reds), MAX_LANE_BODY) > MAX_LANE_BODY:
                fits = False
                break
        if fits and pays:
            return lane
    return None


def _tree_size(e: Expr, leaves: set[Reduce], cap: int) -> int:
    """Nodes of `e` printed as one expression (a shared subexpression counts at each use; `leaves` count 1), or
    some number above `cap`."""
    memo: dict[Expr, int] = {}
    for x in walk(e):
        memo[x] = 1 if x in leaves else min(cap + 1, 1 + sum(memo[c] for c in children(x)))
    return memo[e]


def temporaries(roots: Sequence[tuple[Poly, Expr]], inner: Var | None) -> list[tuple[Expr, bool]]:
    """Which subexpressions of the roots become temporaries, in an order that defines each before its use, and
    whether each is computed once per row (True: it does not depend on the inner loop variable `inner`).

    Subexpressions used more than once become temporaries, and, with an inner loop, so do those that do not depend
    on it (a row-wise reduction feeding every element of its row is computed once per row, not per element).
    Nodes reached only through a guarded select branch are never hoisted: they may read out of range when not
    taken; nothing that depends on a reduction's own variable leaves that reduction, and what inside a reduction
    does not depend on it is computed before its loop. Shared by the CPU and CUDA generators."""
    uses: dict[Expr, int] = {}
    seen: set[Expr] = set()
    fv: dict[Expr, frozenset[Atom]] = {}

    def count(x: Expr, guarded: bool, bound: frozenset[Atom], selected: bool = False) -> None:
        if guarded or (bound and free_vars(x, fv) & bound):
            if isinstance(x, Op):
                for k, a in enumerate(x.args):
                    count(a, True if guarded else (x.attr == "guard" and k > 0), bound,
                          selected or (x.op == "where" and k > 0))
            elif isinstance(x, Reduce) and not guarded:
                count(x.body, False, bound | {x.bound()}, selected)
            return
        uses[x] = uses.get(x, 0) + 1
        if selected and isinstance(x, (Load, TableLoad)):
            # a read under an unguarded select (Where) is in range either way: read it unconditionally, so that gcc
            # blends two vectors instead of emitting masked loads, which gcc 12.2 miscompiles at -O3 with AVX2 for
            # strided loads under a byte mask (Where(bool, uint32, 0) over a row of 6 went wrong at 16+ rows)
            uses[x] = max(uses[x], 2)
        if bound and isinstance(x, (Reduce, Op)):
            # inside a reduction but independent of its variable: compute it once, before the reduction's loop
            # (gcc does not move whole loops such as a softmax's row sum out of an enclosing loop)
            uses[x] = max(uses[x], 2)
        if uses[x] > 1 and x in seen:
            return
        seen.add(x)
        if isinstance(x, Op):
            for k, a in enumerate(x.args):
                count(a, x.attr == "guard" and k > 0, bound,
                      selected or (x.op == "where" and x.attr != "guard" and k > 0))
        elif isinstance(x, Reduce):
            count(x.body, False, bound | {x.bound()}, selected)

    for _, e in roots:
        count(e, False, frozenset())
    order: list[Expr] = []
    for _, e in roots:
        order.extend(walk(e))
    out: list[tuple[Expr, bool]] = []
    depth: dict[Expr, int] = {}
    for x in dict.fromkeys(order):
        # a long chain (a = a*c + d, a thousand times) is cut into statements every _MAX_DEPTH operations: the
        # source stays readable and gcc's time stays linear in its length
        depth[x] = 0 if x in uses and uses[x] > 1 else 1 + max((depth[a] for a in children(x)), default=0)
        # a run-time position (a Gather's index, a Keep's checked one) is worth a temporary too: its index may hold
        # a whole reduction (an ArgMin over the tensor), which per element made a kernel quadratic (fuzz case 628:
        # a Keep re-checked a row-invariant pick in every element, 2^37 reads at the check's large size)
        picks = isinstance(x, IndexVal) and any(isinstance(a, Picked) for a in x.poly.atoms())
        if x not in uses or not (isinstance(x, (Op, Load, TableLoad, Reduce)) or picks):
            continue
        invariant = inner is not None and inner not in free_vars(x, fv)
        if uses[x] > 1 or invariant or (depth[x] >= _MAX_DEPTH and isinstance(x, Op)):
            out.append((x, invariant))
            depth[x] = 0
    return out
