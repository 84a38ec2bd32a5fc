"""Fusion plans on random graphs are legal (issue 4): for both planners, no cycle in the graph of fused groups,
only lowerable nodes fused, and the optimized model computes what onnxruntime computes on the original (every
dependence respected). The graphs mix elementwise ops, broadcasts, reductions and opaque nodes (CumSum, which
evonnx leaves to onnxruntime) so that fusing across an opaque node would create a cycle."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

import evonnx
from evonnx.model import load_model
from evonnx.passes.pipeline import run_pipeline

pytestmark = pytest.mark.compiler
SHAPE = (4, 8)


@st.composite
def random_graphs(draw: st.DrawFn) -> onnx.ModelProto:
    nodes: list[onnx.NodeProto] = []
    inits = [numpy_helper.from_array(np.array([1], np.int64), "axis1"),
             numpy_helper.from_array(np.array(1, np.int64), "axis1s"),
             numpy_helper.from_array(np.array(0.5, np.float32), "half")]
    full = ["x", "y"]  # tensors of SHAPE
    rows: list[str] = []  # tensors of (4, 1)
    for k in range(draw(st.integers(3, 14))):
        out = f"t{k}"
        kind = draw(st.sampled_from(["binary", "unary", "reduce", "broadcast", "opaque", "scale"]))
        if kind == "binary":
            a, b = draw(st.sampled_from(full)), draw(st.sampled_from(full))
            nodes.append(helper.make_node(draw(st.sampled_from(["Add", "Mul", "Sub", "Max"])), [a, b], [out]))
            full.append(out)
        elif kind == "unary":
            nodes.append(helper.make_node(draw(st.sampled_from(["Relu", "Neg", "Abs", "Sigmoid"])),
                                          [draw(st.sampled_from(full))], [out]))
            full.append(out)
        elif kind == "scale":
            nodes.append(helper.make_node("Mul", [draw(st.sampled_from(full)), "half"], [out]))
            full.append(out)
        elif kind == "reduce":
            op = draw(st.sampled_from(["ReduceSum", "ReduceMax"]))
            nodes.append(helper.make_node(op, [draw(st.sampled_from(full)), "axis1"], [out], keepdims=1))
            rows.append(out)
        elif kind == "broadcast" and rows:
            nodes.append(helper.make_node("Mul", [draw(st.sampled_from(full)), draw(st.sampled_from(rows))], [out]))
            full.append(out)
        else:
            nodes.append(helper.make_node("CumSum", [draw(st.sampled_from(full)), "axis1s"], [out]))
            full.append(out)
    consumed = {i for n in nodes for i in n.input}
    outs = [t for t in full[2:] + rows if t not in consumed] or [full[-1]]
    graph = helper.make_graph(
        nodes, "random",
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, list(SHAPE)) for n in ("x", "y")],
        [helper.make_tensor_value_info(o, TensorProto.FLOAT, list(SHAPE) if o in full else [SHAPE[0], 1])
         for o in outs], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=8)


def _group_graph_is_acyclic(model: onnx.ModelProto, groups: list[set[str]]) -> bool:
    unit = {n.name: n.name for n in model.graph.node}
    for k, g in enumerate(groups):
        for name in g:
            unit[name] = f"group{k}"
    producer = {o: n.name for n in model.graph.node for o in n.output}
    succ: dict[str, set[str]] = {}
    for n in model.graph.node:
        for i in n.input:
            p = producer.get(i)
            if p is not None and unit[p] != unit[n.name]:
                succ.setdefault(unit[p], set()).add(unit[n.name])
    state: dict[str, int] = {}

    def visit(u: str) -> bool:
        state[u] = 1
        for v in succ.get(u, ()):
            if state.get(v) == 1 or (v not in state and not visit(v)):
                return False
        state[u] = 2
        return True

    return all(visit(u) for u in set(unit.values()) if u not in state)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(random_graphs(), st.sampled_from(["greedy", "search"]))
def test_plan_legality_random_graphs(tmp_path_factory: pytest.TempPathFactory, model: onnx.ModelProto,
                                     planner: str) -> None:
    d = tmp_path_factory.mktemp("plan")
    src = d / "m.onnx"
    onnx.save(model, str(src))
    loaded = load_model(src)
    result = run_pipeline(loaded, planner=planner)
    groups = [set(g.nodes) for g in result.plan.groups]
    assert _group_graph_is_acyclic(loaded, groups)
    for g in result.plan.groups:
        for name in g.nodes:
            assert isinstance(result.analysis.lowered[name], list), f"{name} fused but not lowerable"
        assert "CumSum" not in g.ops
    out = evonnx.optimize(src, d / "m.opt.onnx", planner=planner)  # runs the onnxruntime check itself
    feeds = {n: np.random.default_rng(3).standard_normal(SHAPE).astype(np.float32) for n in ("x", "y")}
    ref = ort.InferenceSession(str(src), providers=["CPUExecutionProvider"]).run(None, feeds)
    got = evonnx.load_session(out.output).run(None, feeds)
    for r, g_ in zip(ref, got):
        np.testing.assert_allclose(g_, r, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("planner", ["greedy", "search"])
def test_a_view_of_a_value_read_outside_is_left_to_onnxruntime(tmp_path_factory: pytest.TempPathFactory,
                                                               planner: str) -> None:
    """An mmdetection head: a Sigmoid of a transposed score map is read by a node left to onnxruntime and,
    through a Flatten, by the graph's output. Fused, the Flatten would make the kernel write the same values twice;
    it stays with onnxruntime (an alias of the kernel's output), and the result is unchanged."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16, 6, 10])
    nodes = [helper.make_node("Transpose", ["x"], ["t"], "transpose", perm=[0, 2, 3, 1]),
             helper.make_node("Reshape", ["t", "shape"], ["r"], "reshape"),
             helper.make_node("Sigmoid", ["r"], ["s"], "sigmoid"),
             helper.make_node("CumSum", ["s", "axis"], ["m"], "cumsum"),
             helper.make_node("Flatten", ["s"], ["f"], "flatten", axis=2),
             helper.make_node("Unsqueeze", ["f", "zero"], ["y"], "unsqueeze")]
    inits = [numpy_helper.from_array(np.array([1, -1, 8], np.int64), "shape"),
             numpy_helper.from_array(np.array([0], np.int64), "zero"),
             numpy_helper.from_array(np.array(2, np.int64), "axis")]
    outs = [helper.make_tensor_value_info("m", TensorProto.FLOAT, [1, 120, 8]),
            helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 120, 8])]
    model = helper.make_model(helper.make_graph(nodes, "g", [x], outs, inits),
                              opset_imports=[helper.make_opsetid("", 13)], ir_version=8)
    result = run_pipeline(model, planner=planner)
    ops = {op for grp in result.plan.groups for op in grp.ops}
    assert "Sigmoid" in ops and "Flatten" not in ops and "Unsqueeze" not in ops, result.plan.groups
    assert [len(spec.outputs) for spec in result.specs] == [1]
    tmp = tmp_path_factory.mktemp("views")
    src = tmp / "m.onnx"
    onnx.save(model, str(src))
    evonnx.optimize(src, tmp / "m.opt.onnx", guard=False, planner=planner)
    feeds = {"x": np.random.default_rng(0).standard_normal((1, 16, 6, 10)).astype(np.float32)}
    want = ort.InferenceSession(str(src), providers=["CPUExecutionProvider"]).run(None, feeds)
    got = evonnx.load_session(tmp / "m.opt.onnx").run(None, feeds)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-6, atol=1e-7)
