"""Tiled transposes (issue 12): a task whose inner loop `j` stores contiguously but reads some input across a
stride, while an outer loop `w` reads it contiguously (an NCHW to NHWC transpose under Sigmoid: the scores of YOLO
and RetinaNet heads), is computed in blocks of TILE along w by JTILE along j, in the order the input is laid out,
transposed in registers and stored in the order the output is (codegen_c._add_tiled_task, templates/task_tile.c).

`tile_axis` picks w; `merged_tile_axis` makes w as long as the layout allows: the loop outside it whose stride is
w's times w's extent, everywhere, is one loop with it (a Reshape of [H, W] to [H*W] split back into two loops by
the Reshape's divisions). A task's unit then reads runs of up to EVO_TILE_CHUNK blocks along w, not W floats:
mmdet RetinaNet's [1, 720, 80, 80] scores read runs of 80 floats, 16 at a time, which the prefetcher hardly
follows."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, TypeVar

from evonnx.errors import InternalError
from evonnx.expr import Expr, Load, Op, Reduce, TableLoad, substitute, walk
from evonnx.index import Atom, FloorDiv, Foreign, Lookup, Max, Min, Mod, Poly, PolyLike, Var, floordiv, mod, subs, var
from evonnx.kernels.cprint import with_binding
from evonnx.kernels.schedule import polys

# A block is TILE along w (8 float32: one AVX register per row) by JTILE along j: two 8 x 8 register transposes,
# whose output rows are 64 bytes, a whole cache line, stored at once (EVO_STORE16: around the cache where the
# output is large, so that no line is read for ownership first).
TILE = 8
JTILE = 16
TILE_ITEMSIZE = 4
M = TypeVar("M", bound=tuple[Any, ...])


def tile_axis(outer: Sequence[Poly], inner: Poly, expr: Expr, pos: Poly, itemsize: int) -> int | None:
    """Which outer loop to tile with the inner one, or None. A tile pays where the inner loop stores
    contiguously (`pos` has coefficient 1 in it) but reads some input with a stride (coefficient not 0 or 1), and
    an outer loop `w` reads that input contiguously (coefficient 1) while storing with a stride: an NCHW to NHWC
    transpose under Sigmoid. Each tile then reads TILE rows along `w` and stores TILE rows along the inner loop,
    both contiguous. Only elements of TILE_ITEMSIZE bytes; no reductions (they would be recomputed per element);
    no load under a select (YOLOX's objectness-or-class select ran 3x slower tiled: gcc vectorised the untiled
    loop with masked gathers, the tile not at all); neither loop known to be shorter than one tile."""
    j = inner.atom()
    if itemsize != TILE_ITEMSIZE or not isinstance(j, Var) or pos.coefficient(j) != Poly.of(1):
        return None
    if any(isinstance(x, Reduce) or (isinstance(x, Op) and x.op == "where" and any(
            isinstance(y, Load | TableLoad) for b in x.args[1:] for y in walk(b))) for x in walk(expr)):
        return None  # a load under a select is a branch: gcc vectorises neither the tile nor its rows
    if (n := j.extent.const) is not None and n < TILE:
        return None
    loads = [x.index for x in walk(expr) if isinstance(x, Load)]
    strided = [p for p in loads if (c := p.coefficient(j)) is not None and c.const not in (0, 1)]
    for k, lp in enumerate(outer):
        w = lp.atom()
        if not isinstance(w, Var) or ((n := w.extent.const) is not None and n < TILE):
            continue
        cw = pos.coefficient(w)
        if cw is None or cw.const in (0, 1):
            continue
        if any(p.coefficient(w) == Poly.of(1) for p in strided):
            return k
    return None


def row_start(expr: Expr, w: Var, j: Var) -> tuple[int, Poly]:
    """The input slot and the index at w = j = 0 of the first strided row a tiled task reads (as `tile_axis`
    found it): its blocks along w start where such a row is 32-byte aligned, whatever the input's own alignment
    (numpy's large arrays start 16 bytes into a line: RetinaNet's scores took 4.0 -> 5.0 ms there, tiles of 16
    rows read across two lines each)."""
    for x in walk(expr):
        if isinstance(x, Load) and x.index.coefficient(w) == Poly.of(1) and (
                c := x.index.coefficient(j)) is not None and c.const not in (0, 1):
            return x.slot, subs(x.index, {w: 0, j: 0})
    raise InternalError("a tiled task reads no strided row")


def merged_tile_axis(outer: list[Poly], w: int, expr: Expr, pos: Poly) -> tuple[list[Poly], int, Expr, Poly]:
    """`outer` with its loop `w` (`tile_axis`) merged with every loop the layout allows (`merged_loops`)."""
    outer, w, exprs, poss = merged_loops(outer, w, [expr], [pos])
    return outer, w, exprs[0], poss[0]


def merged_loops(loops: list[Poly], w: int, exprs: list[Expr], poss: list[Poly]
                 ) -> tuple[list[Poly], int, list[Expr], list[Poly]]:
    """`loops` with loop `w` merged with every other loop u whose every index (in each of `exprs` and `poss`)
    takes u only as a term whose coefficient is w's times w's extent: u and w become one loop m = u * extent + w,
    and each index is rewritten in m (where it took c*W*u + c*w it takes c*m). The order of `loops` is kept, m in
    w's place; `exprs` and `poss` in the new loops. A plain task's inner loop is merged so (codegen_c._add_task):
    a Concat of [1, 32, 80, 80] tensors is one loop of 204,800, not rows of 80 each with a loop's entry and exit."""
    while True:
        wv = loops[w].atom()
        assert isinstance(wv, Var)
        if wv.extent.const == 0:  # an empty loop (fuzz case 1219's Slice to nothing): nothing to merge, no m / 0
            return loops, w, exprs, poss
        indices = poss + [p for e in exprs for x in walk(e) for p in polys(x)]
        for k, lp in enumerate(loops):
            u = lp.atom()
            if k == w or not isinstance(u, Var) or not _linear_in(indices, u, wv):
                continue
            m = var(f"{u.name}{wv.name}", u.extent * wv.extent)
            mv = m.atom()
            assert isinstance(mv, Var)
            mapping: dict[Atom, PolyLike] = {u: floordiv(m, wv.extent), wv: mod(m, wv.extent)}
            new_exprs, new_poss = [substitute(e, mapping) for e in exprs], [subs(p, mapping) for p in poss]
            if any(not _top_level(p, mv) for p in new_poss + [q for e in new_exprs for x in walk(e) for q in polys(x)]):
                continue  # not put back together (belt and braces: `_linear_in` said it would be)
            loops = [m if i == w else q for i, q in enumerate(loops) if i != k]
            w, exprs, poss = loops.index(m), new_exprs, new_poss
            break
        else:
            return loops, w, exprs, poss


def merged_inner(outer: list[Poly], inner: Poly, members: list[M]) -> tuple[list[Poly], Poly, list[M]]:
    """A plain task's loops with its inner loop merged (`merged_loops`); each member is a tuple ending in its
    expression and its position (codegen_c._add_task)."""
    loops, _, exprs, poss = merged_loops(outer + [inner], len(outer), [m[-2] for m in members],
                                         [m[-1] for m in members])
    merged = [(*m[:-2], e, p) for m, e, p in zip(members, exprs, poss, strict=True)]
    return loops[:-1], loops[-1], merged  # type: ignore[return-value]


def _linear_in(polys: Sequence[Poly], u: Var, w: Var) -> bool:
    """Whether every poly takes u and w only as top-level terms, u's coefficient w's times w's extent."""
    for p in polys:
        if not (_top_level(p, u) and _top_level(p, w)):
            return False
        cu, cw = p.coefficient(u), p.coefficient(w)
        if cu is None or cw is None or cu != cw * w.extent:
            return False
    return True


def _top_level(p: Poly, v: Atom) -> bool:
    """Whether `v` appears in `p` only as a term of its own: in no division, remainder, minimum, maximum, table
    lookup or run-time index (at any depth), and in no product with another loop or with itself."""
    memo: dict[Atom, bool] = {}
    for mono, _ in p.terms:
        if v in mono and (mono.count(v) > 1 or any(isinstance(a, Var) and a != v for a in mono)):
            return False
        if any(a != v and _inside(a, v, memo) for a in mono):
            return False
    return True


def _inside(a: Atom, v: Atom, memo: dict[Atom, bool]) -> bool:
    """Whether `v` may be nested in atom `a` (memoised: nested polynomials are shared DAGs, fuzz case 109)."""
    if a in memo:
        return memo[a]
    if isinstance(a, (FloorDiv, Mod)):
        parts: tuple[Poly, ...] = (a.num, a.den)
    elif isinstance(a, (Min, Max)):
        parts = (a.a, a.b)
    elif isinstance(a, Lookup):
        parts = (a.index,)
    elif isinstance(a, Foreign):  # a run-time index: whatever it reads, taken as depending on every loop
        memo[a] = True
        return True
    elif isinstance(a, Var):
        parts = (a.extent,)
    else:
        parts = ()
    memo[a] = found = any(b == v or _inside(b, v, memo) for q in parts for b in q.atoms())
    return found


def lane_tile_store(roots: Sequence[tuple[Poly, Expr]], dtypes: Sequence[str], lane: Var, j: Var) -> Poly | None:
    """The stride along `lane` of the one store of a lane task whose inner loop `j` stores contiguously and whose
    lanes store across a stride (an L2-normalisation over channels written channels-last: JDE's embeddings), or
    None. Such a task's elements are computed TILE along j by the block's TILE lanes, transposed in registers and
    stored TILE contiguous elements per lane (`lane_tile_lines`), where they were stored one by one, 2 KB apart."""
    if len(roots) != 1 or dtypes[0] != "float32":
        return None
    pos = roots[0][0]
    if not (_top_level(pos, j) and _top_level(pos, lane)) or pos.coefficient(j) != Poly.of(1):
        return None
    stride = pos.coefficient(lane)
    if stride is None or stride.const in (0, 1) or j in stride.atoms() or lane in stride.atoms() or any(
            isinstance(a, Var) for a in stride.atoms()):
        return None
    return stride


def lane_tile_lines(body: str, bind: str, slot: int, pos: str, stride: str) -> list[str]:
    """C for the tiles of a lane task (`lane_tile_store`): whole TILE x TILE tiles of a whole block (skip 0) from
    j = 0, then `jt` where the task's own element loop goes on. `body` computes the element at (j, lane `ll`) into
    tile[jj][ll]; `pos` and `stride` are the store's position at (w, j) and its stride along the lanes."""
    inner = [f"                    {ln.strip()}" for ln in body.split("\n") if ln.strip()]
    return ["        int64_t jt = 0;",
            f"        if (skip == 0 && ln == {TILE}) {{",
            f"            for (; jt + {TILE} <= ext; jt += {TILE}) {{",
            f"                float tile[{TILE}][{TILE}];",
            f"                for (int64_t jj = 0; jj < {TILE}; ++jj) {{",
            "                    const int64_t j = jt + jj;",
            f"                    for (int64_t ll = 0; ll < {TILE}; ++ll) {{",
            *[f"    {ln}" for ln in with_binding(f"                    {bind}", inner)],
            "                    }",
            "                }",
            "                {",
            "                    const int64_t w = l0;",
            "                    const int64_t j = jt;",
            f"                    evo_transpose8x8_to(tile, &out{slot}[{pos}], {stride});",
            "                }",
            "            }",
            "        }"]
