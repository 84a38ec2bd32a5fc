"""Reductions computed for 8 lanes at once (issue 12): where a reduction's body reads with a stride along the
reduced axis but contiguously along a loop of the element (RetinaNet's max over 80 classes 6400 floats apart, a
softmax over channels), the kernel runs the reduction's loop outside and a vectorised loop over 8 adjacent
elements inside, one accumulator per lane (`schedule.lane_axis`, `cprint.lane_reduce`). Every reduction kind must
keep onnxruntime's result: NaN at element 0 and later, ties, -inf, blocks cut at the edge (a short last block runs
as a whole one moved back to end at the edge, storing only its own lanes), empty axes, the lane
loop inner or outer, reductions nested in reductions, and per-row reductions feeding every element of a row."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

import evonnx
from evonnx.expr import Load, Op, Reduce
from evonnx.index import Poly, Sym, var
from evonnx.kernels.schedule import lane_axis

pytestmark = pytest.mark.compiler

C = 12
SHAPES = [(1, 3, 8), (2, 2, 9), (1, 4, 17), (1, 1, 1), (1, 5, 7), (0, 3, 8), (1, 0, 4), (1, 2, 16)]


def _model(tmp_path: Path, nodes: list[onnx.NodeProto], out_shape: list[str | int], dtype: int = TensorProto.FLOAT,
           out_dtype: int | None = None) -> Path:
    x = helper.make_tensor_value_info("x", dtype, ["N", C, "H", "W"])
    y = helper.make_tensor_value_info("y", out_dtype or dtype, out_shape)
    graph = helper.make_graph(nodes, "g", [x], [y])
    path = tmp_path / "m.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=8), str(path))
    return path


def _nhwc(then: onnx.NodeProto) -> list[onnx.NodeProto]:
    return [helper.make_node("Transpose", ["x"], ["t"], perm=[0, 2, 3, 1]), then]


def _nwhc(then: onnx.NodeProto) -> list[onnx.NodeProto]:
    return [helper.make_node("Transpose", ["x"], ["t"], perm=[0, 3, 2, 1]), then]


def _floats(shape: tuple[int, ...], rng: np.random.Generator) -> np.ndarray:
    """Values with ties, infinities and NaN both at element 0 of the reduced axis (C) and after it."""
    x = np.round(rng.standard_normal(shape) * 3, 1).astype(np.float32)
    if x.size:
        flat = x.reshape(-1)
        k = rng.choice(flat.size, size=max(1, flat.size // 9), replace=False)
        flat[k[: len(k) // 3]] = -np.inf
        flat[k[len(k) // 3: 2 * len(k) // 3]] = np.inf
        x[:, 0, 0, :1] = np.nan  # NaN at element 0 of the reduced axis
        x[:, 2, -1, -1:] = np.nan  # NaN after it
    return x


CASES: dict[str, tuple[Callable[[], list[onnx.NodeProto]], list[str | int], str, int, int | None, bool]] = {
    # name: (nodes, output shape, lane loop, input dtype, output dtype, exact)
    "max, lanes inner": (lambda: _nhwc(helper.make_node("ReduceMax", ["t", "ax"], ["y"], keepdims=0)),
                         ["N", "H", "W"], "j", TensorProto.FLOAT, None, True),
    "min, lanes outer": (lambda: _nwhc(helper.make_node("ReduceMin", ["t", "ax"], ["y"], keepdims=0)),
                         ["N", "W", "H"], "w", TensorProto.FLOAT, None, True),
    "argmax last index": (lambda: _nhwc(helper.make_node("ArgMax", ["t"], ["y"], axis=3, keepdims=0,
                                                         select_last_index=1)),
                          ["N", "H", "W"], "j", TensorProto.FLOAT, TensorProto.INT64, True),
    "argmin first index": (lambda: _nwhc(helper.make_node("ArgMin", ["t"], ["y"], axis=3, keepdims=0)),
                           ["N", "W", "H"], "w", TensorProto.FLOAT, TensorProto.INT64, True),
    "int32 max": (lambda: _nhwc(helper.make_node("ReduceMax", ["t", "ax"], ["y"], keepdims=0)),
                  ["N", "H", "W"], "j", TensorProto.INT32, None, True),
    "sum": (lambda: _nwhc(helper.make_node("ReduceSum", ["t", "ax"], ["y"], keepdims=0)),
            ["N", "W", "H"], "w", TensorProto.FLOAT, None, False),
    "per-row max feeding its row, lanes outer": (
        lambda: [helper.make_node("Transpose", ["x"], ["t"], perm=[0, 2, 3, 1]),
                 helper.make_node("ReduceMax", ["t", "ax"], ["m"], keepdims=1),
                 helper.make_node("Sub", ["t", "m"], ["y"])],
        ["N", "H", "W", C], "w", TensorProto.FLOAT, None, True),
    "a max nested in a sum (log-sum-exp)": (
        lambda: [helper.make_node("Constant", [], ["c1"], value=onnx.numpy_helper.from_array(np.array([1], np.int64))),
                 helper.make_node("Neg", ["x"], ["n"]),
                 helper.make_node("ReduceLogSumExp", ["n", "c1"], ["y"], keepdims=0)],
        ["N", "H", "W"], "j", TensorProto.FLOAT, None, False),
}


@pytest.mark.parametrize("name", list(CASES))
def test_lane_reductions_match_onnxruntime(tmp_path: Path, name: str) -> None:
    make, out_shape, lane, dtype, out_dtype, exact = CASES[name]
    nodes = make()
    if any("ax" in n.input for n in nodes):
        nodes.insert(0, helper.make_node("Constant", [], ["ax"], value=onnx.numpy_helper.from_array(
            np.array([3], np.int64))))
    src = _model(tmp_path, nodes, out_shape, dtype, out_dtype)
    dump = tmp_path / "dump"
    # the greedy planner: what is tested is the code of a fused reduction, not whether the cost model fuses it
    evonnx.optimize(src, tmp_path / "m.opt.onnx", dump_dir=dump, guard=False, planner="greedy")
    assert f"reductions for 8 lanes of {lane}<" in (dump / "kernels.c").read_text()
    ref = ort.InferenceSession(str(src), providers=["CPUExecutionProvider"])
    for threads in (1, 2):
        so = ort.SessionOptions()
        so.intra_op_num_threads = threads
        opt = evonnx.load_session(tmp_path / "m.opt.onnx", sess_options=so)
        rng = np.random.default_rng(threads)
        for n, h, w in SHAPES:
            shape = (n, C, h, w)
            x = (_floats(shape, rng) if dtype == TensorProto.FLOAT
                 else rng.integers(-5, 5, size=shape).astype(np.int32))
            (want,) = ref.run(None, {"x": x})
            (got,) = opt.run(None, {"x": x})
            msg = f"{name}: shape {shape}, {threads} thread(s)"
            if exact:
                np.testing.assert_array_equal(got, want, err_msg=msg)
            else:
                np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6, err_msg=msg)


def test_lane_axis_takes_a_loop_read_contiguously_by_a_strided_reduction() -> None:
    hw, w = Poly.of(Sym("HW")), var("w", Poly.of(64))
    a, k = var("a", Poly.of(9)), var("k", Poly.of(80))
    strided = Reduce("max", k, Load(0, k * hw + a * 80 * hw + w, "float32"), "float32")
    assert lane_axis([w], a, [strided]) == w.atom()  # the inner loop a reads 80*HW apart; w contiguously
    contiguous = Reduce("max", k, Load(0, w * 80 + k, "float32"), "float32")
    assert lane_axis([w], a, [contiguous]) is None  # the reduced axis is contiguous: its own simd loop is best
    gathered = Reduce("sum", k, Load(0, k * hw + w * 2, "float32"), "float32")
    assert lane_axis([w], a, [gathered]) is None  # no loop reads it contiguously
    short = var("v", Poly.of(4))
    assert lane_axis([short], a, [Reduce("max", k, Load(0, k * hw + short, "float32"), "float32")]) is None
    guarded = Op("where", (Op("lt", (Load(1, w, "float32"), Load(1, w, "float32")), "bool"), strided,
                          Load(0, w, "float32")), "float32", "guard")
    assert lane_axis([w], a, [guarded]) is None  # a reduction under a guarded select runs per element


def test_a_reduction_over_two_axes_is_not_computed_ahead_on_lanes(tmp_path: Path) -> None:
    """ReduceMin over (C, H) is a reduction over H inside one over C that reads C: it must stay inside the outer
    loop (lanes would compute it ahead, where C is not bound: fuzz seed 170011 ended in a KeyError)."""
    nodes = [helper.make_node("Neg", ["x"], ["n"]),
             helper.make_node("Constant", [], ["ax"], value=onnx.numpy_helper.from_array(np.array([1, 2], np.int64))),
             helper.make_node("ReduceMin", ["n", "ax"], ["y"], keepdims=0)]
    src = _model(tmp_path, nodes, ["N", "W"])
    evonnx.optimize(src, tmp_path / "m.opt.onnx", guard=False, planner="greedy")
    x = _floats((2, C, 3, 17), np.random.default_rng(0))
    (want,) = ort.InferenceSession(str(src), providers=["CPUExecutionProvider"]).run(None, {"x": x})
    (got,) = evonnx.load_session(tmp_path / "m.opt.onnx").run(None, {"x": x})
    np.testing.assert_array_equal(got, want)
