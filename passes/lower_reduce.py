"""Reductions, arg-extremes and Softmax as lazy element functions (see lower_ops)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from evonnx import expr as E
from evonnx.expr import Const, Expr
from evonnx.index import Poly, pmax, pmin, product
from evonnx.passes import lazy as L
from evonnx.passes.lazy import Lazy, Reject
from evonnx.passes.lower_common import Args, Attrs, MapKind, OpDef, Vals, const_ints, norm_axis


def _reduce_axes(op: str, attrs: Attrs, args: Args, vals: Vals, rank: int) -> tuple[list[int] | None, set[int]]:
    """The reduced axes (sorted), or None for "no reduction" (empty axes with noop_with_empty_axes); and the axes
    that onnxruntime keeps on an empty input (see `_empty_quirk`)."""
    if len(args) > 1 and args[1] is not None:
        axes = const_ints(vals[1], f"{op} axes")
    else:
        axes = [int(a) for a in attrs.get("axes", [])]
    if not axes:
        return (None if int(attrs.get("noop_with_empty_axes", 0)) else list(range(rank))), set()
    out = sorted({norm_axis(a, rank, op) for a in axes})
    return out, set(out) - {a for a in axes if a >= 0}


def _empty_quirk(op: str, x: Lazy, axes: Sequence[int], quirk: set[int], keep: int) -> dict[int, Poly]:
    """onnxruntime 1.31 departs from the spec on an empty input: its empty-set path looks for each axis in the axes
    as written, so an axis written negatively is not reduced but kept at its input size. ReduceMax(x[0, 5],
    axes=[-1], keepdims=1) is [0, 5], not [0, 1]; ArgMax(x[5, 0], axis=-1) is [5, 0], not an error (see
    tests/security/sec_models.py). With keepdims=1 that is an output size `numel == 0 ? d : 1` for each such axis
    (returned per axis). With keepdims=0 the rank changes: where every reduced axis has a static size of at least
    1, the input is empty exactly where the output is, and the kernel gives that output onnxruntime's shape then
    (`_empty_shape`); otherwise the node stays with onnxruntime unless the input can never be empty."""
    if not quirk or all((d.const or 0) > 0 for d in x.shape):
        return {}
    if not keep and not all((x.shape[a].const or 0) > 0 for a in axes):
        raise L.RankQuirk(f"{op} with negative axes keeps the input's shape on an empty input in onnxruntime")
    if all(x.shape[k].const is not None for k in range(x.rank) if k not in axes):
        # The spec's result shape is static, so onnxruntime's memory planner may have given the output a buffer of
        # that shape: with the other shape on an empty input it then fails ("Shape mismatch attempting to re-use
        # buffer"), or not, as its plan goes.
        raise Reject(f"{op} with negative axes of an input that can be empty: onnxruntime's result depends on its "
                     "memory plan")
    if not keep:
        return {}
    empty = Poly.of(1) - pmin(product(x.shape), Poly.of(1))
    return {a: Poly.of(1) + empty * (x.shape[a] - Poly.of(1)) for a in quirk}


def _empty_shape(x: Lazy, axes: Sequence[int], quirk: set[int], keep: int) -> tuple[Poly, ...] | None:
    """onnxruntime's shape of a keepdims=0 reduction of an empty `x` where it differs from the spec's (its axes
    written negatively kept at their input sizes, `_empty_quirk`), or None. Its reduced axes have static sizes
    (`_empty_quirk` leaves the node otherwise), so the output is empty exactly where the input is."""
    if keep or not quirk or all((d.const or 0) > 0 for d in x.shape):
        return None
    return tuple(d for k, d in enumerate(x.shape) if k not in axes or k in quirk)


# ReduceL1/L2/SumSquare/LogSum/LogSumExp: a sum of a transformed element, then a final transform (spec formulas)
_SUM_OF = {"l1": "abs", "l2": "square", "sumsquare": "square", "logsum": None, "logsumexp": None}


def _reducer(kind: str) -> Callable[..., list[Lazy]]:
    def f(op: str, attrs: Attrs, args: Args, vals: Vals, n_out: int) -> list[Lazy]:
        x = args[0]
        axes, quirk = _reduce_axes(op, attrs, args, vals, x.rank)
        if axes is None and kind not in _SUM_OF:
            return [x]
        if axes is None:
            axes = []  # noop_with_empty_axes: the transforms still apply to every element
        if kind in ("mean", "l2", "logsum", "logsumexp") and x.dtype not in E.FLOATS:
            raise Reject(f"{op} of integers is not supported")
        if kind in ("sum", "prod", "l1", "sumsquare") and x.dtype not in E.FLOATS:
            # onnxruntime 1.31 accumulates integer sums and products in double and saturates the result:
            # ReduceSum(int64 [2^53 + 1, 2]) is 2^53 + 2 and an overflowing sum is INT_MAX, not the wrapped value.
            # Exact wrapping arithmetic would differ from it, so these stay with onnxruntime.
            raise Reject(f"{op} of integers rounds through double in onnxruntime")
        if kind in ("max", "min") and x.dtype == "int64" and vals[0] is None and not all(
                x.shape[a].const == 1 for a in (axes or range(x.rank))):
            # onnxruntime 1.31 compares int64 pairs inside SIMD blocks by their 32-bit halves, the low ones as
            # signed (as its Min and Max, lower_math._int64_order): ReduceMin([7, -2^32, 7, -5]) is -5 there. Which
            # pairs meet in a block depends on the layout, so no kernel reproduces it (fuzz case001376)
            raise Reject(f"int64 {op} of run-time data (onnxruntime's comparison of 32-bit halves is not reproduced)")
        if kind == "logsumexp" and x.rank and set(axes) == set(range(x.rank)) and vals[0] is None:
            # over every axis, onnxruntime 1.31 shifts by Eigen's maxCoeff of the whole tensor (its aggall), not by
            # the largest finite element as its rows do (_logsumexp_shift); with inf or NaN in the data the result
            # then depends on how that maximum meets them in SIMD lanes: [inf, nan] gives inf, [-inf, nan] -inf,
            # [x, nan, y, inf, z] NaN (fuzz case 1607 of the session-28 focused run)
            raise Reject(f"{op} over every axis of run-time data (onnxruntime's whole-tensor shift is not reproduced)")
        keep = int(attrs.get("keepdims", 1))
        for a in axes:
            if x.shape[a].const == 0:
                raise Reject(f"{op} over an empty axis")
        kept = _empty_quirk(op, x, axes, quirk, keep)
        empty_shape = _empty_shape(x, axes, quirk, keep)
        shape = tuple(kept.get(k, Poly.of(1)) if k in axes else d for k, d in enumerate(x.shape)
                      if keep or k not in axes)
        count = product(x.shape[a] for a in axes)

        def fn(idx: tuple[Poly, ...]) -> Expr:
            full: list[Poly] = []
            rvars: list[Poly] = []
            it = iter(idx)
            for k in range(x.rank):
                if k in axes:
                    if keep:
                        next(it)
                    v = L.fresh_var(x.shape[k])
                    rvars.append(v)
                    full.append(v)
                else:
                    full.append(next(it))
            def reduce(body: Expr, how: str, over: list[Poly] = rvars) -> Expr:
                for v in reversed(over):
                    if v.atom() is not None:
                        body = E.Reduce(how, v, body, x.dtype)
                return body

            elem = x.fn(tuple(full))
            if kind == "logsumexp":
                m = _logsumexp_shift(x, full, rvars, count, reduce) if rvars else elem
                return E.binary("add", E.unary("log", reduce(E.unary("exp", E.binary("sub", elem, m)), "sum")), m)
            if kind in _SUM_OF:
                pre = _SUM_OF[kind]
                body = E.binary("mul", elem, elem) if pre == "square" else E.unary(pre, elem) if pre else elem
                s = reduce(body, "sum")
                return E.unary("sqrt", s) if kind == "l2" else E.unary("log", s) if kind == "logsum" else s
            if kind in ("max", "min") and x.dtype in E.FLOATS and all(
                    (n := x.shape[a].const) is not None and n >= 1 for a in axes):
                # max(f(x)) = f(max(x)) for f nondecreasing that keeps NaN exactly where x is NaN (so the NaN rule
                # picks the same element): RetinaNet's max over 80 sigmoids per anchor becomes one sigmoid. Not over
                # an axis that may be empty, where the start value -inf/+inf would go through f.
                outer: list[str] = []
                while isinstance(elem, E.Op) and elem.op in _MONOTONE and elem.args[0].dtype == x.dtype:
                    outer.append(elem.op)
                    elem = elem.args[0]
                out = _extreme(elem, kind, rvars, count, reduce)
                for name in reversed(outer):
                    out = E.unary(name, out)
                return out
            if kind in ("max", "min") and x.dtype in E.FLOATS:
                return _extreme(elem, kind, rvars, count, reduce)
            out = reduce(elem, "sum" if kind == "mean" else kind)
            if kind == "mean":
                # onnxruntime's mean of an empty set is 0 (the spec's 0/0 would be NaN): the sum 0 over max(n, 1)
                out = E.binary("div", out, E.cast(E.index_val(pmax(count, Poly.of(1))), x.dtype))
            return out

        return [Lazy(x.dtype, shape, fn, uniform=frozenset(kept), empty_shape=empty_shape)]
    return f


# Unary ops that are nondecreasing and NaN exactly where their argument is (`_reducer`'s max/min rewrite). Not
# Relu, Floor or Ceil: they map unequal inputs to +0 and -0, and the max of [ceil(-0.5), ceil(0)] is the first
# zero, -0, where ceil(max) is +0.
_MONOTONE = frozenset({"sigmoid", "exp", "exp_nonpos", "tanh"})


def _extreme(elem: Expr, kind: str, rvars: list[Poly], count: Poly, reduce: Callable[[Expr, str], Expr]) -> Expr:
    """A float max or min of `elem` over the reduced axes, as onnxruntime takes it over their flattened elements:
    NaN where the first element is NaN, else the extreme of the elements that are not NaN. Over one axis that is
    each reduction's own rule (cprint). Over several, nested reductions each applying it would drop a later row
    whose first element is NaN ([[-6.49, -0], [nan, 1.583]] gave -0 where onnxruntime gives 1.583; fuzz case
    4071): the inner ones take NaN as -inf (+inf for min), and the first element alone decides NaN. That element
    is read only where the reduction is not empty."""
    loops = [v for v in rvars if v.atom() is not None]
    if len(loops) < 2:
        return reduce(elem, kind)
    fill = E.const(float("-inf") if kind == "max" else float("inf"), elem.dtype)
    inner = reduce(E.where(E.unary("isnan", elem), fill, elem), kind)
    first = E.unary("isnan", E.substitute(elem, {v.atom(): 0 for v in loops}))  # type: ignore[misc]
    if count.const is None or count.const < 1:
        first = E.guarded_where(E.binary("gt", E.index_val(count), E.const(0, "int64")), first,
                                E.Const(False, "bool"))
    return E.where(first, E.const(float("nan"), elem.dtype), inner)


def _logsumexp_shift(x: Lazy, full: list[Poly], rvars: list[Poly], count: Poly,
                     reduce: Callable[[Expr, str, list[Poly]], Expr]) -> Expr:
    """The shift m of onnxruntime's log(sum(exp(x - m))) + m (its ReduceAggregatorLogSumExp): the largest
    finite element, starting from the row's first element, or from 0 where that one is +-inf. So a row holding
    +inf gives +inf (m finite), not NaN (inf - inf), and [-inf, -1000] gives -inf (m = 0: exp(-1000) is 0), as
    onnxruntime does. The first element is read only where the row is not empty."""
    full2, rvars2 = _fresh_copy(full, rvars)
    x2 = x.fn(full2)
    inf = E.const(float("inf"), x.dtype)
    finite = E.binary("lt", E.unary("abs", x2), inf)  # false for NaN
    top = reduce(E.where(finite, x2, E.const(float("-inf"), x.dtype)), "max", rvars2)
    first = x.fn(tuple(Poly.of(0) if p in rvars else p for p in full))
    from_zero = E.binary("max", E.const(0.0, x.dtype), top)  # top is never NaN
    first_inf = E.binary("eq", E.unary("abs", first), inf)
    if count.const is None or count.const < 1:
        first_inf = E.guarded_where(E.binary("gt", E.index_val(count), E.const(0, "int64")), first_inf,
                                    E.Const(False, "bool"))
    return E.where(first_inf, from_zero, top)


def _fresh_copy(full: list[Poly], rvars: list[Poly]) -> tuple[tuple[Poly, ...], list[Poly]]:
    """`full` with each reduction variable replaced by a new one, and the new ones (a second, independent
    reduction over the same axes)."""
    swap = {v: L.fresh_var(v.atom().extent) for v in rvars if v.atom() is not None}  # type: ignore[union-attr]
    return tuple(swap.get(p, p) for p in full), [swap.get(v, v) for v in rvars]


def _arg_extreme(kind: str) -> Callable[..., list[Lazy]]:
    def f(op: str, attrs: Attrs, args: Args, vals: Vals, n_out: int) -> list[Lazy]:
        x = args[0]
        written = int(attrs.get("axis", 0))
        axis = norm_axis(written, x.rank, op)
        keep = int(attrs.get("keepdims", 1))
        last = int(attrs.get("select_last_index", 0))
        if x.rank == 1 and not last and x.dtype in E.FLOATS:
            # onnxruntime 1.31 reduces a rank-1 input on another path, where the first NaN wins ([0, nan, -1, nan]
            # gives 1, where its rows of a rank-2 input skip a NaN after element 0; select_last_index=1 skips it on
            # both): not the rule evonnx's kernels follow (fuzz case 1027)
            raise Reject(f"{op} of a rank-1 float input (onnxruntime's first NaN wins there)")
        quirk = {axis} if written < 0 else set()
        kept = _empty_quirk(op, x, [axis], quirk, keep)
        empty_shape = _empty_shape(x, [axis], quirk, keep)
        shape = tuple(kept.get(k, Poly.of(1)) if k == axis else d for k, d in enumerate(x.shape)
                      if keep or k != axis)
        # onnxruntime fails an arg-reduction over an empty axis when the result is not empty
        L.require_le(Poly.of(1), x.shape[axis], f"{op} over an empty axis {axis}",
                     unless=Poly() if kept else product(shape))

        def fn(idx: tuple[Poly, ...]) -> Expr:
            v = L.fresh_var(x.shape[axis])
            full = list(idx)
            if keep:
                full[axis] = v
            else:
                full.insert(axis, v)
            if v.atom() is None:
                return Const(0, "int64")
            return E.Reduce(kind, v, x.fn(tuple(full)), "int64", last)

        return [Lazy("int64", shape, fn, uniform=frozenset(kept), empty_shape=empty_shape)]
    return f


def _softmax(log: bool) -> Callable[..., list[Lazy]]:
    def f(op: str, attrs: Attrs, args: Args, vals: Vals, n_out: int) -> list[Lazy]:
        x: Lazy = args[0]
        if x.dtype not in E.FLOATS:
            raise Reject(f"{op} of {x.dtype}")
        if log and x.dtype == "float64":
            # onnxruntime 1.31's double LogSoftmax (Eigen) gives per-lane results on a row holding NaN or +-inf:
            # [1, 2, nan, 3, ...] -> [40.05, 41.05, nan, 42.05, ...]; its float one gives NaN, as evonnx does
            raise Reject("LogSoftmax of float64 (onnxruntime's results with NaN or inf in a row are not reproduced)")
        axis = norm_axis(int(attrs.get("axis", -1)), x.rank, op)
        n = x.shape[axis].const
        # Each output element is computed on its own: the max and sum are shared by the elements computed together
        # (the unrolled last axis) or hoisted per row, but each element computes its exp beside the sum's, where
        # onnxruntime's MLAS kernel stores the exps and scales them: a fused softmax measured slower than it, 403
        # vs 140 us for (2400, 92) with a Mul fused in front, 1823 vs 1037 us for (33600, 17), 238 vs 71-118 us
        # for (4096, 8), 1 thread. The cost model prices that (cost_model._softmax_stats), so a Softmax is fused
        # where its exps are shared: read only by MatMuls by constant weights (a DFL head, `_matmul`), whose
        # weighted sum and row sum run in one loop (cprint.lane_reduce). Longer rows stay with onnxruntime. Over
        # another axis than the last (ultralytics' DFL: axis 1 of [N, 16, 4, A]) onnxruntime transposes around it.
        if n is None or n > MAX_SOFTMAX_AXIS:
            raise Reject(f"{op} over an axis that is not one of at most {MAX_SOFTMAX_AXIS} elements is faster in "
                         "onnxruntime")

        def fn(idx: tuple[Poly, ...]) -> Expr:
            def at(r: Poly) -> Expr:
                return x.fn(idx[:axis] + (r,) + idx[axis + 1:])

            # each exp is of x - m, x one of the row's elements that m is the max of (the first, where NaN): at
            # most 0, or NaN, so it needs no overflow or gradual underflow handling (exp_nonpos: evo_expf_bounded)
            r1, r2 = L.fresh_var(x.shape[axis]), L.fresh_var(x.shape[axis])
            if r1.atom() is None:  # an axis of one element (fuzz case 36, seed 990000): no reduction loop
                m = at(r1)
                s = E.unary("exp_nonpos", E.binary("sub", at(r2), m))
            else:
                m = E.Reduce("max", r1, at(r1), x.dtype)
                s = E.Reduce("sum", r2, E.unary("exp_nonpos", E.binary("sub", at(r2), m)), x.dtype)
            shifted = E.binary("sub", x.fn(idx), m)
            if log:
                return E.binary("sub", shifted, E.unary("log", s))
            return E.binary("div", E.unary("exp_nonpos", shifted), s)

        return [Lazy(x.dtype, x.shape, fn)]
    return f


MAX_SOFTMAX_AXIS = 32  # see _softmax (a DFL head's 16 bins, with room)

# MatMul by a small right-hand matrix [K, N] (a detection head's DFL projection: [16, 1]). Each output element is
# its own chain of K fused multiply-adds, so a large K or N belongs in onnxruntime's GEMM.
MAX_MATMUL_K = 32
MAX_MATMUL_N = 4


def _matmul(op: str, attrs: Attrs, args: Args, vals: Vals, n_out: int) -> list[Lazy]:
    """MatMul (numpy.matmul) of A[..., M, K] by a small constant matrix B[K, N]: out[..., m, n]
    is the chain acc = fma(A[..., m, k], B[k, n], acc) over k in order from +0, which is how onnxruntime's MLAS GEMM
    computes it on a machine with FMA (bit for bit, measured for K 2..32, N 1..4, float32), overflow to inf and
    NaN included. Still checked with a tolerance (E.is_exact): without FMA, MLAS multiplies and adds."""
    a, b = args[0], args[1]
    if a is None or b is None:
        raise Reject(f"{op} without both operands")
    if b.dtype != a.dtype:
        raise Reject(f"{op} of {a.dtype} by {b.dtype}")
    if a.rank < 2 or b.rank != 2:
        raise Reject(f"{op} of rank {a.rank} by rank {b.rank}: only A[..., M, K] by a matrix B[K, N] is fused")
    if len(vals) < 2 or vals[1] is None or vals[1].array() is None:
        # onnxruntime's GEMM is the fma chain below for a constant B, which it packs at session start; B given at
        # run time goes another way (B = [-0, 1, -1.5, 1, -1e30, ...]: 3e38 * -1e30 overflows to -inf on its own,
        # then meets +inf, and gives NaN where the chain gives +inf; fuzz case 326 of the CI budget, B an
        # overridable initializer)
        raise Reject(f"{op} by a B computed or fed at run time (onnxruntime's GEMM then rounds otherwise)")
    k, n = b.shape[0].const, b.shape[1].const
    if k is None or n is None or not 2 <= k <= MAX_MATMUL_K or not 1 <= n <= MAX_MATMUL_N:
        raise Reject(f"{op} by a matrix of {b.shape[0]} x {b.shape[1]}: only 2..{MAX_MATMUL_K} x 1..{MAX_MATMUL_N} "
                     "is fused (outer products and larger ones are onnxruntime's GEMM's)")
    if a.shape[-1].const != k:
        raise Reject(f"{op}: A's last axis {a.shape[-1]} is not B's first ({k})")
    shape = (*a.shape[:-1], Poly.of(n))
    bounded = weights_bounded(vals[1].array() if len(vals) > 1 and vals[1] is not None else None, a.dtype)

    def fn(idx: tuple[Poly, ...]) -> Expr:
        return _dot(lambda v: a.fn((*idx[:-1], v)), lambda v: b.fn((v, idx[-1])), k, a.dtype, bounded)

    return [Lazy(a.dtype, shape, fn)]


def _dot(a_at: Callable[[Poly], Expr], w_at: Callable[[Poly], Expr], k: int, dtype: str, bounded: bool) -> Expr:
    """The chain fma(a_at(v), w_at(v), acc) over v < k in order from +0; of a Softmax's row by `bounded` weights,
    the exps' weighted sum divided once by their sum (`weights_bounded`)."""
    v = L.fresh_var(Poly.of(k))
    av = a_at(v)
    quotient = _softmax_quotient(av, v) if bounded else None
    if quotient is not None:
        return E.binary("div", E.Reduce("dot", v, E.binary("mul", quotient[0], w_at(v)), dtype), quotient[1])
    return E.Reduce("dot", v, E.binary("mul", av, w_at(v)), dtype)


def _conv(op: str, attrs: Attrs, args: Args, vals: Vals, n_out: int) -> list[Lazy]:
    """Conv with a 1x1 kernel by a few constant filters W[O, C, 1, ...] (ultralytics' DFL: one filter of 16 bins
    over a Softmax of them): out[n, o, ...] is the chain fma(X[n, c, ...], W[o, c], acc) over c in order from +0,
    then + B[o], as onnxruntime's MLAS computes a 1x1 convolution (a GEMM, then the bias). Anything else (a wider
    kernel, strides, pads, dilations, groups, run-time weights, more filters or channels) is onnxruntime's."""
    x, w = args[0], args[1] if len(args) > 1 else None
    b = args[2] if len(args) > 2 else None
    if x is None or w is None:
        raise Reject(f"{op} without its weights")
    weights = vals[1].array() if len(vals) > 1 and vals[1] is not None else None
    if weights is None:
        raise Reject(f"{op} by weights that are not a constant")
    if w.dtype != x.dtype or (b is not None and b.dtype != x.dtype):
        raise Reject(f"{op} of {x.dtype} by {w.dtype}")
    spatial = x.rank - 2
    auto_pad = attrs.get("auto_pad", "NOTSET")
    auto_pad = auto_pad.decode() if isinstance(auto_pad, bytes) else str(auto_pad)
    if (x.rank < 3 or w.rank != x.rank or int(attrs.get("group", 1)) != 1 or auto_pad not in ("NOTSET", "VALID")
            or any(int(a) != 1 for key in ("strides", "dilations", "kernel_shape") for a in attrs.get(key, []))
            or any(int(p) != 0 for p in attrs.get("pads", []))
            or any(w.shape[2 + i].const != 1 for i in range(spatial))):
        raise Reject(f"{op} other than a 1x1 kernel with no stride, pad, dilation or group")
    o, c = w.shape[0].const, w.shape[1].const
    if o is None or c is None or not 2 <= c <= MAX_MATMUL_K or not 1 <= o <= MAX_MATMUL_N:
        raise Reject(f"{op} of {w.shape[1]} channels into {w.shape[0]}: only 2..{MAX_MATMUL_K} into "
                     f"1..{MAX_MATMUL_N} is fused")
    if x.shape[1].const != c or (b is not None and (b.rank != 1 or b.shape[0].const != o)):
        raise Reject(f"{op}: the input's channels or the bias do not match the weights")
    for d in x.shape[2:]:  # onnxruntime fails a Conv over an empty spatial axis ("Invalid input shape"), not N = 0
        L.require_le(Poly.of(1), d, f"{op} over an empty spatial axis")
    bounded = weights_bounded(weights.reshape(o, c).T, x.dtype)
    zeros = (Poly(),) * spatial

    def fn(idx: tuple[Poly, ...]) -> Expr:
        acc = _dot(lambda v: x.fn((idx[0], v, *idx[2:])), lambda v: w.fn((idx[1], v, *zeros)), c, x.dtype, bounded)
        return acc if b is None else E.binary("add", acc, b.fn((idx[1],)))

    return [Lazy(x.dtype, (x.shape[0], Poly.of(o), *x.shape[2:]), fn)]


def weights_bounded(weights: np.ndarray | None, dtype: str | None) -> bool:
    """Whether a MatMul of a Softmax by `weights` computes the weighted sum of the exps, divided once by their sum
    (`_softmax_quotient`), where onnxruntime divides each exp first (a DFL head: one exp per element, summed and
    weighted in one loop). Equal but for rounding: the exps lie in [0, 1], so where the weights' absolute column
    sums are finite with room to spare, so is every partial sum."""
    if weights is None or dtype not in ("float32", "float64") or weights.ndim != 2:
        return False
    with np.errstate(all="ignore"):
        sums = np.sum(np.abs(weights.astype(np.float64)), axis=0)
    return bool(np.all(sums < float(np.finfo(dtype).max) / 4))


def _softmax_quotient(e: Expr, v: Poly) -> tuple[Expr, Expr] | None:
    """(exp(x - max), sum) where `e` is an element of a Softmax along `v` (`_softmax`: exp(x - max) / sum, the sum
    independent of `v`), else None."""
    if not (isinstance(e, E.Op) and e.op == "div"):
        return None
    num, den = e.args
    if not (isinstance(num, E.Op) and num.op == "exp_nonpos" and isinstance(den, E.Reduce) and den.op == "sum"):
        return None
    shifted = num.args[0]
    if not (isinstance(shifted, E.Op) and shifted.op == "sub" and isinstance(shifted.args[1], E.Reduce)
            and shifted.args[1].op == "max"):
        return None
    if v.atom() in E.free_vars(den):
        return None
    return num, den


_RED = MapKind.REDUCTION
DEFS = [
    *(OpDef(op, _reducer(kind), _RED, (1,)) for op, kind in (
        ("ReduceSum", "sum"), ("ReduceMean", "mean"), ("ReduceMax", "max"), ("ReduceMin", "min"),
        ("ReduceProd", "prod"), ("ReduceL1", "l1"), ("ReduceL2", "l2"), ("ReduceSumSquare", "sumsquare"),
        ("ReduceLogSum", "logsum"), ("ReduceLogSumExp", "logsumexp"))),
    OpDef("ArgMax", _arg_extreme("argmax"), _RED), OpDef("ArgMin", _arg_extreme("argmin"), _RED),
    OpDef("Softmax", _softmax(False), _RED), OpDef("LogSoftmax", _softmax(True), _RED),
    OpDef("MatMul", _matmul, _RED, dtypes=("float32", "float64")),
    OpDef("Conv", _conv, _RED, dtypes=("float32", "float64")),
]
