"""`View` against numpy: the same op chain applied to a view and to `np.arange(n).reshape(shape)` (whose values
are storage positions) must give, at every position, `View.index(idx) == array[idx]`.

The chain runs on three things at once: a `View`, the lazy tensor `passes.lazy.source(...)` (which falls back to
floor-div/mod index maps when strides cannot express a reshape) and a numpy array built with numpy's own views.
Indices are symbolic loop variables, evaluated at every position, so the simplifications of `evonnx.index` are
exercised too.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from evonnx.expr import Load
from evonnx.index import Poly, evaluate, sym, var
from evonnx.passes import lazy as L
from evonnx.view import View


@dataclass
class Chain:
    view: View | None  # None once a reshape could not be expressed with strides
    lazy: L.Lazy
    array: np.ndarray  # values are storage positions
    numpy_view: bool  # numpy has not copied yet: `array` shares the strides a View should have
    log: list[str]


def _start(shape: tuple[int, ...]) -> Chain:
    n = math.prod(shape)
    return Chain(View.dense(shape), L.source(0, "int64", shape), np.arange(n).reshape(shape), True,
                 [f"dense{shape}"])


def _polys(xs: tuple[int, ...]) -> tuple[Poly, ...]:
    return tuple(Poly.of(x) for x in xs)


def _factor_shape(draw: st.DrawFn, n: int) -> tuple[int, ...]:
    """A random shape with `n` elements (1 to 4 axes, some of size 1)."""
    primes = []
    m, p = n, 2
    while m > 1:
        while m % p == 0:
            primes.append(p)
            m //= p
        p += 1
    rank = draw(st.integers(1, 4))
    dims = [1] * rank
    for q in primes:
        dims[draw(st.integers(0, rank - 1))] *= q
    return tuple(dims)


def _apply(draw: st.DrawFn, c: Chain) -> None:
    shape = c.array.shape
    rank = len(shape)
    choices = ["transpose", "expand", "reshape"] + (["slice"] if rank else []) + (["select"] if rank >= 2 else [])
    op = draw(st.sampled_from(choices))
    if op == "slice":
        axis = draw(st.integers(0, rank - 1))
        d = shape[axis]
        start = draw(st.integers(0, d - 1))
        step = draw(st.sampled_from([1, 2, 3, -1, -2]))
        most = (d - start + step - 1) // step if step > 0 else start // -step + 1
        length = draw(st.integers(1, most))
        stop = start + length * step
        sl = [slice(None)] * rank
        sl[axis] = slice(start, stop if stop >= 0 else None, step)
        c.array = c.array[tuple(sl)]
        if c.view is not None:
            c.view = c.view.slice(axis, start, length, step)
        c.lazy = L.slice_axis(c.lazy, axis, Poly.of(start), Poly.of(length), step)
        c.log.append(f"slice(axis={axis}, start={start}, length={length}, step={step})")
    elif op == "select":
        axis = draw(st.integers(0, rank - 1))
        i = draw(st.integers(0, shape[axis] - 1))
        c.array = c.array[(slice(None),) * axis + (i,)]
        if c.view is not None:
            c.view = c.view.select(axis, i)
        c.lazy = L.select(c.lazy, axis, Poly.of(i))
        c.log.append(f"select(axis={axis}, i={i})")
    elif op == "transpose":
        perm = tuple(draw(st.permutations(range(rank))))
        c.array = c.array.transpose(perm)
        if c.view is not None:
            c.view = c.view.transpose(perm)
        c.lazy = L.transpose(c.lazy, perm)
        c.log.append(f"transpose{perm}")
    elif op == "expand":
        lead = draw(st.integers(0, max(0, 4 - rank)))
        new = tuple(draw(st.integers(1, 3)) for _ in range(lead)) + tuple(
            draw(st.integers(1, 3)) if d == 1 else d for d in shape)
        c.array = np.broadcast_to(c.array, new)
        if c.view is not None:
            c.view = c.view.expand(new)
        c.lazy = L.broadcast_to(c.lazy, _polys(new))
        c.log.append(f"expand{new}")
    else:
        new = _factor_shape(draw, c.array.size)
        nv = c.view.reshape(new) if c.view is not None else None
        if c.numpy_view and c.view is not None:
            alias = c.array.view()
            try:
                alias.shape = new  # numpy refuses exactly when strides cannot express the result
                expressible = True
            except AttributeError:
                expressible = False
            assert (nv is not None) == expressible, (
                f"View.reshape{new} of {c.view} gives {nv}; numpy {'can' if expressible else 'cannot'} "
                f"({' -> '.join(c.log)})")
        if nv is None:
            c.numpy_view = False
        c.view = nv
        c.array = c.array.reshape(new)
        c.lazy = L.reshape(c.lazy, _polys(new))
        c.log.append(f"reshape{new}" + ("" if nv is not None else " (not strided)"))


def _check(c: Chain) -> None:
    shape = c.array.shape
    idx = tuple(var(f"i{k}", d) for k, d in enumerate(shape))
    where = " -> ".join(c.log)
    assert tuple(c.lazy.shape) == _polys(shape), where
    load = c.lazy.at(idx)
    assert isinstance(load, Load) and load.slot == 0, where
    if c.view is not None:
        assert c.view.shape == _polys(shape), where
        pos = c.view.index(idx)
        if c.view.is_contiguous():
            assert c.array.reshape(-1).tolist() == list(range(c.array.size)), f"contiguous view {c.view}: {where}"
    for k in np.ndindex(*shape):
        env = {f"i{a}": int(v) for a, v in enumerate(k)}
        want = int(c.array[k])
        assert evaluate(load.index, env) == want, f"lazy at {k}: {load.index}; {where}"
        if c.view is not None:
            assert evaluate(pos, env) == want, f"{c.view} at {k}; {where}"


@st.composite
def chains(draw: st.DrawFn) -> Chain:
    shape = tuple(draw(st.lists(st.integers(1, 6), min_size=1, max_size=4)))
    c = _start(shape)
    for _ in range(draw(st.integers(1, 5))):
        _apply(draw, c)
        if c.array.size > 2000:
            break
    return c


@settings(max_examples=600, deadline=None)
@given(chains())
def test_view_index_matches_numpy_after_op_chain(c: Chain) -> None:
    _check(c)


@settings(max_examples=300, deadline=None)
@given(chains(), st.data())
def test_view_reshape_falls_back_to_index_map(c: Chain, data: st.DataObject) -> None:
    """After any chain, a reshape to a random shape reads the right elements through the lazy fallback."""
    new = _factor_shape(data.draw, c.array.size)
    c.array = c.array.reshape(new)
    c.view = c.view.reshape(new) if c.view is not None else None
    c.lazy = L.reshape(c.lazy, _polys(new))
    c.log.append(f"reshape{new}")
    _check(c)


def test_view_str_is_one_stable_line() -> None:
    assert str(View.dense((4, 8)).transpose((1, 0))) == "View((8,4):(1,8)+0)"
    assert str(View.dense((4, 8))) == "View((4,8):(8,1)+0)"


def test_view_transpose_of_non_contiguous_reshape_is_none() -> None:
    v = View.dense((4, 8)).transpose((1, 0))
    assert v.reshape((32,)) is None
    assert v.reshape((8, 2, 2)) == View(_polys((8, 2, 2)), _polys((1, 16, 8)), Poly())


def test_view_symbolic_batch_reshape_and_index() -> None:
    n = sym("N")
    v = View.dense((n, 4, 3))
    flat = v.reshape((n, 12))
    assert flat == View.dense((n, 12))
    t = v.transpose((0, 2, 1))  # (N, 3, 4) with strides (12, 1, 3)
    assert t.reshape((n, 12)) is None
    lz = L.reshape(L.from_view(0, "float32", t), (n, Poly.of(12)))
    b, j = var("b", n), var("j", 12)
    load = lz.at((b, j))
    assert isinstance(load, Load)
    for size in (1, 2, 5):
        want = np.arange(size * 12).reshape(size, 4, 3).transpose(0, 2, 1).reshape(size, 12)
        for bi in range(size):
            for ji in range(12):
                assert evaluate(load.index, {"N": size, "b": bi, "j": ji}) == want[bi, ji]


def test_view_slice_with_negative_step_reverses() -> None:
    v = View.dense((5,)).slice(0, 4, 5, -1)
    assert [v.index((i,)).const for i in range(5)] == [4, 3, 2, 1, 0]
    assert v.strides == (Poly.of(-1),) and v.offset == Poly.of(4)
