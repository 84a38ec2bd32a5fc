"""Tasks of boxes (issue 12): a plain CPU task that unrolls the 4 coordinates of an [N, 4] output and computes an
exp, a log or a division runs 8 boxes at a time as the 8 lanes of a vector. gcc's own vectorisation of such a loop
puts the 4 coordinates of 2 boxes in a vector and computes every exp for all 4 lanes where 2 need it; a block
reads its [N, 4] inputs as 4 columns of 8 (prelude.c's `evo_boxes_in`), computes column by column, and stores the
columns back as rows (`evo_boxes_out`). codegen_c prints the block's body; this module decides and lays it out."""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import NamedTuple

from evonnx.expr import Const, Expr, Load, Op, walk
from evonnx.index import Poly, Var
from evonnx.kernels.cprint import CTYPE, Names, print_poly
from evonnx.kernels.schedule import FOUR_BYTE_DTYPES, LANES, TWO_BYTE_DTYPES

BOX = 4  # elements of a box: the unrolled width a box block takes
# Operations that cost a box task far more than the shuffles its blocks add: a task of boxes is blocked only where
# one of these, or a division by a value, is computed. Measured on models/ at 1 thread against gcc's own
# vectorisation (benchmarks/cpu.py): delta2bbox (exp) 364 -> 249 us, bbox2delta (log, divisions) 365 -> 349; but
# clamp_inplace (a clamp per coordinate) 42.6 -> 69.4 us, anchor_grid (a table plus a row's offset) 89.7 -> 209,
# tblr2bbox (adds and multiplies) 16.0 -> 19.2: where every coordinate is a few cheap operations, gcc's vectors of
# 2 boxes waste little, and the shuffles are the larger cost.
_COSTLY = frozenset({"exp", "exp_nonpos", "log", "tanh", "erf", "sigmoid", "softplus", "mish", "pow", "sin", "cos",
                     "sqrt"})

# element types a block moves, and the suffix of prelude.c's helpers for their size (evo_boxes_in, evo_boxes_in2)
_BOX_DTYPES = FOUR_BYTE_DTYPES | TWO_BYTE_DTYPES
_SIZE = {**{d: "" for d in FOUR_BYTE_DTYPES}, **{d: "2" for d in TWO_BYTE_DTYPES}}
# A block whose stores and box reads are all of 2 bytes runs twice LANES boxes (evo_boxes_in2x16): gcc takes a
# vector width from the narrowest type of a loop, and with 8 lanes of 2 bytes it ran the floats 4 wide.
WIDE_LANES = 2 * LANES

class BoxBlock(NamedTuple):
    loop: str  # the head of the task's inner loop, blocks first (before the body in task.c's `$loop`)
    lanes: int  # boxes per block


# the body of a block, printed with the given C for its stores (one per root) and for some reads
PrintBody = Callable[[list[str], dict[Expr, str]], str]


def box_block(roots: Sequence[tuple[Poly, Expr]], targets: Sequence[tuple[int, str]], jv: Var | None,
              unrolled: Poly | None, names: Names, print_body: PrintBody) -> BoxBlock | None:
    """The head of a plain task's inner loop (task.c's `$loop`, before the body) that first runs blocks of LANES
    values of `jv` (C name j) as the lanes of a vector, or None where the task is not one of boxes. A task of boxes
    unrolls BOX elements of 4 or 2 bytes that it stores contiguously, BOX apart along j (an [N, 4] output), and
    computes something costly: each block computes its LANES boxes column by column into arrays
    `evo_bout<k>[BOX][LANES]`, which `evo_boxes_out` stores as rows. The reads of an input at BOX-apart positions
    along j whose BOX columns the task all reads unconditionally (not under a guarded select, not in a reduction)
    come in the same way, through `evo_boxes_in`: every element those read is one the loop reads anyway. A block of
    2-byte elements only (float16) runs WIDE_LANES boxes. The rest of the row, fewer than a block, runs the plain
    loop. Positions are printed with `names` at the block's first j (`jb`); the body is the plain one
    (`print_body`) with the block's arrays in place of those stores and reads, and the same temporaries before
    it. `unrolled` is the task's unrolled width, `jv` its inner loop (None: none)."""
    if (jv is None or unrolled is None or unrolled.const != BOX or len(roots) % BOX
            or any(dtype not in _BOX_DTYPES for _, dtype in targets)):
        return None
    if not any(isinstance(x, Op) and (x.op in _COSTLY or (x.op in ("div", "mod") and not isinstance(x.args[1], Const)))
               for _, e in roots for x in walk(e)):
        return None
    four = Poly.of(BOX)
    at_block = Names({**names.vars, jv: "jb"}, names.syms, names.tables, hoist=names.hoist)
    reads = _whole_boxes_read(roots, jv)
    wide = all(d in TWO_BYTE_DTYPES for _, d in targets) and all(c[0].dtype in TWO_BYTE_DTYPES for _, c in reads)
    lanes, x16 = (WIDE_LANES, "x16") if wide else (LANES, "")
    outs: list[str] = []
    stores: list[str] = []
    decls: list[str] = []
    for k in range(0, len(roots), BOX):
        first = roots[k][0]
        oi, dtype = targets[k]
        if first.coefficient(jv) != four or any(targets[k + u][0] != oi or (roots[k + u][0] - first).const != u
                                                for u in range(BOX)):
            return None
        m = k // BOX
        decls.append(f"{CTYPE[dtype]} evo_bout{m}[{BOX}][{lanes}];")
        outs += [f"evo_bout{m}[{u}][l]" for u in range(BOX)]
        stores.append(f"evo_boxes_out{_SIZE[dtype]}{x16}(evo_bout{m}, &out{oi}[{print_poly(first, at_block)}]);")
    seeded: dict[Expr, str] = {}
    loads: list[str] = []
    for g, ((slot, base), cols) in enumerate(reads):
        decls.append(f"{CTYPE[cols[0].dtype]} evo_bin{g}[{BOX}][{lanes}];")
        loads.append(f"evo_boxes_in{_SIZE[cols[0].dtype]}{x16}(&in{slot}[{print_poly(base, at_block)}], evo_bin{g});")
        seeded.update({load: f"evo_bin{g}[{c}][l]" for c, load in cols.items()})
    body = print_body(outs, seeded)
    pad = "            "
    return BoxBlock("\n".join([
        "        int64_t jb = j0;",
        f"        for (; jb + {lanes} <= stop; jb += {lanes}) {{",
        *(pad + d for d in decls + loads),
        f"{pad}for (int64_t l = 0; l < {lanes}; ++l) {{",
        *([f"{pad}    const int64_t j = jb + l;"] if re.search(r"\bj\b", body) else []),
        "\n".join("    " + ln if ln else ln for ln in body.split("\n")),
        f"{pad}}}",
        *(pad + st for st in stores),
        "        }",
        "        for (int64_t j = jb; j < stop; ++j) {"]), lanes)


def _whole_boxes_read(roots: Sequence[tuple[Poly, Expr]], jv: Var) -> list[tuple[tuple[int, Poly], dict[int, Load]]]:
    """The unconditional reads of 4- or 2-byte inputs BOX apart along `jv`, by (input, position of column 0), where all
    BOX columns are read; in a fixed order."""
    four = Poly.of(BOX)
    columns: dict[tuple[int, Poly], dict[int, Load]] = {}
    seen: set[Expr] = set()
    stack = [e for _, e in roots]
    while stack:
        x = stack.pop()
        if x in seen:
            continue
        seen.add(x)
        if isinstance(x, Load) and x.dtype in _BOX_DTYPES and x.index.coefficient(jv) == four:
            c = dict(x.index.terms).get((), 0) % BOX
            columns.setdefault((x.slot, x.index - c), {})[c] = x
        elif isinstance(x, Op):  # a guarded select's branches may read out of range: not taken as whole boxes
            stack.extend(x.args[:1] if x.attr == "guard" else x.args)
    return sorted(((k, v) for k, v in columns.items() if len(v) == BOX), key=lambda kv: (kv[0][0], str(kv[0][1])))
