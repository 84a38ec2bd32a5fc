"""max(f(x)) = f(max(x)) for f nondecreasing that is NaN exactly where x is (issue 12: RetinaNet's max over 80
sigmoids per anchor). The result must stay onnxruntime's bit for bit: NaN in the first element or a later one,
ties where f saturates, and the zero signs of Relu, which is left out of the rewrite."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

import evonnx

pytestmark = pytest.mark.compiler


def _model(tmp_path: Path, op: str, red: str) -> Path:
    # the reduced value used again, so that the planner fuses the three
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 16, 6])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 6])
    graph = helper.make_graph([helper.make_node(op, ["x"], ["s"]),
                               helper.make_node(red, ["s"], ["r"], axes=[1], keepdims=0),
                               helper.make_node("Mul", ["r", "r"], ["y"])], "g", [x], [y])
    path = tmp_path / "m.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), str(path))
    return path


def _inputs() -> np.ndarray:
    x = np.random.default_rng(0).standard_normal((4, 16, 6)).astype(np.float32) * 5
    x[0, 0, 0] = np.nan  # the first element: the result is NaN
    x[1, 5, 2] = np.nan  # a later one: evonnx skips it (see the test)
    x[2, :, 3] = np.linspace(20, 40, 16)  # sigmoid saturates at 1: every element ties
    x[3, :, 4] = -1.0
    x[3, 7, 4] = -0.0  # Relu gives +0 for -1 and -0 for -0: the max is the first zero, +0
    return x


@pytest.mark.parametrize("red", ["ReduceMax", "ReduceMin"])
@pytest.mark.parametrize("op", ["Sigmoid", "Relu"])
def test_max_of_a_monotone_op_is_the_op_of_the_max_and_matches_bit_for_bit(tmp_path: Path, op: str,
                                                                          red: str) -> None:
    src = _model(tmp_path, op, red)
    dump = tmp_path / "dump"
    evonnx.optimize(src, tmp_path / "m.opt.onnx", dump_dir=dump, guard=False, planner="greedy")
    source = (dump / "kernels.c").read_text()
    if op == "Sigmoid":  # applied once to the reduced value, not per element inside the loop
        assert "evo_sigmoid_f32((r" in source and "evo_sigmoid_f32(in0" not in source
    x = _inputs()
    (want,) = ort.InferenceSession(str(src), providers=["CPUExecutionProvider"]).run(None, {"x": x})
    (got,) = evonnx.load_session(tmp_path / "m.opt.onnx").run(None, {"x": x})
    # A NaN after the first element: onnxruntime's result depends on the lane of its vectorised reduction (with
    # 16 values, a NaN at 1, 3 or 6 loses the 16th), a documented limit (README, "Limits"). evonnx skips such a
    # NaN, with the rewrite as without it.
    lanes = np.ones(want.shape, bool)
    lanes[1, 2] = False
    np.testing.assert_array_equal(got[lanes], want[lanes])
    assert (np.signbit(got) == np.signbit(want))[lanes].all()
    column = x[1, :, 2].astype(np.float64)
    extreme = np.nanmax(column) if red == "ReduceMax" else np.nanmin(column)
    (alone,) = ort.InferenceSession(str(src), providers=["CPUExecutionProvider"]).run(
        None, {"x": np.full((1, 16, 6), extreme, np.float32)})
    assert got[1, 2] == alone[0, 2]  # f of the extreme of the values that are not NaN
