"""The loop schedule both kernel printers share (issue 13): for each output piece (`evonnx.kernels.pieces`),
its loops with the element expression in their terms, the subexpressions that become temporaries, and the
tables an expression reads. `codegen_c` and `codegen_cuda` only print them."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import replace

from evonnx.expr import (
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
    subs,
    var,
)
from evonnx.kernels.periodic import offset_var
from evonnx.kernels.pieces import piece_vars
from evonnx.records import KernelOutput
from evonnx.view import View

_MAX_DEPTH = 12  # operations in one C expression before a temporary


def piece_loops(o: KernelOutput, ranges: Sequence[tuple[Poly, Poly]],
                out_view: View) -> tuple[list[Poly], Expr, Poly]:
    """The loops of one piece, outermost first, with the element expression and the store position in their
    terms: one loop per axis of extent > 1, then split where the expression divides them (`_split_axes`).
    Shared by the CPU and CUDA generators."""
    mapping, local = piece_vars(o, ranges)
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
