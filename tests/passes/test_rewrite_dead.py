"""Which unread nodes the optimized model keeps (passes/rewrite.py): onnxruntime runs a node that nothing reads, so
a node left to it that can fail stays, but not one that onnxruntime's own folding removes from the original.
`_removed_by_onnxruntime` models that folding; each case here pins it against onnxruntime itself (the nodes of
its ORT_ENABLE_BASIC write-back)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnx_graphsurgeon as gs
import onnxruntime as ort
import pytest
from onnx import TensorProto as T
from onnx import helper

import evonnx
from evonnx.model import load_model
from evonnx.passes.rewrite import _removed_by_onnxruntime

CASES = {
    # a Shape of a static shape is folded, and what only it read is dropped
    "neg_shape_static": ([("Neg", ["x"], ["t"], {}), ("Shape", ["t"], ["s"], {})], [2, 3]),
    "neg_relu_shape_static": ([("Neg", ["x"], ["t"], {}), ("Relu", ["t"], ["u"], {}), ("Shape", ["u"], ["s"], {})],
                              [2, 3]),
    "neg_reducemax_shape": ([("Neg", ["x"], ["t"], {}), ("ReduceMax", ["t"], ["u"], {"keepdims": 1}),
                             ("Shape", ["u"], ["s"], {})], ["M", 3]),
    "shape_of_shape": ([("Neg", ["x"], ["t"], {}), ("Shape", ["t"], ["u"], {"start": -1}), ("Shape", ["u"], ["s"], {})],
                       ["M"]),
    # not a Shape of a partly symbolic shape, whatever part it takes, nor a Size
    "shape_start_partial": ([("Neg", ["x"], ["t"], {}), ("Shape", ["t"], ["s"], {"start": 1})], ["M", 3]),
    "size_static": ([("Neg", ["x"], ["t"], {}), ("Size", ["t"], ["s"], {})], [2, 3]),
    # a node read by one that nothing reads is kept
    "partly_dead": ([("Neg", ["x"], ["t"], {}), ("ReduceMax", ["t"], ["u"], {"keepdims": 1}),
                     ("Relu", ["u"], ["dead"], {}), ("Shape", ["u"], ["s"], {})], [2, 3]),
}


def _model(nodes: list, shape: list) -> onnx.ModelProto:
    made = [helper.make_node(op, ins, outs, name=f"n{k}", **attrs) for k, (op, ins, outs, attrs) in enumerate(nodes)]
    graph = helper.make_graph(made, "g", [helper.make_tensor_value_info("x", T.FLOAT, shape)],
                              [helper.make_tensor_value_info("s", T.INT64, None)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=8)


@pytest.mark.parametrize("case", sorted(CASES))
def test_removed_nodes_are_the_ones_onnxruntime_removes(case: str, tmp_path: Path) -> None:
    model = _model(*CASES[case])
    path = tmp_path / "m.onnx"
    onnx.save(model, str(path))
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    so.optimized_model_filepath = str(tmp_path / "ort.onnx")
    so.log_severity_level = 3
    ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
    runs = {n.name for n in onnx.load(str(tmp_path / "ort.onnx")).graph.node}
    g = gs.import_onnx(load_model(path))
    g.toposort()
    removed = _removed_by_onnxruntime(g)
    assert removed == {n.name for n in model.graph.node} - runs, case


def test_a_failing_node_onnxruntime_drops_is_not_kept(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The class of fuzz case 595: a float16 ScatterElements with a reduction (which onnxruntime's CPU kernel
    cannot run) read only through Shape(start=-1) -> Shape, beside a fused chain. onnxruntime drops the
    ScatterElements from the original; the optimized model must not run it. Planned on the model as written (as
    where onnxruntime's rewrite cannot be planned on: case 595 had an If beside float16 tensors)."""
    monkeypatch.setenv("EVONNX_ORT_FOLD", "0")
    nodes = [helper.make_node("ScatterElements", ["h", "i", "u"], ["t"], axis=-1, reduction="add"),
             helper.make_node("Shape", ["t"], ["s1"], start=-1), helper.make_node("Shape", ["s1"], ["s2"]),
             helper.make_node("ConstantOfShape", ["s2"], ["c"]),
             helper.make_node("Neg", ["x"], ["n"]), helper.make_node("Exp", ["n"], ["e"]),
             helper.make_node("Add", ["e", "c"], ["y"])]
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("h", T.FLOAT16, ["M"]),
                     helper.make_tensor_value_info("x", T.FLOAT, ["N"])],
        [helper.make_tensor_value_info("y", T.FLOAT, ["N"])],
        [onnx.numpy_helper.from_array(np.array([-1], np.int64), "i"),
         onnx.numpy_helper.from_array(np.array([1.5], np.float16), "u")])
    src = tmp_path / "m.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=8), str(src))
    res = evonnx.optimize(src, tmp_path / "m.opt.onnx", guard=False)
    assert res.kernels, "the Neg -> Exp -> Add chain is fused"
    assert "ScatterElements" not in {n.op_type for n in onnx.load(str(tmp_path / "m.opt.onnx")).graph.node}
    feeds = {"h": np.ones(3, np.float16), "x": np.linspace(-2, 2, 5).astype(np.float32)}
    want = ort.InferenceSession(str(src), providers=["CPUExecutionProvider"]).run(None, feeds)
    got = evonnx.load_session(tmp_path / "m.opt.onnx").run(None, feeds)
    np.testing.assert_allclose(got[0], want[0], rtol=1e-6)
