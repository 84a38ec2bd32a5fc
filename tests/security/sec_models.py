"""The deterministic models of the security issue's bug classes (used by test_bug_classes and test_sanitizers).

`REGRESSIONS` maps an id `<class>/<variant>` to a `Regression`: the model, the sizes to run it at (always with
0 and 1) and whether a Fused kernel must be generated (models that are invalid at every size may be refused).
Each model puts fusible nodes (Neg, Abs before; Add, Mul after) around the op under test, so that a kernel is
generated even when the op itself is left to onnxruntime.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper
from sec_cases import I32_MAX, I32_MIN, I64_MAX, I64_MIN

F, I64, I32 = TensorProto.FLOAT, TensorProto.INT64, TensorProto.INT32


@dataclass(frozen=True)
class Regression:
    model: onnx.ModelProto
    plans: list[dict[str, int]]
    require_kernel: bool = True
    note: str = ""
    regime: str = "small"  # input values (sec_cases.make_feeds)


def make_model(nodes: Sequence[onnx.NodeProto], inputs: Sequence[tuple[str, int, list]],
               outputs: Sequence[tuple[str, int, int]], initializers: dict[str, Any], opset: int = 18,
               name: str = "g") -> onnx.ModelProto:
    graph = helper.make_graph(
        list(nodes), name,
        [helper.make_tensor_value_info(n, t, s) for n, t, s in inputs],
        [helper.make_tensor_value_info(n, t, [None] * r) for n, t, r in outputs],
        [numpy_helper.from_array(np.asarray(v), k) for k, v in initializers.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=8)


def node(op: str, ins: Sequence[str], outs: Sequence[str], **attrs: object) -> onnx.NodeProto:
    return helper.make_node(op, list(ins), list(outs), name=f"{op}_{outs[0]}", **attrs)


def sizes(symbol: str, values: Sequence[int]) -> list[dict[str, int]]:
    return [{symbol: v} for v in values]


def around(op: Sequence[onnx.NodeProto], src: str, dst: str) -> list[onnx.NodeProto]:
    """x -> Neg -> Abs -> `src` ... (the op under test) ... `dst` -> Add(c) -> Mul(c) -> y."""
    return [node("Neg", ["x"], ["nx"]), node("Abs", ["nx"], [src]), *op, node("Add", [dst, "c"], ["ad"]),
            node("Mul", ["ad", "c"], ["y"])]


# -- GatherElements with constant indices over symbolic data dims ---------------------------------------------------
def gather_elements_symbolic(axis: int) -> Regression:
    # data x[N, 4], indices [2, 4] in [0, 2): onnxruntime errors when N < 2 (axis 0: an index reaches N; axis 1:
    # the indices' dim 0 exceeds the data's); the kernel checks both at run time
    ind = np.array([[1, 0, 1, 0], [0, 1, 1, 0]], np.int64) if axis == 0 else np.array([[3, 0, -1, 1], [0, 1, 2, -4]],
                                                                                         np.int64)
    model = make_model(around([node("GatherElements", ["a", "i"], ["g"], axis=axis)], "a", "g"),
                       [("x", F, ["N", 4])], [("y", F, 2)], {"i": ind, "c": np.arange(1, 5, dtype=np.float32)})
    return Regression(model, sizes("N", [0, 1, 2, 3, 7]), note=f"GatherElements(x[N,4], [2,4] const, axis={axis})")


# -- scatter through tables (indices no affine grid) into symbolic data dims -----------------------------------------
def scatter_table_symbolic(op: str) -> Regression:
    # data x[N, 4]; ScatterND rows [[3], [0], [2]] (no affine grid) or ScatterElements along axis 0 hitting row 3
    # twice, reduction add: onnxruntime errors when N <= 3 (index 3 out of range); the kernel checks max index < N
    # at run time
    if op == "ScatterND":
        ind, upd = np.array([[3], [0], [2]], np.int64), np.ones((3, 4), np.float32)
        nodes = [node("ScatterND", ["a", "i", "u"], ["g"], reduction="add")]
    else:
        ind, upd = np.array([[3, 0, 3, 1], [3, 3, 0, 0]], np.int64), np.ones((2, 4), np.float32)
        nodes = [node("ScatterElements", ["a", "i", "u"], ["g"], axis=0, reduction="add")]
    model = make_model(around(nodes, "a", "g"), [("x", F, ["N", 4])], [("y", F, 2)],
                       {"i": ind, "u": upd, "c": np.arange(1, 5, dtype=np.float32)})
    return Regression(model, sizes("N", [0, 1, 3, 4, 7]), note=f"{op}(x[N,4], constant rows up to 3, add)")


# -- a constant scalar Gather index on a symbolic axis -------------------------------------------------------------
def gather_scalar(index: int) -> Regression:
    # onnxruntime errors when the index is out of [-N, N): at N=0 for every index, at N=1 and 2 for index 2.
    model = make_model(around([node("Gather", ["a", "i"], ["g"], axis=0)], "a", "g"), [("x", F, ["N", 4])],
                       [("y", F, 1)], {"i": np.array(index, np.int64), "c": np.arange(1, 5, dtype=np.float32)})
    return Regression(model, sizes("N", [0, 1, 2, 3, 7]), note=f"Gather(x[N,4], {index}, axis=0)")


# -- ScatterND with constant indices into data with fewer rows -------------------------------------------------------
def scatternd_rows() -> Regression:
    # indices [[1],[2],[3]] into [N,8]: onnxruntime errors for N <= 3.
    model = make_model(around([node("ScatterND", ["a", "i", "u"], ["s"])], "a", "s"), [("x", F, ["N", 8])],
                       [("y", F, 2)], {"i": np.array([[1], [2], [3]], np.int64),
                                       "u": np.arange(24, dtype=np.float32).reshape(3, 8), "c": np.float32(0.5)})
    return Regression(model, sizes("N", [0, 1, 2, 3, 4, 9]), note="ScatterND(x[N,8], [[1],[2],[3]], const[3,8])")


def scatternd_data_dependent_updates() -> Regression:
    # updates are -a[0:3] (shape [min(N,3), 8]): onnxruntime errors unless N >= 4
    op = [node("Slice", ["a", "z", "three", "z"], ["u"]), node("Neg", ["u"], ["nu"]),
          node("ScatterND", ["a", "i", "nu"], ["s"])]
    model = make_model(around(op, "a", "s"), [("x", F, ["N", 8])], [("y", F, 2)],
                       {"i": np.array([[1], [2], [3]], np.int64), "z": np.array([0], np.int64),
                        "three": np.array([3], np.int64), "c": np.float32(2.0)})
    return Regression(model, sizes("N", [0, 1, 2, 3, 4, 9]), note="ScatterND(x[N,8], [[1],[2],[3]], -x[0:3])")


# -- integer extremes in constants -------------------------------------------------------------------------------------
EXTREME_CONSTANTS: dict[str, tuple[int, np.ndarray]] = {
    "int64 [MAX, MIN]": (I64, np.array([I64_MAX, I64_MIN], np.int64)),
    "int64 [MIN, MAX]": (I64, np.array([I64_MIN, I64_MAX], np.int64)),
    "int64 [MAX-1, MAX, MIN]": (I64, np.array([I64_MAX - 1, I64_MAX, I64_MIN], np.int64)),  # +1 steps, wrapping
    "int64 [MIN, 0, MAX]": (I64, np.array([I64_MIN, 0, I64_MAX], np.int64)),
    "int32 [MAX, MIN]": (I32, np.array([I32_MAX, I32_MIN], np.int32)),
    "int32 [MAX-1, MAX, MIN]": (I32, np.array([I32_MAX - 1, I32_MAX, I32_MIN], np.int32)),
}


def integer_extremes(key: str, use: str, layout: str) -> Regression:
    """The constant (a row [k] against x[N,k], or a column [k,1] against x[N,k,1], where consecutive rows look
    like an arithmetic progression) read element by element, with no overflow anywhere: max(|x|, c),
    where(|x| > 0, c, |x|), concat(|x|, c[None]), |x| * 0 + c; then Add/Mul with 0/1."""
    dtype, c = EXTREME_CONSTANTS[key]
    k = c.size
    shape: list = ["N", k] if layout == "row" else ["N", k, 1]
    const = c if layout == "row" else c.reshape(k, 1)
    if use == "max":
        op = [node("Max", ["a", "k"], ["m"])]
    elif use == "where":
        op = [node("Greater", ["a", "zero"], ["p"]), node("Where", ["p", "k", "a"], ["m"])]
    elif use == "concat":
        op = [node("Unsqueeze", ["k", "ax0"], ["k2"]), node("Concat", ["a", "k2"], ["m"], axis=0)]
    else:
        op = [node("Mul", ["a", "zero"], ["z"]), node("Add", ["z", "k"], ["m"])]
    npt = np.int64 if dtype == I64 else np.int32
    ones = np.array([0, 1] * (k // 2) + [1] * (k % 2), npt).reshape(const.shape)
    model = make_model(around(op, "a", "m"), [("x", dtype, shape)], [("y", dtype, len(shape))],
                       {"k": const, "zero": np.array(0, npt), "ax0": np.array([0], np.int64), "c": ones})
    return Regression(model, sizes("N", [0, 1, 3]), note=f"{use} with constant {key} as a {layout}")


def extreme_indices(op: str, indices: list) -> Regression:
    """Indices out of range at every size: onnxruntime always errors; evonnx must refuse or error too."""
    idx = np.array(indices, np.int64)
    if op == "Gather":
        nd = node("Gather", ["a", "i"], ["g"], axis=0)
        idx = idx.reshape(-1)
    else:
        nd = node("ScatterND", ["a", "i", "u"], ["g"])
    model = make_model(around([nd], "a", "g"), [("x", F, ["N", 4])], [("y", F, 2)],
                       {"i": idx, "u": np.ones((len(indices), 4), np.float32), "c": np.float32(3.0)})
    return Regression(model, sizes("N", [0, 1, 3, 9]), require_kernel=False, note=f"{op} with indices {indices}")


# -- Slice with extreme steps on symbolic dims ------------------------------------------------------------------------
SLICES = [(-1, I64_MIN, I64_MIN), (I64_MAX, I64_MIN, I64_MIN), (0, I64_MAX, I64_MAX), (-1, -I64_MAX, I64_MIN),
          (I64_MIN, I64_MAX, I64_MAX), (-2, I64_MIN, -I64_MAX), (1, I64_MAX, 1), (-3, I64_MAX, 2),
          (-I64_MAX, -100, -1), (I64_MIN, 100, -1),  # a huge negative start, negative step, at N = 0
          (0, I64_MAX, -2), (-1, I64_MAX, -1), (2, I64_MAX - 1, -1)]  # onnxruntime: INT64_MAX ends go to element 0


def slice_steps(start: int, end: int, step: int) -> Regression:
    model = make_model(around([node("Slice", ["a", "s", "e", "ax", "k"], ["sl"])], "a", "sl"), [("x", F, ["N", 4])],
                       [("y", F, 2)], {"s": np.array([start], np.int64), "e": np.array([end], np.int64),
                                       "ax": np.array([0], np.int64), "k": np.array([step], np.int64),
                                       "c": np.arange(4, dtype=np.float32)})
    return Regression(model, sizes("N", [0, 1, 2, 5]), note=f"Slice(x[N,4], {start}:{end}:{step}, axis 0)")


# -- Reshape with 0 and -1 on empty tensors ---------------------------------------------------------------------------
RESHAPES = [([0, -1], 0), ([-1, 2], 0), ([2, -1], 0), ([0, 2, -1], 0), ([-1], 0), ([0, 0], 1), ([4, -1], 0),
            ([-1, 0], 0)]


def reshape(target: list[int], allowzero: int) -> Regression:
    model = make_model(around([node("Reshape", ["a", "t"], ["r"], allowzero=allowzero)], "a", "r"),
                       [("x", F, ["N", 4])], [("y", F, len(target))],
                       {"t": np.array(target, np.int64), "c": np.float32(1.5)})
    # With allowzero=1 a 0 is a literal 0: the model runs only at N = 0, so evonnx's own check may refuse it.
    return Regression(model, sizes("N", [0, 1, 2, 3]), require_kernel=not (allowzero and 0 in target),
                      note=f"Reshape(x[N,4], {target}, allowzero={allowzero})")


# -- broadcasting two symbolic dims ----------------------------------------------------------------------------------
def broadcast_same_axis() -> Regression:
    # a[A,4] + yy[B,4]: onnxruntime accepts A == B, A == 1 or B == 1, and errors otherwise.
    model = make_model(around([node("Add", ["a", "yy"], ["s"])], "a", "s"), [("x", F, ["A", 4]), ("yy", F, ["B", 4])],
                       [("y", F, 2)], {"c": np.arange(4, dtype=np.float32)})
    pairs = [(3, 3), (1, 3), (3, 1), (1, 1), (0, 1), (1, 0), (0, 0), (3, 5), (0, 3), (3, 0)]
    plans = [{"A": a, "B": b} for a, b in pairs]
    return Regression(model, plans, note="Add(x[A,4], y[B,4])")


def broadcast_other_axes() -> Regression:
    # a[A,1] * yy[1,B] -> [A,B]
    model = make_model(around([node("Mul", ["a", "yy"], ["m"])], "a", "m"), [("x", F, ["A", 1]), ("yy", F, [1, "B"])],
                       [("y", F, 2)], {"c": np.float32(2.0)})
    plans = [{"A": a, "B": b} for a, b in [(3, 3), (1, 3), (3, 1), (0, 3), (3, 0), (2, 5)]]
    return Regression(model, plans, note="Mul(x[A,1], y[1,B])")


def broadcast_constant() -> Regression:
    # a[N,4] + yy[3,4]: onnxruntime accepts N == 3 and N == 1 (the result is [3,4] then) and errors otherwise.
    model = make_model(around([node("Add", ["a", "yy"], ["s"])], "a", "s"), [("x", F, ["N", 4]), ("yy", F, [3, 4])],
                       [("y", F, 2)], {"c": np.arange(4, dtype=np.float32)})
    return Regression(model, sizes("N", [3, 1, 0, 2, 5]), note="Add(x[N,4], y[3,4])")


def broadcast_only_shape_used() -> Regression:
    # Range(0, Shape(a + yy)[0]) where the sum itself is read by nothing else: the kernel computing the Range must
    # still check that A and B broadcast, since the Add that onnxruntime would fail no longer runs
    nodes = [node("Neg", ["x"], ["a"]), node("Add", ["a", "yy"], ["s"]), node("Shape", ["s"], ["sh"]),
             node("Gather", ["sh", "zero"], ["n"], axis=0), node("Range", ["zero", "n", "one"], ["r"]),
             node("Cast", ["r"], ["rf"], to=F), node("Mul", ["rf", "c"], ["m"]), node("Neg", ["m"], ["y"])]
    model = make_model(nodes, [("x", F, ["A", 4]), ("yy", F, ["B", 4])], [("y", F, 1)],
                       {"zero": np.array(0, np.int64), "one": np.array(1, np.int64), "c": np.float32(0.5)})
    pairs = [(3, 3), (1, 3), (3, 1), (0, 1), (3, 5), (0, 3)]
    return Regression(model, [{"A": a, "B": b} for a, b in pairs], note="Range(0, Shape(x[A,4] + y[B,4])[0])")


# -- Reshape to sizes read from the graph, which copy an input dim when they are 0 -------------------------------------
def reshape_from_shapes() -> Regression:
    # x[1,6,H,W] -> Reshape to [1, 2, 3, H, W] built from Shape/Gather: at H = 0 the entry 0 copies input dim 3
    # (W) under allowzero=0, so onnxruntime fails the node unless W is 0 too; at W = 0 it copies a dim x lacks.
    nodes = [node("Shape", ["x"], ["sh"]), node("Gather", ["sh", "i2"], ["h"], axis=0),
             node("Gather", ["sh", "i3"], ["w"], axis=0), node("Concat", ["head", "h", "w"], ["t"], axis=0),
             *around([node("Reshape", ["a", "t"], ["r"])], "a", "r")]
    model = make_model(nodes, [("x", F, [1, 6, "H", "W"])], [("y", F, 5)],
                       {"i2": np.array([2], np.int64), "i3": np.array([3], np.int64),
                        "head": np.array([1, 2, 3], np.int64), "c": np.float32(0.5)})
    plans = [{"H": h, "W": w} for h, w in [(2, 3), (0, 3), (3, 0), (0, 0), (1, 1)]]
    return Regression(model, plans, note="Reshape(x[1,6,H,W], [1,2,3,H,W] from Shape)")


# -- groups whose every input is a constant ---------------------------------------------------------------------------
def constant_group() -> Regression:
    # ConstantOfShape -> Neg -> Abs -> Sigmoid is constant but large; a kernel with no inputs is invalid in
    # onnxruntime ("Fused has input size 0"), so such nodes stay with onnxruntime, which folds them once.
    nodes = [node("ConstantOfShape", ["shp"], ["k"], value=numpy_helper.from_array(np.array([1.5], np.float32))),
             node("Neg", ["k"], ["nk"]), node("Abs", ["nk"], ["ak"]), node("Sigmoid", ["ak"], ["sk"]),
             *around([node("Add", ["a", "sk"], ["s"])], "a", "s")]
    model = make_model(nodes, [("x", F, ["N", 1024, 1100])], [("y", F, 3)],
                       {"shp": np.array([1024, 1100], np.int64), "c": np.float32(2.0)})
    return Regression(model, sizes("N", [1]), note="ConstantOfShape([1024,1100]) -> Neg -> Abs -> Sigmoid -> Add(x)")


def gather_no_indices() -> Regression:
    # Gather of x[N, 8] at the indices of an empty constant Range: an empty result, whose elements are never
    # computed (fuzz case 2097: planning asked for the first index of none, an internal error)
    nodes = around([node("Range", ["zero", "zero", "one"], ["r"]), node("Gather", ["a", "r"], ["g"], axis=1),
                    node("Concat", ["a", "g"], ["k"], axis=1)], "a", "k")
    model = make_model(nodes, [("x", F, ["N", 8])], [("y", F, 2)],
                       {"zero": np.array(0, np.int64), "one": np.array(1, np.int64), "c": np.float32(2.0)})
    return Regression(model, sizes("N", [0, 1, 3]), note="Concat(x, Gather(x[N,8], Range(0, 0, 1), axis=1))")


# -- a zero from Min/Max of +0 and -0 as a divisor --------------------------------------------------------------------
def zero_sign_divisor(op: str) -> Regression:
    # onnxruntime's Min/Max of +0 and -0 gives either zero depending on the element's position; 1 / that zero is
    # +inf or -inf (fuzz case 359, seed 978007: the check refused evonnx's own model). The Min stays with it.
    signs = np.array([-0.0, 0.0, -0.0, -0.0, 0.0, 0.0, -0.0, 0.0], np.float32)
    nodes = around([node("Mul", ["a", "zero"], ["z"]), node(op, ["z", "signs"], ["m"]),
                    node("Div", ["one", "m"], ["d"])], "a", "d")
    model = make_model(nodes, [("x", F, ["N", 8])], [("y", F, 2)],
                       {"zero": np.float32(0.0), "one": np.float32(1.0), "signs": signs, "c": np.float32(2.0)})
    return Regression(model, sizes("N", [1, 3, 37]), note=f"Div(1, {op}(x * 0, [-0, +0, ...]))")


# -- Softmax over an axis of one element ------------------------------------------------------------------------------
def softmax_one_element(op: str, axis: int) -> Regression:
    # a row of one element has no reduction loop (fuzz case 36, seed 990000: an internal error): exp(x - x) / itself
    model = make_model(around([node(op, ["a"], ["s"], axis=axis)], "a", "s"), [("x", F, ["N", 1, 3])],
                       [("y", F, 3)], {"c": np.float32(2.0)})
    return Regression(model, sizes("N", [0, 1, 4]), note=f"{op}(x[N, 1, 3], axis={axis})", regime="special")


# -- static empty tensors through reshapes -----------------------------------------------------------------------------
def static_empty(shape: list, perm: list[int]) -> Regression:
    # a dim that is 0 in the model itself: flattening index arithmetic must not divide by it
    model = make_model(around([node("Unsqueeze", ["a", "one"], ["u"]), node("Transpose", ["u"], ["t"], perm=perm),
                               node("Flatten", ["t"], ["f"], axis=2), node("Neg", ["f"], ["g"])], "a", "g"),
                       [("x", I64, shape)], [("y", I64, 2)],
                       {"one": np.array([1], np.int64), "c": np.array(3, np.int64)})
    return Regression(model, [{"M": m, "N": n} for m, n in [(0, 0), (1, 2), (3, 1)]], require_kernel=False,
                      note=f"Unsqueeze/Transpose/Flatten of int64{shape}")


# -- integer reductions that overflow ----------------------------------------------------------------------------------
def integer_reduction(op: str, dtype: int) -> Regression:
    # onnxruntime sums integers in double and saturates; evonnx must give its values (or leave the node to it)
    npt = np.int64 if dtype == I64 else np.int32
    big = npt(1 << 61) if dtype == I64 else npt(1 << 29)
    nodes = [node("Abs", ["x"], ["a"]), node("Mul", ["a", "big"], ["m"]),
             node(op, ["m", "ax"], ["r"], keepdims=0), node("Neg", ["r"], ["y"])]
    model = make_model(nodes, [("x", dtype, ["N", 40])], [("y", dtype, 1)],
                       {"big": big, "ax": np.array([1], np.int64)})
    return Regression(model, sizes("N", [0, 1, 3]), require_kernel=False, note=f"{op} over int{npt().nbytes * 8}")


# -- a rank-0 input --------------------------------------------------------------------------------------------------
def scalar_input() -> Regression:
    model = make_model(around([node("Mul", ["a", "s"], ["m"])], "a", "m"), [("x", F, ["N", 4]), ("s", F, [])],
                       [("y", F, 2)], {"c": np.float32(2.0)})
    return Regression(model, sizes("N", [0, 1, 3]), note="Mul(x[N,4], s[]) with a 0-d input")


# -- float to integer casts of NaN, infinities and out-of-range values ------------------------------------------------
def float_to_int(to: int, regime: str) -> Regression:
    # C leaves these conversions undefined (gcc folded Cast(Cast(x, int64), float) into a truncation); onnxruntime's
    # CPU Cast gives INT_MIN for NaN and out-of-range values, and the narrow types wrap that 32-bit result
    nodes = [node("Neg", ["x"], ["nx"]), node("Cast", ["nx"], ["k"], to=to), node("Cast", ["k"], ["kf"], to=F),
             node("Add", ["kf", "x"], ["y"])]
    model = make_model(nodes, [("x", F, ["N", 16])], [("y", F, 2)], {})
    return Regression(model, sizes("N", [1, 7, 300]), note=f"Cast(float -> {to} -> float) of {regime} values",
                      regime=regime)


# -- int64 orderings onnxruntime computes on 32-bit halves ---------------------------------------------------------
def int64_order(op: str) -> Regression:
    # onnxruntime 1.31: Min(-2, -2**32) over 16 elements is -2 (Max and Clip alike); the node stays with it
    if op == "Clip":
        mid = [node("Clip", ["a", "lo", "hi"], ["m"])]
    else:
        mid = [node(op, ["a", "k"], ["m"])]
    nodes = [node("Neg", ["x"], ["nx"]), node("Add", ["nx", "two"], ["a"]), *mid, node("Neg", ["m"], ["y"])]
    model = make_model(nodes, [("x", I64, ["N", 16])], [("y", I64, 2)],
                       {"two": np.array(-2, np.int64), "k": np.full(16, -(1 << 32), np.int64),
                        "lo": np.array(-(2 << 32), np.int64), "hi": np.array(-(1 << 32), np.int64)})
    return Regression(model, sizes("N", [1, 4]), note=f"int64 {op} beyond 32 bits")


def int64_sign() -> Regression:
    # onnxruntime 1.31: Sign of an int64 in [2**31, 2**32) is -1 where its SIMD loop reaches the element and 1 in
    # the scalar tail (fuzz case000762, seed 4000017: Sign(x + 2**32 - 1)); the node stays with it
    nodes = [node("Neg", ["x"], ["nx"]), node("Add", ["nx", "k"], ["a"]), node("Sign", ["a"], ["m"]),
             node("Neg", ["m"], ["y"])]
    model = make_model(nodes, [("x", I64, ["N", 16])], [("y", I64, 2)], {"k": np.array(3 << 30, np.int64)})
    return Regression(model, sizes("N", [1, 4]), note="int64 Sign between 2**31 and 2**32")


def int64_order_scalar() -> Regression:
    # one element: onnxruntime compares correctly, and so the node is fused
    nodes = [node("Neg", ["x"], ["nx"]), node("Min", ["nx", "k"], ["m"]), node("Neg", ["m"], ["y"])]
    model = make_model(nodes, [("x", I64, [])], [("y", I64, 0)], {"k": np.array(-(1 << 32), np.int64)})
    return Regression(model, [{}], note="int64 Min of two scalars beyond 32 bits")


def int64_reduce_order(op: str, axes: list[int] | None) -> Regression:
    # onnxruntime 1.31 compares the int64 pairs that meet inside one SIMD block by their 32-bit halves, the low ones
    # as signed (Eigen's SSE2 Packet2l): ReduceMin([7, -2**32, 7, -5]) is -5 there, and ReduceMax([0, 2**32 + 5,
    # 0, 2**32 + 2**31]) is 2**32 + 5. Which pairs meet depends on the layout, so the reduction stays with it
    # (fuzz case001376, a ReduceMin over a ScatterND)
    pattern = [7, -(1 << 32), 7, -5] if op == "ReduceMin" else [0, (1 << 32) + 5, 0, (1 << 32) + (1 << 31)]
    red = node(op, ["b", "ax"] if axes is not None else ["b"], ["m"], keepdims=1)
    nodes = [node("Mul", ["x", "zero"], ["z"]), node("Add", ["z", "k"], ["b"]), red, node("Neg", ["m"], ["y"])]
    inits: dict[str, Any] = {"zero": np.array(0, np.int64), "k": np.array(pattern * 4, np.int64)}
    if axes is not None:
        inits["ax"] = np.array(axes, np.int64)
    model = make_model(nodes, [("x", I64, ["N", 16])], [("y", I64, 2)], inits)
    return Regression(model, sizes("N", [1, 4]), note=f"int64 {op} beyond 32 bits")


# -- reductions of empty tensors -----------------------------------------------------------------------------------
EMPTY_REDUCTIONS = (("ReduceMax", [-1], 1), ("ReduceMax", [-1], 0), ("ReduceSum", [1], 1), ("ReduceMin", [0, -1], 1),
                    ("ReduceMax", [-2, -1], 1), ("ReduceMean", [1], 0), ("ArgMax", -1, 1), ("ArgMax", 1, 1),
                    ("ArgMin", 1, 0))


def empty_reduction(op: str, axes: list[int] | int, keep: int, static_rows: bool = False) -> Regression:
    # onnxruntime 1.31 keeps an axis written negatively at its size on an empty input (ReduceMax(x[0, 5], [-1]) is
    # [0, 5]), and fails an ArgMax over an empty axis when the result is not empty (x[5, 0], axis=1). With x[2, M]
    # the spec's result shape is static, and onnxruntime may fail reusing a buffer of that shape (fuzz case 40)
    if isinstance(axes, int):
        red = node(op, ["a"], ["r"], axis=axes, keepdims=keep)
        nodes = [node("Neg", ["x"], ["a"]), red, node("Add", ["r", "r"], ["y"])]
        out, inits = I64, {}
    else:
        red = node(op, ["a", "ax"], ["r"], keepdims=keep)
        nodes = [node("Neg", ["x"], ["a"]), red, node("Mul", ["r", "r"], ["y"])]
        out, inits = F, {"ax": np.array(axes, np.int64)}
    model = make_model(nodes, [("x", F, [2, "M"] if static_rows else ["N", "M"])], [("y", out, 2 if keep else 1)],
                       inits)
    plans = [{"M": m} for m in (0, 1, 3)] if static_rows else \
        [{"N": n, "M": m} for n, m in [(0, 3), (3, 0), (0, 0), (1, 1), (2, 3)]]
    return Regression(model, plans, require_kernel=False, note=f"{op}({axes}, keepdims={keep}) of an empty input")


def empty_reduction_static_axis() -> Regression:
    # ReduceMax(x[N, M, 6], [-1], keepdims=0) and ArgMax(axis=-1, keepdims=0): over a static axis the kernel gives
    # onnxruntime's [0, M, 6] where N = 0 (ABI 4: infer sets the rank), and the Add after the ArgMax, which reads a
    # tensor of another rank there, stays with onnxruntime
    nodes = [node("Neg", ["x"], ["a"]), node("ReduceMax", ["a", "ax"], ["m"], keepdims=0),
             node("ArgMax", ["a"], ["i"], axis=-1, keepdims=0), node("Add", ["i", "i"], ["y"])]
    model = make_model(nodes, [("x", F, ["N", "M", 6])], [("m", F, 2), ("y", I64, 2)], {"ax": np.array([-1], np.int64)})
    return Regression(model, [{"N": n, "M": m} for n, m in [(0, 3), (3, 0), (0, 0), (1, 1), (2, 3)]],
                      note="ReduceMax/ArgMax(-1, keepdims=0) over a static axis of an empty input")


# -- values evonnx knows at plan time whose producer onnxruntime still runs -----------------------------------------
def empty_gather() -> Regression:
    # x[0, M, 8]: the Gather's result is empty whatever M is, but onnxruntime checks its index against M (fails at
    # M <= 3); evonnx knew the empty result and dropped the Gather (fuzz case 57)
    nodes = [node("Gather", ["x", "i"], ["g"], axis=1), node("Abs", ["g"], ["a"]), node("Neg", ["a"], ["y"])]
    model = make_model(nodes, [("x", F, [0, "M", 8])], [("y", F, 3)], {"i": np.array([3], np.int64)})
    return Regression(model, sizes("M", [0, 2, 5]), require_kernel=False, note="Gather of an empty tensor")


def shape_of_reshape() -> Regression:
    # Shape(Reshape(x[N, 8], [0, 2, -1]))[1:] is [2, 4] for every N > 0; at N = 0 onnxruntime cannot infer -1 and
    # fails, and the value evonnx folded must fail there too (fuzz case 227)
    nodes = [node("Reshape", ["x", "s"], ["r"]), node("Shape", ["r"], ["sh"], start=1), node("Abs", ["sh"], ["a"]),
             node("Reshape", ["a", "s2"], ["y"])]
    model = make_model(nodes, [("x", I64, ["N", 8])], [("y", I64, 2)],
                       {"s": np.array([0, 2, -1], np.int64), "s2": np.array([-1, 1], np.int64)})
    return Regression(model, sizes("N", [0, 1, 3]), require_kernel=False, note="a size known only when N > 0")


def rank_quirk_downstream() -> Regression:
    # ReduceSum(x[M], axes=[-1], keepdims=0) is a scalar, but onnxruntime returns x's shape [0] at M = 0 and the
    # nodes after it go on with a rank the model does not declare: they stay with onnxruntime (fuzz case 1043)
    nodes = [node("Add", ["x", "x"], ["a"]), node("ReduceSum", ["a", "ax"], ["r"], keepdims=0),
             node("Unsqueeze", ["r", "ax"], ["u"]), node("Concat", ["u", "x"], ["y"], axis=0)]
    model = make_model(nodes, [("x", F, ["M"])], [("y", F, 1)], {"ax": np.array([-1], np.int64)})
    return Regression(model, sizes("M", [0, 1, 3]), require_kernel=False, note="a reduction's quirk rank downstream")


def quirk_shape_downstream() -> Regression:
    # an int64 ReduceSum stays with onnxruntime; over axes [-2, -1] of an empty x[N, M] it gives [N, M], not the
    # [1, 1] the model says, and the kernel after it must not take the [1, 1] for granted (fuzz case 2109)
    nodes = [node("ReduceSum", ["x", "ax"], ["r"], keepdims=1), node("Expand", ["r", "shape"], ["e"]),
             node("Neg", ["e"], ["y"])]
    model = make_model(nodes, [("x", I64, ["N", "M"])], [("y", I64, 3)],
                       {"ax": np.array([-2, -1], np.int64), "shape": np.array([2, 1, 1], np.int64)})
    return Regression(model, [{"N": n, "M": m} for n, m in [(0, 0), (0, 3), (2, 3)]], require_kernel=False,
                      note="a kernel after onnxruntime's empty reduction")


def quirk_rank_through_gather_nd() -> Regression:
    # ArgMin(x[8, N, N], axis=-1, keepdims=1) is [8, N, 0] at N = 0 in onnxruntime, not [8, N, 1]; as GatherND's
    # indices it makes index tuples of no element and a result of rank 5 where inference says 4, and the kernel
    # after the GatherND must not take rank 4 for granted (fuzz case 1819)
    nodes = [node("Abs", ["x"], ["a"]), node("ArgMin", ["a"], ["i"], axis=-1, keepdims=1),
             node("GatherND", ["a", "i"], ["g"]), node("Neg", ["g"], ["n"]), node("Max", ["n", "n"], ["y"])]
    model = make_model(nodes, [("x", F, [8, "N", "N"])], [("y", F, 4)], {})
    return Regression(model, sizes("N", [0, 1, 2]), require_kernel=False,
                      note="a GatherND whose rank follows onnxruntime's empty ArgMin")


def reduce_of_expanded_scalar() -> Regression:
    # a kernel whose only input is a scalar, reducing it expanded to Shape(x[N, 1, N]): N sizes only the reduction's
    # loop, and x must be bound for it (an optimize traceback, fuzz case 286)
    nodes = [node("Shape", ["x"], ["sh"]), node("Expand", ["s", "sh"], ["e"]), node("Max", ["e", "e"], ["m"]),
             node("ReduceMax", ["m"], ["r"], keepdims=1), node("Greater", ["r", "c"], ["y"])]
    model = make_model(nodes, [("x", I32, ["N", 1, "N"]), ("s", F, [])], [("y", TensorProto.BOOL, 3)],
                       {"c": np.full((1, 1, 1), 8.0, np.float32)})
    return Regression(model, sizes("N", [0, 1, 3]), note="ReduceMax of an expanded scalar")


def failing_node_read_through_shape() -> Regression:
    # The ScatterND stays with onnxruntime (its updates, x[0:2], are not provably [2, 3]), which fails it at N < 2;
    # only its Shape[1:] is read, which evonnx knows, but the node must still run (fuzz cases 7 and 1605)
    nodes = [node("Slice", ["x", "zero", "two", "zero"], ["s"]), node("Neg", ["s"], ["u"]),
             node("ScatterND", ["x", "ind", "u"], ["w"]), node("Shape", ["w"], ["sh"], start=1),
             node("Neg", ["sh"], ["y"])]
    model = make_model(nodes, [("x", F, ["N", 3])], [("y", I64, 1)],
                       {"zero": np.array([0], np.int64), "two": np.array([2], np.int64),
                        "ind": np.array([[0], [1]], np.int64)})
    return Regression(model, sizes("N", [0, 1, 3]), require_kernel=False, note="a failing node read only through Shape")


def checked_kernel_read_through_shape() -> Regression:
    # the kernel's Mul of x[N, 1] and z[M, 1] must check that N and M broadcast; only the shape of a Slice of its
    # Concat is read, and onnxruntime folds Shape of a declared static shape and then skips the kernel (fuzz 1262)
    nodes = [node("Mul", ["x", "z"], ["m"]), node("Concat", ["c", "m"], ["cc"], axis=0),
             node("Slice", ["cc", "zero", "one", "zero"], ["s"]), node("Shape", ["s"], ["y"])]
    model = make_model(nodes, [("x", I64, ["N", 1]), ("z", I64, ["M", 1])], [("y", I64, 1)],
                       {"c": np.array([[8], [-5]], np.int64), "zero": np.array([0], np.int64),
                        "one": np.array([1], np.int64)})
    return Regression(model, [{"N": n, "M": m} for n, m in [(0, 3), (3, 0), (2, 2)]], require_kernel=False,
                      note="a checked kernel read only through Shape")


def _all() -> dict[str, Callable[[], Regression]]:
    out: dict[str, Callable[[], Regression]] = {}
    for i in (0, -1, 2):
        out[f"gather-scalar-index/{i}"] = lambda i=i: gather_scalar(i)
    for axis in (0, 1):
        out[f"gather-elements-symbolic/axis{axis}"] = lambda a=axis: gather_elements_symbolic(a)
    for op in ("ScatterND", "ScatterElements"):
        out[f"scatter-table-symbolic/{op}"] = lambda o=op: scatter_table_symbolic(o)
    out["scatternd-rows/const-updates"] = scatternd_rows
    out["scatternd-rows/data-updates"] = scatternd_data_dependent_updates
    for key in EXTREME_CONSTANTS:
        for use in ("max", "where", "concat", "add"):
            for layout in ("row", "column"):
                out[f"int-extremes/{key}-{use}-{layout}"] = lambda k=key, u=use, lo=layout: integer_extremes(k, u, lo)
    for op in ("Gather", "ScatterND"):
        for name, ind in (("MAX,MIN", [[I64_MAX], [I64_MIN]]), ("MAX-1,MAX,MIN", [[I64_MAX - 1], [I64_MAX], [I64_MIN]]),
                          ("MIN,0", [[I64_MIN], [0]])):
            out[f"int-extreme-indices/{op}-{name}"] = lambda o=op, v=ind: extreme_indices(o, v)
    for s, e, k in SLICES:
        out[f"slice-steps/{s}:{e}:{k}"] = lambda s=s, e=e, k=k: slice_steps(s, e, k)
    for target, az in RESHAPES:
        out[f"reshape-empty/{target}-allowzero{az}"] = lambda t=target, a=az: reshape(t, a)
    out["broadcast-symbols/same-axis"] = broadcast_same_axis
    out["broadcast-symbols/other-axes"] = broadcast_other_axes
    out["broadcast-symbols/constant"] = broadcast_constant
    out["broadcast-symbols/only-its-shape-used"] = broadcast_only_shape_used
    out["reshape-from-shapes/zero-copies"] = reshape_from_shapes
    out["constant-group/no-inputs"] = constant_group
    out["gather-no-indices/empty-range"] = gather_no_indices
    for op in ("Min", "Max"):
        out[f"zero-sign/{op}-divisor"] = lambda o=op: zero_sign_divisor(o)
    for op in ("Softmax", "LogSoftmax"):
        out[f"softmax/{op}-one-element-axis"] = lambda o=op: softmax_one_element(o, 1)
    for shape, perm in ((["M", "N", 0], [3, 1, 0, 2]), (["M", 0, "N"], [0, 2, 1, 3]), ([0, "M"], [1, 0, 2])):
        out[f"static-empty/{shape}-{perm}"] = lambda s=shape, p=perm: static_empty(s, p)
    for op in ("ReduceSum", "ReduceProd", "ReduceSumSquare", "ReduceL1"):
        for dtype, bits in ((I64, 64), (I32, 32)):
            out[f"integer-reduction/{op}-int{bits}"] = lambda o=op, d=dtype: integer_reduction(o, d)
    for op, axes, keep in EMPTY_REDUCTIONS:
        out[f"empty-reduction/{op}{axes}-keepdims{keep}"] = lambda o=op, a=axes, k=keep: empty_reduction(o, a, k)
    out["empty-reduction/ReduceMin[-1, -2]-static-result"] = lambda: empty_reduction("ReduceMin", [-1, -2], 1, True)
    out["empty-reduction/rank-downstream"] = rank_quirk_downstream
    out["empty-reduction/static-axis-keepdims0"] = empty_reduction_static_axis
    out["empty-reduction/shape-downstream"] = quirk_shape_downstream
    out["empty-reduction/gather-nd-rank"] = quirk_rank_through_gather_nd
    out["reduction-extent/expanded-scalar"] = reduce_of_expanded_scalar
    out["plan-time-value/failing-node-read-through-shape"] = failing_node_read_through_shape
    out["plan-time-value/checked-kernel-read-through-shape"] = checked_kernel_read_through_shape
    out["plan-time-value/empty-gather"] = empty_gather
    out["plan-time-value/shape-of-reshape"] = shape_of_reshape
    out["scalar-input/rank-0"] = scalar_input
    for op in ("Min", "Max", "Clip"):
        out[f"int64-order/{op}"] = lambda o=op: int64_order(o)
    out["int64-order/scalar-Min"] = int64_order_scalar
    out["int64-order/Sign"] = int64_sign
    for op in ("ReduceMin", "ReduceMax"):
        out[f"int64-order/{op}-all"] = lambda o=op: int64_reduce_order(o, None)
        out[f"int64-order/{op}-rows"] = lambda o=op: int64_reduce_order(o, [1])
    for to, name in ((I64, "int64"), (I32, "int32"), (TensorProto.INT16, "int16"), (TensorProto.INT8, "int8"),
                     (TensorProto.UINT32, "uint32"), (TensorProto.UINT16, "uint16"), (TensorProto.UINT8, "uint8")):
        for regime in ("extreme", "special", "wide"):
            out[f"float-to-int/{name}-{regime}"] = lambda t=to, r=regime: float_to_int(t, r)
    return out


REGRESSIONS = _all()  # id -> () -> Regression (built on demand)
# One model per class, for the sanitizer runs.
SANITIZER_SUBSET = ("gather-scalar-index/0", "gather-scalar-index/2", "scatternd-rows/const-updates",
                    "scatternd-rows/data-updates", "int-extremes/int64 [MAX-1, MAX, MIN]-concat-column",
                    "slice-steps/-1:-9223372036854775808:-9223372036854775808", "reshape-empty/[0, -1]-allowzero0",
                    "broadcast-symbols/same-axis", "empty-reduction/static-axis-keepdims0")
