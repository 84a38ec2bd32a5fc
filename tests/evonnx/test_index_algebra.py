"""Index polynomials: floor division, modulo, min, max and substitution simplify without changing values.

Property tests build random expressions over loop indices with known extents and a size symbol `N`, once with
the simplifying constructors of `evonnx.index` and once as plain Python integer arithmetic (floor semantics), and
require `evaluate` of the simplified polynomial to equal the Python value at every point of the domain.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from evonnx.index import (
    FloorDiv,
    Max,
    Min,
    Mod,
    Poly,
    Sym,
    Var,
    evaluate,
    floordiv,
    is_le,
    is_lt,
    is_nonneg,
    mod,
    pmax,
    pmin,
    subs,
    sym,
    var,
)

N = sym("N")
A = var("a", 3)
B = var("b", 5)
C = var("c", N)  # an index over a symbolic extent
U = var("u", 15)  # = 5*a + b, for substitution
W = var("w", 4 * N)  # = N*q + c, for substitution
Q = var("q", 4)
SIZES_OF_N = (1, 2, 3, 7)

# An expression is (poly, python, names): python(env) gives the value by plain integer arithmetic over the
# atoms `names` (the simplified poly may have dropped some of them).
Expr = tuple[Poly, Callable[[dict[str, int]], int], frozenset[str]]


def _env_values(names: set[str]) -> Iterator[dict[str, int]]:
    """Every point of the domain of the named atoms: N in SIZES_OF_N and each index over its extent."""
    for n in SIZES_OF_N:
        extents = {"a": 3, "b": 5, "c": n, "u": 15, "w": 4 * n, "q": 4}
        keys = sorted(k for k in names if k in extents)
        for values in itertools.product(*(range(extents[k]) for k in keys)):
            yield {"N": n, **dict(zip(keys, values, strict=True))}


def _names(p: Poly) -> set[str]:
    return {a.name for a in p.atoms() if isinstance(a, (Var, Sym))}


def _node(p: Poly, python: Callable[[dict[str, int]], int], *parts: Expr) -> Expr:
    return p, python, frozenset().union(*(x[2] for x in parts))


def _leaf(name: str) -> Expr:
    p = {"a": A, "b": B, "c": C, "u": U, "w": W, "q": Q, "N": N}[name]
    return p, lambda env: env[name], frozenset({name})


def _const(c: int) -> Expr:
    return Poly.of(c), lambda env: c, frozenset()


leaves = st.one_of(st.sampled_from(["a", "b", "c", "u", "w", "N"]).map(_leaf),
                   st.integers(-6, 12).map(_const))
# Divisors are positive: a constant, the size N, or a multiple of it (index arithmetic never divides by less).
divisors = st.one_of(st.integers(1, 9).map(_const), st.just(_leaf("N")),
                     st.integers(2, 3).map(lambda k: (k * N, lambda env: k * env["N"], frozenset({"N"}))))


def _combine(children: st.SearchStrategy[Expr]) -> st.SearchStrategy[Expr]:
    def add(x: Expr, y: Expr) -> Expr:
        return _node(x[0] + y[0], lambda env: x[1](env) + y[1](env), x, y)

    def sub(x: Expr, y: Expr) -> Expr:
        return _node(x[0] - y[0], lambda env: x[1](env) - y[1](env), x, y)

    def mul(x: Expr, k: int) -> Expr:
        return _node(x[0] * k, lambda env: x[1](env) * k, x)

    def fdiv(x: Expr, d: Expr) -> Expr:
        return _node(floordiv(x[0], d[0]), lambda env: x[1](env) // d[1](env), x, d)

    def fmod(x: Expr, d: Expr) -> Expr:
        return _node(mod(x[0], d[0]), lambda env: x[1](env) % d[1](env), x, d)

    def lo(x: Expr, y: Expr) -> Expr:
        return _node(pmin(x[0], y[0]), lambda env: min(x[1](env), y[1](env)), x, y)

    def hi(x: Expr, y: Expr) -> Expr:
        return _node(pmax(x[0], y[0]), lambda env: max(x[1](env), y[1](env)), x, y)

    return st.one_of(
        st.builds(add, children, children), st.builds(sub, children, children),
        st.builds(mul, children, st.integers(-4, 85)), st.builds(fdiv, children, divisors),
        st.builds(fmod, children, divisors), st.builds(lo, children, children), st.builds(hi, children, children))


expressions = st.recursive(leaves, _combine, max_leaves=6)


def _assert_same_values(p: Poly, python: Callable[[dict[str, int]], int], names: frozenset[str] | set[str]) -> None:
    for env in _env_values(names | _names(p)):
        assert evaluate(p, env) == python(env), f"{p} at {env}"


def _plus_scaled(prev: Callable[[dict[str, int]], int], f: Callable[[dict[str, int]], int], k: int
                 ) -> Callable[[dict[str, int]], int]:
    return lambda env: prev(env) + f(env) * k


def _nonneg_expressions() -> st.SearchStrategy[Expr]:
    """Sums of non-negative multiples of indices and N plus a constant: the shape of real index arithmetic."""
    atoms = st.sampled_from(["a", "b", "c", "u", "w", "N"])
    terms = st.lists(st.tuples(atoms, st.integers(0, 90)), min_size=1, max_size=4)

    def build(ts: list[tuple[str, int]], c: int) -> Expr:
        out: Expr = _const(c)
        for name, k in ts:
            out = _node(out[0] + _leaf(name)[0] * k, _plus_scaled(out[1], _leaf(name)[1], k), out, _leaf(name))
        return out

    return st.builds(build, terms, st.integers(0, 20))


@settings(max_examples=300, deadline=None)
@given(_nonneg_expressions(), divisors)
def test_index_floordiv_mod_of_nonneg_index_match_python(x: Expr, d: Expr) -> None:
    q, r = floordiv(x[0], d[0]), mod(x[0], d[0])
    names = x[2] | d[2]
    _assert_same_values(q, lambda env: x[1](env) // d[1](env), names)
    _assert_same_values(r, lambda env: x[1](env) % d[1](env), names)
    # and they recombine into the dividend
    _assert_same_values(q * d[0] + r, x[1], names)


@settings(max_examples=300, deadline=None)
@given(expressions)
def test_index_simplified_expression_matches_python(x: Expr) -> None:
    _assert_same_values(x[0], x[1], x[2])


@settings(max_examples=200, deadline=None)
@given(expressions)
def test_index_subs_unflatten_keeps_values(x: Expr) -> None:
    """Substituting u = 5*a + b and w = N*q + c (how a reshape unflattens an index) keeps every value."""
    p = subs(x[0], {U.atom(): 5 * A + B, W.atom(): N * Q + C})  # type: ignore[dict-item]

    def python(env: dict[str, int]) -> int:
        return x[1]({**env, "u": 5 * env["a"] + env["b"], "w": env["N"] * env["q"] + env["c"]})

    assert "u" not in _names(p) and "w" not in _names(p)
    _assert_same_values(p, python, (x[2] - {"u", "w"}) | {"a", "b", "c", "q", "N"})


@settings(max_examples=200, deadline=None)
@given(expressions, expressions)
def test_index_proofs_hold_at_every_point(x: Expr, y: Expr) -> None:
    """`is_nonneg`, `is_lt` and `is_le` may fail to prove a fact, but never prove a false one."""
    names = x[2] | y[2]
    if is_nonneg(x[0]):
        assert all(x[1](env) >= 0 for env in _env_values(names))
    if is_lt(x[0], y[0]):
        assert all(x[1](env) < y[1](env) for env in _env_values(names))
    if is_le(x[0], y[0]):
        assert all(x[1](env) <= y[1](env) for env in _env_values(names))


# -- the simplifications index code relies on --------------------------------------------------------------
def _opaque(p: Poly) -> set[type]:
    return {type(a) for a in p.atoms() if isinstance(a, (FloorDiv, Mod, Min, Max))}


def test_index_mod_of_in_range_index_is_dropped() -> None:
    b, c = var("b", 3), var("c", 85)
    assert mod(85 * b + c, 255) == 85 * b + c
    assert floordiv(85 * b + c, 85) == b
    assert mod(85 * b + c, 85) == c


def test_index_unflatten_of_flat_index_gives_plain_strides() -> None:
    i, j, k = var("i", 3), var("j", 4), var("k", 5)
    flat = 20 * i + 5 * j + k
    assert floordiv(flat, 5) == 4 * i + j
    assert mod(flat, 5) == k
    assert floordiv(floordiv(flat, 5), 4) == i
    assert mod(floordiv(flat, 5), 4) == j
    assert not _opaque(floordiv(flat, 20)) and not _opaque(mod(flat, 20))


def test_index_flat_index_over_a_multiple_of_its_stride_lands_on_the_loop_variable() -> None:
    # A Transpose [720, 80, 80] -> [80, 80, 720] read through Reshape [57600, 80]: element (o, j) of the output is
    # flat 80*o + j, whose channel 80*o + j mod 720 is 80*(o mod 9) + j and whose position (80*o + j) div 720 is
    # o div 9, because j < 80 and 80 divides 720. Without the rule every element divided by 720 and 57600
    # (RetinaNet's score head ran 7x slower than onnxruntime).
    o, j = var("o", 57600), var("j", 80)
    flat = 80 * o + j
    assert floordiv(flat, 720) == floordiv(o, 9)
    assert mod(flat, 720) == 80 * mod(o, 9) + j
    assert floordiv(flat, 57600) == floordiv(o, 720)
    for ov, jv in itertools.product((0, 1, 8, 9, 17, 719, 720, 57599), (0, 1, 79)):
        env = {"o": ov, "j": jv}
        for d in (720, 57600, 160, 80):
            assert evaluate(floordiv(flat, d), env) == (80 * ov + jv) // d
            assert evaluate(mod(flat, d), env) == (80 * ov + jv) % d
    # no rule where the small part can reach the stride: j < 81 against 80
    k = var("k", 81)
    assert _opaque(floordiv(80 * o + k, 720))


def test_index_concat_part_read_through_a_reshape_lands_on_the_loop_variable() -> None:
    # mmyolo's YOLOv8 head: a DFL map [64, 40, 40] flattened to [64, 1600] and concatenated after 6400 anchors of
    # the level before, read at anchor 6403 + j: row (6403 + j - 6400) div 40, column mod 40. A floor division
    # gives up the constant's multiple of its divisor, and d*fdiv(x, d) + mod(x, d) is x again: the read is 3 + j,
    # contiguous along j (it was a division and a remainder per element, and no lane schedule)
    j = var("j", 1594)
    x = 6403 + j
    assert floordiv(x, 40) == 160 + floordiv(3 + j, 40)
    assert mod(x, 40) == mod(3 + j, 40)
    assert 40 * mod(floordiv(x, 40), 40) + mod(x, 40) == 3 + j
    assert 80 * floordiv(x, 80) + mod(x, 80) == x
    assert 2 * (80 * floordiv(x, 80)) + 2 * mod(x, 80) + 1 == 2 * x + 1
    for jv in (0, 1, 36, 37, 1593):
        for d in (40, 80, 6400, 7):
            for c in (6403, -5, -6403, 0):
                assert evaluate(floordiv(c + j, d), {"j": jv}) == (c + jv) // d
                assert evaluate(mod(c + j, d), {"j": jv}) == (c + jv) % d
    # not recombined unless the coefficients match
    assert _opaque(80 * floordiv(x, 80) + 2 * mod(x, 80)) == {FloorDiv, Mod}


def test_index_symbolic_extent_divides_out() -> None:
    c, q = var("c", N), var("q", 4)
    assert floordiv(N * q + c, N) == q
    assert mod(N * q + c, N) == c
    assert floordiv(c, N) == Poly()


def test_index_recombines_over_symbolic_sizes_but_not_over_loop_indices() -> None:
    # a Reshape of symbolic [H, W] to [H*W] read back: W*fdiv(m, W) + mod(m, W) is m (a YOLOv5 decode exported
    # with dynamic sizes: its tiled transposes then run over H*W, not rows of W); not over a loop index, which is
    # 0 in a loop that runs, where fdiv and mod by 0 are not an identity
    h, w = sym("H"), sym("W")
    m = var("m", h * w)
    assert w * floordiv(m, w) + mod(m, w) == m
    assert 3 * (h * w) * floordiv(m + 2, h * w) + 3 * mod(m + 2, h * w) == 3 * m + 6
    assert _opaque(2 * w * floordiv(m, w) + mod(m, w)) == {FloorDiv, Mod}
    c = sym("C")  # times another size: an NHWC output's row stride C*W
    assert c * w * floordiv(m, w) + c * mod(m, w) + 1 == c * m + 1
    k = var("k", 5)
    assert _opaque(k * floordiv(m, k) + mod(m, k)) == {FloorDiv, Mod}
    for hv, wv in itertools.product((1, 2, 3), (1, 4, 7)):
        for mv in range(hv * wv):
            env = {"H": hv, "W": wv, "m": mv}
            assert evaluate(floordiv(m, w), env) * wv + evaluate(mod(m, w), env) == mv


def test_index_nested_floordiv_merges() -> None:
    x = var("x", 1000)
    assert floordiv(floordiv(x, 4), 3) == floordiv(x, 12)


def test_index_floordiv_keeps_an_opaque_term_when_needed() -> None:
    x = var("x", 10)
    q = floordiv(x, 4)
    assert _opaque(q) == {FloorDiv}
    assert [evaluate(q, {"x": v}) for v in range(10)] == [v // 4 for v in range(10)]
    r = mod(x - 5, 4)
    assert [evaluate(r, {"x": v}) for v in range(10)] == [(v - 5) % 4 for v in range(10)]  # floor, not C's %


def test_index_pmin_pmax_decide_when_provable() -> None:
    a = var("a", 3)
    assert pmin(a, 2) == a and pmax(a, 2) == Poly.of(2)
    assert pmax(a, 0) == a and pmin(a, 0) == Poly()
    assert pmin(N, N + 1) == N
    assert _opaque(pmin(a, 1)) == {Min}


def test_index_division_by_zero_raises() -> None:
    with pytest.raises(ZeroDivisionError):
        floordiv(var("a", 3), 0)
    with pytest.raises(ZeroDivisionError):
        mod(var("a", 3), 0)


# -- known bugs (minimal repros) ----------------------------------------------------------------------------
def test_index_pmin_of_floordiv_with_negative_symbolic_numerator() -> None:
    a = var("a", 3)
    f = floordiv(-N - a, 2)
    m = pmin(f, -N)
    for n, x in itertools.product((1, 2, 4), range(3)):
        assert evaluate(m, {"N": n, "a": x}) == min((-n - x) // 2, -n)


def test_index_negative_divisor_bounds() -> None:
    a = var("a", 6)
    r = mod(floordiv(a, -2), 7)
    assert [evaluate(r, {"a": x}) for x in range(6)] == [(x // -2) % 7 for x in range(6)]
    s = floordiv(mod(a, -4), 8)
    assert [evaluate(s, {"a": x}) for x in range(6)] == [(x % -4) // 8 for x in range(6)]


def test_overflows_finds_int64_overflow_of_exporter_constants() -> None:
    from evonnx.index import SIZE_MAX
    from evonnx.passes.lower_groups import INT64_MAX, overflows

    n, h = Poly.of(sym("N")), Poly.of(sym("H"))
    i = var("i", n * h)
    assert not overflows(n * h * 85 + i * 4 + 3)  # products of sizes index memory: bounded by SIZE_MAX
    assert overflows(n * 4 + (INT64_MAX - 1))  # a Range limit - start + step - 1 with step INT64_MAX
    assert overflows(i * -(2**63))  # a Slice step of INT64_MIN over a symbolic dim
    assert overflows(floordiv(n * 2**62 + 1, 7))  # inside a floor division too
    # a constant's multiple of the divisor comes out of a floor division, exactly: the rest no longer overflows
    k = INT64_MAX - 2
    assert floordiv(n * 4 + k, 7) == k // 7 + floordiv(n * 4 + k % 7, 7)
    assert not overflows(floordiv(n * 4 + k, 7))
    assert not overflows(Poly.of(INT64_MAX))  # a constant alone is what C writes
    assert overflows(n * (INT64_MAX // SIZE_MAX + 1))


def test_a_cancelled_remainder_is_not_paired_with_a_quotient() -> None:
    """(a % N + b % N) - a % N: the subtraction leaves a % N with coefficient 0, which `_recombined` paired with an
    absent N * (a // N) and failed with a KeyError (hypothesis, CI of 16ca866, through is_lt)."""
    a, b, n = var("a", 3), var("b", 3), sym("N")
    assert mod(a, n) + mod(b, n) - mod(a, n) == mod(b, n)
    assert not is_lt(mod(a, n), mod(a, n) + mod(b, n))  # b % N may be 0
