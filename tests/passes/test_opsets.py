"""Opsets: the range evonnx optimizes is onnxruntime's, and a node whose definition is newer than those evonnx
implements is left to onnxruntime."""

from __future__ import annotations

import onnx
import onnx_graphsurgeon as gs
import onnxruntime as ort
from onnx import TensorProto, helper

from evonnx.model import OPSET_MIN, REVIEWED_OPSET, ir_version_for, opset_max
from evonnx.passes.analyze import analyze
from evonnx.passes.lazy import Reject


def _graph(opset: int) -> gs.Graph:
    nodes = [helper.make_node("Mod", ["a", "b"], ["m"], name="mod"), helper.make_node("Neg", ["m"], ["y"], name="neg")]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info(n, TensorProto.INT64, ["N"]) for n in "ab"],
                          [helper.make_tensor_value_info("y", TensorProto.INT64, ["N"])])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)], ir_version=ir_version_for(opset))
    return gs.import_onnx(onnx.shape_inference.infer_shapes(model))


def test_opset_max_is_what_onnxruntime_loads() -> None:
    newest = opset_max()
    assert OPSET_MIN < newest <= onnx.defs.onnx_opset_version()
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])
    g = helper.make_graph([helper.make_node("Neg", ["x"], ["y"])], "g", [x], [y])
    so = ort.SessionOptions()
    so.log_severity_level = 4
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", newest)], ir_version=ir_version_for(newest))
    ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])


def test_a_definition_newer_than_reviewed_is_left_to_onnxruntime() -> None:
    # Mod-13 up to opset 27; Mod-28 (newer than REVIEWED_OPSET) must not be lowered with Mod-13's semantics
    assert REVIEWED_OPSET < 28
    an = analyze(_graph(REVIEWED_OPSET), REVIEWED_OPSET)
    assert isinstance(an.lowered["mod"], list)
    an = analyze(_graph(28), 28)
    assert isinstance(an.lowered["mod"], Reject) and "Mod-28" in an.lowered["mod"].reason
    assert isinstance(an.lowered["neg"], list)  # Neg-13 still is lowered at opset 28
