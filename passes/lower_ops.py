"""The op registry: one `OpDef` per ONNX op evonnx handles (opsets 13 to 26, see evonnx.model.REVIEWED_OPSET), the
single place to add or change an op. The lowerings live by family: `lower_math` (elementwise), `lower_views`
(views and generators), `lower_reduce` (reductions, Softmax), `lower_writes` (ScatterND, ScatterElements).

`lower_node(op, attrs, args, vals, out_count)` returns one `Lazy` per output, or raises `Reject` with the
reason evonnx leaves the node to onnxruntime. `args[k]` is the lazy of input k (None when omitted); `vals[k]` is
its value when known at plan time (constants and shape arithmetic such as `Shape -> Gather -> Concat`), which
the shape-like inputs (Reshape's shape, Slice's starts, ...) must have.

The tables the passes ask (`LOWER`, `VALUE_INPUTS`, `REDUCTIONS`, `FREE_OPS`, `WRITE_OPS`, `SHAPE_ONLY_OPS`)
are views of `OPS`, never written by hand.
"""

from __future__ import annotations

from collections.abc import Sequence

from evonnx import expr as E
from evonnx.errors import InternalError, debug_checks
from evonnx.model import HALF_MOVES
from evonnx.passes.lazy import Lazy, Reject
from evonnx.passes.lower_common import Derived, Handler, Known, MapKind, OpDef, Value, check_dtype
from evonnx.passes.lower_gathers import DEFS as _GATHERS
from evonnx.passes.lower_math import DEFS as _MATH
from evonnx.passes.lower_reduce import DEFS as _REDUCE
from evonnx.passes.lower_views import DEFS as _VIEWS
from evonnx.passes.lower_writes import DEFS as _WRITES

__all__ = ["OPS", "LOWER", "VALUE_INPUTS", "REDUCTIONS", "FREE_OPS", "WRITE_OPS", "SHAPE_ONLY_OPS", "Known",
           "Derived", "Value", "MapKind", "OpDef", "lower_node"]


def _registry(*families: list[OpDef]) -> dict[str, OpDef]:
    out: dict[str, OpDef] = {}
    for d in (d for fam in families for d in fam):
        if d.op in out:
            raise AssertionError(f"two OpDefs for {d.op}")
        out[d.op] = d
    return out


OPS: dict[str, OpDef] = _registry(_MATH, _VIEWS, _REDUCE, _WRITES, _GATHERS)

LOWER: dict[str, Handler] = {op: d.lower for op, d in OPS.items()}
# Inputs read only for their value at plan time (never loaded by a kernel): these edges do not tie a node to
# its producer in a fused group.
VALUE_INPUTS: dict[str, tuple[int, ...]] = {op: d.value_inputs for op, d in OPS.items() if d.value_inputs}
REDUCTIONS = frozenset(op for op, d in OPS.items() if d.reduction)
# Ops that onnxruntime runs without touching the data (aliases); a group made only of these gains nothing.
FREE_OPS = frozenset(op for op, d in OPS.items() if d.free)
WRITE_OPS = frozenset(op for op, d in OPS.items() if d.writes)
SHAPE_ONLY_OPS = frozenset(op for op, d in OPS.items() if d.shape_only)




def lower_node(op: str, attrs: dict[str, object], args: Sequence[Lazy | None], vals: Sequence[Value | None],
               n_out: int) -> list[Lazy]:
    d = OPS.get(op)
    if d is None:
        raise Reject(f"{op} is not handled by evonnx")
    if any(a is not None and a.dtype == E.HALF for k, a in enumerate(args) if k not in d.value_inputs):
        if op not in HALF_MOVES:  # every other op on float16 computes in float32
            return _in_float32(op, d, attrs, args, vals, n_out)
        if d.writes and attrs.get("reduction", "none") not in ("none", b"none"):
            raise Reject(f"{op} with reduction on float16")
    for k, a in enumerate(args):
        if a is not None and k not in d.value_inputs:
            check_dtype(a, op)
            if a.dtype not in d.dtypes and not (a.dtype == E.HALF and op in HALF_MOVES):
                raise Reject(f"{op} on {a.dtype} is not supported")
    if d.needs_data and args and args[0] is None:
        raise Reject(f"{op} has no data input")
    try:
        return d.lower(op, dict(attrs), list(args), list(vals), n_out)
    except (ValueError, TypeError, KeyError, IndexError, ZeroDivisionError) as e:
        # A handler says why it leaves a node by raising Reject; anything else is a bug in it. Users still get
        # the node left to onnxruntime (the model stays right), the test suite (EVONNX_DEBUG=1) gets the bug.
        if debug_checks():
            raise InternalError(f"the lowering of {op} raised {type(e).__name__}: {e}") from e
        raise Reject(f"{op}: {e}") from e


def _in_float32(op: str, d: OpDef, attrs: dict[str, object], args: Sequence[Lazy | None],
                vals: Sequence[Value | None], n_out: int) -> list[Lazy]:
    """`op` on float16 inputs, as onnxruntime's CPU kernels compute it: the float16 inputs converted to float32
    (exact), the op in float32, and its float results rounded to float16 where its first input is float16 (the
    type its float outputs share in ONNX; Pow's exponent may be float16 under a float32 base)."""
    if op in ("MatMul", "Range", "ReduceLogSumExp", "Softplus"):
        # onnxruntime's float16 ReduceLogSumExp and Softplus overflow where evonnx's float32 ones do not (167.4
        # against inf): they compute in float16
        raise Reject(f"{op} on float16")
    wide = [_converted(a, "float32") if a is not None and a.dtype == E.HALF and k not in d.value_inputs else a
            for k, a in enumerate(args)]
    if op == "Clip" and args[0] is not None and args[0].dtype == E.HALF:
        # a bound not given is float16's largest finite value (onnxruntime: Clip(+inf) without a maximum is 65504),
        # not float32's, which the clip in float32 would take
        edges = [_constant(-65504.0), _constant(65504.0)]
        wide = [wide[0], *(b if k + 1 < len(wide) and (b := wide[k + 1]) is not None else c
                           for k, c in enumerate(edges))]
        vals = [*vals, *[None] * (3 - len(vals))]
    outs = lower_node(op, attrs, wide, vals, n_out)
    if op == "Cast" or args[0] is None or args[0].dtype != E.HALF:
        return outs  # a Cast's result has the type it names
    if op == "Sign":  # onnxruntime's float16 Sign of NaN is 0 (its float one is NaN)
        x, s = wide[0], outs[0]
        assert x is not None
        zero = E.const(0.0, "float32")
        outs = [Lazy(s.dtype, s.shape, lambda idx: E.where(E.Op("isnan", (x.fn(idx),), "bool"), zero, s.fn(idx)),
                     uniform=s.uniform)]
    return [_converted(o, E.HALF, approx=op in _HALF_APPROX) if o.dtype == "float32" else o for o in outs]


# Ops exact in float32 whose float16 kernels in onnxruntime compute otherwise (the semantics table): their float16
# results are compared within the float16 tolerance, not bit for bit (`expr.is_exact`)
_HALF_APPROX = frozenset({"HardSwish", "HardSigmoid"})


def _constant(value: float) -> Lazy:
    """A float32 scalar."""
    c = E.const(value, "float32")
    return Lazy("float32", (), lambda idx: c)


def _converted(x: Lazy, dtype: str, approx: bool = False) -> Lazy:
    def fn(idx: tuple) -> E.Expr:  # type: ignore[type-arg]
        e = E.cast(x.fn(idx), dtype)
        return E.Op("cast", e.args, dtype, "approx") if approx and isinstance(e, E.Op) else e

    # onnxruntime's shape of an empty input stays the op's (fuzz case 10515 of the long run on 6acdaa3: a float16
    # ReduceSum(axes=[-3], keepdims=0), computed in float32 and converted back, lost it: [0, 0] against [8, 0, 0])
    return Lazy(dtype, x.shape, fn, uniform=x.uniform, empty_shape=x.empty_shape)
