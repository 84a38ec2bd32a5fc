"""The one expression printer for C: index polynomials and value expressions.

Index arithmetic is int64 with floor division and floor modulo through helpers (never C's truncating `/` and
`%` on possibly negative values). Signed integer arithmetic wraps through unsigned casts, as onnxruntime's
two's-complement arithmetic does, instead of C's undefined behaviour.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence

import numpy as np

from evonnx.errors import InternalError
from evonnx.expr import FLOATS, HALF, INTS, SIGNED, Const, Expr, IndexVal, Load, Op, Picked, Reduce, TableLoad, walk
from evonnx.index import Atom, FloorDiv, Lookup, Max, Min, Mod, Poly, Sym, Var
from evonnx.kernels.share import extreme_and_first

CTYPE = {"float32": "float", "float64": "double", "int64": "int64_t", "int32": "int32_t", "int16": "int16_t",
         "int8": "int8_t", "uint8": "uint8_t", "uint16": "uint16_t", "uint32": "uint32_t", "uint64": "uint64_t",
         "bool": "uint8_t", "float16": "evo_half"}
UTYPE = {"int64": "uint64_t", "int32": "uint32_t", "int16": "uint16_t", "int8": "uint8_t"}
SUFFIX = {"float32": "f32", "float64": "f64", "int64": "i64", "int32": "i32", "int16": "i16", "int8": "i8",
          "uint8": "u8", "uint16": "u16", "uint32": "u32", "uint64": "u64", "bool": "u8", "float16": "f16"}
_MATH1 = {"exp": "exp", "exp_nonpos": "exp", "log": "log", "tanh": "tanh", "erf": "erf", "sin": "sin", "cos": "cos",
          "sqrt": "sqrt", "floor": "floor", "ceil": "ceil", "round": "rint"}


class Names:
    """C names of the atoms a kernel uses: loop variables, size symbols, tables.

    `index_type` is the one dialect hook: None prints index arithmetic in int64 (`INT64_C(c)` literals), as the
    CPU kernels compute it; a type name (the CUDA kernels' template parameter `I`, int32_t or int64_t) makes
    every literal and table entry of an index polynomial that type, so a whole index is computed in it.
    """

    def __init__(self, vars_: dict[Var, str], syms: dict[Sym, str], tables: dict[object, str],
                 index_type: str | None = None, hoist: Hoist | None = None):
        self.vars = vars_
        self.hoist = hoist if index_type is None else None
        self.syms = syms
        self.tables = tables  # index.Table and expr.ValueTable objects -> C array names
        self.index_type = index_type
        self._loops = 0
        # statements to print before the statement being printed (a reduction's loop), or None where there is no
        # such place (the expression must stay one expression)
        self.pre: list[str] | None = None
        # reductions already computed for a block of lanes (`lane_reduce`): their per-lane result expressions
        self.lane_results: dict[Expr, str] = {}
        self.searches: dict[Expr, Expr] = {}  # extreme -> its first index's search (share.argmax_from_max)
        self.found: dict[Expr, str] = {}  # searches their extreme's pass computed (share.extreme_and_first)
        # how many guarded Where branches enclose the expression being printed (print_expr)
        self.guarded = 0
        # divisions kept as running values by a task's inner loop (carry.py): their C names
        self.carried: dict[Atom, str] = {}

    def fresh_loop(self) -> str:
        """A C name for one printed reduction loop, never reused (a reduction printed twice gets two)."""
        self._loops += 1
        return f"r{self._loops}"

    def int_literal(self, c: int) -> str:
        _check_range(c, "int64")
        if c == -(1 << 63):
            return "INT64_MIN" if self.index_type is None else f"(({self.index_type})INT64_MIN)"
        if self.index_type is None:
            return f"INT64_C({c})"
        # A literal beyond int32 only occurs in indices whose bound rules the 32-bit variant out at run time.
        return f"(({self.index_type}){c})" if -(1 << 31) <= c < (1 << 31) else f"(({self.index_type})INT64_C({c}))"


class Hoist:
    """A kernel's long size expressions, each printed once as a local (`z<k>`) that every function of the kernel
    declares after its size symbols (`HOISTED`, replaced by `lines`; unused ones are dropped). A min, max, floor
    division or modulo of sizes alone (no loop variable) that prints longer than `LONG` characters is named: the
    offsets of a chain of Slices of symbolic sizes nest such atoms, and printed in place they repeat the same
    subexpression at every use (fuzz case 109: a 3.8 MB line of one task, 25 s of gcc). evo_fdiv and evo_fmod are
    total and min/max cannot fail, so computing them ahead of the checks that use them changes nothing."""

    LONG = 48
    HOISTED = "    `hoisted`"  # a backtick: never in encoded model text (ctext._SAFE), so never in a comment

    def __init__(self) -> None:
        self.text: dict[Atom, str] = {}  # each size atom printed: its text or its local's name
        self.consts: dict[tuple[str, str], str] = {}  # (literal, dtype) -> its opaque local (`opaque`)
        self.lines: list[str] = []

    def opaque(self, literal: str, dtype: str) -> str:
        """A local holding the float constant `literal` through evo_opaque_* (prelude.c), declared once: the
        bound of a Clip, Min or Max. gcc 12 folds a comparison with a select of constants into mask arithmetic, a
        vectorised clamp of 9 instructions instead of vmaxps and vminps (delta2bbox: 1.23x faster)."""
        known = self.consts.get((literal, dtype))
        if known is None:
            known = self.consts[(literal, dtype)] = f"zf{len(self.lines)}"
            self.lines.append(f"    const {CTYPE[dtype]} {known} = evo_opaque_{SUFFIX[dtype]}({literal});")
        return known

    def place(self, source: str) -> str:
        """`source` with each HOISTED marker line replaced by the declarations."""
        return source.replace(self.HOISTED + "\n", "".join(ln + "\n" for ln in self.lines))


def print_poly(p: Poly, names: Names) -> str:
    if not p.terms:
        return "0"
    parts = []
    for mono, c in p.terms:
        factors = [_atom(a, names) for a in mono]
        if not factors:
            parts.append(names.int_literal(c))
        elif c == 1:
            parts.append("*".join(factors))
        else:
            parts.append(f"{names.int_literal(c)}*" + "*".join(factors))
    return "(" + " + ".join(parts) + ")"


def _atom(a: Atom, names: Names) -> str:
    if names.carried and a in names.carried:
        return names.carried[a]
    if isinstance(a, Var):
        return names.vars[a]
    if isinstance(a, Sym):
        return names.syms[a]
    h = names.hoist
    if h is not None and isinstance(a, (FloorDiv, Mod, Min, Max)):
        known = h.text.get(a)
        if known is not None:
            return known
        text = _compound(a, names)
        parts = (a.num, a.den) if isinstance(a, (FloorDiv, Mod)) else (a.a, a.b)
        if not any(isinstance(x, (Var, Lookup, Picked)) for p in parts for x in p.atoms()):
            if len(text) > h.LONG:
                h.lines.append(f"    const int64_t z{len(h.lines)} = {text};")
                text = f"z{len(h.lines) - 1}"
            h.text[a] = text
        return text
    return _compound(a, names)


def _compound(a: Atom, names: Names) -> str:
    if isinstance(a, FloorDiv):
        return f"evo_fdiv({print_poly(a.num, names)}, {print_poly(a.den, names)})"
    if isinstance(a, Mod):
        return f"evo_fmod({print_poly(a.num, names)}, {print_poly(a.den, names)})"
    if isinstance(a, Min):
        return f"evo_imin({print_poly(a.a, names)}, {print_poly(a.b, names)})"
    if isinstance(a, Max):
        return f"evo_imax({print_poly(a.a, names)}, {print_poly(a.b, names)})"
    if isinstance(a, Lookup):
        entry = f"{names.tables[a.table]}[{print_poly(a.index, names)}]"
        return entry if names.index_type is None else f"(({names.index_type}){entry})"
    if isinstance(a, Picked) and names.index_type is None:
        # the index read and checked where it is used (flag bit 2: the Run fails); one expression, no statement
        saved, names.pre = names.pre, None

        def inline(x: Expr) -> str:
            return print_expr(x, names, inline)

        text = f"evo_pick({inline(a.value)}, {print_poly(a.dim, names)}, &evo_zero)"
        names.pre = saved
        return text
    raise TypeError(f"cannot print atom {a!r}")


_IDENTITY = {"sum": 0, "prod": 1}


def _extreme(dtype: str, low: bool) -> str:
    if dtype in FLOATS:
        return print_const(float("-inf") if low else float("inf"), dtype)
    info = __import__("numpy").iinfo(dtype) if dtype != "bool" else None
    return print_const((info.min if low else info.max) if info is not None else (0 if low else 1), dtype)


def _print_reduce(e: Reduce, names: Names, sub: Callable[[Expr], str]) -> str:
    """A reduction with its own loop variable: its statements go to `names.pre` (before the statement being
    printed) and the result is a variable; with no statement context (`names.pre` None: the CUDA printer, a guarded
    select branch, whose reads must not run unless taken) a GNU statement expression in C, a lambda called in place
    in CUDA's C++. In C the loop carries `omp simd reduction(...)` (-fopenmp-simd): gcc reassociates and vectorises
    it. max/min give the same value in any order; sums and products round differently from one chain, as
    onnxruntime's vectorised ones do (checked with a tolerance). An extreme whose first index is searched for
    computes both in one pass (share.extreme_and_first)."""
    if e in names.lane_results:
        return names.lane_results[e]
    if (found := names.found.pop(e, None)) is not None:
        return found
    v = e.var.atom()
    assert isinstance(v, Var)
    r = names.fresh_loop()
    names.vars[v] = r
    ext = print_poly(v.extent, names)
    outer = names.pre
    inner: list[str] | None = [] if outer is not None else None
    names.pre = inner  # what the body's own reductions compute goes inside this loop
    body = _dot_factors(e, sub) if e.op == "dot" else sub(e.body)
    names.pre = outer
    if (search := names.searches.get(e)) and outer is not None and names.index_type is None and not inner:
        lines, result, names.found[search] = extreme_and_first(e.op, r, ext, body, CTYPE[e.body.dtype], _extreme(
            e.body.dtype, e.op == "max"), e.body.dtype in FLOATS, v.extent.const)
    else:
        lines, result = _reduce_code(e, r, ext, body, inner or [], simd=names.index_type is None)
        names.found.pop(e, None)  # a search printed on its own leaves no result for a later print of it
    if outer is not None:
        outer.extend(lines)
        return result
    if names.index_type is not None:  # CUDA is C++: a lambda called in place, which NVRTC compiles too
        return f"([&]() {{ {' '.join(lines)} return {result}; }}())"
    return f"__extension__ ({{ {' '.join(lines)} {result}; }})"


def _dot_factors(e: Reduce, sub: Callable[[Expr], str]) -> str:
    """The two factors of a dot reduction's body (a product), as the first two arguments of fma."""
    assert isinstance(e.body, Op) and e.body.op == "mul", "a dot reduction sums products"
    return f"{sub(e.body.args[0])}, {sub(e.body.args[1])}"


def _fma(dtype: str) -> str:
    return "fmaf" if dtype == "float32" else "fma"


def _loop(head: str, statements: Sequence[str]) -> list[str]:
    return [f"{head} {{", *(f"    {st}" for st in statements), "}"]


def _sum_type(e: Reduce, t: str) -> str:
    """The accumulator type of a sum: double for float32 over a long or run-time axis. Over thousands of elements
    one float accumulator per SIMD lane was about ten times less accurate than onnxruntime's float sum (relative
    errors 1e-6 against 1e-7 for 4,099 x 2 positive values); in double evonnx's sum is the exact one rounded once,
    so it differs from onnxruntime's by onnxruntime's own error only, on the CPU and on CUDA alike. Over a constant
    axis of at most SHORT_SUM elements (a DFL head's softmax over 16 bins) float keeps the error within a few ulp
    of onnxruntime's float sum, and without the conversions to double a DFL kernel ran 0.8x the time. Products
    stay in their type (their overflow and underflow are onnxruntime's)."""
    if e.op != "sum" or t != "float":
        return t
    atom = e.var.atom()
    n = atom.extent.const if isinstance(atom, Var) else None
    return "float" if n is not None and n <= SHORT_SUM else "double"


SHORT_SUM = 32


def _reduce_code(e: Reduce, r: str, ext: str, body: str, inner: Sequence[str], simd: bool) -> tuple[list[str], str]:
    """The statements of reduction `e` over loop variable `r` < `ext` of element `body` (preceded in each loop by
    `inner`, the statements of the reductions inside it), and the C expression of its result."""
    t = CTYPE[e.body.dtype]
    floating = e.body.dtype in FLOATS
    loop = f"for (int64_t {r} = 0; {r} < {ext}; ++{r})"
    value = [*inner, f"const {t} {r}_v = {body};"]

    def pragma(op: str, acc: str) -> list[str]:
        return [f'_Pragma("omp simd reduction({op}:{acc})")'] if simd else []

    if e.op in ("first", "last"):
        # the first (last) position where the bool body holds, else 0 (share.argmax_from_max: an ArgMax's search).
        # In C a min (max) reduction of the positions that hold, which gcc vectorises (a loop that stops at the
        # first match does not: a scalar search of a row of 80 scores cost more than its vectorised max)
        if simd:
            # positions in int32 where the extent is known to fit (AVX2 compares 8 of them at once, 4 int64)
            n = e.var.atom().extent.const  # type: ignore[union-attr]
            it = "int32_t" if n is not None and n < (1 << 31) else "int64_t"
            none, m, cmp = (f"({it}){ext}", "min", "<") if e.op == "first" else (f"({it})-1", "max", ">")
            return ([f"{it} {r}_at = {none};", *pragma(m, f"{r}_at"),
                     *_loop(loop, [*value, f"const {it} {r}_p = {r}_v ? ({it}){r} : {none};",
                                   f"{r}_at = {r}_p {cmp} {r}_at ? {r}_p : {r}_at;"]),
                     f"const int64_t {r}_i = {r}_at == {none} ? 0 : (int64_t){r}_at;"], f"{r}_i")
        scan = loop if e.op == "first" else f"for (int64_t {r} = {ext} - 1; {r} >= 0; --{r})"
        return [f"int64_t {r}_at = 0;", *_loop(scan, [*value, f"if ({r}_v) {{ {r}_at = {r}; break; }}"])], f"{r}_at"
    if simd and e.op in ("argmax", "argmin"):
        # onnxruntime starts from element 0 and takes a strictly better one: NaN at 0 gives 0, a later NaN is
        # skipped. The vectorised extreme skips NaN too (a NaN never compares better), then the scan finds its index.
        cmp, m = (">", "max") if e.op == "argmax" else ("<", "min")
        scan = (f"for (int64_t {r} = {ext} - 1; {r} >= 0; --{r})" if e.attr
                else f"for (int64_t {r} = 0; {r} < {ext}; ++{r})")
        lines = [f"{t} {r}_best = {_extreme(e.body.dtype, e.op == 'argmax')};", *pragma(m, f"{r}_best"),
                 *_loop(loop, [*value, f"{r}_best = {r}_v {cmp} {r}_best ? {r}_v : {r}_best;"]),
                 f"int64_t {r}_at = 0;"]
        if floating:
            first = f"for (int64_t {r} = 0; {r} < ({ext} > 0); ++{r})"  # element 0, if any
            lines += [f"int {r}_nan0 = 0;", *_loop(first, [*value, f"{r}_nan0 = {r}_v != {r}_v;"])]
            scan = f"if (!{r}_nan0) {scan}"
        lines += _loop(scan, [*value, f"if ({r}_v == {r}_best) {{ {r}_at = {r}; break; }}"])
        return lines, f"{r}_at"
    if simd and e.op in ("max", "min"):
        # onnxruntime's reductions start from element 0 and take a strictly greater (smaller) one: NaN at 0 gives
        # NaN, a later NaN is skipped (`v > acc` is false). The vectorised compare-select skips every NaN, and an
        # or-reduction records whether element 0 was one, so the max-reduction itself never sees a NaN.
        cmp = ">" if e.op == "max" else "<"
        step = f"{r}_acc = {r}_v {cmp} {r}_acc ? {r}_v : {r}_acc;"
        init = f"{t} {r}_acc = {_extreme(e.dtype, e.op == 'max')};"
        if not floating:
            return [init, *pragma(e.op, f"{r}_acc"), *_loop(loop, [*value, step])], f"{r}_acc"
        return ([init, f"int {r}_nan0 = 0;", f'_Pragma("omp simd reduction({e.op}:{r}_acc) reduction(|:{r}_nan0)")',
                 *_loop(loop, [*value, step, f"{r}_nan0 |= ({r} == 0) & ({r}_v != {r}_v);"])],
                f"({r}_nan0 ? ({t})NAN : {r}_acc)")
    if e.op == "dot":
        # onnxruntime's MatMul (MLAS on an FMA machine): one fused multiply-add per step, in order, from +0 (so a
        # zero product gives +0). No reassociation (no simd pragma). +0 not as a literal (helpers.h, evo_pzero).
        return ([f"{t} {r}_acc = evo_pzero_{SUFFIX[e.dtype]}();",
                 *_loop(loop, [*inner, f"{r}_acc = {_fma(e.dtype)}({body}, {r}_acc);"])], f"{r}_acc")
    if e.op in _IDENTITY:
        op = "+" if e.op == "sum" else "*"
        acc_t = _sum_type(e, t)  # the CUDA kernels too: one thread sums a row in order, as exact as the CPU's
        return ([f"{acc_t} {r}_acc = {print_const(_IDENTITY[e.op], e.dtype)};", *pragma(op, f"{r}_acc"),
                 *_loop(loop, [*inner, f"{r}_acc = {r}_acc {op} ({body});"])],
                f"({t}){r}_acc" if acc_t != t else f"{r}_acc")
    if e.op in ("argmax", "argmin"):
        better = (">" if e.op == "argmax" else "<") + ("=" if e.attr else "")
        take = f"if ({r} == 0 || {r}_v {better} {r}_best) {{ {r}_best = {r}_v; {r}_at = {r}; }}"
        return ([f"int64_t {r}_at = 0;", f"{t} {r}_best = {_extreme(e.body.dtype, e.op == 'argmax')};",
                 *_loop(loop, [*value, take])], f"{r}_at")
    # max/min from element 0, as above
    return ([f"{t} {r}_acc = {_extreme(e.dtype, e.op == 'max')};",
             *_loop(loop, [*value, f"{r}_acc = ({r} == 0 || {r}_v {'>' if e.op == 'max' else '<'} {r}_acc) ? {r}_v : "
                                   f"{r}_acc;"])], f"{r}_acc")


def with_binding(bind: str, statements: Sequence[str]) -> list[str]:
    """`statements` after the declaration `bind` (`const int64_t NAME = ...;`) where they read NAME."""
    name = bind.split("=")[0].split()[-1]
    used = any(re.search(rf"\b{name}\b", st) for st in statements)
    return [bind, *statements] if used else list(statements)


def lane_reduce(group: Sequence[Reduce], names: Names, bind: str, lanes: int) -> list[str]:
    """Statements computing the reductions `group` for a block of up to `lanes` adjacent elements at once, and
    records each one's per-lane result in `names.lane_results` (an expression of the lane index `ll`).

    The reduction's loop is outside and a loop over the block's lanes (`ll` < `ln`, each lane's loop variable
    bound by `bind`) inside, with one accumulator per lane: where the body reads contiguously along the lanes but
    with a stride along the reduced axis, gcc vectorises the lane loop with plain loads (schedule.lane_axis). Each
    lane accumulates in the reduced axis' order, and max/min/argmax/argmin keep onnxruntime's rules (from element
    0, a strictly better element replaces it: NaN at element 0 wins, a later one is skipped). The body is printed
    as one expression; the reductions inside it must be in `names.lane_results` already.

    The reductions of a group run over the same extent and none reads another (`lane_groups`): they share one
    loop, so what their bodies compute alike (a Softmax's exps, summed and weighted by a DFL head's bins) is
    computed once per step (gcc's common subexpressions: the bodies are printed with the same loop variable)."""
    r = names.fresh_loop()
    ext = ""
    inits: list[tuple[str, str, str]] = []
    steps: list[str] = []
    for e in group:
        v = e.var.atom()
        assert isinstance(v, Var)
        names.vars[v] = r
        ext = print_poly(v.extent, names)
        tag = r if e is group[0] else names.fresh_loop()
        decls, step, result = _lane_step(e, names, r, tag)
        inits += decls
        steps += step
        names.lane_results[e] = result
    lines = [f"{ct} {name}[{lanes}];" for ct, name, _ in inits]
    lines += _loop(f"for (int64_t ll = 0; ll < {lanes}; ++ll)", [f"{name}[ll] = {v0};" for _, name, v0 in inits])
    lane_loop = ['_Pragma("omp simd")', *_loop("for (int64_t ll = 0; ll < ln; ++ll)", with_binding(bind, steps))]
    return lines + _loop(f"for (int64_t {r} = 0; {r} < {ext}; ++{r})", lane_loop)


def lane_groups(reds: Sequence[Reduce]) -> list[list[Reduce]]:
    """`reds` (each after the reductions in its body) in groups that `lane_reduce` computes in one loop: runs of
    reductions over the same extent where none is inside another's body."""
    groups: list[list[Reduce]] = []
    for red in reds:
        last = groups[-1] if groups else None
        if (last is not None and last[0].var.atom().extent == red.var.atom().extent  # type: ignore[union-attr]
                and not set(last) & set(walk(red.body))):
            last.append(red)
        else:
            groups.append([red])
    return groups


def _lane_step(e: Reduce, names: Names, r: str, tag: str) -> tuple[list[tuple[str, str, str]], list[str], str]:
    """Reduction `e`'s per-lane accumulators (C type, name, initial value), the statements of one step of loop
    `r` for lane `ll`, and its result, its names prefixed with `tag`."""
    saved, names.pre = names.pre, None  # a reduction nested in the body and not on lanes: a statement expression

    def inline(x: Expr) -> str:
        return print_expr(x, names, inline)

    body = _dot_factors(e, inline) if e.op == "dot" else inline(e.body)
    names.pre = saved
    t = CTYPE[e.body.dtype]
    value = f"const {t} {tag}_v = {body};"
    if e.op == "dot":  # as _reduce_code: one fma per step and lane, in order
        return ([(t, f"{tag}_acc", f"evo_pzero_{SUFFIX[e.dtype]}()")],
                [f"{tag}_acc[ll] = {_fma(e.dtype)}({body}, {tag}_acc[ll]);"], f"{tag}_acc[ll]")
    if e.op in _IDENTITY:
        op = "+" if e.op == "sum" else "*"
        acc_t = _sum_type(e, t)
        return ([(acc_t, f"{tag}_acc", print_const(_IDENTITY[e.op], e.dtype))],
                [value, f"{tag}_acc[ll] = {tag}_acc[ll] {op} {tag}_v;"],
                f"({t}){tag}_acc[ll]" if acc_t != t else f"{tag}_acc[ll]")
    if e.op in ("max", "min"):
        cmp = ">" if e.op == "max" else "<"
        step = [value, f"{tag}_acc[ll] = {tag}_v {cmp} {tag}_acc[ll] ? {tag}_v : {tag}_acc[ll];"]
        decls = [(t, f"{tag}_acc", _extreme(e.dtype, e.op == "max"))]
        if e.body.dtype not in FLOATS:
            return decls, step, f"{tag}_acc[ll]"
        # the extreme skips every NaN (a NaN never compares better); element 0's is kept apart
        decls.append(("int", f"{tag}_nan0", "0"))
        step.append(f"{tag}_nan0[ll] |= ({r} == 0) & ({tag}_v != {tag}_v);")
        return decls, step, f"({tag}_nan0[ll] ? ({t})NAN : {tag}_acc[ll])"
    if e.op in ("argmax", "argmin"):
        better = (">" if e.op == "argmax" else "<") + ("=" if e.attr else "")
        return ([(t, f"{tag}_best", _extreme(e.body.dtype, e.op == "argmax")), ("int64_t", f"{tag}_at", "0")],
                [value, f"const int {tag}_take = ({r} == 0) | ({tag}_v {better} {tag}_best[ll]);",
                 f"{tag}_best[ll] = {tag}_take ? {tag}_v : {tag}_best[ll];",
                 f"{tag}_at[ll] = {tag}_take ? {r} : {tag}_at[ll];"], f"{tag}_at[ll]")
    raise TypeError(f"cannot print reduction {e.op}")


_RANGE = {t: (int(np.iinfo(t).min), int(np.iinfo(t).max)) for t in UTYPE.keys() | {"uint8", "uint16", "uint32",
                                                                                   "uint64"}}


def _check_range(v: int, dtype: str) -> None:
    """A literal outside its type would be reinterpreted by the C compiler: that is a bug upstream, never C."""
    lo, hi = _RANGE[dtype]
    if not lo <= v <= hi:
        raise InternalError(f"integer literal {v} does not fit {dtype}")


def _decimal(v: float, dtype: str) -> str:
    """The shortest decimal literal that reads back as `v` in `dtype` (float32: numpy's shortest unique digits,
    which a C compiler rounds to the same float; float64: Python's repr), positional for ordinary magnitudes."""
    if dtype == "float32":
        f = np.float32(v)
        plain = v == 0 or 1e-4 <= abs(float(f)) < 1e7
        text = (np.format_float_positional(f, unique=True, trim="0") if plain
                else np.format_float_scientific(f, unique=True, trim="-"))
        return f"{text}f"
    text = repr(float(v))
    return text if any(ch in text for ch in ".e") else f"{text}.0"


def print_const(value: float | int | bool, dtype: str) -> str:
    if dtype in FLOATS:
        v = float(value)
        t = CTYPE[dtype]
        if math.isnan(v):
            return f"(({t})NAN)"
        if math.isinf(v):
            return f"(({t})INFINITY)" if v > 0 else f"(-({t})INFINITY)"
        return _decimal(v, dtype)
    if dtype == HALF:  # its bits: a constant expression in C and CUDA alike, NaN and infinities included
        return f"((evo_half)0x{int(np.array(value, np.float16).view(np.uint16)):04x})"
    if dtype == "bool":
        return "1" if value else "0"
    v = int(value)
    _check_range(v, dtype)
    if dtype == "int64":
        return f"INT64_C({v})" if v != -(1 << 63) else "INT64_MIN"
    if dtype == "uint64":
        return f"UINT64_C({v})"
    return f"(({CTYPE[dtype]}){v})"


def _call_argument(text: str, fn: str) -> str | None:
    """The argument of `text` where all of it is one call `fn(...)`, else None."""
    if not (text.startswith(fn + "(") and text.endswith(")")):
        return None
    depth = 0
    for k, ch in enumerate(text[len(fn):]):
        depth += ch == "("
        depth -= ch == ")"
        if depth == 0 and k != len(text) - len(fn) - 1:
            return None  # the call closes before the end: `fn(a) + g(b)`
    return text[len(fn) + 1:-1]


def _at_most_88(x: Expr) -> bool:
    """Whether float `x` is at most 88 or NaN (its exp cannot overflow): a Min by such a constant (a Clip)."""
    return isinstance(x, Op) and x.op in ("min", "nmin") and any(isinstance(c, Const) and c.value <= 88 for c in x.args)


def _half_cast(e: Op, src: str, a: str) -> str:
    """A conversion to or from float16, the only operation on it besides a select (expr.HALF): from float16 to
    float32, or to float16 from float32, an integer or a bool (exact in float32 wherever the result is finite). A
    value rounded to float16 and read back at once (each float16 operation's result) is evo_round_h."""
    if e.op == "cast" and src == HALF and e.dtype == "float32":
        inner = _call_argument(a, "evo_f2h")
        return f"evo_round_h({inner})" if inner is not None else f"evo_h2f({a})"
    if e.op == "cast" and e.dtype == HALF and src == "float32":
        return f"evo_f2h({a})"
    if e.op == "cast" and e.dtype == HALF and (src in INTS or src == "bool"):
        return f"evo_f2h((float){a})"
    raise InternalError(f"operation {e.op} from {src} to {e.dtype}: float16 is converted, never computed in")


def print_expr(e: Expr, names: Names, sub: Callable[[Expr], str]) -> str:
    """C for one expression node; `sub` prints its children (a temporary's name or the inline expression)."""
    if isinstance(e, Const):
        if e.dtype in FLOATS and e.value == 0 and not math.copysign(1.0, float(e.value)) < 0:
            return f"evo_pzero_{SUFFIX[e.dtype]}()"  # not a literal: gcc 12 folds 0 - X wrongly (helpers.h)
        return print_const(e.value, e.dtype)
    if isinstance(e, (Load, TableLoad)):
        ref = f"in{e.slot}" if isinstance(e, Load) else names.tables[e.table]
        if names.guarded and names.index_type is None:
            # a read that may be out of range where the guard fails (a ScatterND's updates, a Concat's other part):
            # read through a volatile lvalue, which gcc never speculates, so the loop is not if-converted into
            # masked loads. gcc 12.2 miscompiles permuted masked loads at -O3 with AVX2 (GCC PR 114375; fuzz case
            # 5940: a ScatterND of 2 constant rows into [N,4], concatenated with itself, read garbage and
            # crashed in the x86-64-v3 kernels at N = 100000 on 2 threads).
            return f"(*(const volatile {CTYPE[e.dtype]} *)&{ref}[{print_poly(e.index, names)}])"
        return f"{ref}[{print_poly(e.index, names)}]"
    if isinstance(e, IndexVal):
        return print_poly(e.poly, names)
    if isinstance(e, Reduce):
        return _print_reduce(e, names, sub)
    assert isinstance(e, Op)
    if e.attr == "guard":  # the operands after the first are read only where it holds: no statement before
        saved = names.pre
        a = [sub(e.args[0])]
        names.pre = None
        names.guarded += 1
        a += [sub(x) for x in e.args[1:]]
        names.guarded -= 1
        names.pre = saved
    else:
        a = [sub(x) for x in e.args]
    src = e.args[0].dtype if e.args else e.dtype
    t = CTYPE[e.dtype]
    s = SUFFIX[src]
    op = e.op
    if HALF in (src, e.dtype) and op not in ("where", "keep"):
        return _half_cast(e, src, a[0])
    if op in ("add", "sub", "mul"):
        sym_ = {"add": "+", "sub": "-", "mul": "*"}[op]
        if src in SIGNED:
            u = UTYPE[src]
            return f"(({t})(({u}){a[0]} {sym_} ({u}){a[1]}))"
        return f"(({t})({a[0]} {sym_} {a[1]}))" if src in INTS else f"({a[0]} {sym_} {a[1]})"
    if op in ("div", "mod") and src not in FLOATS:
        divisor = e.args[1]
        b = a[1] if isinstance(divisor, Const) and divisor.value != 0 else f"evo_nz_{s}({a[1]}, &evo_zero)"
        return f"evo_div_{s}({a[0]}, {b})" if op == "div" else f"evo_{'tmod' if e.attr else 'pmod'}_{s}({a[0]}, {b})"
    if op == "div":
        return f"({a[0]} / {a[1]})"
    if op == "mod":
        return f"{'fmodf' if src == 'float32' else 'fmod'}({a[0]}, {a[1]})"
    if op == "pow":
        return f"{'powf' if src == 'float32' else 'pow'}({a[0]}, {a[1]})"
    if op in ("min", "max", "nmin", "nmax"):
        if names.hoist is not None and src in ("float32", "float64"):
            a = [names.hoist.opaque(t, src) if isinstance(x, Const) else t for x, t in zip(e.args, a, strict=True)]
        return f"evo_{op}_{s}({a[0]}, {a[1]})"
    if op in ("eq", "lt", "le", "gt", "ge"):
        return f"({a[0]} {({'eq': '==', 'lt': '<', 'le': '<=', 'gt': '>', 'ge': '>='})[op]} {a[1]})"
    # And/Or evaluate both sides, as ONNX does: a short-circuit `&&` puts the right side's reads under a condition,
    # which gcc may if-convert into masked loads (gcc 12.2 miscompiles those, see schedule.temporaries). Every
    # operand is in range without the other, so reading it unconditionally is safe.
    if op == "and":
        return f"((({a[0]}) != 0) & (({a[1]}) != 0))"
    if op == "or":
        return f"((({a[0]}) != 0) | (({a[1]}) != 0))"
    if op == "xor":
        return f"(!{a[0]} != !{a[1]})"
    if op == "not":
        return f"(!{a[0]})"
    if op == "where":
        return f"({a[0]} ? {a[1]} : {a[2]})"
    if op == "keep":  # expr.keep: the run-time positions evaluated (and checked), then the value
        return "(" + "".join(f"(void)({x}), " for x in a[1:]) + f"{a[0]})"
    if op == "cast":
        if e.dtype == "bool":
            return f"(({t})({a[0]} != 0))"
        if src in FLOATS and e.dtype in INTS:
            return f"evo_f2{SUFFIX[e.dtype]}({a[0]})"  # defined out of range (kernels/templates/helpers.h)
        if src in INTS and e.dtype in FLOATS:
            # + 0.0, a no-op on every integer's value, keeps a zero +0.0: with -fno-trapping-math and SSE4.1 (the
            # x86-64-v3 clone), gcc 12 folds (float)(int64_t)x into truncf(x), which gives -0.0 for x in (-1, 0)
            # where onnxruntime's Cast to int and back gives +0.0 (fuzz seed 160001)
            return f"(({t}){a[0]} + evo_pzero_{SUFFIX[e.dtype]}())"
        return f"(({t}){a[0]})"
    if op == "neg":
        # "- x", not "-x": a literal -0.0f after a bare minus would read as the decrement operator
        return f"(({t})(-({UTYPE[src]}){a[0]}))" if src in SIGNED else f"(- {a[0]})"
    if op in ("abs", "relu", "sign"):
        return f"evo_{op}_{s}({a[0]})"
    if op == "reciprocal":
        return f"({print_const(1, src)} / {a[0]})"
    if op == "sigmoid":
        return f"evo_sigmoid_{s}({a[0]})"
    if op in ("softplus", "mish"):
        return f"evo_{op}_{s}({a[0]})"
    if op == "isnan":
        return f"(isnan({a[0]}) != 0)"
    if op in ("exp", "exp_nonpos") and src == "float32":
        return f"evo_expf{'_bounded' if op == 'exp_nonpos' or _at_most_88(e.args[0]) else ''}({a[0]})"
    if op == "log" and src == "float32":
        return f"evo_logf({a[0]})"
    if op in ("erf", "tanh") and src == "float32":
        return f"evo_{op}_f32({a[0]})"
    if op in _MATH1:
        return f"{_MATH1[op]}{'f' if src == 'float32' else ''}({a[0]})"
    raise TypeError(f"cannot print operation {op}")
