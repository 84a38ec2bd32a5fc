"""Lazy broadcasting: an axis repeats when its size is 1, and a symbolic size that may be the target's or 1 at run
time reads at min(i, size - 1), so both cases are right; the kernel checks that the sizes broadcast."""

from __future__ import annotations

from evonnx.expr import Load
from evonnx.index import Max, Min, Poly, evaluate, pmin, sym, var
from evonnx.passes import lazy as L


def test_lazy_broadcast_repeats_size_one_axes() -> None:
    n = sym("N")
    x = L.source(0, "float32", (1, 4))
    y = L.broadcast_to(x, (n, 4))
    i, j = var("i", n), var("j", 4)
    assert y.at((i, j)) == Load(0, j, "float32")


def test_lazy_broadcast_of_the_same_symbolic_size_keeps_the_index() -> None:
    n = sym("N")
    x = L.source(0, "float32", (n,))
    i = var("i", n)
    assert L.broadcast_to(x, (n,)).at((i,)) == Load(0, i, "float32")


def test_lazy_broadcast_of_another_symbolic_size_reads_row_zero_when_it_is_one() -> None:
    # valid_flags gave wrong flags when this index was dropped (0a416be); it is now min(i, N-1): i when N == M,
    # 0 when N == 1
    n, m = sym("N"), sym("M")
    x = L.source(0, "float32", (n,))
    i = var("i", m)
    assert L.broadcast_to(x, (m,)).at((i,)) == Load(0, pmin(i, n - 1), "float32")


def test_broadcast_shapes_of_two_symbols_is_onnx_broadcasting_with_a_run_time_check() -> None:
    n, m = sym("N"), sym("M")
    with L.collect_checks() as checks:
        (out,) = L.broadcast_shapes([(n,), (m,)], "Add")
    assert [(c.kind, c.lhs, c.rhs) for c in checks] == [("bcast", n, m)]
    assert out == Poly.of(Max(n, m)) * Poly.of(Min(Poly.of(Min(n, m)), Poly.of(1)))
    for a, b, want in [(3, 3, 3), (1, 3, 3), (3, 1, 3), (0, 1, 0), (1, 0, 0), (0, 0, 0), (1, 1, 1)]:
        assert evaluate(out, {"N": a, "M": b}) == want, (a, b)


def test_broadcast_shapes_of_a_symbol_against_a_constant_is_the_constant() -> None:
    n = sym("N")
    with L.collect_checks() as checks:
        (out,) = L.broadcast_shapes([(n,), (Poly.of(3),)], "Mul")
    assert out == Poly.of(3) and [(c.kind, c.lhs, c.rhs) for c in checks] == [("bcast", Poly.of(3), n)]
