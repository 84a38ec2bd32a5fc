"""Reductions a kernel computes once: the same reduction reached twice, and an ArgMax reading its ReduceMax.

Every lowering of a reduction binds a loop variable of its own (`lazy.fresh_var`), so two consumers of one
ReduceMax, or a ReduceMax and an ArgMax of the same values (torch's `max(dim)` exports both, and a score filter
tests the max and stores it too), reach reductions that are equal but for the name of that variable. The
temporaries (`schedule.temporaries`) share only equal expressions, so each was its own pass over the row: a
YOLO score filter read its 80 class scores four times per box. `Canon` names every reduction's variable by its
place among the reductions nested in it, so equal reductions become one expression, computed once.

`argmax_from_max` then computes an ArgMax/ArgMin from the extreme it selects, as one more reduction of the same
values: the index is the first (with `select_last_index`, the last) position holding the ReduceMax/ReduceMin value,
and 0 where there is none. That is onnxruntime's rule exactly: it starts from element 0 and takes a strictly
greater one (`>=` for the last index), so a later NaN never wins, a NaN at element 0 keeps index 0 (the
ReduceMax is NaN then, which equals nothing), and -0 and +0 tie. The max is shared with a ReduceMax of the same
values where the kernel has one, and the search stops at the first match.
"""

from __future__ import annotations

from collections.abc import Sequence

from evonnx.expr import Const, Expr, Op, Reduce, binary, children, substitute, walk
from evonnx.index import Poly, Var


class Canon:
    """Rewrites expressions so that reductions equal up to the names of their loop variables are equal: each
    variable is named after its reduction's height (1 + the height of the reductions nested in its body, 0 for
    none) and extent, bottom up. A reduction and one nested in it never share a name, so the renaming captures
    nothing; siblings may share one, as a C loop variable may be reused. One instance per kernel."""

    def __init__(self) -> None:
        self._memo: dict[Expr, Expr] = {}
        self._height: dict[Expr, int] = {}

    def __call__(self, e: Expr) -> Expr:
        memo, height = self._memo, self._height
        for x in walk(e):
            if x in memo:
                continue
            if isinstance(x, Op):
                memo[x] = _rebuilt(x, memo)
                height[x] = max((height[a] for a in x.args), default=0)
            elif isinstance(x, Reduce) and (chain := _unrolled(x, memo[x.body])) is not None:
                memo[x] = chain
                height[x] = 0
            elif isinstance(x, Reduce):
                memo[x] = self._reduce(x.op, x.bound(), memo[x.body], x.dtype, x.attr, height[x.body])
                height[x] = height[x.body] + 1
            else:
                memo[x] = x
                height[x] = 0
            height[memo[x]] = height[x]
        return memo[e]

    def _reduce(self, op: str, v: object, body: Expr, dtype: str, attr: int, inner: int) -> Reduce:
        assert isinstance(v, Var)
        name = Var(f"_k{inner}", v.extent)  # lazy.fresh_var's names are _r<n>
        return Reduce(op, Poly.of(name), body if name == v else substitute(body, {v: Poly.of(name)}), dtype, attr)

    def extreme(self, arg: Reduce) -> Reduce:
        """The ReduceMax (ReduceMin) of the values ArgMax (ArgMin) `arg` reduces, named as `Canon` names it."""
        v = arg.bound()
        assert isinstance(v, Var)
        inner = self._height[arg] - 1
        red = self._reduce("max" if arg.op == "argmax" else "min", v, arg.body, arg.body.dtype, 0, inner)
        self._memo.setdefault(red, red)
        self._height.setdefault(red, inner + 1)
        return red


SMALL_REDUCTION = 4


def _unrolled(x: Reduce, body: Expr) -> Expr | None:
    """A float sum or product of at most SMALL_REDUCTION elements, with no reduction in its body, as the chain
    the loop computes, from the identity in order (((0 + b(0)) + b(1)) + ...: a -0 term still gives +0), with
    the loop variable a constant in each term, so that what the body selects by it folds (Expr.substitute). A
    stack reduced at once (effdet's BiFPN: Unsqueeze, Concat on a new last axis, ReduceSum over its 2 or 3
    inputs) read each input under a select by the loop variable, whose guarded reads kept gcc from vectorising
    the element loop: 2.2 ms against onnxruntime's 0.8 for [1, 64, 64, 64] x 2; unrolled, each term reads one
    input at its own position."""
    v = x.bound()
    n = v.extent.const if isinstance(v, Var) else None
    if (x.op not in ("sum", "prod") or x.dtype not in ("float32", "float64") or n is None
            or not 1 <= n <= SMALL_REDUCTION or any(isinstance(y, Reduce) for y in walk(body))):
        return None
    acc: Expr = Const(0.0 if x.op == "sum" else 1.0, x.dtype)
    for k in range(n):
        acc = binary("add" if x.op == "sum" else "mul", acc, substitute(body, {v: Poly.of(k)}))
    return acc


def _top_level(roots: Sequence[Expr]) -> set[Expr]:
    """The nodes reached from `roots` only outside reduction bodies and guarded select branches: a reduction
    computed once per element, before the statement that reads it."""
    top: set[Expr] = set()
    deep: set[Expr] = set()
    stack: list[tuple[Expr, bool]] = [(e, False) for e in roots]
    while stack:
        x, inside = stack.pop()
        seen = deep if inside else top
        if x in seen:
            continue
        seen.add(x)
        kids = children(x)
        for k, a in enumerate(kids):
            stack.append((a, inside or isinstance(x, Reduce) or (isinstance(x, Op) and x.attr == "guard" and k > 0)))
    return top - deep


def argmax_from_max(roots: Sequence[Expr], canon: Canon, searches: dict[Expr, Expr] | None = None) -> list[Expr]:
    """`roots` (in `canon`'s names) with each top-level ArgMax/ArgMin computed as the first (last) index of its
    extreme: Reduce("first"/"last", v, body == extreme). Only at the top level: inside another reduction or a
    guarded branch the extreme would not be hoisted out of the search's loop (`schedule.temporaries` hoists what
    does not depend on a reduction's variable only where it is computed unconditionally). `searches` takes each
    extreme whose first index is searched for, with that search: the C printer computes both in one pass
    (`extreme_and_first`)."""
    top = _top_level(roots)
    swap: dict[Expr, Expr] = {}
    for x in top:
        if isinstance(x, Reduce) and x.op in ("argmax", "argmin"):
            found = binary("eq", x.body, extreme := canon.extreme(x))
            swap[x] = Reduce("last" if x.attr else "first", x.var, found, x.dtype)
            if searches is not None and not x.attr and x.body.dtype not in ("float16", "bfloat16", "bool"):
                searches[extreme] = swap[x]
    if not swap:
        return list(roots)
    memo: dict[Expr, Expr] = {}
    out = []
    for e in roots:
        for x in walk(e):
            memo[x] = swap[x] if x in swap else _rebuilt(x, memo)
        out.append(memo[e])
    return out


def _rebuilt(x: Expr, memo: dict[Expr, Expr]) -> Expr:
    """`x` over its children's rewrites in `memo` (`x` itself where none changed)."""
    if isinstance(x, Op):
        args = tuple(memo[a] for a in x.args)
        return x if all(a is b for a, b in zip(args, x.args, strict=True)) else Op(x.op, args, x.dtype, x.attr)
    if isinstance(x, Reduce):
        body = memo[x.body]
        return x if body is x.body else Reduce(x.op, x.var, body, x.dtype, x.attr)
    return x


def extreme_and_first(op: str, r: str, ext: str, body: str, t: str, init: str, floating: bool,
                      n: int | None) -> tuple[list[str], str, str]:
    """C statements computing a max (min) reduction and the first index holding it (`argmax_from_max`'s search) in
    one pass over loop variable `r` < `ext` of element `body` (of C type `t`, `init` the identity), and the C of
    both results. Eight lanes each keep their extreme and the first index reaching it (`r` modulo 8: a strictly
    better value replaces it), which gcc vectorises; across lanes the extreme is the max of theirs and its index
    the least of the lanes holding it, whose own value is taken (so -0 and +0 come as the first of them, as
    onnxruntime's sequential pass keeps). The rules of the two passes it replaces: NaN at element 0 gives NaN and
    index 0, a later NaN never wins; where no element beats `init` (all of them `init`, or NaN), a scan finds the
    first `init`. A score filter's max and argmax over 80 classes read the row once instead of twice."""
    cmp, red = (">", "max") if op == "max" else ("<", "min")
    it = "int32_t" if n is not None and n < (1 << 31) else "int64_t"
    none = f"({it}){ext}"
    lines = [f"{t} {r}_m[8];", f"{it} {r}_i[8];",
             f"for (int64_t {r}_l = 0; {r}_l < 8; ++{r}_l) {{ {r}_m[{r}_l] = {init}; {r}_i[{r}_l] = {none}; }}",
             f"int64_t {r}_b = 0;",
             f"for (; {r}_b + 8 <= {ext}; {r}_b += 8) {{",
             '    _Pragma("omp simd")',
             f"    for (int64_t {r}_l = 0; {r}_l < 8; ++{r}_l) {{",
             f"        const int64_t {r} = {r}_b + {r}_l;",
             f"        const {t} {r}_v = {body};",
             # a bitwise blend, stored whole: as a select gcc stores it masked (vmaskmovps), and the next
             # block's load of a masked store is not forwarded (13x the time of the two passes)
             f"        const {it} {r}_k = -({it})({r}_v {cmp} {r}_m[{r}_l]);",
             f"        {r}_m[{r}_l] = {r}_v {cmp} {r}_m[{r}_l] ? {r}_v : {r}_m[{r}_l];",
             f"        {r}_i[{r}_l] = (({it}){r} & {r}_k) | ({r}_i[{r}_l] & ~{r}_k);",
             "    }", "}",
             f"for (int64_t {r} = {r}_b; {r} < {ext}; ++{r}) {{",
             f"    const {t} {r}_v = {body};",
             f"    if ({r}_v {cmp} {r}_m[{r} - {r}_b]) "
             f"{{ {r}_m[{r} - {r}_b] = {r}_v; {r}_i[{r} - {r}_b] = ({it}){r}; }}",
             "}",
             f"{t} {r}_acc = {init};",
             f'_Pragma("omp simd reduction({red}:{r}_acc)")',
             f"for (int64_t {r}_l = 0; {r}_l < 8; ++{r}_l) "
             f"{r}_acc = {r}_m[{r}_l] {cmp} {r}_acc ? {r}_m[{r}_l] : {r}_acc;",
             f"{it} {r}_at = {none};",
             f'_Pragma("omp simd reduction(min:{r}_at)")',
             f"for (int64_t {r}_l = 0; {r}_l < 8; ++{r}_l) {{",
             f"    const {it} {r}_p = {r}_m[{r}_l] == {r}_acc ? {r}_i[{r}_l] : {none};",
             f"    {r}_at = {r}_p < {r}_at ? {r}_p : {r}_at;",
             "}",
             f"if ({r}_at != {none}) {{",
             f"    {r}_acc = {r}_m[{r}_at & 7];",
             "} else {",
             f"    for (int64_t {r} = 0; {r} < {ext}; ++{r}) {{",
             f"        const {t} {r}_v = {body};",
             f"        if ({r}_v == {r}_acc) {{ {r}_at = ({it}){r}; break; }}",
             "    }",
             "}",
             f"const int64_t {r}_i0 = {r}_at == {none} ? 0 : (int64_t){r}_at;"]
    if not floating:
        return lines, f"{r}_acc", f"{r}_i0"
    lines += [f"int {r}_nan0 = 0;",
              f"for (int64_t {r} = 0; {r} < ({ext} > 0); ++{r}) {{",
              f"    const {t} {r}_v = {body};",
              f"    {r}_nan0 = {r}_v != {r}_v;",
              "}"]
    return lines, f"({r}_nan0 ? ({t})NAN : {r}_acc)", f"({r}_nan0 ? (int64_t)0 : {r}_i0)"
