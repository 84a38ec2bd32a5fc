"""Carried divisions (issue 12): a floor division or modulo, by a divisor fixed for the inner loop, of an index that
grows by 0 or 1 from one iteration to the next, is kept as a running quotient and remainder instead of divided
again in every iteration.

An anchor grid flattened by Reshape/Expand and broadcast against another size (mmdet's valid flags: an element
j < max(3*H*W, N) reads row fdiv(fdiv(min(j, 3*H*W - 1), 3), W) % H) divides by run-time sizes twice per element;
`schedule._split_axes` undoes the flattening only where the divisor divides the loop's extent. Here the divisions
were 44 % of valid_flags' profile: carried, the kernel ran 461 -> 181 us (100,800 anchors, 1 thread).

An index steps by 0 or 1 when it is c + X with c fixed in the inner loop and X one of: the inner loop variable
(steps by 1); min(a, K) or max(a, K) of a stepping a and a fixed K (steps while a < K, resp. once a >= K); a
carried floor division (steps when its remainder wraps). A carried (n, d) pair keeps q = fdiv(n, d) and
r = fmod(n, d) (floor semantics, so r is in [0, d) for negative n too): set once per row at j0, then after each
iteration, where n steps, r + 1 wraps to 0 at d and carries into q. The carried loop runs where every divisor is
at least 1 at run time; otherwise the row runs the loop as printed before (evo_fdiv's results for 0 and negative
divisors)."""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from evonnx.expr import Expr, walk
from evonnx.index import Atom, FloorDiv, Foreign, Lookup, Max, Min, Mod, Poly, Var
from evonnx.kernels.cprint import Names, print_poly
from evonnx.kernels.schedule import polys


@dataclass(frozen=True)
class _Pair:
    num: Poly
    den: Poly
    k: int  # its C names: cq<k>, cr<k>, cd<k>


def _fixed(p: Poly, j: Var, loop_vars: set[Var]) -> bool:
    """Whether `p` is the same in every iteration of the inner loop `j` (outer loop variables and sizes only)."""
    atoms = p.atoms()
    return j not in atoms and all(not isinstance(a, (Lookup, Foreign)) and (not isinstance(a, Var) or a in loop_vars)
                                  for a in atoms)


class Carries:
    """The carried pairs of one task's inner loop `j` (`find`), and the C that sets, steps and reads them."""

    def __init__(self, j: Var, loop_vars: set[Var]):
        self.j, self.loop_vars = j, loop_vars
        self.pairs: dict[tuple[Poly, Poly], _Pair] = {}

    def stepper(self, p: Poly) -> Atom | None:
        """X where `p` = c + X steps by 0 or 1 (module doc), else None."""
        moving = [k for k, (mono, _) in enumerate(p.terms) if self.j in Poly(((mono, 1),)).atoms()]
        if len(moving) != 1 or p.terms[moving[0]][1] != 1 or len(p.terms[moving[0]][0]) != 1:
            return None
        if not _fixed(Poly(p.terms[:moving[0]] + p.terms[moving[0] + 1:]), self.j, self.loop_vars):
            return None
        x = p.terms[moving[0]][0][0]
        if x == self.j:
            return x
        if isinstance(x, (Min, Max)):
            for a, b in ((x.a, x.b), (x.b, x.a)):
                if _fixed(b, self.j, self.loop_vars) and self.stepper(a) is not None:
                    return x
            return None
        if isinstance(x, FloorDiv) and (x.num, x.den) in self.pairs:
            return x
        return None

    def find(self, exprs: Sequence[Expr], positions: Sequence[Poly]) -> bool:
        """Carry every floor division and modulo of `exprs` and `positions` that qualifies, inner ones first.
        True where any divisor is not a constant (a constant one gcc divides by multiplying, and the loop may
        vectorise: nothing to gain)."""
        found: dict[Atom, None] = {}
        for p in [q for e in exprs for x in walk(e) for q in polys(x)] + list(positions):
            for a in p.atoms():
                if isinstance(a, (FloorDiv, Mod)) and self.j in a.num.atoms():
                    found[a] = None
        # inner first: an atom nested in another's numerator has the smaller weight
        for a in sorted(found, key=lambda a: (a.num.weight(), str(a))):  # type: ignore[attr-defined]
            num, den = a.num, a.den  # type: ignore[attr-defined]
            if (num, den) not in self.pairs and _fixed(den, self.j, self.loop_vars) and self.stepper(num) is not None:
                self.pairs[(num, den)] = _Pair(num, den, len(self.pairs))
        return any(pr.den.const is None for pr in self.pairs.values())

    def names(self) -> dict[Atom, str]:
        """What each carried atom prints as."""
        out: dict[Atom, str] = {}
        for pr in self.pairs.values():
            out[FloorDiv(pr.num, pr.den)] = f"cq{pr.k}"
            out[Mod(pr.num, pr.den)] = f"cr{pr.k}"
        return out

    def _step(self, x: Atom, names: Names) -> str:
        """C for: the stepping atom `x` grows by 1 after this iteration (read before any pair is stepped)."""
        if x == self.j:
            return "1"
        if isinstance(x, FloorDiv):
            pr = self.pairs[(x.num, x.den)]
            return f"({self._step_of(pr.num, names)} && cr{pr.k} + 1 == cd{pr.k})"
        assert isinstance(x, (Min, Max))
        a, b = (x.a, x.b) if _fixed(x.b, self.j, self.loop_vars) and self.stepper(x.a) else (x.b, x.a)
        cmp = "<" if isinstance(x, Min) else ">="
        return f"({self._step_of(a, names)} && ({print_poly(a, names)}) {cmp} ({print_poly(b, names)}))"

    def _step_of(self, p: Poly, names: Names) -> str:
        x = self.stepper(p)
        assert x is not None
        return self._step(x, names)

    def setup(self, names: Names, indent: str) -> tuple[list[str], str]:
        """The statements that set every pair at j = j0 (the divisors first), and the C condition under which the
        carried loop runs (every divisor at least 1). `names` prints carried atoms already (`names.carried`)."""
        lines = [f"{indent}const int64_t cd{pr.k} = {print_poly(pr.den, names)};" for pr in self.pairs.values()]
        lines += [f"{indent}int64_t c{v}{pr.k} = 0;" for pr in self.pairs.values() for v in "qr"]
        ok = " && ".join(f"cd{pr.k} > 0" for pr in self.pairs.values())
        lines.append(f"{indent}if ({ok}) {{")
        lines.append(f"{indent}    const int64_t j = j0;")
        for pr in self.pairs.values():  # in order: each numerator reads only pairs set before it
            lines.append(f"{indent}    const int64_t cn{pr.k} = {print_poly(pr.num, names)};")
            lines.append(f"{indent}    cq{pr.k} = evo_fdiv(cn{pr.k}, cd{pr.k});")
            lines.append(f"{indent}    cr{pr.k} = evo_fmod(cn{pr.k}, cd{pr.k});")
        lines.append(f"{indent}}}")
        return lines, ok

    def advance(self, names: Names, indent: str) -> list[str]:
        """The statements ending an iteration: every step read first, then each pair stepped."""
        steps = [f"{indent}const int cs{pr.k} = {self._step_of(pr.num, names)};" for pr in self.pairs.values()]
        moves = [f"{indent}if (cs{pr.k} && ++cr{pr.k} == cd{pr.k}) {{ cr{pr.k} = 0; ++cq{pr.k}; }}"
                 for pr in self.pairs.values()]
        return steps + moves


JLOOP = "        for (int64_t j = j0; j < stop; ++j) {"


def plan_carries(j: Var, loop_vars: set[Var], roots: Sequence[tuple[Poly, Expr]]) -> Carries | None:
    """The carries of a task's inner loop `j` whose roots (position, expression) are `roots`, or None where
    nothing is worth carrying (`Carries.find`)."""
    carries = Carries(j, loop_vars)
    return carries if carries.find([e for _, e in roots], [p for p, _ in roots]) else None


def render(carries: Carries, names: Names, body: Callable[[], str], plain_body: str, head: str = JLOOP) -> str:
    """The inner loop `head` (8 spaces in, over j from j0 to stop) with its divisions carried: the carried loop,
    whose body `body()` prints while `names` prints the carried atoms as their running values, where every
    divisor is at least 1 at run time, and the loop of `plain_body` otherwise. A quotient nothing reads is not
    kept (the source compiles warning-free with -Wall -Wextra)."""
    names.carried = carries.names()
    try:
        setup, ok = carries.setup(names, "        ")
        text = "\n".join([*setup, f"        if ({ok}) {{", head, body(), *carries.advance(names, "            "),
                          "        }", "        } else {", head, plain_body, "        }", "        }"])
    finally:
        names.carried = {}
    for pr in carries.pairs.values():
        q = f"cq{pr.k}"
        if len(re.findall(rf"\b{q}\b", text)) == 3:  # declared, set at j0 and stepped, and read nowhere
            text = text.replace(f"        int64_t {q} = 0;\n", "").replace(
                f"            {q} = evo_fdiv(cn{pr.k}, cd{pr.k});\n", "").replace(f" ++{q};", "")
    return text
