"""Min/Max whose zero sign reaches a divisor stay with onnxruntime (passes/zero_signs.py, fuzz case 359)."""

from __future__ import annotations

import numpy as np
import onnx
import onnx_graphsurgeon as gs
from onnx import TensorProto, helper, numpy_helper

from evonnx.passes.analyze import analyze
from evonnx.passes.lazy import naming
from evonnx.passes.zero_signs import zero_sign_leaves


def _leaves(nodes: list[onnx.NodeProto], dtype: int = TensorProto.FLOAT) -> set[str]:
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", dtype, ["N", 4])],
                              [helper.make_tensor_value_info("y", dtype, None)],
                              [numpy_helper.from_array(np.ones(4, helper.tensor_dtype_to_np_dtype(dtype)), "c")])
    model = onnx.shape_inference.infer_shapes(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]))
    g = gs.import_onnx(model)
    with naming():
        return set(zero_sign_leaves(g, analyze(g, 18)))


def mk(op: str, ins: list[str], out: str, **kw: object) -> onnx.NodeProto:
    return helper.make_node(op, ins, [out], name=out, **kw)


def test_a_min_reaching_a_divisor_through_carrying_nodes_is_left() -> None:
    assert _leaves([mk("Min", ["x", "c"], "m"), mk("Neg", ["m"], "n"), mk("Reshape", ["n", "s"], "r"),
                    helper.make_node("Constant", [], ["s"], value=numpy_helper.from_array(np.array([-1], np.int64))),
                    mk("Div", ["c", "r"], "y")]) == {"m"}
    assert _leaves([mk("ReduceMax", ["x"], "m", keepdims=1), mk("Reciprocal", ["m"], "y")]) == {"m"}
    assert _leaves([mk("Max", ["x", "c"], "m"), mk("Pow", ["m", "c"], "y")]) == {"m"}


def test_a_min_whose_zero_sign_is_lost_or_only_divided_stays_fusible() -> None:
    assert not _leaves([mk("Min", ["x", "c"], "m"), mk("Abs", ["m"], "a"), mk("Div", ["c", "a"], "y")])
    assert not _leaves([mk("Min", ["x", "c"], "m"), mk("Less", ["m", "c"], "l"),
                        mk("Cast", ["l"], "f", to=TensorProto.FLOAT), mk("Div", ["c", "f"], "y")])
    assert not _leaves([mk("Min", ["x", "c"], "m"), mk("Div", ["m", "c"], "y")])  # the dividend: a zero result
    assert not _leaves([mk("Min", ["x", "c"], "m"), mk("Div", ["c", "m"], "y")], TensorProto.INT64)
