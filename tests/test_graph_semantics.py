"""Graph semantics as onnxruntime's (issue 16): inputs that have a default (an initializer of the same name, IR 4 and
later) stay inputs a user may feed; the check feeds them, with their default and with another value."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import evonnx

pytestmark = pytest.mark.compiler

F = TensorProto.FLOAT


def _model(ir_version: int, every_initializer_an_input: bool) -> onnx.ModelProto:
    # y = |(-x) * w + b|: w is an input with a default; b an initializer that is an input only in IR 3 style
    nodes = [helper.make_node("Neg", ["x"], ["n"]), helper.make_node("Mul", ["n", "w"], ["m"]),
             helper.make_node("Add", ["m", "b"], ["a"]), helper.make_node("Abs", ["a"], ["y"])]
    inits = [numpy_helper.from_array(np.array([2.0, -1.0], np.float32), "w"),
             numpy_helper.from_array(np.array([0.5, 0.25], np.float32), "b")]
    inputs = [helper.make_tensor_value_info("x", F, ["N", 2]), helper.make_tensor_value_info("w", F, [2])]
    if every_initializer_an_input:
        inputs.append(helper.make_tensor_value_info("b", F, [2]))
    graph = helper.make_graph(nodes, "g", inputs, [helper.make_tensor_value_info("y", F, ["N", 2])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=ir_version)


@pytest.mark.parametrize("ir_version,every", [(8, False), (4, True)], ids=["one-default", "all-defaults"])
def test_inputs_with_a_default_stay_inputs(tmp_path: Path, ir_version: int, every: bool) -> None:
    src = tmp_path / "m.onnx"
    onnx.save(_model(ir_version, every), str(src))
    result = evonnx.optimize(src, tmp_path / "m.opt.onnx")
    assert len(result.kernels) == 1  # still fused: the defaults are read at run time
    optimized = onnx.load(str(tmp_path / "m.opt.onnx"))
    defaults = {"w", "b"} if every else {"w"}
    assert defaults <= {i.name for i in optimized.graph.input}
    assert defaults <= {t.name for t in optimized.graph.initializer}
    so = ort.SessionOptions()
    so.log_severity_level = 4
    plain = ort.InferenceSession(str(src), so, providers=["CPUExecutionProvider"])
    fused = evonnx.load_session(tmp_path / "m.opt.onnx")
    x = np.arange(6, dtype=np.float32).reshape(3, 2) - 2.5
    feeds: list[dict[str, np.ndarray]] = [{"x": x}, {"x": x, "w": np.array([-3.0, 0.5], np.float32)}]
    if every:
        feeds.append({"x": x, "b": np.array([7.0, -7.0], np.float32)})
    for f in feeds:
        np.testing.assert_array_equal(fused.run(None, f)[0], plain.run(None, f)[0])


def test_before_ir4_initializers_listed_as_inputs_are_constants(tmp_path: Path) -> None:
    # onnxruntime does not let a Run feed them (IR < 4 required every initializer to be an input): evonnx folds
    # them like any constant, and the optimized model takes the same inputs as the original
    src = tmp_path / "m.onnx"
    onnx.save(_model(3, True), str(src))
    evonnx.optimize(src, tmp_path / "m.opt.onnx")
    so = ort.SessionOptions()
    so.log_severity_level = 4
    plain = ort.InferenceSession(str(src), so, providers=["CPUExecutionProvider"])
    fused = evonnx.load_session(tmp_path / "m.opt.onnx")
    assert [i.name for i in fused.get_inputs()] == [i.name for i in plain.get_inputs()] == ["x"]
    x = np.arange(6, dtype=np.float32).reshape(3, 2) - 2.5
    np.testing.assert_array_equal(fused.run(None, {"x": x})[0], plain.run(None, {"x": x})[0])


# -- tensors captured by subgraph bodies ------------------------------------------------------------------------
def _body(name: str, nodes: list[onnx.NodeProto], inputs: list[onnx.ValueInfoProto],
          outputs: list[onnx.ValueInfoProto], inits: dict[str, np.ndarray] | None = None) -> onnx.GraphProto:
    return helper.make_graph(nodes, name, inputs, outputs,
                             [numpy_helper.from_array(v, k) for k, v in (inits or {}).items()])


def _captures(kind: str) -> onnx.ModelProto:
    """x -> Neg -> Abs (b) -> Sigmoid (c), fused; b and c are read only inside `kind`'s bodies (If: nested two
    deep), plus z = b * b in the main graph, so that the kernel exists and must still give b and c."""
    vi = helper.make_tensor_value_info
    main = [helper.make_node("Neg", ["x"], ["a"]), helper.make_node("Abs", ["a"], ["b"]),
            helper.make_node("Sigmoid", ["b"], ["c"]), helper.make_node("Mul", ["b", "b"], ["z"])]
    inputs = [vi("x", F, [3])]
    if kind == "If":
        inner = _body("inner", [helper.make_node("Mul", ["b", "two"], ["i_out"])], [], [vi("i_out", F, [3])],
                      {"two": np.array(2.0, np.float32)})
        then = _body("then", [helper.make_node("Add", ["c", "one"], ["t_out"])], [], [vi("t_out", F, [3])],
                     {"one": np.array(1.0, np.float32)})
        other = _body("else", [helper.make_node("If", ["cond"], ["e_out"], then_branch=inner, else_branch=inner)],
                      [], [vi("e_out", F, [3])])
        main.append(helper.make_node("If", ["cond"], ["y"], then_branch=then, else_branch=other))
        inputs.append(vi("cond", TensorProto.BOOL, []))
    elif kind == "Loop":  # v <- v * c + b, twice
        body = _body("body", [helper.make_node("Identity", ["cond_in"], ["cond_out"]),
                              helper.make_node("Mul", ["v_in", "c"], ["m"]),
                              helper.make_node("Add", ["m", "b"], ["v_out"])],
                     [vi("i", TensorProto.INT64, []), vi("cond_in", TensorProto.BOOL, []), vi("v_in", F, [3])],
                     [vi("cond_out", TensorProto.BOOL, []), vi("v_out", F, [3])])
        main.append(helper.make_node("Loop", ["trips", "", "x"], ["y"], body=body))
        inputs.append(vi("trips", TensorProto.INT64, []))
    else:  # Scan over the rows of s: state <- state + row * c[0]
        body = _body("body", [helper.make_node("Gather", ["c", "zero"], ["c0"], axis=0),
                              helper.make_node("Mul", ["row", "c0"], ["m"]),
                              helper.make_node("Add", ["st_in", "m"], ["st_out"]),
                              helper.make_node("Identity", ["st_out"], ["echo"])],
                     [vi("st_in", F, [2]), vi("row", F, [2])], [vi("st_out", F, [2]), vi("echo", F, [2])],
                     {"zero": np.array(0, np.int64)})
        main.append(helper.make_node("Scan", ["s0", "s"], ["y", "rows"], body=body, num_scan_inputs=1))
        inputs += [vi("s0", F, [2]), vi("s", F, [4, 2])]
    outputs = [vi("y", F, None), vi("z", F, [3])] + ([vi("rows", F, None)] if kind == "Scan" else [])
    graph = helper.make_graph(main, "g", inputs, outputs)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


@pytest.mark.parametrize("kind", ["If", "Loop", "Scan"])
def test_tensors_captured_by_subgraphs_stay(kind: str, tmp_path: Path) -> None:
    model = _captures(kind)
    for o in model.graph.output:  # outputs of unknown shape: the checker wants a shape field
        if not o.type.tensor_type.HasField("shape"):
            o.type.tensor_type.shape.SetInParent()
    src = tmp_path / "m.onnx"
    onnx.save(model, str(src))
    result = evonnx.optimize(src, tmp_path / "m.opt.onnx")  # checks against onnxruntime on the original
    assert len(result.kernels) == 1
    outs = {o.name for o in result.kernels[0].outputs}
    assert ({"c"} if kind == "Scan" else {"b", "c"}) <= outs  # the captured tensors are still produced
    so = ort.SessionOptions()
    so.log_severity_level = 4
    plain = ort.InferenceSession(str(src), so, providers=["CPUExecutionProvider"])
    fused = evonnx.load_session(tmp_path / "m.opt.onnx")
    x = np.array([1.0, -2.0, 3.0], np.float32)
    feeds = {"If": [{"x": x, "cond": np.array(v)} for v in (True, False)],
             "Loop": [{"x": x, "trips": np.array(2, np.int64)}],
             "Scan": [{"x": x, "s0": np.zeros(2, np.float32), "s": np.arange(8, dtype=np.float32).reshape(4, 2)}]}
    for f in feeds[kind]:
        for got, want in zip(fused.run(None, f), plain.run(None, f)):
            np.testing.assert_allclose(got, want, rtol=1e-5)


def test_outputs_without_a_shape_as_graphsurgeon_writes_them(tmp_path: Path) -> None:
    # onnx-graphsurgeon writes an output whose shape is None as a tensor type with no shape field, and so may a
    # hand-built graph: onnxruntime runs such a model, the ONNX checker alone requires the field. evonnx takes it
    # (the checker runs on a copy with an empty shape there), fuses, and matches onnxruntime.
    nodes = [helper.make_node("Neg", ["x"], ["n"]), helper.make_node("Tile", ["n", "r"], ["t"]),
             helper.make_node("Abs", ["t"], ["y"]), helper.make_node("Exp", ["t"], ["z"])]
    outputs = [helper.make_tensor_value_info(o, F, None) for o in ("y", "z")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", F, ["N", 2])], outputs,
                              [numpy_helper.from_array(np.array([2, 3], np.int64), "r")],
                              value_info=[helper.make_tensor_value_info("n", F, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    with pytest.raises(onnx.checker.ValidationError, match="shape"):
        onnx.checker.check_model(model)
    src = tmp_path / "m.onnx"
    onnx.save(model, str(src))
    result = evonnx.optimize(src, tmp_path / "m.opt.onnx")
    assert len(result.kernels) == 1
    so = ort.SessionOptions()
    so.log_severity_level = 4
    plain = ort.InferenceSession(str(src), so, providers=["CPUExecutionProvider"])
    fused = evonnx.load_session(tmp_path / "m.opt.onnx")
    for n in (0, 1, 3):
        x = np.arange(2 * n, dtype=np.float32).reshape(n, 2) - 2.5
        for got, ref in zip(fused.run(None, {"x": x}), plain.run(None, {"x": x})):
            np.testing.assert_array_equal(got, ref)


def test_an_input_without_a_shape_is_checked_at_the_shape_the_user_names(tmp_path: Path) -> None:
    # an input with no shape field (not even a rank) runs in onnxruntime; evonnx plans nothing on it but may fuse
    # past a Reshape to constant dims. The check cannot guess its rank: it asks for --input-shape, nothing written
    nodes = [helper.make_node("Reshape", ["x", "s"], ["r"]), helper.make_node("Transpose", ["r"], ["t"], perm=[1, 0]),
             helper.make_node("Neg", ["t"], ["n"]), helper.make_node("Exp", ["n"], ["y"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", F, None)],
                              [helper.make_tensor_value_info("y", F, None)],
                              [numpy_helper.from_array(np.array([2, 3], np.int64), "s")])
    src = tmp_path / "m.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), str(src))
    dst = tmp_path / "out" / "m.opt.onnx"
    dst.parent.mkdir()
    with pytest.raises(evonnx.VerificationError, match=r"input 'x' has no shape .*--input-shape x="):
        evonnx.optimize(src, dst)
    assert not any(dst.parent.iterdir())
    result = evonnx.optimize(src, dst, shapes={"x": [6]})
    assert len(result.kernels) == 1
    x = np.linspace(-2, 2, 6, dtype=np.float32)
    so = ort.SessionOptions()
    so.log_severity_level = 4
    want = ort.InferenceSession(str(src), so, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_allclose(evonnx.load_session(dst).run(None, {"x": x})[0], want, rtol=1e-6)  # Exp: 1 ulp


def test_a_node_that_runs_only_through_onnxruntimes_rewrite_keeps_its_neighbours(tmp_path: Path) -> None:
    """A float16 ScatterND with reduction min has no kernel in onnxruntime 1.31 ("MLFloat16 data type is not
    supported"). The original runs only through onnxruntime's optimizations: they inline the If of a constant
    condition, and its float16 Casts then take the whole chain, ScatterND included, to float32. evonnx plans on the
    model as written (a rewrite with bodies and those Casts), and with Fused nodes next to the ScatterND the Casts
    stop at them: the optimized model failed where the original runs (fuzz case 1676). The check's failure names the
    node; the kernels next to it go back to onnxruntime, and the model matches."""
    f16 = TensorProto.FLOAT16

    def branch(op: str, *args: str) -> onnx.GraphProto:
        return helper.make_graph([helper.make_node(op, list(args), ["t"])], op, [],
                                 [helper.make_tensor_value_info("t", f16, None)])

    nodes = [helper.make_node("If", ["cond"], ["a"], then_branch=branch("Add", "x", "x"),
                              else_branch=branch("Add", "x", "x")),
             helper.make_node("Slice", ["a", "zero", "three", "zero"], ["s"]),
             helper.make_node("Neg", ["s"], ["u"]),
             helper.make_node("ScatterND", ["a", "rows", "u"], ["w"], reduction="min"),
             helper.make_node("Abs", ["w"], ["b"]), helper.make_node("Neg", ["b"], ["y"]),
             # an If onnxruntime keeps: its rewrite has a body, and evonnx plans on the model as written
             helper.make_node("Size", ["x"], ["n"]), helper.make_node("Greater", ["n", "twenty"], ["big"]),
             helper.make_node("If", ["big"], ["z"], then_branch=branch("Neg", "x"), else_branch=branch("Abs", "x"))]
    consts = [numpy_helper.from_array(np.array(False), "cond"), numpy_helper.from_array(np.array(20), "twenty"),
              numpy_helper.from_array(np.array([0], np.int64), "zero"),
              numpy_helper.from_array(np.array([3], np.int64), "three"),
              numpy_helper.from_array(np.array([[3], [2], [1]], np.int64), "rows")]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", f16, ["N", 4])],
                          [helper.make_tensor_value_info("y", f16, ["N", 4]),
                           helper.make_tensor_value_info("z", f16, ["N", 4])], consts)
    src = tmp_path / "m.onnx"
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)], ir_version=8), src)
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    x = np.arange(20, dtype=np.float16).reshape(5, 4) - 7
    with pytest.raises(Exception, match="MLFloat16 data type is not supported"):
        ort.InferenceSession(str(src), so, providers=["CPUExecutionProvider"]).run(None, {"x": x})
    result = evonnx.optimize(src, tmp_path / "o.onnx", sizes={"N": 5}, guard=False)
    assert result.check is not None and result.check.compared > 0
    ref = ort.InferenceSession(str(src), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    got = evonnx.load_session(tmp_path / "o.onnx").run(None, {"x": x})[0]
    np.testing.assert_array_equal(got, ref)
    assert {"Slice", "Neg", "Abs"} <= {n.op_type for n in onnx.load(tmp_path / "o.onnx").graph.node}


def _old_opset_model(opset: int) -> onnx.ModelProto:
    """Ops whose definitions before opset 13 take attributes (Unsqueeze, Squeeze and Split axes and sizes, Slice-1's
    bounds before opset 10) or mean something else (Softmax before 13 normalises over every dim after its axis,
    the input flattened into 2-D there), around fusable arithmetic."""
    f32 = TensorProto.FLOAT
    if opset >= 10:
        sliced = [helper.make_node("Slice", ["u", "s0", "s1", "s2"], ["sl"])]
        consts = [numpy_helper.from_array(np.array(v, np.int64), n) for n, v in
                  (("s0", [1]), ("s1", [4]), ("s2", [3]))]
    else:
        sliced = [helper.make_node("Slice", ["u"], ["sl"], starts=[1], ends=[4], axes=[3])]
        consts = []
    nodes = [helper.make_node("Neg", ["x"], ["n"]), helper.make_node("Unsqueeze", ["n"], ["u"], axes=[0, 3]),
             *sliced, helper.make_node("Squeeze", ["sl"], ["q"], axes=[0]),
             helper.make_node("Split", ["q"], ["a", "b"], axis=1, split=[1, 3]),
             helper.make_node("Softmax", ["b"], ["sm"], axis=1), helper.make_node("Abs", ["sm"], ["y"]),
             helper.make_node("Exp", ["a"], ["z"])]
    g = helper.make_graph(nodes, "old", [helper.make_tensor_value_info("x", f32, ["N", 4, 5])],
                          [helper.make_tensor_value_info(o, f32, None) for o in "yz"], consts)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)], ir_version=7)


@pytest.mark.parametrize("opset", [9, 11, 12])
def test_models_before_opset_13_fuse_what_evonnx_implements_and_match(opset: int, tmp_path: Path) -> None:
    """Older exports (mmdeploy at opset 11, YOLOv5's at 12) were refused outright. A node whose definition at the
    model's opset is older than those evonnx implements goes to onnxruntime (Softmax-11, Slice-1); the rest fuses,
    with Squeeze, Unsqueeze and Split reading their attributes, and matches onnxruntime."""
    src = tmp_path / "m.onnx"
    onnx.save(_old_opset_model(opset), src)
    result = evonnx.optimize(src, tmp_path / "o.onnx", sizes={"N": 3}, guard=False)
    assert result.check is not None and result.check.compared > 0 and result.kernels
    left = {n.op_type for n in onnx.load(tmp_path / "o.onnx").graph.node if n.domain != "ai.evonnx"}
    assert "Softmax" in left and ("Slice" in left) == (opset < 10)
    ref = ort.InferenceSession(str(src), providers=["CPUExecutionProvider"])
    opt = evonnx.load_session(tmp_path / "o.onnx")
    for n in (1, 2, 6):
        x = np.random.default_rng(n).normal(size=(n, 4, 5)).astype(np.float32)
        for got, want in zip(opt.run(None, {"x": x}), ref.run(None, {"x": x}), strict=True):
            np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)
