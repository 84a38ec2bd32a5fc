"""Value expressions: what one element of a fused kernel's output is, in terms of loads from its inputs.

Leaves are `Const`, `Load` (an input slot read at an index polynomial), `TableLoad` (a constant array baked
into the kernel) and `IndexVal` (an integer computed from indices and sizes, e.g. Range or Shape elements).
`Op` applies one ONNX elementwise operation. Constructors fold constants and index arithmetic with the same
semantics the generated C and onnxruntime have (truncating integer division, wrap-around, IEEE floats), and never
fold transcendental functions (their rounding is the kernel's business).
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

from evonnx.index import Atom, Foreign, Poly, PolyLike, floordiv, is_le, is_lt, is_nonneg, subs

FLOATS = ("float32", "float64")
SIGNED = ("int8", "int16", "int32", "int64")
UNSIGNED = ("uint8", "uint16", "uint32", "uint64")
INTS = SIGNED + UNSIGNED
DTYPES = FLOATS + INTS + ("bool",)  # the element types a kernel computes in
# float16 is stored, never computed in: a kernel computes each op in float32 and rounds its result to float16
# (`lower_ops.lower_node`), as onnxruntime's CPU kernels do (for + - * / and sqrt the correctly rounded result).
HALF = "float16"
STORED = DTYPES + (HALF,)  # the element types a kernel loads and stores

# ONNX TensorProto element type codes
ONNX_CODE = {"float32": 1, "uint8": 2, "int8": 3, "uint16": 4, "int16": 5, "int32": 6, "int64": 7, "bool": 9,
             "float16": 10, "float64": 11, "uint32": 12, "uint64": 13}
FROM_ONNX_CODE = {v: k for k, v in ONNX_CODE.items()}


class Expr:
    __slots__ = ()
    dtype: str  # != is object's: the inverse of each node's __eq__


class _Shared(Expr):
    """Base of the expression nodes with children (`Op`, `Reduce`). Expressions are DAGs: `a = a*a + a` twelve
    times over is 25 nodes but 3^12 paths. The generated hash and equality of a frozen dataclass walk every
    path, so these nodes cache their hash, and two distinct but equal nodes, once compared, remember that they
    are equal (the later one points to the earlier one), so comparing two equal DAGs visits each node once."""

    __slots__ = ("_hash", "_same")
    _hash: int
    _same: Expr

    def _key(self) -> tuple[object, ...]:
        raise NotImplementedError

    def __hash__(self) -> int:
        try:
            return self._hash
        except AttributeError:
            h = hash((type(self), self._key()))
            object.__setattr__(self, "_hash", h)
            return h

    def _root(self) -> Expr:
        x: Expr = self
        while True:
            try:
                x = x._same  # type: ignore[attr-defined]
            except AttributeError:
                return x

    def __eq__(self, other: object) -> bool:
        if self is other:
            return True
        if type(other) is not type(self):
            return NotImplemented
        a, b = self._root(), other._root()
        if a is b:
            return True
        if hash(a) != hash(b) or a._key() != b._key():  # type: ignore[attr-defined]
            return False
        object.__setattr__(b, "_same", a)
        return True


@dataclass(frozen=True, slots=True, eq=False)
class Const(Expr):
    """A constant. Equal constants are equal bit for bit: -0.0 is not 0.0 (a plain float comparison would let one
    stand for the other wherever expressions are shared or memoised: Where(c, x, -0.0) came out +0.0), and a NaN
    equals a NaN."""

    value: float | int | bool
    dtype: str

    def _key(self) -> tuple[object, ...]:
        v = self.value
        if isinstance(v, float) or self.dtype in FLOATS:
            f = float(v)
            return (self.dtype, "nan" if f != f else f.hex())
        return (self.dtype, v)

    def __eq__(self, other: object) -> bool:
        if self is other:
            return True
        if type(other) is not Const:
            return NotImplemented
        return self._key() == other._key()

    def __hash__(self) -> int:
        return hash(self._key())

    def __str__(self) -> str:
        return f"{self.value}:{self.dtype}"


@dataclass(frozen=True, slots=True)
class Load(Expr):
    slot: int
    index: Poly
    dtype: str

    def __str__(self) -> str:
        return f"in{self.slot}[{self.index}]"


@dataclass(frozen=True, slots=True)
class ValueTable:
    name: str
    dtype: str
    values: tuple[float | int | bool, ...]


@dataclass(frozen=True, slots=True)
class TableLoad(Expr):
    table: ValueTable
    index: Poly
    dtype: str

    def __str__(self) -> str:
        return f"{self.table.name}[{self.index}]"


@dataclass(frozen=True, slots=True)
class IndexVal(Expr):
    poly: Poly
    dtype: str = "int64"

    def __str__(self) -> str:
        return f"({self.poly})"


@dataclass(frozen=True, slots=True, eq=False)
class Op(_Shared):
    op: str
    args: tuple[Expr, ...]
    dtype: str
    attr: float | int | str | None = None  # Cast target, Mod's fmod, etc. when not in dtype

    def _key(self) -> tuple[object, ...]:
        return (self.op, self.dtype, self.attr, self.args)

    def __str__(self) -> str:
        return f"{self.op}(" + ", ".join(str(a) for a in self.args) + ")"


@dataclass(frozen=True, slots=True, eq=False)
class Reduce(_Shared):
    """`op` of `body` over the loop variable `var` (bound here): sum, prod, max, min, argmax, argmin, or dot (a
    sum of the products `body` is, as one fma chain: MatMul); the C kernels also search with first and last (the
    first or last position where a bool `body` holds, else 0: `kernels/share.py`'s ArgMax)."""

    op: str
    var: Poly  # a Var atom
    body: Expr
    dtype: str
    attr: int = 0  # argmax/argmin: 1 selects the last index of the extreme value

    def _key(self) -> tuple[object, ...]:
        return (self.op, self.dtype, self.attr, self.var, self.body)

    def bound(self) -> Atom:
        """The loop variable this reduction binds."""
        a = self.var.atom()
        assert a is not None, "a reduction's variable is one atom"
        return a

    def __str__(self) -> str:
        return f"{self.op}[{self.var}]({self.body})"


# -- op catalogue -----------------------------------------------------------------------------------------
# min/max are std::min/std::max (NaN in the second argument is ignored: Clip, index sizes); nmin/nmax propagate NaN
# from either side, as onnxruntime's Min/Max do
ARITH = {"add", "sub", "mul", "div", "mod", "pow", "min", "max", "nmin", "nmax"}
COMPARE = {"eq", "lt", "le", "gt", "ge"}
LOGIC = {"and", "or", "xor"}
UNARY_EXACT = {"neg", "abs", "floor", "ceil", "round", "sqrt", "reciprocal", "relu", "sign", "not",
               "isnan", "isinf"}
UNARY_INEXACT = {"exp", "exp_nonpos", "log", "sigmoid", "tanh", "erf", "sin", "cos", "softplus", "mish"}
EXACT_OPS = ARITH - {"pow"} | COMPARE | LOGIC | UNARY_EXACT | {"where", "cast", "clip", "keep"}


def is_exact(e: Expr) -> bool:
    """True when every operation of `e` rounds exactly as onnxruntime does (IEEE basic arithmetic)."""
    rounded: dict[Expr, bool] = {}  # a float16 rounding of float arithmetic at or below the node
    for x in walk(e):
        below = any(rounded[a] for a in children(x))
        here = _half_rounding(x)
        if here and below:
            # float16 arithmetic on float16 arithmetic: where onnxruntime rounds to float16 inside such a chain
            # depends on where its graph optimizations leave the Casts it puts around float16 ops (Sub -> Gather ->
            # Transpose -> Mul rounds after each op at ORT_DISABLE_ALL and once at the end at ORT_ENABLE_ALL; fuzz
            # case 2554), so such results are compared within float16's tolerance. One op rounded once is exact.
            return False
        rounded[x] = here or below
        if isinstance(x, Reduce) and x.op in ("sum", "prod", "dot") and x.dtype in FLOATS:
            # onnxruntime sums floats in its own (vectorised) order, and a MatMul's fma chain is MLAS's on an FMA
            # machine only; max/min/argmax are exact
            return False
        if isinstance(x, Op) and (x.op not in EXACT_OPS or (x.op == "mod" and x.dtype in FLOATS)
                                  or (x.op == "cast" and x.attr == "approx")):
            return False
    return True


def _half_rounding(x: Expr) -> bool:
    """`x` rounds the result of float arithmetic to float16 (not a conversion of a conversion or of a load)."""
    if not (isinstance(x, Op) and x.op == "cast" and x.dtype == HALF):
        return False
    a = x.args[0]
    return isinstance(a, (Op, Reduce)) and a.dtype in FLOATS and not (isinstance(a, Op) and a.op == "cast")


def np_dtype(dtype: str) -> np.dtype:
    return np.dtype(dtype)


def const(value: object, dtype: str) -> Const:
    """A constant of `dtype`; an integer outside the type wraps around (two's complement), as the kernels' and
    onnxruntime's integer arithmetic does (a plan-time sum near INT64_MAX, fuzz seed 140034)."""
    if dtype in INTS and isinstance(value, int | np.integer) and not isinstance(value, bool):
        bits = np_dtype(dtype).itemsize * 8
        w = int(value) & ((1 << bits) - 1)
        value = w - (1 << bits) if dtype in SIGNED and w >> (bits - 1) else w
    v = np.asarray(value).astype(np_dtype(dtype)).item()
    return Const(v, dtype)


# -- constructors with folding ----------------------------------------------------------------------------
def _trunc_div(a: int, b: int) -> int:
    q = abs(a) // abs(b)  # b != 0 (_fold_binary)
    return q if (a >= 0) == (b >= 0) else -q


def _wrap(v: int, dtype: str) -> int:
    return int(np.array(v & 0xFFFFFFFFFFFFFFFF, dtype=np.uint64).astype(np_dtype(dtype)).item()) \
        if dtype != "uint64" else v & 0xFFFFFFFFFFFFFFFF


def _fold_binary(name: str, a: Const, b: Const, dtype: str) -> Const | None:
    x, y = a.value, b.value
    if name in COMPARE:
        return Const(bool({"eq": x == y, "lt": x < y, "le": x <= y, "gt": x > y, "ge": x >= y}[name]), "bool")
    if name in LOGIC:
        return Const(bool({"and": x and y, "or": x or y, "xor": bool(x) != bool(y)}[name]), "bool")
    if dtype in FLOATS:
        t = np_dtype(dtype).type
        with np.errstate(all="ignore"):
            r = {"add": lambda: t(x) + t(y), "sub": lambda: t(x) - t(y), "mul": lambda: t(x) * t(y),
                 "div": lambda: t(x) / t(y), "min": lambda: t(min(x, y)), "max": lambda: t(max(x, y)),
                 "nmin": lambda: t(x + y) if np.isnan(x) or np.isnan(y) else t(min(x, y)),
                 "nmax": lambda: t(x + y) if np.isnan(x) or np.isnan(y) else t(max(x, y))}.get(name)
            return Const(float(r()), dtype) if r else None
    xi, yi = int(x), int(y)
    if name == "div" and yi == 0:  # no value: onnxruntime fails the Run, so does the kernel (evo_nz; fuzz case 185)
        return None
    r2 = {"add": lambda: xi + yi, "sub": lambda: xi - yi, "mul": lambda: xi * yi,
          "div": lambda: _trunc_div(xi, yi), "min": lambda: min(xi, yi), "max": lambda: max(xi, yi)}.get(name)
    return Const(_wrap(r2(), dtype), dtype) if r2 else None


def index_val(p: Poly) -> Expr:
    """An int64 value computed from sizes and indices; a constant when it is one (wrapped into int64: polynomial
    arithmetic is on Python ints, and the value 2**64 - 2 of fuzz seed 140034 came from here)."""
    return const(p.const, "int64") if p.const is not None else IndexVal(p)


def _fold_index(name: str, a: Poly, b: Poly) -> Expr | None:
    """Integer (int64) arithmetic on index values stays an index value."""
    if name in ("add", "sub", "mul"):
        p = a + b if name == "add" else a - b if name == "sub" else a * b
        return index_val(p) if _small(p) else None
    if name == "div" and is_nonneg(a) and b.const is not None and b.const > 0:
        return index_val(floordiv(a, b))
    if name == "eq" and a == b:
        return Const(True, "bool")
    if name == "eq" and (is_lt(a, b) or is_lt(b, a)):
        return Const(False, "bool")
    if name in ("lt", "ge"):
        if is_lt(a, b):
            return Const(name == "lt", "bool")
        if is_le(b, a):
            return Const(name == "ge", "bool")
    if name in ("le", "gt"):
        if is_le(a, b):
            return Const(name == "le", "bool")
        if is_lt(b, a):
            return Const(name == "gt", "bool")
    return None


# Integer arithmetic folds into index polynomials (Python ints, no wrap-around) only while every coefficient stays
# far inside int64; beyond, it stays an operation the kernel computes with int64 wrap-around, as onnxruntime does.
_INDEX_LIMIT = 1 << 40


def _small(p: Poly) -> bool:
    return all(-_INDEX_LIMIT < c < _INDEX_LIMIT for _, c in p.terms)


def _as_index(e: Expr) -> Poly | None:
    if isinstance(e, IndexVal):
        return e.poly
    if isinstance(e, Const) and e.dtype == "int64" and -_INDEX_LIMIT < int(e.value) < _INDEX_LIMIT:
        return Poly.of(int(e.value))
    return None


def as_integer(e: Expr) -> Poly | None:
    """The integer an expression holds when it is an index value, an integer-valued constant, or an index value
    cast to a float. Casting a size to float32 is exact below 2**24; evonnx assumes sizes stay below that."""
    if isinstance(e, Const) and not isinstance(e.value, bool) and float(e.value).is_integer():
        return Poly.of(int(e.value))
    if isinstance(e, IndexVal):
        return e.poly
    if isinstance(e, Op) and e.op == "cast" and e.args[0].dtype in INTS:
        return as_integer(e.args[0])
    return None


def binary(name: str, a: Expr, b: Expr) -> Expr:
    if a.dtype != b.dtype and name not in ("pow",):
        raise TypeError(f"{name} of {a.dtype} and {b.dtype}")
    if name in ("nmin", "nmax") and a.dtype not in FLOATS:
        name = name[1:]  # no NaN to propagate
    dtype = "bool" if name in COMPARE | LOGIC else a.dtype
    if isinstance(a, Const) and isinstance(b, Const):
        folded = _fold_binary(name, a, b, dtype)
        if folded is not None:
            return folded
    if name in LOGIC and (isinstance(a, Const) or isinstance(b, Const)):
        return _fold_logic(name, a, b)
    pa, pb = _as_index(a), _as_index(b)
    if pa is not None and pb is not None:
        folded2 = _fold_index(name, pa, pb)
        if folded2 is not None:
            return folded2
    return Op(name, (a, b), dtype)


def _fold_logic(name: str, a: Expr, b: Expr) -> Expr:
    """And, Or or Xor with one constant operand: `x & 0` is 0, `x & 1` is x, and so on. The other operand is
    pure (a kernel's expressions have no effects: integer divisions that may fail are kernel outputs computed
    whole, `analyze.computed_whole`), so dropping it changes nothing but the reads. A ScatterND's in-range test
    of constant indices ends in such a term, and left unfolded its Where kept a dead branch whose reads (volatile,
    `cprint`) ran at every element."""
    v, x = (bool(a.value), b) if isinstance(a, Const) else (bool(b.value) if isinstance(b, Const) else False, a)
    if name == "and":
        return x if v else Const(False, "bool")
    if name == "or":
        return Const(True, "bool") if v else x
    return unary("not", x) if v else x


def unary(name: str, a: Expr) -> Expr:
    dtype = "bool" if name in ("not", "isnan", "isinf") else a.dtype
    if isinstance(a, Const) and name in ("neg", "abs", "not", "relu") and a.dtype != "bool":
        v = a.value
        r = -v if name == "neg" else abs(v) if name == "abs" else max(v, 0)
        return const(r, dtype)
    if isinstance(a, Const) and name == "not":
        return Const(not a.value, "bool")
    return Op(name, (a,), dtype)


def where(c: Expr, a: Expr, b: Expr) -> Expr:
    if c.dtype != "bool":
        raise TypeError("Where condition must be bool")
    if isinstance(c, Const):
        return a if c.value else b
    if a == b:
        return a
    return Op("where", (c, a, b), a.dtype)


_WIDE = {"int64": 64, "int32": 32, "int16": 32, "int8": 32, "uint32": 64, "uint16": 32, "uint8": 32}


def float_to_int(x: float, dtype: str) -> int:
    """onnxruntime's CPU Cast of a finite float to an integer type (x86-64 static_cast, as the kernels'
    evo_f2* helpers): truncation through a 32- or 64-bit conversion whose out-of-range result is INT_MIN, then
    wrapped to the type."""
    bits = _WIDE.get(dtype, 64)
    v = int(x)  # truncates toward 0
    if not -(1 << (bits - 1)) <= v < (1 << (bits - 1)):
        v = -(1 << (bits - 1))
    width = np.iinfo(np.dtype(dtype)).bits
    v &= (1 << width) - 1
    if dtype.startswith("int") and v >= 1 << (width - 1):
        v -= 1 << width
    return v


def cast(a: Expr, dtype: str) -> Expr:
    if a.dtype == dtype:
        return a
    if isinstance(a, Const):
        if dtype == "bool":
            return Const(bool(a.value), "bool")
        if a.dtype in FLOATS and dtype in INTS:
            if not np.isfinite(a.value):
                return Op("cast", (a,), dtype)
            return const(float_to_int(float(a.value), dtype), dtype)
        return const(a.value, dtype)
    if isinstance(a, IndexVal) and dtype in INTS and dtype != "int64":
        return Op("cast", (a,), dtype)
    return Op("cast", (a,), dtype)


def clip(x: Expr, lo: Expr | None, hi: Expr | None) -> Expr:
    out = x
    if lo is not None:
        out = Op("max", (out, lo), x.dtype)
    if hi is not None:
        out = Op("min", (out, hi), x.dtype)
    return out


def free_vars(e: Expr, memo: dict[Expr, frozenset[Atom]] | None = None) -> frozenset[Atom]:
    """Loop-variable atoms `e` depends on, excluding those its reductions bind."""
    memo = {} if memo is None else memo
    if e in memo:
        return memo[e]
    out: frozenset[Atom]
    if isinstance(e, (Load, TableLoad)):
        out = frozenset(e.index.vars())
    elif isinstance(e, IndexVal):
        out = frozenset(e.poly.vars())
    elif isinstance(e, Op):
        out = frozenset[Atom]().union(*(free_vars(a, memo) for a in e.args))
    elif isinstance(e, Reduce):
        out = free_vars(e.body, memo) - {e.bound()}
    else:
        out = frozenset()
    memo[e] = out
    return out


def children(x: Expr) -> tuple[Expr, ...]:
    if isinstance(x, Op):
        return x.args
    if isinstance(x, Reduce):
        return (x.body,)
    return ()


def walk(e: Expr) -> list[Expr]:
    """Every subexpression of `e`, children before parents, each once (iterative: chains may be deep)."""
    seen: dict[Expr, None] = {}
    stack: list[tuple[Expr, int]] = [(e, 0)]
    while stack:
        x, k = stack.pop()
        if k == 0 and x in seen:
            continue
        kids = children(x)
        if k < len(kids):
            stack.append((x, k + 1))
            if kids[k] not in seen:
                stack.append((kids[k], 0))
        else:
            seen[x] = None
    return list(seen)


def guarded_where(c: Expr, a: Expr, b: Expr) -> Expr:
    if isinstance(c, Const):
        return a if c.value else b
    return Op("where", (c, a, b), a.dtype, "guard")


def substitute(e: Expr, mapping: Mapping[Atom, PolyLike]) -> Expr:
    """`e` with index atoms (loop variables) replaced by polynomials, folded again."""
    memo: dict[Expr, Expr] = {}
    atoms: dict[Atom, Poly] = {}  # index.subs's memo, shared by every index of `e`

    def go(x: Expr) -> Expr:
        if x in memo:
            return memo[x]
        if isinstance(x, Load):
            r: Expr = Load(x.slot, subs(x.index, mapping, atoms), x.dtype)
        elif isinstance(x, TableLoad):
            r = TableLoad(x.table, subs(x.index, mapping, atoms), x.dtype)
        elif isinstance(x, IndexVal):
            r = index_val(subs(x.poly, mapping, atoms))
        elif isinstance(x, Op) and x.op == "where" and isinstance(cond := go(x.args[0]), Const):
            # a branch the substitution made dead is not substituted: its reads may be out of range there
            # (a Concat piece's table index at an unrolled position of the other piece)
            r = go(x.args[1] if cond.value else x.args[2])
        elif isinstance(x, Op):
            args = tuple(go(a) for a in x.args)
            if x.op == "where":
                r = guarded_where(*args) if x.attr == "guard" else where(*args)
            elif x.op in COMPARE | LOGIC or (x.op in ("add", "sub", "mul", "div", "min", "max", "nmin", "nmax")):
                r = binary(x.op, args[0], args[1])
            elif x.op == "cast":
                r = cast(args[0], x.dtype)
                if x.attr == "approx" and isinstance(r, Op):  # keeps its mark (lower_ops._HALF_APPROX)
                    r = Op("cast", r.args, x.dtype, x.attr)
            else:
                r = Op(x.op, args, x.dtype, x.attr)
        elif isinstance(x, Reduce):
            r = Reduce(x.op, x.var, go(x.body), x.dtype, x.attr)
        else:
            r = x
        memo[x] = r
        return r

    return go(e)


@dataclass(frozen=True, slots=True)
class Picked(Foreign):
    """A position along an axis of `dim` elements read from a tensor at run time: a Gather's index `value` (an
    int64 expression of loads; a reduction in it, an ArgMax's, is computed in place), counted from the end where
    negative. onnxruntime fails the Run on an index outside [-dim, dim); a kernel checks each one where it reads it
    (`evo_pick` sets the task's failure flag and gives 0) and checks dim >= 1 (lower_gathers), and computes the
    Gather's result whole, so that every index is read and checked (`analyze.computed_whole`), as onnxruntime does."""

    value: Expr
    dim: Poly
    _text: list[str] = field(default_factory=list, compare=False, repr=False)  # str(), once computed

    def children(self) -> tuple[Poly, ...]:
        return (self.dim, *leaf_polys(self.value))

    def bounds(self) -> tuple[Poly | None, Poly | None]:
        return Poly(), self.dim - 1

    def substituted(self, mapping: Mapping[Atom, PolyLike], memo: dict[Atom, Poly]) -> Poly:
        return picked(substitute(self.value, mapping), subs(self.dim, mapping, memo))

    def __str__(self) -> str:
        """In full where `value` is a few nodes; else the digest of its nodes, each printed once with its
        children by number: its text in full grows with its paths, exponentially in a DAG (the atoms' sort key,
        fuzz case 1654: a MemoryError)."""
        if not self._text:
            nodes = walk(self.value)
            num = {x: k for k, x in enumerate(nodes)}
            text = "; ".join(f"{x.op} {x.dtype} {x.attr} {[num[c] for c in children(x)]}" if isinstance(x, Op)
                             else f"{x.op} {x.dtype} {x.attr} {x.var} {num[x.body]}" if isinstance(x, Reduce)
                             else str(x) for x in nodes)
            short = str(self.value) if len(nodes) <= 8 else "#" + hashlib.sha1(text.encode()).hexdigest()[:16]
            self._text.append(f"pick({short}, {self.dim})")
        return self._text[0]


def leaf_polys(e: Expr) -> list[Poly]:
    """The index polynomials of `e`'s loads and index values (and its reductions' variables)."""
    out: list[Poly] = []
    for x in walk(e):
        if isinstance(x, (Load, TableLoad)):
            out.append(x.index)
        elif isinstance(x, IndexVal):
            out.append(x.poly)
        elif isinstance(x, Reduce):
            out.append(x.var)
    return out


def picked(value: Expr, dim: PolyLike) -> Poly:
    """The position that index `value` (an integer expression) selects along an axis of `dim` elements: itself
    when it is an index value provably in [0, dim), else a run-time `Picked` atom."""
    dim = Poly.of(dim)
    if value.dtype not in INTS:
        raise TypeError(f"an index of {value.dtype}")
    value = cast(value, "int64")
    p = as_integer(value)
    if p is not None:
        if is_nonneg(p) and is_lt(p, dim):
            return p
        if p.const is not None and dim.const is not None and -dim.const <= p.const < 0:
            return p + dim.const
    return Poly.of(Picked(value, dim))


def keep(value: Expr, positions: list[Poly]) -> Expr:
    """`value`, evaluated after each run-time position in `positions` (`Picked`), whether its address uses it or
    not: a Gather's element of data that does not vary along the axis (one element there) read at 0 dropped the
    index from its address, and with it the check onnxruntime makes (fuzz case 918, seed 970000). Op "keep":
    its first argument's value; the others are evaluated for their checks only."""
    picks = [IndexVal(p) for p in positions if any(isinstance(a, Picked) for a in p.atoms())]
    return Op("keep", (value, *picks), value.dtype) if picks else value
