"""Gathers whose indices are read at run time: Gather, GatherElements and GatherND of indices that a kernel loads
(a TopK's, or a grid built from sizes), as positions `expr.Picked` that the kernel checks where it reads them.

onnxruntime's CPU kernels fail the Run on an index outside [-dim, dim), and check every index, read later or not.
A kernel checks the indices it reads, so the result is computed whole (`analyze.computed_whole`: every element
reads its index), and an axis of 0 elements is checked before anything is read (`evo_pick` gives position 0 for a
bad index). Where onnxruntime may check an index that no result element reads (a Gather whose dims before or after
the axis may be 0, a GatherND whose slices may be empty), the node stays with onnxruntime. The CUDA kernels cannot
fail a Run, so a CUDA target leaves these nodes to onnxruntime (`RUNTIME_INDICES`).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from contextvars import ContextVar

from evonnx import expr as E
from evonnx.index import Poly, is_le, product
from evonnx.passes import lazy as L
from evonnx.passes.lazy import Index, Lazy, Reject
from evonnx.passes.lower_common import Args, Attrs, MapKind, OpDef, Vals

# Whether a kernel may read a Gather's indices at run time: the pipeline sets it per run (off for a CUDA target).
RUNTIME_INDICES: ContextVar[bool] = ContextVar("runtime_indices", default=True)


def enabled() -> bool:
    """Run-time indices are on unless EVONNX_RUNTIME_INDICES=0. They were opt-in while the fuzzer found classes
    in them (session 20's note on issue 8: an index the gathered element does not address, indices computed by
    inexact ops; fixed in e8ab716 and 24f8f13, float16 data in f7c86e2) and were fuzzed clean since (session 21's
    note)."""
    return os.environ.get("EVONNX_RUNTIME_INDICES", "") != "0"


def runtime_indices(op: str, ind: Lazy) -> None:
    """Reject unless indices read at run time are allowed here and `ind` holds integers."""
    if not RUNTIME_INDICES.get():
        raise Reject(f"{op} indices are data-dependent (read at run time on the CPU only)")
    if ind.dtype not in ("int32", "int64"):
        raise Reject(f"{op} indices of {ind.dtype}")


def _nonempty(dims: Sequence[Poly], op: str, what: str) -> None:
    """onnxruntime checks the indices of slices of no element too, which a kernel never reads: these dims must be
    provably at least 1."""
    if not is_le(Poly.of(1), product(dims)):
        raise Reject(f"{op} {what} may be empty (onnxruntime still checks the indices there)")


def _axis_present(dim: Poly, out: Sequence[Poly], op: str) -> None:
    """The kernel reads no index of an empty axis: it fails where the result has an element (onnxruntime fails
    there on the first index it checks)."""
    L.require_le(Poly.of(1), dim, f"{op} indexes an axis of 0 elements", unless=product(out))


def gather(op: str, x: Lazy, axis: int, ind: Lazy) -> Lazy:
    """Gather along `axis` at indices `ind` read at run time."""
    runtime_indices(op, ind)
    dim = x.shape[axis]
    # onnxruntime checks every index before it copies anything, even where the result is empty because a dim
    # before the axis is 0 (fuzz case 173, seed 969006: x[N, N] at N = 0); a kernel reads an index only for an
    # element of the result, so those dims must be provably at least 1, as the slices after the axis
    _nonempty(x.shape[:axis], op, "rows before the axis")
    _nonempty(x.shape[axis + 1:], op, "slices")
    out_shape = x.shape[:axis] + ind.shape + x.shape[axis + 1:]
    _axis_present(dim, out_shape, op)
    r = ind.rank

    def at(idx: Index) -> Poly:
        return E.picked(ind.fn(idx[axis:axis + r]), dim)

    return _gathered(x, out_shape, lambda idx: idx[:axis] + (at(idx),) + idx[axis + r:], lambda idx: [at(idx)])


def gather_elements(op: str, x: Lazy, axis: int, ind: Lazy) -> Lazy:
    """GatherElements along `axis` at indices `ind` (of x's rank) read at run time."""
    runtime_indices(op, ind)
    if ind.rank != x.rank:
        raise Reject("GatherElements indices of another rank than the data")
    for k in range(x.rank):
        if k != axis:  # onnxruntime fails the Run where an indices dim exceeds the data's
            L.require_le(ind.shape[k], x.shape[k], f"GatherElements indices dim {k} must not exceed the data's")
    dim = x.shape[axis]
    _axis_present(dim, ind.shape, op)

    def at(idx: Index) -> Poly:
        return E.picked(ind.fn(idx), dim)

    return _gathered(x, ind.shape, lambda idx: idx[:axis] + (at(idx),) + idx[axis + 1:], lambda idx: [at(idx)])


def _gather_nd(op: str, attrs: Attrs, args: Args, vals: Vals, n_out: int) -> list[Lazy]:
    x, ind = args[0], args[1]
    runtime_indices(op, ind)
    b = int(attrs.get("batch_dims", 0))
    if ind.rank < 1 or not 0 <= b < min(ind.rank, x.rank):
        raise Reject(f"GatherND with batch_dims {b} of indices of rank {ind.rank} and data of rank {x.rank}")
    k = ind.shape[-1].const
    if k is None or not 1 <= k <= x.rank - b:
        raise Reject(f"GatherND index tuples of {ind.shape[-1]} elements into data of rank {x.rank}")
    if any(d != e for d, e in zip(x.shape[:b], ind.shape[:b])):
        raise Reject("GatherND batch dims of the indices not provably the data's")
    rows = ind.shape[b:-1]
    rest = x.shape[b + k:]
    _nonempty(rest, op, "slices")
    out_shape = ind.shape[:-1] + rest
    dims = x.shape[b:b + k]
    for d in dims:
        _axis_present(d, out_shape, op)
    nr = len(rows)

    def pos(idx: Index) -> list[Poly]:
        return [E.picked(ind.fn(idx[:b + nr] + (Poly.of(j),)), d) for j, d in enumerate(dims)]

    return [_gathered(x, out_shape, lambda idx: idx[:b] + tuple(pos(idx)) + idx[b + nr:], pos)]


def _gathered(x: Lazy, shape: Sequence[Poly], index_map: Callable[[Index], Index],
              picks: Callable[[Index], list[Poly]]) -> Lazy:
    """x read at `index_map(idx)`, each run-time position `picks(idx)` evaluated by the element whether its address
    uses it or not (`expr.keep`)."""
    return Lazy(x.dtype, tuple(shape), lambda idx: E.keep(x.fn(index_map(idx)), picks(idx)))


DEFS = [OpDef("GatherND", _gather_nd, MapKind.SHUFFLE)]
