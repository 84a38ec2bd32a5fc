"""The semantics table (issue 16): every op evonnx fuses, for every element type onnxruntime runs it on, on a grid of
special values (NaN, +-0, +-inf, denormals, the type's min and max, -1, 1; `sec_cases.GRID`) and at sizes 0, 1
and 2, compared with onnxruntime 1.31 on the original model value for value (bit for bit where the op is exact)
and error for error.

One model per element type and family (elementwise exact / inexact, Cast to every type, reductions, Where and
Clip, views, scatters): each op reads Transposes of the inputs and is Transposed back, so the planner fuses it
(a lone op between graph inputs and outputs gains nothing from a kernel). An op onnxruntime does not implement
for a type is left out (probed with a one-node session). Every op node that evonnx's lowering accepts must end
up fused; those it rejects stay with onnxruntime, which is correct by construction.

Where onnxruntime departs from the spec or from the obvious formula, evonnx follows it:
- double Softplus is log(exp(x) + 1), inf from x = 709.8 (float uses the stable form and stays finite);
- float attributes are float32, defaults included: a double LeakyRelu multiplies by (double)0.01f;
- float to uint32 out of range gives 0 or 2^31 depending on whether the element falls in a SIMD block or the
  scalar tail, so that Cast (and float to uint64) stays with onnxruntime;
- double LogSoftmax of a row holding NaN or +-inf gives lane-dependent values ([1, 2, nan, 3] -> [40.05, 41.05,
  nan, 42.05]), so it stays with onnxruntime; float LogSoftmax gives NaN, as evonnx does;
- int64 Min, Max, Clip, Relu, Sign, ReduceMin and ReduceMax compare by 32-bit halves, the low one as signed, in
  onnxruntime's SIMD loops (Sign(2**31) is -1, Relu(2**31) is 0, the scalar tail is right), so of run-time data
  with more than one element they stay with onnxruntime; the int64 grid has 2**31, -2**31 - 1 and 2**32 + 5;
- integer Div/Mod by zero fails the Run (test_special_values), so they are not in the exact elementwise family;
- float16 is computed in float32 and rounded per op (`expr.HALF`), except: float16 Sign(NaN) is 0 (float's is
  NaN); float16 Softplus and ReduceLogSumExp overflow to inf where float32 ones do not (167.4 against inf), so
  they stay with onnxruntime, as does a Cast from double to float16 (float32 in between would round twice);
  float16 HardSwish and HardSigmoid round otherwise than float's formula does (1 ulp), so they are compared
  within the float16 tolerance, not bit for bit;
- a float Where gives X + 0 where the condition holds and Y as it is elsewhere: -0.0 from X is +0.0, from Y -0.0;
- Min and Max of +0 and -0 give either zero depending on the element's position (SIMD packet or scalar tail, and
  the broadcast form), so an output computed through Min or Max compares +0 and -0 as equal
  (`evonnx.verify.signed_zero_outputs`); every other exact output is compared bit for bit, the sign of zero
  included.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import cache
from pathlib import Path

import numpy as np
import onnx
import onnx_graphsurgeon as gs
import onnxruntime as ort
import pytest
from onnx import TensorProto as T
from onnx import helper, numpy_helper
from sec_cases import GRID, case_from_model
from sec_models import make_model, node
from sec_oracle import check_case

from evonnx.passes.analyze import analyze
from evonnx.passes.lazy import Reject

DT = {"float16": T.FLOAT16, "float32": T.FLOAT, "float64": T.DOUBLE, "int8": T.INT8, "int16": T.INT16, "int32": T.INT32,
      "int64": T.INT64, "uint8": T.UINT8, "uint16": T.UINT16, "uint32": T.UINT32, "uint64": T.UINT64,
      "bool": T.BOOL}
UNARY = ["Abs", "Neg", "Ceil", "Floor", "Round", "Sqrt", "Reciprocal", "Exp", "Log", "Sigmoid", "Tanh", "Sin", "Cos",
         "Erf", "Relu", "Sign", "IsNaN", "Not", "Softplus", "HardSigmoid", "HardSwish", "LeakyRelu", "Identity"]
BINARY = ["Add", "Sub", "Mul", "Div", "Mod", "Mod-fmod", "Pow", "Min", "Max", "Equal", "Less", "LessOrEqual",
          "Greater", "GreaterOrEqual", "And", "Or", "Xor", "Sum", "Mean"]
VARIADIC3 = ["Sum", "Mean", "Min", "Max"]
BOOL_OUT = {"IsNaN", "Equal", "Less", "LessOrEqual", "Greater", "GreaterOrEqual", "And", "Or", "Xor", "Not"}
INEXACT = {"Exp", "Log", "Sigmoid", "Tanh", "Sin", "Cos", "Erf", "Softplus", "Pow", "HardSigmoid", "HardSwish"}
REDUCE = ["ReduceSum", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceMean", "ReduceL1", "ReduceL2", "ReduceLogSum",
          "ReduceLogSumExp", "ReduceSumSquare", "ArgMax", "ArgMin"]
REDUCE_INEXACT = {"ReduceSum", "ReduceProd", "ReduceMean", "ReduceL1", "ReduceL2", "ReduceLogSum", "ReduceLogSumExp",
                  "ReduceSumSquare"}
# 37 rows: vectorised loops with a remainder (gcc 12.2 miscompiled masked strided loads under a Where from 16 rows)
# Nodes evonnx lowers that even the greedy planner leaves to onnxruntime, by (type, op): a Where selecting against
# a float Range that onnxruntime folds at session start is a kernel with no neighbour to fuse with.
LEFT_ALONE = {("float32", "Where"), ("float64", "Where")}
PLANS = [{"N": 1}, {"N": 0}, {"N": 2}, {"N": 37}]
FLOAT_TYPES = ("float16", "float32", "float64")


def _op(op: str, ins: list[str], out: str) -> onnx.NodeProto:
    if op.startswith("Mod"):
        return node("Mod", ins, [out], fmod=int(op == "Mod-fmod"))
    return node(op, ins, [out])


@cache
def _ort_runs(model_bytes: bytes) -> bool:
    try:
        so = ort.SessionOptions()
        so.log_severity_level = 4
        sess = ort.InferenceSession(model_bytes, so, providers=["CPUExecutionProvider"])
        sess.run(None, {i.name: np.ones([d if isinstance(d, int) else 1 for d in i.shape],
                                        np.dtype(_NP[i.type])) for i in sess.get_inputs()})
        return True
    except Exception:  # noqa: BLE001 - NOT_IMPLEMENTED, type errors, fmod=0 on floats: all mean "not this type"
        return False


_NP = {"tensor(float16)": "float16", "tensor(float)": "float32", "tensor(double)": "float64", "tensor(bool)": "bool",
       **{f"tensor({t})": t for t in ("int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64")}}


def _runs(nodes: list[onnx.NodeProto], inputs: list[tuple[str, int, list]], outputs: list[tuple[str, int, int]],
          inits: dict | None = None) -> bool:
    return _ort_runs(make_model(nodes, inputs, outputs, inits or {}).SerializeToString())


def _helper(op: str, ins: list[str], outs: list[str], **attrs: object) -> onnx.NodeProto:
    """A node around the op under test (its Transposes, a Neg): it may stay with onnxruntime with that op."""
    return helper.make_node(op, ins, outs, name=f"helper_{outs[0]}", **attrs)


def _wrapped(tag: str, inputs: list[str], make: Callable[[list[str], str], onnx.NodeProto],
             perm: tuple[int, ...] = (1, 0)) -> list[onnx.NodeProto]:
    """Transpose(inputs) -> make(...) -> Transpose -> `r_<tag>`: each op with Transposes of its own, so that fusing
    them is worth a kernel."""
    pre = [_helper("Transpose", [x], [f"{tag}_{x}"], perm=list(perm)) for x in inputs]
    return [*pre, make([f"{tag}_{x}" for x in inputs], f"{tag}_d"),
            _helper("Transpose", [f"{tag}_d"], [f"r_{tag}"], perm=list(perm))]


def _elementwise(dt: str, exact: bool) -> tuple[onnx.ModelProto, bool] | None:
    g = len(GRID[dt])
    nodes, outs = [], []
    ops = [(o, 1) for o in UNARY] + [(o, 2) for o in BINARY] + [(o, 3) for o in VARIADIC3]
    for o, arity in ops:
        if (o in INEXACT) == exact or (o in ("Div", "Mod", "Mod-fmod") and dt not in FLOAT_TYPES):
            continue
        otype = T.BOOL if o in BOOL_OUT else DT[dt]
        if not _runs([_op(o, [f"x{k}" for k in range(arity)], "r")], [(f"x{k}", DT[dt], [2]) for k in range(arity)],
                     [("r", otype, 1)]):
            continue
        nodes += _wrapped(f"{o}_{arity}", [f"x{k}" for k in range(arity)], lambda i, r, o=o: _op(o, i, r))
        outs.append((f"r_{o}_{arity}", otype, 2))
    if not outs:
        return None
    return make_model(nodes, [(f"x{k}", DT[dt], ["N", g ** 3]) for k in range(3)], outs, {}), exact


def _casts(dt: str) -> tuple[onnx.ModelProto, bool] | None:
    nodes, outs = [], []
    for to, tp in DT.items():
        if not _runs([node("Cast", ["x0"], ["r"], to=tp)], [("x0", DT[dt], [2])], [("r", tp, 1)]):
            continue
        nodes += _wrapped(to, ["x0"], lambda i, r, tp=tp: node("Cast", i, [r], to=tp))
        outs.append((f"r_{to}", tp, 2))
    return make_model(nodes, [("x0", DT[dt], ["N", len(GRID[dt])])], outs, {}), True


def _reductions(dt: str, exact: bool) -> tuple[onnx.ModelProto, bool] | None:
    # over x0's leading axis (the Transposed axis 1): onnxruntime's row-0 NaN rule, see test_special_values
    nodes, outs = [], []
    axes = {"ax": np.array([1], np.int64)}
    for op in REDUCE:
        if exact and op in REDUCE_INEXACT and dt in FLOAT_TYPES:
            continue
        if not exact and (op not in REDUCE_INEXACT or dt not in FLOAT_TYPES):
            continue
        if op.startswith("Arg"):
            otype, mk = T.INT64, lambda i, o, op=op: node(op, [i], [o], axis=1, keepdims=1)
        else:
            otype, mk = DT[dt], lambda i, o, op=op: node(op, [i, "ax"], [o], keepdims=1)
        if not _runs([mk("x0", "r")], [("x0", DT[dt], [2, 3])], [("r", otype, 2)], axes):
            continue
        if op == "ReduceLogSum":  # of |x|: the log of a sum that cancels to near 0 is not comparable at any rtol
            nodes.append(_helper("Abs", ["x0"], ["abs_x0"]))
        nodes += _wrapped(op, ["abs_x0" if op == "ReduceLogSum" else "x0"], lambda i, r, mk=mk: mk(i[0], r))
        outs.append((f"r_{op}", otype, 2))
    if not outs:
        return None
    return make_model(nodes, [("x0", DT[dt], [len(GRID[dt]), "N"])], outs, axes), exact


def _softmax(dt: str) -> tuple[onnx.ModelProto, bool] | None:
    # evonnx lowers a Softmax over a last axis of at most 32 elements (the greedy planner fuses it here)
    nodes, outs = [], []
    for op in ("Softmax", "LogSoftmax"):
        if not _runs([node(op, ["x0"], ["r"], axis=-1)], [("x0", DT[dt], [2, 8])], [("r", DT[dt], 2)]):
            continue
        # Neg before and after (Softmax runs on float types only): the Transposes alone are not worth a kernel
        nodes += [_helper("Neg", ["x0"], [f"n_{op}"]), node(op, [f"n_{op}"], [f"s_{op}"], axis=-1),
                  _helper("Neg", [f"s_{op}"], [f"r_{op}"])]
        outs.append((f"r_{op}", DT[dt], 3))
    if not outs:
        return None
    # a fixed small size: at a symbolic one the default cost model prices evonnx's exp above onnxruntime's Softmax
    return make_model(nodes, [("x0", DT[dt], [3, len(GRID[dt]), 8])], outs, {}), False


def _matmul(dt: str) -> tuple[onnx.ModelProto, bool] | None:
    # MatMul by a small right-hand matrix (a DFL projection is [16, 1]; up to 32 x 4 is fused): the grid's special
    # values on the left against constant weights of mixed signs, as a column, a matrix, and two rows (K = 2)
    if dt not in ("float32", "float64") or not _runs([node("MatMul", ["x0", "w"], ["r"])],
                                                     [("x0", DT[dt], [2, 3])], [("r", DT[dt], 2)],
                                                     {"w": np.ones((3, 1), dt)}):
        return None
    g = len(GRID[dt])
    inits = {"w_col": np.linspace(-2.0, 3.0, g).astype(dt).reshape(g, 1),
             "w_mat": np.arange(g * 3, dtype=dt).reshape(g, 3) - g,
             "w_two": np.array([[0.5, -1.5, 2.0], [-0.25, 3.0, 1.0]], dt)}
    nodes: list[onnx.NodeProto] = []
    outs: list[tuple[str, int, int]] = []
    for tag, w, src in (("col", "w_col", "x0"), ("mat", "w_mat", "x0"), ("two", "w_two", "x1")):
        nodes += [_helper("Neg", [src], [f"n_{tag}"]), node("MatMul", [f"n_{tag}", w], [f"m_{tag}"]),
                  _helper("Neg", [f"m_{tag}"], [f"r_{tag}"])]
        outs.append((f"r_{tag}", DT[dt], 3))
    return make_model(nodes, [("x0", DT[dt], [3, "N", g]), ("x1", DT[dt], ["N", g, 2])], outs, inits), False


def _where_clip(dt: str) -> tuple[onnx.ModelProto, bool] | None:
    g = len(GRID[dt])
    nodes, outs = [], []
    if _runs([node("Where", ["c", "x0", "x1"], ["r"])], [("c", T.BOOL, [2]), ("x0", DT[dt], [2]),
                                                        ("x1", DT[dt], [2])], [("r", DT[dt], 1)]):
        nodes += _wrapped("where", ["c", "x0", "x1"], lambda i, r: node("Where", i, [r]))
        outs.append(("r_where", DT[dt], 2))
    inits: dict[str, np.ndarray] = {}
    if dt != "bool":
        v = GRID[dt]
        bounds = [(v[3], v[-3]), (v[2], v[3]), (v[0], v[1])]  # ordinary, lo = hi, lo > hi or extremes
        if dt.startswith("float"):
            bounds += [(np.nan, 1.0), (-1.0, np.nan), (np.inf, -np.inf)]  # NaN bounds are ignored
        # a bound not given is the type's lowest or largest value: Clip(+inf) without a maximum is FLT_MAX
        bounds += [(None, v[-3]), (v[3], None), (None, None)]
        for k, (lo, hi) in enumerate(bounds):
            given = {"lo": lo, "hi": hi}
            arrays = {b: np.array(x, dt) for b, x in given.items() if x is not None}
            if not _runs([node("Clip", ["x0", *(b if b in arrays else "" for b in given)], ["r"])],
                         [("x0", DT[dt], [2])], [("r", DT[dt], 1)], arrays):
                break
            inits.update({f"{b}{k}": a for b, a in arrays.items()})
            names = [f"{b}{k}" if b in arrays else "" for b in given]
            nodes += _wrapped(f"clip{k}", ["x0"], lambda i, r, names=names: node("Clip", [*i, *names], [r]))
            outs.append((f"r_clip{k}", DT[dt], 2))
    if not outs:
        return None
    used = {i for n in nodes for i in n.input}
    return make_model(nodes, [(x, DT[dt] if x != "c" else T.BOOL, ["N", g * g]) for x in ("x0", "x1", "c")],
                      outs, {k: a for k, a in inits.items() if k in used}), True


def _views(dt: str) -> tuple[onnx.ModelProto, bool] | None:
    g = max(len(GRID[dt]), 3)

    def i64(*v: int) -> np.ndarray:
        return np.array(v, np.int64)

    inits = {"s0": i64(-1), "s1": i64(-(2**63)), "sa": i64(1), "ss": i64(-2), "gi": i64(2, 0, -1),
             "ex": i64(3, 1, 1), "rp": i64(1, 2), "sh": i64(0, -1, 2), "uq": i64(0), "sp": i64(g, g), "sq": i64(-4)}
    nodes = [node("Slice", ["x0", "s0", "s1", "sa", "ss"], ["a"]), node("Gather", ["x1", "gi"], ["b"], axis=1),
             node("Concat", ["a", "b"], ["c"], axis=1), node("Unsqueeze", ["c", "uq"], ["d0"]),
             node("Unsqueeze", ["d0", "uq"], ["d1"]), node("Squeeze", ["d1", "sq"], ["d"]),  # a negative axis
             node("Expand", ["d", "ex"], ["e"]), node("Transpose", ["e"], ["f"], perm=[2, 1, 0]),
             node("Flatten", ["f"], ["h"], axis=2), node("Transpose", ["h"], ["r_view1"], perm=[1, 0]),
             node("Tile", ["x1", "rp"], ["tl"]), node("Split", ["tl", "sp"], ["p", "q"], axis=1),
             node("Reshape", ["q", "sh"], ["rs"]), node("Transpose", ["rs"], ["r_view2"], perm=[2, 0, 1])]
    model = make_model(nodes, [("x0", DT[dt], ["N", g]), ("x1", DT[dt], ["N", g])],
                       [("r_view1", DT[dt], 2), ("r_view2", DT[dt], 3)], inits)
    return (model, True) if _ort_runs(model.SerializeToString()) else None


def _scatters(dt: str) -> tuple[onnx.ModelProto, bool] | None:
    # constant indices that write each element once, reversed: ScatterND over rows [n, N], ScatterElements over a
    # [n, 1] column (its indices must have the updates' shape, so no size symbol there); GatherElements reads
    # that column back in reverse through negative indices
    n = len(GRID[dt])
    idx = np.arange(n, dtype=np.int64)[::-1].copy().reshape(n, 1)
    nodes = [*_wrapped("se", ["y0", "y1"], lambda i, r: node("ScatterElements", [i[0], "si", i[1]], [r], axis=0)),
             *_wrapped("sn", ["x0", "x1"], lambda i, r: node("ScatterND", [i[0], "ni", i[1]], [r])),
             *_wrapped("ge", ["y0"], lambda i, r: node("GatherElements", [i[0], "gi"], [r], axis=0))]
    model = make_model(nodes, [("x0", DT[dt], ["N", n]), ("x1", DT[dt], ["N", n]), ("y0", DT[dt], [1, n]),
                               ("y1", DT[dt], [1, n])], [("r_se", DT[dt], 2), ("r_sn", DT[dt], 2), ("r_ge", DT[dt], 2)],
                       {"si": idx, "ni": idx, "gi": idx - n})  # negative indices from the end
    return (model, True) if _ort_runs(model.SerializeToString()) else None


def _generators(dt: str) -> tuple[onnx.ModelProto, bool] | None:
    # ConstantOfShape filled with the type's special values, and Range over constant bounds, each selected
    # against an input by Where (every type has Where) so that they are read at run time
    g = len(GRID[dt])
    nodes: list[onnx.NodeProto] = [_helper("Shape", ["x0"], ["shape"])]
    outs: list[tuple[str, int, int]] = []
    inits: dict[str, np.ndarray] = {}
    for k, v in enumerate(GRID[dt][:4]):
        fill = numpy_helper.from_array(np.array([v], dt), "value")
        if not _runs([node("ConstantOfShape", ["s"], ["r"], value=fill)], [("s", T.INT64, [1])], [("r", DT[dt], 1)]):
            break
        nodes += [node("ConstantOfShape", ["shape"], [f"fill{k}"], value=fill),
                  node("Where", ["c", "x0", f"fill{k}"], [f"r_fill{k}"])]
        outs.append((f"r_fill{k}", DT[dt], 2))
    # Size, a count known only at run time (0 at N = 0), cast to the type
    if _runs([node("Cast", ["s"], ["r"], to=DT[dt])], [("s", T.INT64, [1])], [("r", DT[dt], 1)]):
        # added to x0 between Transposes (a float Where against a count alone is left to onnxruntime by cost);
        # bool selects
        op = "Where" if dt == "bool" else "Add"
        nodes += [node("Size", ["x0"], ["size"]), node("Cast", ["size"], ["sizec"], to=DT[dt]),
                  *_wrapped("size", ["x0"], lambda i, r: node(op, ["c", i[0], "sizec"] if op == "Where" else
                                                             [i[0], "sizec"], [r]), perm=(0, 1))]
        outs.append(("r_size", DT[dt], 2))
    bounds = {"int16": (-7, 5, 1), "int32": (7, -5, -1), "int64": (-7, 5, 1), "float32": (-3.5, 8.0, 1.0),
              "float64": (8.0, -3.5, -1.0)}.get(dt)
    if bounds is not None:
        inits.update({"start": np.array(bounds[0], dt), "limit": np.array(bounds[1], dt),
                      "delta": np.array(bounds[2], dt)})
        nodes += [node("Range", ["start", "limit", "delta"], ["rng"]), node("Where", ["c", "x0", "rng"], ["r_range"])]
        outs.append(("r_range", DT[dt], 2))
    if not outs:
        return None
    model = make_model(nodes, [("x0", DT[dt], ["N", g]), ("c", T.BOOL, ["N", g])], outs, inits)
    return (model, True) if _ort_runs(model.SerializeToString()) else None


FAMILIES = {
    "elementwise": lambda dt: _elementwise(dt, True), "elementwise-inexact": lambda dt: _elementwise(dt, False),
    "cast": _casts, "reduce": lambda dt: _reductions(dt, True), "reduce-inexact": lambda dt: _reductions(dt, False),
    "softmax": _softmax, "matmul": _matmul, "where-clip": _where_clip, "views": _views, "scatters": _scatters,
    "generators": _generators,
}
# only the (type, family) pairs with an op onnxruntime runs: nothing to compare otherwise
TABLE = [(dt, fam) for dt in DT for fam, make in FAMILIES.items() if make(dt) is not None]


def _lowered_alone(model: onnx.ModelProto) -> set[str]:
    """Names of the nodes whose lowering evonnx accepts (the ones that must end up fused)."""
    g = gs.import_onnx(onnx.shape_inference.infer_shapes(model))
    an = analyze(g, 18)
    return {n.name for n in g.nodes if not isinstance(an.lowered.get(n.name, Reject("")), Reject)}


@pytest.mark.parametrize(("dtype", "family"), TABLE, ids=[f"{d}-{f}" for d, f in TABLE])
def test_semantics_table(dtype: str, family: str, tmp_path: Path) -> None:
    made = FAMILIES[family](dtype)
    assert made is not None
    model, exact = made
    plans = PLANS if any(d.dim_param for i in model.graph.input for d in i.type.tensor_type.shape.dim) else [{}]
    # on the graph as written: onnxruntime's own rewrites (its common-subexpression elimination merges the per-op
    # Transposes of one input) would change which ops a kernel holds, and this table is about each op's semantics
    # The greedy planner: every op evonnx lowers is fused and compared, whatever the cost model thinks of it here
    # (it had left the table's LogSumExp to onnxruntime, whose +inf rows evonnx then got wrong elsewhere).
    result = check_case(case_from_model(model, plans, exact=exact, value_regime="grid"), tmp_path,
                        tmp_path / "marker", env_extra={"EVONNX_ORT_FOLD": "0", "EVONNX_SEC_PLANNER": "greedy"})
    assert result.status == "ok", result.note
    assert not result.findings, "\n".join(result.findings)
    assert result.runs_compared + result.runs_both_failed == len(plans), result.note
    assert result.runs_compared >= min(2, len(plans)), result.note
    fused_alone = {name for name in _lowered_alone(model) if not name.startswith("helper_")}
    optimized = onnx.load(tmp_path / "out" / "model.opt.onnx")
    left = sorted(n.name for n in optimized.graph.node
                  if n.name in fused_alone and (dtype, n.op_type) not in LEFT_ALONE)
    assert not left, f"evonnx lowers these nodes but left them to onnxruntime: {left}"
    assert result.fused >= 1 or not fused_alone
