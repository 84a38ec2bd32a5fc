"""Unswitched guards (issue 12): a guarded select whose condition is the same in every iteration of a task's inner
loop is decided once per row, and the inner loop is printed once for each way it can go.

A guarded select reads its branches only where its condition holds (a Concat piece's other part, a ScatterND's
updates), and its reads print as volatile lvalues (cprint.print_expr), which gcc never speculates: the loop around
them is not vectorised. Where the Concat boundary lies on an outer axis folded into the inner loop's row, the
condition depends on the outer loop variables alone: YOLOv8-pose's keypoint decode ([1, 51, A] as 17 triples,
x and y decoded, the third a Sigmoid) selects on `(2 + o0) % 3 < 2` in a loop over the anchors. There the select
is taken out of the loop: `if (cond) { loop with the first branch } else { loop with the second }`, each loop
reading only what its branch reads, unconditionally, so gcc vectorises both.

Only the guards the roots reach without passing through another guard's branch or into a reduction are taken:
their conditions are evaluated unconditionally already, so evaluating them once per row reads nothing new. A
condition that holds a reduction is left in the loop, as are guards past the first `MAX_GUARDS` (each doubles the
printed loops)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from evonnx.expr import Expr, Op, Reduce, free_vars, walk
from evonnx.index import Poly, Var
from evonnx.kernels.carry import JLOOP
from evonnx.kernels.cprint import Names, print_expr

MAX_GUARDS = 2


def invariant_guards(roots: Sequence[tuple[Poly, Expr]], inner: Var, outer: set[Var]) -> list[Expr]:
    """The conditions of the guarded selects to unswitch (module doc), in the order first reached."""
    found: dict[Expr, None] = {}
    seen: set[Expr] = set()
    stack = [e for _, e in reversed(roots)]
    while stack:
        x = stack.pop()
        if x in seen or isinstance(x, Reduce):
            continue
        seen.add(x)
        if not isinstance(x, Op):
            continue
        if x.attr == "guard":
            cond = x.args[0]
            if (inner not in free_vars(cond) and free_vars(cond) <= outer
                    and not any(isinstance(y, Reduce) for y in walk(cond))):
                found.setdefault(cond)
            stack.append(cond)  # its branches are read only where it holds: not searched
        else:
            stack.extend(reversed(x.args))
    return list(found)[:MAX_GUARDS]


def choose(e: Expr, choice: Mapping[Expr, bool]) -> Expr:
    """`e` with each guarded select whose condition `choice` decides replaced by the branch it takes."""
    memo: dict[Expr, Expr] = {}

    def go(x: Expr) -> Expr:
        if x in memo:
            return memo[x]
        r = x
        if isinstance(x, Op) and x.attr == "guard" and x.args[0] in choice:
            r = go(x.args[1] if choice[x.args[0]] else x.args[2])
        elif isinstance(x, Op):
            args = tuple(go(a) for a in x.args)
            if args != x.args:
                r = Op(x.op, args, x.dtype, x.attr)
        elif isinstance(x, Reduce):
            body = go(x.body)
            if body is not x.body:
                r = Reduce(x.op, x.var, body, x.dtype, x.attr)
        memo[x] = r
        return r

    return go(e)


def unswitched_loop(conds: Sequence[Expr], roots: Sequence[tuple[Poly, Expr]], names: Names,
                    body: Callable[[list[tuple[Poly, Expr]]], tuple[str, str]]) -> str:
    """The inner loop (JLOOP, 8 spaces in) in an `if` per condition of `conds`, each way printed by `body` (the
    roots with those conditions decided -> per-row statements, loop body) with its own per-row statements."""

    def cond_c(c: Expr) -> str:
        saved, names.pre = names.pre, []

        def sub(x: Expr) -> str:
            return print_expr(x, names, sub)

        try:
            text = print_expr(c, names, sub)
            assert not names.pre  # no reduction (invariant_guards)
        finally:
            names.pre = saved
        return text

    tests = [cond_c(c) for c in conds]

    def ways(k: int, choice: dict[Expr, bool]) -> list[str]:
        if k == len(conds):
            row, loop = body([(p, choose(e, choice)) for p, e in roots])
            return [row, JLOOP, loop, "        }"]
        return [f"        if ({tests[k]}) {{", *ways(k + 1, {**choice, conds[k]: True}), "        } else {",
                *ways(k + 1, {**choice, conds[k]: False}), "        }"]

    return "\n".join(line for line in ways(0, {}) if line)
