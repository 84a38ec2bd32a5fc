"""Lazy broadcasting: an axis is repeated only when its size is 1, never because two sizes differ symbolically."""

from __future__ import annotations

from evonnx.expr import Load
from evonnx.index import sym, var
from evonnx.passes import lazy as L


def test_lazy_broadcast_repeats_size_one_axes() -> None:
    n = sym("N")
    x = L.source(0, "float32", (1, 4))
    y = L.broadcast_to(x, (n, 4))
    i, j = var("i", n), var("j", 4)
    assert y.at((i, j)) == Load(0, j, "float32")


def test_lazy_broadcast_of_assumed_equal_symbolic_sizes_keeps_the_index() -> None:
    n, m = sym("N"), sym("M")
    x = L.source(0, "float32", (n,))
    y = L.broadcast_to(x, (m,))
    i = var("i", m)
    assert y.at((i,)) == Load(0, i, "float32")  # fixed in 0a416be; valid_flags gave wrong flags before
