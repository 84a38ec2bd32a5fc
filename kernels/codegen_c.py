"""C code generation: one kernel (infer + compute) per `KernelSpec`, in one source file per model.

For each output, the iteration space is split into *pieces* wherever a Concat boundary (a guarded select on one
loop index) falls, so no select survives inside a loop. A small last axis (<= 8, e.g. the 4 box coordinates) is
unrolled and its elements share common subexpressions; the axis before it is the inner loop, which reads with
constant strides that gcc vectorises, merged with every outer loop that all its indices take as one with it
(`tiles.merged_inner`: a Concat of contiguous tensors is one loop). The outer axes and the inner loop are one
range that `evo_run` splits into tasks on onnxruntime's thread pool. The (output, piece) pairs whose loops are the
same share one task function, and with it their temporaries: a chain feeding several outputs is computed once per
element. `schedule` works out the pieces, loops and temporaries (the CUDA printer shares it); this module prints.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass

from evonnx.expr import ONNX_CODE, Expr, Op, Reduce, children, free_vars, substitute, walk
from evonnx.index import SIZE_MAX, Atom, FloorDiv, Mod, Poly, Sym, Var, product, subs
from evonnx.kernels.boxes import box_block
from evonnx.kernels.carry import JLOOP, plan_carries, render
from evonnx.kernels.cprint import CTYPE, Hoist, Names, lane_groups, lane_reduce, print_expr, print_poly, with_binding
from evonnx.kernels.ctext import encode, lint
from evonnx.kernels.periodic import MAX_UNROLL
from evonnx.kernels.pieces import Piece, pieces
from evonnx.kernels.printing import (
    Tables,
    bind_symbols,
    drop_unused_locals,
    half_define,
    helpers,
    kernel_symbols,
    node_list,
    template,
)
from evonnx.kernels.schedule import (
    FOUR_BYTE_DTYPES,
    LANES,
    lane_axis,
    loop_var,
    nonempty_view,
    piece_loops,
    temporaries,
    unguarded_reductions,
)
from evonnx.kernels.share import Canon, argmax_from_max
from evonnx.kernels.tiles import (
    JTILE,
    TILE,
    TILE_ITEMSIZE,
    lane_tile_lines,
    lane_tile_store,
    merged_inner,
    merged_tile_axis,
    row_start,
    tile_axis,
)
from evonnx.kernels.unswitch import invariant_guards, unswitched_loop
from evonnx.records import KernelOutput, KernelSpec, kernel_fingerprint
from evonnx.view import View

MAX_TASK_PARTS = 16  # (output, piece) pairs one task function computes at most


# -- pieces: splitting loops at Concat boundaries ---------------------------------------------------------


# -- one task function per loop nest (the outputs' pieces that share it) ---------------------------------------
class _Kernel:
    def __init__(self, spec: KernelSpec):
        self.spec = spec
        self.syms, self.sym_names = kernel_symbols(spec)
        self.tables = Tables(spec.name)
        self.tasks: list[str] = []
        self.runs: list[str] = []
        self.canon = Canon()  # equal reductions as one expression, across the kernel's tasks (share.py)
        self.hoist = Hoist()  # long size expressions as locals, declared in every function (cprint.Hoist)

    def add_outputs(self, outputs: Sequence[KernelOutput]) -> None:
        """One task function per set of (output, piece) pairs with the same loops: outputs computed over one
        iteration space (a kernel's outputs along a chain, the parts of a Concat) share a loop and its temporaries,
        so a chain that feeds several outputs is computed once per element, and gcc compiles one loop, not one per
        output (their code and compile time grew with the square of such chains)."""
        tasks: dict[tuple[Poly, ...], list[tuple[int, KernelOutput, int, Piece, Expr, Poly]]] = {}
        loops_of: dict[tuple[Poly, ...], list[Poly]] = {}
        for oi, o in enumerate(outputs):
            o = nonempty_view(o)
            out_view = View.dense(o.shape)
            for pi, piece in enumerate(pieces(o)):
                loops, expr, pos = piece_loops(o, piece.ranges, out_view)
                key = tuple(loops)
                group = tasks.setdefault(key, [])
                if len(group) >= MAX_TASK_PARTS:  # keep each function a size gcc handles quickly
                    key = key + (Poly.of(len(tasks)),)
                    group = tasks.setdefault(key, [])
                loops_of[key] = loops
                group.append((oi, o, pi, piece, expr, pos))
        for key, members in tasks.items():
            self._add_task(list(loops_of[key]), members)

    def _add_task(self, loops: list[Poly], members: list[tuple[int, KernelOutput, int, Piece, Expr, Poly]]) -> None:
        exts = [lp.atom().extent for lp in loops]  # type: ignore[union-attr]
        # the trailing loops of constant extents whose product is at most MAX_UNROLL are unrolled (a box's 4
        # coordinates, or 2 x 2 once a stride-2 slice assignment split them: `periodic.periods`)
        unrolls: list[Poly] = []
        width = 1
        while loops and (n := exts[-1].const) is not None and width * n <= MAX_UNROLL:
            unrolls.insert(0, loops.pop())
            exts.pop()
            width *= n
        unroll = unrolls[-1] if unrolls else None
        inner = loops.pop() if loops else None
        inner_ext = exts.pop() if inner is not None else Poly.of(1)
        outer, outer_ext = loops, exts
        if inner is not None:  # with the loops every index takes as one with it
            outer, inner, members = merged_inner(outer, inner, members)
            outer_ext, inner_ext = [lp.atom().extent for lp in outer], inner.atom().extent  # type: ignore[union-attr]
        if unroll is None and inner is not None and len(members) == 1:
            oi, o, pi, piece, expr, pos = members[0]
            w = tile_axis(outer, inner, expr, pos, TILE_ITEMSIZE if o.dtype in FOUR_BYTE_DTYPES else 0)
            if w is not None:
                self._add_tiled_task(outer, outer_ext, inner, inner_ext, w, members[0])
                return
        # C names: o<n> for the outer loops, j for the inner one; the unrolled one becomes constants
        cvars: dict[Var, str] = {}
        for n, lp in enumerate(outer):
            cvars[lp.atom()] = f"o{n}"  # type: ignore[index]
        if inner is not None:
            cvars[inner.atom()] = "j"  # type: ignore[index]
        roots: list[tuple[Poly, Expr]] = []
        targets: list[tuple[int, str]] = []
        uas = [loop_var(lp) for lp in unrolls]
        for oi, o, _, _, expr, pos in members:
            for us in itertools.product(*(range(int(ua.extent.const or 0)) for ua in uas)):
                m: dict[Atom, Poly] = {ua: Poly.of(u) for ua, u in zip(uas, us)}
                roots.append((subs(pos, m), substitute(expr, m)))
                targets.append((oi, o.dtype))
        unrolled = Poly.of(width) if uas else None
        for _, e in roots:
            self.tables.collect(e)
        roots = [(p, self.canon(e)) for p, e in roots]
        lane = lane_axis(outer, inner, [e for _, e in roots]) if inner is not None else None
        if inner is not None and lane is not None:
            self._add_lane_task(outer, outer_ext, inner, inner_ext, lane, roots, targets, members, unrolled)
            return
        # an ArgMax is its ReduceMax's first index, both in one pass (lane tasks: cprint.lane_reduce does the same)
        names = Names(cvars, self.sym_names, self.tables.names, hoist=self.hoist)
        roots = list(zip([p for p, _ in roots], argmax_from_max([e for _, e in roots], self.canon, names.searches),
                         strict=True))
        row_body, body = _body(roots, targets, names, jv := loop_var(inner) if inner is not None else None)
        boxes = box_block(roots, targets, jv, unrolled, names,
                          lambda outs, seeded: _body(roots, targets, names, jv, outs=outs, seeded=seeded)[1])
        fname, rng = f"{self.spec.name}_task{len(self.runs)}", len(self.runs)
        unravel, advance = _odometer(outer_ext, names)
        looped = [loop_var(lp) for lp in outer + ([inner] if inner is not None else [])]
        parts = "; ".join(f"output {oi} ('{o.name}') piece {pi} [" + ", ".join(f"{lo}:{hi}" for lo, hi in piece.ranges)
                          + ")" for oi, o, pi, piece, _, _ in members)
        note = parts + "; loops " + " ".join(f"{cvars[v]}<{v.extent}" for v in looped) + (
            f", {unrolled} unrolled" if unrolled is not None else "") + (
            f"; blocks of {boxes.lanes} boxes" if boxes is not None else "")
        carries = plan_carries(jv, set(cvars), roots) if boxes is None and jv is not None else None
        loop = (render(carries, names, lambda: _body(roots, targets, names, jv)[1], body) if carries is not None
                else f"{boxes.loop if boxes is not None else JLOOP}\n{body}\n        }}")
        if boxes is None and carries is None and jv is not None and (
                conds := invariant_guards(roots, jv, {v for v in cvars if v != jv})):
            # each row decides its guarded selects once, and its loop reads unconditionally (kernels/unswitch.py)
            loop, row_body = unswitched_loop(conds, roots, names, lambda rs: _body(rs, targets, names, jv)), ""
        self.tasks.append(template("task.c").substitute(
            kernel=self.spec.name, note=encode(note, limit=600), fname=fname, range=rng, bindings=self._bindings(),
            inner_extent=print_poly(inner_ext, names), unravel=unravel, loop=loop, row_body=row_body, advance=advance))
        total = print_poly(product(outer_ext + [inner_ext]), names)
        cost = max(1, len(roots)) * max(1, _cost(roots))
        self.runs.append(f"    evo_run(a, EVO_PICK(a, {fname}), &c, &c.ranges[{rng}], {total}, {cost});")

    def _add_tiled_task(self, outer: list[Poly], outer_ext: list[Poly], inner: Poly, inner_ext: Poly, w: int,
                        member: tuple[int, KernelOutput, int, Piece, Expr, Poly]) -> None:
        """A task whose inner loop `j` stores contiguously but reads across a stride, tiled with the outer loop
        `w` that reads contiguously (tiles.py), merged first with the loops the layout allows
        (`tiles.merged_tile_axis`). A task's unit is a row of the other outer loops, a block of JTILE along j, and
        a chunk of EVO_TILE_CHUNK blocks of TILE along w (so a single row still spreads over the pool). It runs
        over its TILE x JTILE blocks of (w, j) in the order of w, computed with w innermost, transposed in
        registers and stored as TILE rows of JTILE along j, a cache line each (`EVO_STORE16`, around the cache
        where the output is large): its reads are JTILE streams along w, which the prefetcher follows. Units run
        with the block of j fastest: the blocks of j of one chunk along w are stored one after another, while the
        chunk's output lines are in cache (with j slowest, mmdet RetinaNet's [1, 720, 80, 80] scores wrote each
        320-byte output row in 10 visits a whole pass apart, and every line was read for ownership twice). What
        does not depend on j is computed once per block, and blocks cut short at the edges in blocks of TILE x
        TILE or element by element."""
        oi, o, pi, piece, expr, pos = member
        outer, w, expr, pos = merged_tile_axis(outer, w, expr, pos)
        outer_ext = [loop_var(lp).extent for lp in outer]
        wv, jv = outer[w].atom(), inner.atom()
        assert isinstance(wv, Var) and isinstance(jv, Var)
        rest = [lp for k, lp in enumerate(outer) if k != w]
        rest_ext = [e for k, e in enumerate(outer_ext) if k != w]
        cvars: dict[Var, str] = {lp.atom(): f"o{n}" for n, lp in enumerate(rest)}  # type: ignore[misc]
        cvars[wv], cvars[jv] = "w", "j"
        self.tables.collect(expr)
        names = Names(cvars, self.sym_names, self.tables.names, hoist=self.hoist)
        # what does not depend on j is computed once per w, into arrays over the tile's rows
        decls: list[str] = []
        row_body, body = _body([(pos, expr)], [(oi, o.dtype)], names, jv, row_arrays=decls)
        _, tile_body = _body([(pos, expr)], [(oi, o.dtype)], names, jv, into="tile[jj][ww]", row_arrays=[])
        fname = f"{self.spec.name}_task{len(self.runs)}"
        rng = len(self.runs)
        unravel, _ = _odometer(rest_ext, names)
        slot, start = row_start(expr, wv, jv)
        size = f"sizeof(*in{slot})"
        addr = f"(uintptr_t)in{slot} + (uintptr_t)({print_poly(start, names)}) * {size}"
        wshift = f"(int64_t)((({addr}) % (8 * {size})) / {size})"
        note = (f"output {oi} ('{o.name}') piece {pi} [" + ", ".join(f"{lo}:{hi}" for lo, hi in piece.ranges)
                + "); rows " + " ".join(f"{cvars[loop_var(lp)]}<{loop_var(lp).extent}" for lp in rest)
                + f"; {TILE}x{JTILE} tiles of w<{wv.extent}, j<{jv.extent}, transposed")
        indent, wstride = "                            ", print_poly(pos.coefficient(wv) or Poly.of(1), names)
        loop = {streamed: template("task_tile_loop.c").substitute(
            streamed=streamed, unravel=_indented(unravel, "        "), ctype=CTYPE[o.dtype],
            tile_body=_indented(tile_body, indent[8:]), tile_body8=_indented(tile_body, indent[4:]),
            body=_indented(body, indent[4:]), slot=oi, row_loop=_row_loop(decls, row_body, indent[:20]),
            wshift=wshift, pos=print_poly(pos, names), wstride=wstride).rstrip("\n") for streamed in ("1", "0")}
        self.tasks.append(template("task_tile.c").substitute(
            kernel=self.spec.name, note=encode(note, limit=600), fname=fname, range=rng,
            bindings=self._bindings(), w_extent=print_poly(outer_ext[w], names),
            inner_extent=print_poly(inner_ext, names), ctype=CTYPE[o.dtype], loop_streamed=loop["1"],
            loop_cached=loop["0"], rows=print_poly(product(rest_ext), names),
            wstride=wstride))
        # a task's unit is one row of the other outer loops, one block of JTILE along j and a chunk of up to
        # EVO_TILE_CHUNK blocks of TILE along w (prelude.c)
        wext, jext = print_poly(outer_ext[w], names), print_poly(inner_ext, names)
        units = (f"{print_poly(product(rest_ext), names)} * (({jext} + {JTILE - 1}) / {JTILE}) * "
                 f"(((({wext}) + {TILE - 1}) / {TILE} + EVO_TILE_CHUNK - 1) / EVO_TILE_CHUNK)")
        self.runs.append(f"    evo_run(a, EVO_PICK(a, {fname}), &c, &c.ranges[{rng}], {units}, "
                         f"{max(1, _cost([(pos, expr)]))} * {JTILE} * evo_imin({wext}, {TILE} * EVO_TILE_CHUNK));")

    def _add_lane_task(self, outer: list[Poly], outer_ext: list[Poly], inner: Poly, inner_ext: Poly, lane: Var,
                       roots: list[tuple[Poly, Expr]], targets: list[tuple[int, str]],
                       members: list[tuple[int, KernelOutput, int, Piece, Expr, Poly]], unrolled: Poly | None) -> None:
        """A task whose reductions are computed for LANES adjacent values of loop `lane` at once
        (`schedule.lane_axis`, `cprint.lane_reduce`). Its unit is a row of the other outer loops and a block of
        LANES along `lane`; the inner loop, when it is not the lane loop, runs inside the unit. What does not depend
        on the inner loop is computed once per block (into arrays over the lanes when the lane loop is an outer
        one)."""
        jv = inner.atom()
        assert isinstance(jv, Var)
        on_inner = lane == jv
        rest = [lp for lp in outer if lp.atom() != lane]
        rest_ext = [e for lp, e in zip(outer, outer_ext, strict=True) if lp.atom() != lane]
        lane_ext = inner_ext if on_inner else outer_ext[[lp.atom() for lp in outer].index(lane)]
        cvars: dict[Var, str] = {lp.atom(): f"o{n}" for n, lp in enumerate(rest)}  # type: ignore[misc]
        lane_name = "j" if on_inner else "w"
        cvars[lane] = lane_name
        if not on_inner:
            cvars[jv] = "j"
        names = Names(cvars, self.sym_names, self.tables.names, hoist=self.hoist)
        bind = f"const int64_t {lane_name} = l0 + ll;"
        decls: list[str] = []
        row_lanes: list[str] = []
        lanes: list[str] = []
        fv: dict[Expr, frozenset[object]] = {}
        per_row: list[Reduce] = []
        per_step: list[Reduce] = []
        for red in unguarded_reductions([e for _, e in roots]):
            if lane in free_vars(red, fv):  # type: ignore[arg-type]
                row = not on_inner and jv not in free_vars(red, fv)  # type: ignore[arg-type]
                (per_row if row else per_step).append(red)
        for reds, out in ((per_row, row_lanes), (per_step, lanes)):
            for group in lane_groups(reds):
                out.extend(lane_reduce(group, names, bind, LANES))
        row_body, body = _body(roots, targets, names, lane if on_inner else jv,
                               row_arrays=None if on_inner else decls, lane_index="ll")
        fname = f"{self.spec.name}_task{len(self.runs)}"
        rng = len(self.runs)
        unravel, _ = _odometer(rest_ext, names)
        parts = "; ".join(f"output {oi} ('{o.name}') piece {pi} [" + ", ".join(f"{lo}:{hi}" for lo, hi in piece.ranges)
                          + ")" for oi, o, pi, piece, _, _ in members)
        note = (parts + "; rows " + " ".join(f"{cvars[loop_var(lp)]}<{loop_var(lp).extent}" for lp in rest)
                + ("" if on_inner else f", j<{jv.extent}") + (f", {unrolled} unrolled" if unrolled is not None else "")
                + f"; reductions for {LANES} lanes of {lane_name}<{lane.extent} at once")
        def lane_loop(text: str, indent: str, start: str = "skip") -> list[str]:
            """A loop over the block's lanes: from `skip` where it stores (task_lanes.c), from 0 for row arrays."""
            lines = with_binding(f"{indent}    {bind}", [text]) if text.strip() else []
            return [f"{indent}for (int64_t ll = {start}; ll < ln; ++ll) {{", *lines, f"{indent}}}"]

        unit: list[str] = []
        if on_inner:  # what does not depend on j, once per block; then the block's reductions and elements
            unit += [_indented(row_body, ""), *("        " + ln for ln in lanes), *lane_loop(body, "        ")]
        else:
            unit += ["        " + ln for ln in row_lanes]
            if decls:
                unit += ["        " + d for d in decls] + lane_loop(_indented(row_body, "    "), "        ", "0")
            stride = lane_tile_store(roots, [t for _, t in targets], lane, jv) if not lanes else None
            if stride is not None:  # stored across a stride per lane: TILE x TILE tiles transposed (tiles.py)
                _, tiled = _body(roots, targets, names, jv, row_arrays=[], lane_index="ll", outs=["tile[jj][ll]"])
                unit += lane_tile_lines(tiled, bind, targets[0][0], print_poly(roots[0][0], names),
                                        print_poly(stride, names))
            unit += [f"        for (int64_t j = {'jt' if stride is not None else 0}; j < ext; ++j) {{",
                     *("            " + ln for ln in lanes),
                     *lane_loop(_indented(body, "    "), "            "), "        }"]
        self.tasks.append(template("task_lanes.c").substitute(
            kernel=self.spec.name, note=encode(note, limit=600), fname=fname, range=rng,
            bindings=self._bindings(), lane_extent=print_poly(lane_ext, names),
            inner_extent=print_poly(inner_ext, names), unravel=_indented(unravel, "    "),
            unit="\n".join(ln for ln in unit if ln.strip())))
        units = f"{print_poly(product(rest_ext), names)} * (({print_poly(lane_ext, names)} + {LANES - 1}) / {LANES})"
        work = max(1, len(roots)) * (max(1, _cost(roots)) + _reduce_work(roots))
        per_unit = f"{work} * {LANES}" + ("" if on_inner else f" * ({print_poly(inner_ext, names)})")
        self.runs.append(f"    evo_run(a, EVO_PICK(a, {fname}), &c, &c.ranges[{rng}], {units}, {per_unit});")

    def _bindings(self) -> str:
        lines = [f"    const {CTYPE[i.dtype]} *restrict in{k} = (const {CTYPE[i.dtype]} *)c->in[{k}];"
                 for k, i in enumerate(self.spec.inputs) if i.dtype]
        lines += [f"    {CTYPE[o.dtype]} *restrict out{k} = ({CTYPE[o.dtype]} *)c->out[{k}];"
                  for k, o in enumerate(self.spec.outputs)]
        lines += [f"    const int64_t {n} = c->sym[{self.syms.index(s)}];" for s, n in self.sym_names.items()]
        return "\n".join([*lines, Hoist.HOISTED])



def _cost(roots: Sequence[tuple[Poly, Expr]]) -> int:
    seen: set[Expr] = set()
    for _, e in roots:
        seen.update(x for x in walk(e) if isinstance(x, Op))
    return max(1, len(seen) // max(1, len(roots)))


def _reduce_work(roots: Sequence[tuple[Poly, Expr]]) -> int:
    """Element-operations of the roots' reductions per element: each one's length (16 where it is not a constant)
    times the operations of its body."""
    work = 0
    for red in unguarded_reductions([e for _, e in roots]):
        v = red.bound()
        n = v.extent.const if isinstance(v, Var) else 1
        work += (16 if n is None else int(n)) * max(1, sum(1 for x in walk(red.body) if isinstance(x, Op)))
    return min(work, 1 << 20)


def _odometer(outer_ext: Sequence[Poly], names: Names) -> tuple[str, str]:
    """C that unravels the flat row number into the outer loop variables o0.., and advances them by one row."""
    if not outer_ext:
        return "    (void)row;", ""
    n = len(outer_ext)
    un = []
    for k in range(n - 1, -1, -1):
        if k == 0:
            un.append("    int64_t o0 = row;")
        else:
            d = print_poly(outer_ext[k], names)
            un.append(f"    int64_t o{k} = row % {d};\n    row /= {d};")
    adv = []
    for depth, k in enumerate(range(n - 1, -1, -1)):
        indent = "        " + "    " * depth
        if k == 0:
            adv.append(f"{indent}++o0;")
        else:
            adv.append(f"{indent}if (++o{k} == {print_poly(outer_ext[k], names)}) {{\n{indent}    o{k} = 0;")
    close = "".join("\n        " + "    " * d + "}" for d in range(n - 2, -1, -1))
    return "\n".join(un), "\n".join(adv) + close


def _row_loop(decls: Sequence[str], row_body: str, indent: str) -> str:
    """A tiled task's per-block arrays of what does not depend on j, and the loop over w filling them."""
    if not decls:
        return f"{indent}/* nothing to compute once per w */"
    return "\n".join([*(indent + d for d in decls), f"{indent}for (int64_t ww = wlo; ww < wn; ++ww) {{",
                      f"{indent}    const int64_t w = w0 + ww;", _indented(row_body, indent[:-4]), f"{indent}}}"])


def _indented(text: str, more: str) -> str:
    return "\n".join(more + ln if ln else ln for ln in text.split("\n"))


def _body(roots: Sequence[tuple[Poly, Expr]], targets: Sequence[tuple[int, str]], names: Names,
          inner: Var | None, into: str | None = None, row_arrays: list[str] | None = None,
          lane_index: str = "ww", outs: Sequence[str] | None = None,
          seeded: dict[Expr, str] | None = None) -> tuple[str, str]:
    """Statements computing every root and storing it to its target (output slot, element type): (per row, before
    the inner loop; inside the inner loop). `into` names one C lvalue that takes the single root instead, `outs`
    one per root. With `row_arrays` (a tiled or lane task), the per-row temporaries are arrays over a block's rows
    or lanes, `tK[<lane_index>]`, whose declarations are appended to it. Reductions in `names.lane_results` are
    computed already, and their bodies print nothing here. `seeded` gives C for some subexpressions (a box
    block's reads, boxes.py), numbered as temporaries all the same: the others keep their names."""
    temps: dict[Expr, str] = {}
    row_lines: list[str] = []
    lines: list[str] = []
    # what the statements below reach: not the bodies of reductions computed already
    reach: set[Expr] = set()
    stack = [e for _, e in roots]
    while stack:
        x = stack.pop()
        if x not in reach:
            reach.add(x)
            if x not in names.lane_results:
                stack.extend(children(x))

    def sub(x: Expr) -> str:
        if x in temps:
            return temps[x]
        if seeded and x in seeded:
            return seeded[x]
        return print_expr(x, names, sub)

    def emit(into: list[str], indent: str, line: str) -> None:
        """`line` after the loops of the reductions printed into it (`names.pre`)."""
        assert names.pre is not None
        into.extend(indent + st for st in names.pre)
        into.append(indent + line)

    for x, per_row in temporaries(roots, inner):
        if x not in reach:
            continue
        if seeded and x in seeded:
            temps[x] = seeded[x]
            continue
        names.pre = []
        code = print_expr(x, names, sub)
        name = f"t{len(temps)}"
        if per_row and row_arrays is not None:
            row_arrays.append(f"{CTYPE[x.dtype]} {name}[{TILE}];")
            emit(row_lines, "        ", f"{name}[{lane_index}] = {code};")
            name += f"[{lane_index}]"
        else:
            emit(row_lines if per_row else lines, "        " if per_row else "            ",
                 f"const {CTYPE[x.dtype]} {name} = {code};")
        temps[x] = name
    for k, ((pos, e), (oi, dtype)) in enumerate(zip(roots, targets, strict=True)):
        names.pre = []
        code = sub(e)
        target = into if into is not None else outs[k] if outs is not None else f"out{oi}[{print_poly(pos, names)}]"
        emit(lines, "            ", f"{target} = ({CTYPE[dtype]})({code});")
    names.pre = None
    return "\n".join(row_lines), "\n".join(lines)


# -- whole kernels ----------------------------------------------------------------------------------------
def _kernel_source(spec: KernelSpec) -> str:
    k = _Kernel(spec)
    k.add_outputs(spec.outputs)
    names = Names({}, k.sym_names, k.tables.names)  # the input checks come first, before the sizes are checked
    binding, sym_binding = bind_symbols(spec, k.syms, k.sym_names)
    checks = []
    for si, i in enumerate(spec.inputs):
        for axis, d in enumerate(i.shape):
            s = d.atom()
            if isinstance(s, Sym) and binding.get(s) == (si, axis):
                continue
            expect = print_poly(d, names)
            checks.append(
                f"    if (in_dims[{si}][{axis}] != {expect}) {{\n"
                f"        snprintf(err, EVO_ERRLEN, \"kernel {spec.name}: input {si} ('{encode(i.name)}') dim {axis} "
                f"is %lld, expected %lld ({encode(str(d))})\",\n"
                f"                 (long long)in_dims[{si}][{axis}], (long long){expect});\n"
                f"        return 1;\n    }}")
    for sym in k.syms:  # the plan proved its index arithmetic safe up to SIZE_MAX (overflowing_kernels)
        n = k.sym_names[sym]
        checks.append(
            f"    if ({n} > INT64_C({SIZE_MAX})) {{\n"
            f"        snprintf(err, EVO_ERRLEN, \"kernel {spec.name}: size {encode(sym.name)} = %lld is above 2^40, "
            f"the largest a fused kernel takes\", (long long){n});\n"
            f"        return 1;\n    }}")
    checks.append(Hoist.HOISTED)  # the sizes are in range from here on
    names = Names({}, k.sym_names, k.tables.names, hoist=k.hoist)
    for c in spec.checks:
        pa, pb = print_poly(c.lhs, names), print_poly(c.rhs, names)
        if c.kind == "bcast":
            checks.append(
                f"    if ({pa} != {pb} && {pa} != 1 && {pb} != 1) {{\n"
                f"        snprintf(err, EVO_ERRLEN, \"kernel {spec.name}: sizes {encode(str(c.lhs))} = %lld and "
                f"{encode(str(c.rhs))} = %lld do not broadcast ({encode(c.why, limit=240)}; onnxruntime fails "
                f"this node too)\",\n"
                f"                 (long long){pa}, (long long){pb});\n"
                f"        return 1;\n    }}")
        else:
            unless = f"{print_poly(c.unless, names)} != 0 && " if c.unless is not None else ""
            checks.append(
                f"    if ({unless}{pa} > {pb}) {{\n"
                f"        snprintf(err, EVO_ERRLEN, \"kernel {spec.name}: {encode(c.why, limit=240)}: needs "
                f"{encode(str(c.lhs))} <= {encode(str(c.rhs))}, but %lld > %lld (onnxruntime fails this node "
                f"too)\",\n"
                f"                 (long long){pa}, (long long){pb});\n"
                f"        return 1;\n    }}")
    out_dims = []
    for oi, o in enumerate(spec.outputs):
        for a, d in enumerate(o.shape):
            for den in _size_divisors(d):
                pd = print_poly(den, names)
                checks.append(
                    f"    if ({pd} == 0) {{\n"
                    f"        snprintf(err, EVO_ERRLEN, \"kernel {spec.name}: output {oi} dim {a} is "
                    f"{encode(str(d), limit=160)}, but {encode(str(den))} is 0 (onnxruntime fails here too: a Reshape "
                    f"cannot infer -1 from 0 elements)\");\n"
                    f"        return 1;\n    }}")
            out_dims.append(f"    out_dims[{oi}][{a}] = {print_poly(d, names)};")
        if o.empty_shape is not None:  # onnxruntime's shape where the output is empty (records.KernelOutput)
            dims = [f"out_dims[{oi}][{a}] = {print_poly(d, names)};" for a, d in enumerate(o.empty_shape)]
            out_dims.append(f"    if ({print_poly(product(o.shape), names)} == 0) {{\n"
                            f"        out_ranks[{oi}] = {len(o.empty_shape)};\n"
                            + "".join(f"        {d}\n" for d in dims) + "    }")
    ctx_fill = [f"    c.in[{si}] = a->inputs[{si}];" for si in range(len(spec.inputs))]
    ctx_fill += [f"    c.out[{oi}] = a->outputs[{oi}];" for oi in range(len(spec.outputs))]
    ctx_fill += [f"    c.sym[{n}] = {k.sym_names[s]};" for n, s in enumerate(k.syms)]
    io = [f" * in{si}: {encode(i.name)} {i.dtype}[{encode(', '.join(map(str, i.shape)), limit=240)}]"
          for si, i in enumerate(spec.inputs)]
    for oi, o in enumerate(spec.outputs):
        io.append(f" * out{oi}: {encode(o.name)} {o.dtype}[{encode(', '.join(map(str, o.shape)), limit=240)}] reads "
                  + encode("; ".join(o.reads), limit=400))
    return drop_unused_locals(k.hoist.place(template("kernel.c").substitute(
        kernel=spec.name, nodes=node_list(spec.source_nodes), ops=encode(" ".join(spec.source_ops), limit=400),
        io_comment="\n".join(io), n_in_alloc=max(1, len(spec.inputs)), n_out=len(spec.outputs),
        n_sym_alloc=max(1, len(k.syms)), n_ranges=max(1, len(k.runs)),
        tables=k.tables.text(), tasks="".join(k.tasks),
        sym_binding=sym_binding, checks="\n".join(checks), out_dims="\n".join(out_dims),
        ctx_fill="\n".join(ctx_fill), runs="\n".join(k.runs), zero_div=_zero_div_check(spec),
        in_types=", ".join(str(ONNX_CODE.get(i.dtype, 0)) for i in spec.inputs) or "0",
        in_ranks=", ".join(str(len(i.shape)) for i in spec.inputs) or "0",
        out_types=", ".join(str(ONNX_CODE[o.dtype]) for o in spec.outputs),
        out_ranks=", ".join(str(len(o.shape)) for o in spec.outputs),
        n_in=len(spec.inputs), fingerprint=kernel_fingerprint(spec), hoisted=Hoist.HOISTED)))


def _zero_div_check(spec: KernelSpec) -> str:
    """The compute function's failures when a task met an integer divisor of 0 (kernels with integer Div/Mod) or a
    Gather index out of range (kernels that read indices at run time), as onnxruntime fails those nodes."""
    out = []
    for bit, ops, what in ((1, ("Div", "Mod"), "integer division by zero"),
                           (2, ("Gather", "GatherElements", "GatherND"), "an index out of range")):
        nodes = [n for n, op in zip(spec.source_nodes, spec.source_ops) if op in ops]
        if nodes:
            out.append(f"    if (c.zero_div & {bit}) {{\n"
                       f"        snprintf(err, EVO_ERRLEN, \"kernel {spec.name}: {what} in "
                       f"{encode(', '.join(repr(n) for n in nodes), limit=240)} (onnxruntime fails this node too)\");\n"
                       f"        return 1;\n    }}")
    return "\n".join(out)


def _size_divisors(p: Poly) -> list[Poly]:
    """The divisors of `p` that are not constants (sizes), innermost first."""
    out: list[Poly] = []
    for a in p.atoms():
        if isinstance(a, (FloorDiv, Mod)):
            out.extend(_size_divisors(a.num) + _size_divisors(a.den))
            if a.den.const is None:
                out.append(a.den)
    return list(dict.fromkeys(out))


@dataclass(frozen=True)
class CSource:
    """A model's generated C: the prelude every translation unit starts with, each kernel's source, and the tail
    (the kernel table, then what was appended: the CUDA host code). `text` is the one translation unit it is
    (what --dump-dir writes); `units(n)` splits it into up to n + 1 for a parallel build. Kernel entries are
    extern (hidden), so the table in the tail's unit reaches the kernels of the others."""

    prelude: str
    kernels: tuple[str, ...]
    tail: str

    @property
    def text(self) -> str:
        return self.prelude + "".join(self.kernels) + self.tail

    def __len__(self) -> int:
        return len(self.prelude) + sum(len(k) for k in self.kernels) + len(self.tail)

    def append(self, more: str) -> CSource:
        """This source with `more` after its tail (in the tail's unit)."""
        return CSource(self.prelude, self.kernels, self.tail + more)

    def units(self, n: int) -> list[str]:
        """The tail's unit, then up to `n` units of kernels of about equal size (kernels kept in their order
        within a unit); one unit when n <= 1 or there are fewer than two kernels."""
        if n <= 1 or len(self.kernels) < 2:
            return [self.text]
        n = min(n, len(self.kernels))
        load = [0] * n
        members: list[list[int]] = [[] for _ in range(n)]
        for k in sorted(range(len(self.kernels)), key=lambda k: -len(self.kernels[k])):
            u = load.index(min(load))
            load[u] += len(self.kernels[k])
            members[u].append(k)
        return [self.prelude + self.tail] + [self.prelude + "".join(self.kernels[k] for k in sorted(m))
                                             for m in members]


def generate_source(specs: Sequence[KernelSpec], model_name: str) -> CSource:
    """The C source of every kernel of one model, with the kernel table the runtime looks names up in."""
    prelude = template("prelude.c").substitute(model=encode(model_name), helpers=helpers(), half=half_define(specs))
    kernels = tuple(_kernel_source(s) for s in specs)
    table = ", ".join(f"&{s.name}_entry" for s in specs) or "0"
    tail = ("\n" + "".join(f"extern const evo_kernel {s.name}_entry;\n" for s in specs)
            + f"const evo_kernel *const evo_kernel_table[] = {{{table}}};\n"
            f"const int32_t evo_kernel_count = {len(specs)};\n"
            f"const char evo_library_model[] = \"{encode(model_name)}\";\n")
    source = CSource(prelude, kernels, tail)
    lint(source.text, f"kernels of {encode(model_name)}")
    return source


def generate(specs: Sequence[KernelSpec], model_name: str) -> str:
    """`generate_source` as one translation unit."""
    return generate_source(specs, model_name).text
