"""Symbolic integer arithmetic for sizes and indices.

A `Poly` is a polynomial with integer coefficients over *atoms*:
- `Sym`: a size bound at run time (a dynamic batch `N`), always >= 0;
- `Var`: a loop index in `[0, extent)`;
- opaque atoms that do not simplify further: `FloorDiv`, `Mod`, `Min`, `Max`, `Lookup` (an entry of a
  constant integer table, for Gather with constant indices) and `Foreign` ones (`expr.Picked`: a run-time value).

`floordiv` and `mod` use floor semantics (as Python does) and simplify with bounds: `(85*b + c) % 255` becomes
`85*b + c` when `b < 3` and `c < 85` are known. This is what turns the div/mod chains of a general reshape back
into plain strides. Every function returns a new value; nothing is mutated.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from evonnx.errors import InternalError

Monomial = tuple["Atom", ...]


class Atom:
    """Base of the atoms a polynomial is built on. Subclasses are frozen dataclasses."""

    __slots__ = ()

    def sort_key(self) -> str:
        return str(self)


class Foreign(Atom):
    """An atom defined by another module through these hooks: the polynomials it nests, its bounds, and itself
    with atoms replaced (`expr.Picked`, a position read from a tensor at run time). It has no plan-time value."""

    __slots__ = ()
    children: Callable[[], tuple[Poly, ...]]
    bounds: Callable[[], tuple[Poly | None, Poly | None]]
    substituted: Callable[[Mapping[Atom, PolyLike], dict[Atom, Poly]], Poly]


@dataclass(frozen=True, slots=True)
class Sym(Atom):
    """A size known only at run time, e.g. the `dim_param` of a dynamic batch."""

    name: str

    def __str__(self) -> str:
        return self.name


@dataclass(frozen=True, slots=True)
class Var(Atom):
    """A loop index ranging over `[0, extent)`."""

    name: str
    extent: Poly

    def __str__(self) -> str:
        return self.name


@dataclass(frozen=True, slots=True)
class FloorDiv(Atom):
    num: Poly
    den: Poly

    def __str__(self) -> str:
        return f"fdiv({self.num}, {self.den})"


@dataclass(frozen=True, slots=True)
class Mod(Atom):
    num: Poly
    den: Poly

    def __str__(self) -> str:
        return f"fmod({self.num}, {self.den})"


@dataclass(frozen=True, slots=True)
class Min(Atom):
    a: Poly
    b: Poly

    def __str__(self) -> str:
        return f"min({self.a}, {self.b})"


@dataclass(frozen=True, slots=True)
class Max(Atom):
    a: Poly
    b: Poly

    def __str__(self) -> str:
        return f"max({self.a}, {self.b})"


@dataclass(frozen=True, slots=True)
class Table:
    """A constant integer table, referenced by `Lookup` atoms."""

    name: str
    values: tuple[int, ...]

    def __str__(self) -> str:
        return self.name


@dataclass(frozen=True, slots=True)
class Lookup(Atom):
    table: Table
    index: Poly

    def __str__(self) -> str:
        return f"{self.table.name}[{self.index}]"


@dataclass(frozen=True, slots=True)
class Poly:
    """Sum of `coefficient * product(atoms)`; `terms` is sorted and has no zero coefficients."""

    terms: tuple[tuple[Monomial, int], ...] = ()
    _hash: int | None = field(default=None, compare=False, repr=False)
    # atoms() and str() (the atoms' sort key) cached too: an uncached walk visits a shared nested polynomial once per
    # path to it, exponentially many (a Min of Mins of one index; fuzz case 109: 4.5 minutes in codegen)
    _atoms: frozenset[Atom] | None = field(default=None, compare=False, repr=False)
    _text: str | None = field(default=None, compare=False, repr=False)
    _weight: int | None = field(default=None, compare=False, repr=False)

    def __hash__(self) -> int:
        # cached: atoms nest polynomials, and an uncached hash walks the whole tree on every dict lookup
        h = self._hash
        if h is None:
            h = hash(self.terms)
            object.__setattr__(self, "_hash", h)
        return h

    @staticmethod
    def of(x: PolyLike) -> Poly:
        if isinstance(x, Poly):
            return x
        if isinstance(x, bool):
            raise TypeError("bool is not an index")
        if isinstance(x, int):
            return Poly((((), x),)) if x else Poly()
        if isinstance(x, Atom):
            return Poly((((x,), 1),))
        raise TypeError(f"cannot make an index polynomial of {type(x).__name__}")

    @staticmethod
    def _from(acc: Mapping[Monomial, int]) -> Poly:
        if any(isinstance(a, Mod) for m, c in acc.items() if c for a in m):
            acc = _recombined(acc)
        items = [(m, c) for m, c in acc.items() if c]
        items.sort(key=lambda mc: (len(mc[0]), tuple(a.sort_key() for a in mc[0])))
        return Poly(tuple(items))

    @property
    def const(self) -> int | None:
        """The value when the polynomial is a constant, else None."""
        if not self.terms:
            return 0
        if len(self.terms) == 1 and not self.terms[0][0]:
            return self.terms[0][1]
        return None

    def atom(self) -> Atom | None:
        """The atom when the polynomial is exactly `1 * atom`."""
        if len(self.terms) == 1 and len(self.terms[0][0]) == 1 and self.terms[0][1] == 1:
            return self.terms[0][0][0]
        return None

    def atoms(self) -> set[Atom]:
        """Every atom, including those nested inside opaque atoms and Var extents."""
        if self._atoms is None:
            own = {a for mono, _ in self.terms for a in mono}
            object.__setattr__(self, "_atoms", frozenset(own.union(*(p.atoms() for a in own for p in _children(a)))))
        return set(self._atoms or ())

    def weight(self) -> int:
        """How many atoms the polynomial holds written out as a tree, each shared nested polynomial counted at
        every place it occurs: what a walk without a memo visits, and what its printed text grows with."""
        if self._weight is None:
            w = sum(1 + sum(p.weight() for p in _children(a)) for mono, _ in self.terms for a in mono)
            object.__setattr__(self, "_weight", w)
        return self._weight or 0

    def vars(self) -> set[Var]:
        return {a for a in self.atoms() if isinstance(a, Var)}

    def syms(self) -> set[Sym]:
        return {a for a in self.atoms() if isinstance(a, Sym)}

    def coefficient(self, atom: Atom) -> Poly | None:
        """The factor multiplying `atom` when the polynomial is linear in it (None if not linear)."""
        acc: dict[Monomial, int] = {}
        for mono, c in self.terms:
            n = mono.count(atom)
            if n > 1 or any(atom in _nested_atoms(a) for a in mono if a != atom):
                return None
            if n == 1:
                rest = list(mono)
                rest.remove(atom)
                acc[tuple(rest)] = acc.get(tuple(rest), 0) + c
        return Poly._from(acc)

    def __add__(self, other: PolyLike) -> Poly:
        acc = dict(self.terms)
        for m, c in Poly.of(other).terms:
            acc[m] = acc.get(m, 0) + c
        return Poly._from(acc)

    __radd__ = __add__

    def __neg__(self) -> Poly:
        return Poly(tuple((m, -c) for m, c in self.terms))

    def __sub__(self, other: PolyLike) -> Poly:
        return self + (-Poly.of(other))

    def __rsub__(self, other: PolyLike) -> Poly:
        return Poly.of(other) - self

    def __mul__(self, other: PolyLike) -> Poly:
        o = Poly.of(other)
        acc: dict[Monomial, int] = {}
        for m1, c1 in self.terms:
            for m2, c2 in o.terms:
                m = tuple(sorted(m1 + m2, key=Atom.sort_key))
                acc[m] = acc.get(m, 0) + c1 * c2
        return Poly._from(acc)

    __rmul__ = __mul__

    def __floordiv__(self, other: PolyLike) -> Poly:
        return floordiv(self, other)

    def __mod__(self, other: PolyLike) -> Poly:
        return mod(self, other)

    def __str__(self) -> str:
        if self._text is None:
            parts = []
            for mono, c in self.terms:
                body = "*".join(str(a) for a in mono)
                parts.append(str(c) if not mono else body if c == 1 else f"-{body}" if c == -1 else f"{c}*{body}")
            object.__setattr__(self, "_text", " + ".join(parts).replace("+ -", "- ") if parts else "0")
        return self._text or "0"


PolyLike = Poly | int | Atom


def _recombined(acc: Mapping[Monomial, int]) -> dict[Monomial, int]:
    """`acc` with each `c*r*d*fdiv(x, d) + c*r*mod(x, d)` as `c*r*x` (a Reshape [80, 80] -> [6400] read at j: j), d a
    positive constant times sizes (a symbolic [H, W]): d = 0 only in loops that do not run, unlike a loop index."""
    out = dict(acc)
    for m, c in list(out.items()):
        mods = [a for a in m if isinstance(a, Mod)] if c and m in out else []  # a cancelled term: nothing to pair
        if len(mods) != 1 or len(dt := mods[0].den.terms) != 1 or dt[0][1] <= 0:
            continue
        md, rest = mods[0], tuple(a for a in m if not isinstance(a, Mod))
        div = tuple(sorted(rest + dt[0][0] + (FloorDiv(md.num, md.den),), key=Atom.sort_key))
        if all(isinstance(a, Sym) for a in dt[0][0]) and out.get(div, 0) == c * dt[0][1]:
            del out[m], out[div]
            for k, v in ((tuple(sorted(rest + xm, key=Atom.sort_key)), c * xc) for xm, xc in md.num.terms):
                out[k] = out.get(k, 0) + v
    return out


def _children(a: Atom) -> tuple[Poly, ...]:
    if isinstance(a, Var):
        return (a.extent,)
    if isinstance(a, (FloorDiv, Mod)):
        return (a.num, a.den)
    if isinstance(a, (Min, Max)):
        return (a.a, a.b)
    if isinstance(a, Lookup):
        return (a.index,)
    return a.children() if isinstance(a, Foreign) else ()


def _nested_atoms(a: Atom) -> set[Atom]:
    out: set[Atom] = set()
    for p in _children(a):
        out |= p.atoms()
    return out


# -- constructors -----------------------------------------------------------------------------------------
def var(name: str, extent: PolyLike) -> Poly:
    """A loop index over `[0, extent)`; an index over one element is the constant 0."""
    e = Poly.of(extent)
    if e.const == 1:
        return Poly()
    return Poly.of(Var(name, e))


def sym(name: str) -> Poly:
    return Poly.of(Sym(name))


def lookup(table: Table, index: PolyLike) -> Poly:
    i = Poly.of(index)
    if i.const is not None:
        if not 0 <= i.const < len(table.values):  # never Python's negative indexing: a generated read is in range
            raise InternalError(f"index table {table.name} of {len(table.values)} entries read at {i.const}")
        return Poly.of(table.values[i.const])
    if len(set(table.values)) == 1:
        return Poly.of(table.values[0])
    return Poly.of(Lookup(table, i))


# -- bounds and proofs ------------------------------------------------------------------------------------
Bound = Poly | None


def _atom_bounds(a: Atom, depth: int) -> tuple[Bound, Bound]:
    if isinstance(a, Sym):
        return Poly.of(a), Poly.of(a)
    if isinstance(a, Var):
        return Poly(), a.extent - 1
    if isinstance(a, Lookup):
        return Poly.of(min(a.table.values)), Poly.of(max(a.table.values))
    if isinstance(a, Foreign):
        return a.bounds()
    if isinstance(a, Mod):
        d = a.den.const
        if d is not None and d < 0:
            return a.den + 1, Poly()  # floor modulo takes the divisor's sign
        if d is not None or is_nonneg(a.den - 1, depth):
            return Poly(), a.den - 1
        return None, None
    if isinstance(a, FloorDiv):
        lo, hi = bounds(a.num, depth)
        nonneg = lo is not None and is_nonneg(lo, depth)
        d = a.den.const
        if d is not None and d > 0:
            qlo = Poly.of(lo.const // d) if lo is not None and lo.const is not None else (Poly() if nonneg else None)
            # a symbolic bound of the numerator bounds the quotient only when the numerator is >= 0
            qhi = Poly.of(hi.const // d) if hi is not None and hi.const is not None else (hi if nonneg else None)
            return qlo, qhi
        if d is None and nonneg and is_nonneg(a.den - 1, depth):
            return Poly(), hi
        return None, None
    if isinstance(a, Min):
        (alo, ahi), (blo, bhi) = bounds(a.a, depth), bounds(a.b, depth)
        lo = Poly.of(min(alo.const, blo.const)) if (
            alo is not None and blo is not None and alo.const is not None and blo.const is not None) else None
        if lo is None and alo is not None and blo is not None and is_nonneg(alo, depth) and is_nonneg(blo, depth):
            lo = Poly()
        return lo, (ahi if ahi is not None else bhi)
    if isinstance(a, Max):
        (alo, ahi), (blo, bhi) = bounds(a.a, depth), bounds(a.b, depth)
        hi = Poly.of(max(ahi.const, bhi.const)) if (
            ahi is not None and bhi is not None and ahi.const is not None and bhi.const is not None) else None
        return (alo if alo is not None else blo), hi
    raise TypeError(f"unknown atom {a!r}")


def bounds(p: PolyLike, depth: int = 0) -> tuple[Bound, Bound]:
    """Lower and upper bounds of `p` as polynomials over size symbols (None when unbounded)."""
    p = Poly.of(p)
    if depth > 6:
        return None, None
    lo: Bound = Poly()
    hi: Bound = Poly()
    for mono, c in p.terms:
        if not mono:
            lo = lo + c if lo is not None else None
            hi = hi + c if hi is not None else None
            continue
        if all(isinstance(a, Sym) for a in mono):
            term = Poly(((mono, c),))
            lo = lo + term if lo is not None else None
            hi = hi + term if hi is not None else None
            continue
        abs_ = [_atom_bounds(a, depth + 1) for a in mono]
        if len(mono) > 1 and not all(b[0] is not None and is_nonneg(b[0], depth + 1) for b in abs_):
            lo = hi = None
            break
        mlo: Bound = Poly.of(c)
        mhi: Bound = Poly.of(c)
        for alo, ahi in abs_:
            small, big = (alo, ahi) if c > 0 else (ahi, alo)
            mlo = mlo * small if mlo is not None and small is not None else None
            mhi = mhi * big if mhi is not None and big is not None else None
        lo = lo + mlo if lo is not None and mlo is not None else None
        hi = hi + mhi if hi is not None and mhi is not None else None
    return lo, hi


def is_nonneg(p: PolyLike, depth: int = 0) -> bool:
    """True when `p >= 0` is proven for every value of the loop indices and sizes (sizes are >= 0)."""
    p = Poly.of(p)
    if p.const is not None:
        return p.const >= 0
    if all(isinstance(a, Sym) for m, _ in p.terms for a in m):
        # Sizes are only known to be >= 0: a size can be 0 at run time (no detections), and onnxruntime then
        # computes empty tensors, or fails, exactly by the formulas. Every coefficient must be >= 0.
        return all(c >= 0 for _, c in p.terms)
    lo, _ = bounds(p, depth + 1)
    return lo is not None and lo != p and is_nonneg(lo, depth + 1)


def is_lt(a: PolyLike, b: PolyLike) -> bool:
    """True when `a < b` is proven."""
    return is_nonneg(Poly.of(b) - Poly.of(a) - 1)


# The largest size a kernel takes (each bound symbol is checked against it at run time, codegen_c): a tensor of
# more elements cannot exist in memory, so only an empty one's dim could exceed it.
SIZE_MAX = 1 << 40


def is_le(a: PolyLike, b: PolyLike) -> bool:
    return is_nonneg(Poly.of(b) - Poly.of(a))


# -- floor division, modulo, min, max ---------------------------------------------------------------------
def _split(p: Poly, d: Poly) -> tuple[Poly, Poly] | None:
    """`p = d*q + r` where q collects the terms d divides exactly; None when d is not a monomial."""
    if len(d.terms) != 1:
        return None
    dmono, dc = d.terms[0]
    if dc <= 0:
        return None
    q: dict[Monomial, int] = {}
    r: dict[Monomial, int] = {}
    for mono, c in p.terms:
        rest = list(mono)
        ok = c % dc == 0
        for a in dmono:
            if ok and a in rest:
                rest.remove(a)
            else:
                ok = False
        if ok:
            q[tuple(rest)] = q.get(tuple(rest), 0) + c // dc
        else:
            r[mono] = r.get(mono, 0) + c
    return Poly._from(q), Poly._from(r)


def _scaled(r: Poly, d: int) -> tuple[int, Poly, Poly] | None:
    """`r = g*x + y` with g > 1 dividing `d` and 0 <= y < g provably (g, x, y), or None. Then
    fdiv(r, d) = fdiv(x, d/g) and mod(r, d) = g*mod(x, d/g) + y: a flattened index `80*o + j` (j < 80) over a
    dim of 720 is `o` over 9, so a Reshape/Transpose chain's divisions land on whole loop variables."""
    if d <= 1:
        return None
    for g in sorted({math.gcd(d, abs(c)) for _, c in r.terms if c}, reverse=True):
        if g <= 1:
            break
        x = Poly._from({m: c // g for m, c in r.terms if c % g == 0})
        y = Poly._from({m: c for m, c in r.terms if c % g != 0})
        if x.terms and is_nonneg(y) and is_lt(y, g):
            return g, x, y
    return None


def _const_term(p: Poly) -> int:
    return next((c for m, c in p.terms if not m), 0)


def floordiv(p: PolyLike, d: PolyLike) -> Poly:
    p, d = Poly.of(p), Poly.of(d)
    if d.const == 1:
        return p
    if d.const == 0:
        raise ZeroDivisionError("index division by zero")
    if p.const is not None and d.const is not None:
        return Poly.of(p.const // d.const)
    split = _split(p, d)
    if split is None:
        return Poly.of(FloorDiv(p, d))
    q, r = split
    if r.const is not None and d.const is not None:
        return q + r.const // d.const
    if d.const is not None and d.const > 0 and (k := _const_term(r)) // d.const:
        # the constant's multiple of d comes out (exactly, and the rest no longer overflows int64 for it):
        # fdiv(6403 + j, 40) = 160 + fdiv(3 + j, 40), a Concat's later part read at its own offset
        return q + k // d.const + floordiv(r - (k // d.const) * d.const, d)
    if is_nonneg(r) and is_lt(r, d):
        return q
    if d.const is not None and (sc := _scaled(r, d.const)) is not None:
        return q + floordiv(sc[1], d.const // sc[0])
    # fdiv(fdiv(x, a), b) == fdiv(x, a*b) for positive constants
    inner = r.atom()
    if isinstance(inner, FloorDiv) and inner.den.const and d.const and inner.den.const > 0 and d.const > 0:
        return q + floordiv(inner.num, inner.den.const * d.const)
    return q + Poly.of(FloorDiv(r, d)) if r.terms else q


def mod(p: PolyLike, d: PolyLike) -> Poly:
    p, d = Poly.of(p), Poly.of(d)
    if d.const == 1:
        return Poly()
    if d.const == 0:
        raise ZeroDivisionError("index modulo by zero")
    if p.const is not None and d.const is not None:
        return Poly.of(p.const % d.const)
    split = _split(p, d)
    r = p if split is None else split[1]
    if r.const is not None and d.const is not None:
        return Poly.of(r.const % d.const)
    if d.const is not None and d.const > 0 and (k := _const_term(r)) // d.const:
        return mod(r - (k // d.const) * d.const, d)  # mod(6403 + j, 40) = mod(3 + j, 40); see floordiv
    if is_nonneg(r) and is_lt(r, d):
        return r
    if d.const is not None and (sc := _scaled(r, d.const)) is not None:
        g, x, y = sc
        return g * mod(x, d.const // g) + y
    return Poly.of(Mod(r, d))


def pmin(a: PolyLike, b: PolyLike) -> Poly:
    a, b = Poly.of(a), Poly.of(b)
    return a if is_le(a, b) else b if is_le(b, a) else Poly.of(Min(a, b))


def pmax(a: PolyLike, b: PolyLike) -> Poly:
    a, b = Poly.of(a), Poly.of(b)
    return b if is_le(a, b) else a if is_le(b, a) else Poly.of(Max(a, b))


# -- substitution and evaluation --------------------------------------------------------------------------
def subs(p: PolyLike, mapping: Mapping[Atom, PolyLike], memo: dict[Atom, Poly] | None = None) -> Poly:
    """Replace atoms (usually Vars) by polynomials and simplify again. `memo` (atom -> result) may be shared by
    calls with the same `mapping`: index expressions repeat the same floor divisions and remainders."""
    p = Poly.of(p)
    if not mapping:
        return p
    if memo is None:
        memo = {}
    out = Poly()
    for mono, c in p.terms:
        term = Poly.of(c)
        for a in mono:
            term = term * _subs_atom(a, mapping, memo)
        out = out + term
    return out


def _subs_atom(a: Atom, mapping: Mapping[Atom, PolyLike], memo: dict[Atom, Poly]) -> Poly:
    if a in mapping:
        return Poly.of(mapping[a])
    done = memo.get(a)
    if done is not None:
        return done
    if isinstance(a, (FloorDiv, Mod)):
        r = (floordiv if isinstance(a, FloorDiv) else mod)(subs(a.num, mapping, memo), subs(a.den, mapping, memo))
    elif isinstance(a, (Min, Max)):
        r = (pmin if isinstance(a, Min) else pmax)(subs(a.a, mapping, memo), subs(a.b, mapping, memo))
    elif isinstance(a, Lookup):
        r = lookup(a.table, subs(a.index, mapping, memo))
    elif isinstance(a, Foreign):
        r = a.substituted(mapping, memo)
    else:
        r = Poly.of(a)
    memo[a] = r
    return r


def evaluate(p: PolyLike, env: Mapping[str, int], memo: dict[Atom, int] | None = None) -> int:
    """The integer value of `p` with every Sym and Var named in `env` (`memo`: atoms already evaluated)."""
    memo = {} if memo is None else memo
    total = 0
    for mono, c in Poly.of(p).terms:
        v = c
        for a in mono:
            if (x := memo.get(a)) is None:
                x = memo[a] = _eval_atom(a, env, memo)
            v *= x
        total += v
    return total


def _eval_atom(a: Atom, env: Mapping[str, int], memo: dict[Atom, int]) -> int:
    if isinstance(a, (Sym, Var)):
        return env[a.name]
    if isinstance(a, Lookup):
        return a.table.values[evaluate(a.index, env, memo)]
    if not isinstance(a, (FloorDiv, Mod, Min, Max)):
        raise TypeError(f"unknown atom {a!r}")
    p, q = (a.num, a.den) if isinstance(a, (FloorDiv, Mod)) else (a.a, a.b)
    x, y = evaluate(p, env, memo), evaluate(q, env, memo)
    return x // y if isinstance(a, FloorDiv) else x % y if isinstance(a, Mod) else min(x, y) if isinstance(
        a, Min) else max(x, y)


def product(dims: Iterable[PolyLike]) -> Poly:
    out = Poly.of(1)
    for d in dims:
        out = out * Poly.of(d)
    return out


