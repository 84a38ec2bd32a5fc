"""Elementwise ops as lazy element functions (see lower_ops)."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import onnx

from evonnx import expr as E
from evonnx.expr import FROM_ONNX_CODE, Expr
from evonnx.passes import lazy as L
from evonnx.passes.lazy import Lazy, Reject
from evonnx.passes.lower_common import Args, Attrs, MapKind, OpDef, Vals, Value, may_hold_zero

_BINARY = {"Add": "add", "Sub": "sub", "Mul": "mul", "Div": "div", "Equal": "eq", "Less": "lt",
           "LessOrEqual": "le", "Greater": "gt", "GreaterOrEqual": "ge", "And": "and", "Or": "or", "Xor": "xor"}
_UNARY = {"Neg": "neg", "Abs": "abs", "Floor": "floor", "Ceil": "ceil", "Round": "round", "Sqrt": "sqrt",
          "Reciprocal": "reciprocal", "Relu": "relu", "Sign": "sign", "Not": "not", "Exp": "exp", "Log": "log",
          "Sigmoid": "sigmoid", "Tanh": "tanh", "Erf": "erf", "Sin": "sin", "Cos": "cos", "IsNaN": "isnan",
          "Softplus": "softplus"}
_FLOAT_ONLY = {"floor", "ceil", "round", "sqrt", "reciprocal", "exp", "log", "sigmoid", "tanh", "erf", "sin",
               "cos", "isnan", "softplus"}




def _whole_divisor(op: str, out: Lazy, divisor: Lazy, val: Value | None) -> Lazy:
    """`out`, an integer Div or Mod, once sure that it meets every element of a divisor that may hold 0.
    onnxruntime fails the Run on a zero anywhere in the divisor tensor, even where the result is empty (x[0, 4] /
    d[4]; fuzz case 1109, seed 300025); a kernel checks the divisors of the elements it computes, all of them for
    such a result (`analyze.computed_whole`), so the divisor must have the result's shape, or the node stays with
    onnxruntime."""
    if out.dtype in E.FLOATS or not may_hold_zero(val):
        return out
    if divisor.rank != out.rank or any(d != o for d, o in zip(divisor.shape, out.shape)):
        raise Reject(f"integer {op} broadcasting a divisor that may hold 0 (onnxruntime checks every divisor "
                     "element, even for an empty result)")
    return out


def _softplus_of(e: Expr, x: Expr) -> bool:
    """Whether `e` is softplus(x), or torch's thresholded form where(x > c, x, softplus(x)) (the dynamo exporter's
    F.softplus, c = 20) with c >= 9: above 9 onnxruntime's tanh is its value at 9 (MLAS clamps there), so under a
    Tanh both forms give the same bits."""
    if not isinstance(e, E.Op):
        return False
    if e.op == "softplus":
        return e.args[0] == x
    if e.op != "where" or not isinstance(cond := e.args[0], E.Op) or cond.op != "gt":
        return False
    c, taken = cond.args[1], e.args[1]
    if isinstance(taken, E.Op) and taken.op == "add" and isinstance(z := taken.args[1], E.Const) and z.value == 0:
        taken = taken.args[0]  # x + 0.0 (the -0.0 of a Where's branch made +0.0): x itself where x > c
    return (cond.args[0] == x and isinstance(c, E.Const) and float(c.value) >= 9.0 and taken == x
            and isinstance(sp := e.args[2], E.Op) and sp.op == "softplus" and sp.args[0] == x)


def _mish(x: Expr, y: Expr) -> Expr | None:
    """Mish, x * tanh(softplus(x)) in either order (softplus as `_softplus_of` takes it), of float32: one op
    (helpers.h's evo_mish_f32: one exp and one division, where the three ops take an exp, a log, a rational tanh and
    three divisions; YOLOv4's trunk runs 72 of them on 5.5 M floats and more), else None."""
    for a, b in ((x, y), (y, x)):
        if a.dtype == "float32" and isinstance(b, E.Op) and b.op == "tanh" and _softplus_of(b.args[0], a):
            return E.Op("mish", (a,), "float32")
    return None


def _binary(name: str) -> Callable[..., list[Lazy]]:
    def element(x: Expr, y: Expr) -> Expr:
        return (name == "mul" and _mish(x, y)) or E.binary(name, x, y)

    def f(op: str, attrs: Attrs, args: Args, vals: Vals, n_out: int) -> list[Lazy]:
        a, b = args[0], args[1]
        dtype = "bool" if name in E.COMPARE | E.LOGIC else a.dtype
        out = L.elementwise([a, b], element, dtype, op)
        return [_whole_divisor(op, out, b, vals[1]) if name == "div" else out]
    return f


def _unary(name: str) -> Callable[..., list[Lazy]]:
    def f(op: str, attrs: Attrs, args: Args, vals: Vals, n_out: int) -> list[Lazy]:
        x = args[0]
        dtype = "bool" if name in ("not", "isnan") else x.dtype
        if name in ("sign", "relu"):
            _int64_order(op, [x], vals[:1])
        return [L.Lazy(dtype, x.shape, lambda idx: E.unary(name, x.fn(idx)), uniform=x.uniform)]
    return f


def _mod(op: str, attrs: Attrs, args: Args, vals: Vals, n_out: int) -> list[Lazy]:
    fmod = int(attrs.get("fmod", 0))
    if args[0].dtype in E.FLOATS and not fmod:
        raise Reject("Mod of floats needs fmod=1")
    out = L.elementwise(args[:2], lambda x, y: E.Op("mod", (x, y), x.dtype, fmod), args[0].dtype, op)
    return [_whole_divisor(op, out, args[1], vals[1])]


def _pow(op: str, attrs: Attrs, args: Args, vals: Vals, n_out: int) -> list[Lazy]:
    x, y = args
    if x.dtype not in E.FLOATS:
        raise Reject(f"Pow of {x.dtype} is not supported")
    yk = vals[1].array() if vals[1] is not None else None
    if yk is not None and yk.size == 1 and float(yk.reshape(-1)[0]) in (1.0, 2.0, 3.0):
        # onnxruntime special-cases these exponents as repeated multiplication
        n = int(float(yk.reshape(-1)[0]))

        def powi(v: Expr) -> Expr:
            out = v
            for _ in range(n - 1):
                out = E.binary("mul", out, v)
            return out
        return [L.Lazy(x.dtype, x.shape, lambda idx: powi(x.fn(idx)), uniform=x.uniform)]
    return [L.elementwise([x, y], lambda a, b: E.Op("pow", (a, E.cast(b, a.dtype)), a.dtype), x.dtype, op)]


def _variadic(name: str) -> Callable[..., list[Lazy]]:
    def f(op: str, attrs: Attrs, args: Args, vals: Vals, n_out: int) -> list[Lazy]:
        xs = [a for a in args if a is not None]

        def comb(*es: Expr) -> Expr:
            out = es[0]
            for e in es[1:]:
                out = E.binary("add" if name in ("sum", "mean") else "n" + name if name in ("min", "max") else name,
                               out, e)
            if name == "mean":  # as onnxruntime: the sum times the reciprocal (not a division), bit for bit
                out = E.binary("mul", out, E.const(np.asarray(1, E.np_dtype(out.dtype)) / len(es), out.dtype))
            return out
        if name == "mean" and xs[0].dtype not in E.FLOATS:
            raise Reject("Mean of integers is not supported")
        if name in ("min", "max"):
            _int64_order(op, xs, [v for a, v in zip(args, vals) if a is not None])
        return [L.elementwise(xs, comb, xs[0].dtype, op)]
    return f


def _where(op: str, attrs: Attrs, args: Args, vals: Vals, n_out: int) -> list[Lazy]:
    dtype = args[1].dtype
    if dtype not in E.FLOATS + (E.HALF,):
        return [L.elementwise(args[:3], E.where, dtype, op)]
    zero = E.const(0.0, dtype if dtype != E.HALF else "float32")

    def where(c: Expr, a: Expr, b: Expr) -> Expr:
        # onnxruntime's float Where gives X + 0 where the condition holds and Y as it is elsewhere: a -0.0 taken
        # from X comes out as +0.0, one from Y stays -0.0 (measured on 1.31, float16, float and double, every
        # broadcast form; fuzz seed 47192: Div(-1e30, Where(x == x, x, x)) is -inf at x = -0.0). x + 0 is x
        # otherwise; float16 adds in float32 (expr.HALF).
        if dtype == E.HALF:
            return E.where(c, E.cast(E.binary("add", E.cast(a, "float32"), zero), E.HALF), b)
        return E.where(c, E.binary("add", a, zero), b)

    return [L.elementwise(args[:3], where, dtype, op)]


def _int64_order(op: str, xs: list[Lazy], vals: Vals) -> None:
    """onnxruntime 1.31's int64 Min, Max, Clip, Relu and Sign compare the low 32-bit halves as signed numbers
    whenever the output has two elements or more: Min(-2, -2**32) is -2 there, Sign(2**31) is -1 at most positions
    (fuzz seed 4000017) and Relu(2**31) is 0; one element gets the right answer. So int64
    orderings of run-time data stay with onnxruntime unless every input is a single element; sizes known at plan
    time (shape arithmetic) are computed exactly."""
    if xs[0].dtype != "int64" or all(v is not None for v in vals):
        return
    if all(d.const == 1 for x in xs for d in x.shape):
        return
    raise Reject(f"int64 {op} of run-time data (onnxruntime's comparison of 32-bit halves is not reproduced)")


def _clip(op: str, attrs: Attrs, args: Args, vals: Vals, n_out: int) -> list[Lazy]:
    x = args[0]
    _int64_order(op, [a for a in args if a is not None], [v for a, v in zip(args, vals) if a is not None])
    lo = args[1] if len(args) > 1 else None
    hi = args[2] if len(args) > 2 else None
    for b in (lo, hi):
        if b is not None and b.shape != ():
            raise Reject("Clip bounds must be scalars")
    # a bound not given is the type's lowest or largest value (the spec, and onnxruntime's kernel): for floats, a
    # finite one, so that Clip(+inf) without a maximum is FLT_MAX, not +inf
    edge = float(np.finfo(E.np_dtype(x.dtype)).max) if x.dtype in (*E.FLOATS, E.HALF) else None
    low = lo.fn(()) if lo else None if edge is None else E.const(-edge, x.dtype)
    high = hi.fn(()) if hi else None if edge is None else E.const(edge, x.dtype)
    return [L.Lazy(x.dtype, x.shape, lambda idx: E.clip(x.fn(idx), low, high), uniform=x.uniform)]


def _type_name(code: int) -> str:
    """ONNX's name of element type `code` (bfloat16, float8e4m3fn, ...), else the number."""
    try:
        return onnx.helper.tensor_dtype_to_string(code).removeprefix("TensorProto.").lower()
    except (KeyError, ValueError):
        return f"element type {code}"


def _cast(op: str, attrs: Attrs, args: Args, vals: Vals, n_out: int) -> list[Lazy]:
    to = FROM_ONNX_CODE.get(int(attrs["to"]))
    if to is None:
        raise Reject(f"Cast to {_type_name(int(attrs['to']))} is not supported")
    x = args[0]
    if to == E.HALF and x.dtype == "float64":
        raise Reject("Cast from float64 to float16 (through float32, a kernel would round twice)")
    if x.dtype in E.FLOATS and to in ("uint32", "uint64"):
        # onnxruntime 1.31 on x86-64 casts a float that is negative or too large for uint32 to 0 or to 2^31
        # depending on whether its loop reaches the element in a SIMD block or in the scalar tail (-3e38 gives
        # 2147483648 at position 0 of 24 and 0 at position 18 of 19): no kernel can reproduce that
        raise Reject(f"Cast from float to {to} (onnxruntime's out-of-range results depend on the element's position)")
    return [L.Lazy(to, x.shape, lambda idx: E.cast(x.fn(idx), to), uniform=x.uniform)]


def _leaky_relu(op: str, attrs: Attrs, args: Args, vals: Vals, n_out: int) -> list[Lazy]:
    x = args[0]
    # float attributes are float32 in ONNX, defaults included: onnxruntime's double kernels widen 0.01f, not 0.01
    alpha = E.const(float(np.float32(attrs.get("alpha", 0.01))), x.dtype)
    zero = E.const(0, x.dtype)
    return [L.Lazy(x.dtype, x.shape, lambda idx: E.where(E.binary("lt", x.fn(idx), zero),
                                                         E.binary("mul", x.fn(idx), alpha), x.fn(idx)),
                   uniform=x.uniform)]


def _hard_sigmoid(op: str, attrs: Attrs, args: Args, vals: Vals, n_out: int) -> list[Lazy]:
    x = args[0]
    alpha = E.const(float(np.float32(attrs.get("alpha", 0.2))), x.dtype)
    beta = E.const(float(np.float32(attrs.get("beta", 0.5))), x.dtype)
    zero, one = E.const(0, x.dtype), E.const(1, x.dtype)
    return [L.Lazy(x.dtype, x.shape, lambda idx: E.clip(
        E.binary("add", E.binary("mul", x.fn(idx), alpha), beta), zero, one), uniform=x.uniform)]


def _hard_swish(op: str, attrs: Attrs, args: Args, vals: Vals, n_out: int) -> list[Lazy]:
    """x * HardSigmoid(x) with alpha = 1/6 (as float32) and beta = 0.5: ONNX's function body for HardSwish, which
    onnxruntime runs (measured bit for bit, test_special_values)."""
    (hs,) = _hard_sigmoid(op, {"alpha": 1.0 / 6.0, "beta": 0.5}, args, vals, n_out)
    x = args[0]
    return [L.Lazy(x.dtype, x.shape, lambda idx: E.binary("mul", x.fn(idx), hs.fn(idx)), uniform=x.uniform)]


_1 = MapKind.ONE_TO_ONE  # becomes a broadcast where an input's shape differs from the output's (classify)
DEFS = [
    *(OpDef(op, _binary(name), _1) for op, name in _BINARY.items()),
    *(OpDef(op, _unary(name), _1, dtypes=E.FLOATS if name in _FLOAT_ONLY else E.DTYPES) for op, name in _UNARY.items()),
    OpDef("Mod", _mod, _1), OpDef("Pow", _pow, _1), OpDef("Where", _where, _1), OpDef("Clip", _clip, _1),
    OpDef("Cast", _cast, _1), OpDef("LeakyRelu", _leaky_relu, _1), OpDef("HardSigmoid", _hard_sigmoid, _1),
    OpDef("HardSwish", _hard_swish, _1, dtypes=E.FLOATS),
    OpDef("Max", _variadic("max"), _1), OpDef("Min", _variadic("min"), _1), OpDef("Sum", _variadic("sum"), _1),
    OpDef("Mean", _variadic("mean"), _1),
]
