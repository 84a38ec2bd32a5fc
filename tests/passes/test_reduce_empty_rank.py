"""A reduction with keepdims=0 over axes written negatively (torch's `prob[..., :-1].max(-1)` of a DETR head:
ReduceMax(axes=[-1], keepdims=0) and ArgMax(axis=-1, keepdims=0)) gives, in onnxruntime 1.31, the input's own shape
where the input is empty: [0, 5, 91], not the spec's [0, 5]. Where the reduced axes have static sizes the input is
empty exactly where the output is, and the fused kernel gives that shape, rank included (ABI 4: infer sets the
rank). What reads such a tensor stays with onnxruntime (its rank is not the model's there)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

import evonnx

pytestmark = pytest.mark.compiler

C = 12


def _model(tmp_path: Path, reduced: int | str = C, downstream: bool = False) -> Path:
    """x[N, M, reduced] -> Slice(:-1 on the last axis) -> ReduceMax(axes=[-1]), ArgMax(axis=-1), both keepdims=0;
    with `downstream`, a Cast reads the ArgMax (onnxruntime runs it on the quirk shape)."""
    nodes = [helper.make_node("Neg", ["x"], ["n"]),
             helper.make_node("Slice", ["n", "st", "en", "ax"], ["s"]),
             helper.make_node("ReduceMax", ["s", "ax"], ["scores"], keepdims=0),
             helper.make_node("ArgMax", ["s"], ["arg"], axis=-1, keepdims=0)]
    outs = [helper.make_tensor_value_info("scores", TensorProto.FLOAT, ["N", "M"])]
    if downstream:
        nodes.append(helper.make_node("Cast", ["arg"], ["labels"], to=TensorProto.FLOAT))
        outs.append(helper.make_tensor_value_info("labels", TensorProto.FLOAT, ["N", "M"]))
    else:
        nodes.append(helper.make_node("Identity", ["arg"], ["labels"]))
        outs.append(helper.make_tensor_value_info("labels", TensorProto.INT64, ["N", "M"]))
    inits = [onnx.numpy_helper.from_array(np.array(v, np.int64), n) for n, v in
             (("st", [0]), ("en", [-1]), ("ax", [-1]))]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", "M", reduced])],
                              outs, inits)
    path = tmp_path / "m.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=8), str(path))
    return path


def _compare(src: Path, opt: Path, sizes: list[tuple[int, int, int]]) -> None:
    ref = ort.InferenceSession(str(src), providers=["CPUExecutionProvider"])
    got_s = evonnx.load_session(opt)
    rng = np.random.default_rng(0)
    for n, m, c in sizes:
        x = np.round(rng.standard_normal((n, m, c)), 1).astype(np.float32)
        want = ref.run(None, {"x": x})
        got = got_s.run(None, {"x": x})
        for w, g in zip(want, got, strict=True):
            assert g.shape == w.shape and g.dtype == w.dtype, f"N={n}, M={m}: {g.shape} against {w.shape}"
            np.testing.assert_array_equal(g, w, err_msg=f"N={n}, M={m}")


def _fused(path: Path) -> list[onnx.NodeProto]:
    return [n for n in onnx.load(str(path)).graph.node if n.domain == "ai.evonnx"]


@pytest.mark.parametrize("downstream", [False, True])
def test_a_kernel_gives_onnxruntimes_shape_of_an_empty_reduction(tmp_path: Path, downstream: bool) -> None:
    src = _model(tmp_path, downstream=downstream)
    opt = tmp_path / "m.opt.onnx"
    evonnx.optimize(src, opt, guard=False, planner="greedy")
    fused = _fused(opt)
    assert len(fused) == 1, "the Slice, the ReduceMax and the ArgMax are one kernel"
    if downstream:  # the Cast reads a tensor whose rank is another where it is empty: onnxruntime runs it
        assert any(n.op_type == "Cast" for n in onnx.load(str(opt)).graph.node)
    g = onnx.load(str(opt)).graph
    inner = {o for n in fused for o in n.output} - {o.name for o in g.output}  # outputs keep what the model says
    assert bool(inner) == downstream
    for v in g.value_info:  # a kernel output onnxruntime reads is declared with no rank
        assert v.name not in inner or not v.type.tensor_type.HasField("shape")
    _compare(src, opt, [(0, 5, C), (2, 0, C), (0, 0, C), (3, 4, C), (1, 1, C)])


def test_a_reduced_axis_that_can_be_empty_is_left_to_onnxruntime(tmp_path: Path) -> None:
    # over a symbolic axis the output may be non-empty where the input is empty ([2, 3, 0] gives [2, 3, 0] in
    # onnxruntime, the spec's [2, 3] holds elements): the reduction stays with onnxruntime, as before ABI 4
    src = _model(tmp_path, reduced="K")
    opt = tmp_path / "m.opt.onnx"
    evonnx.optimize(src, opt, guard=False, planner="greedy")
    kept = {n.op_type for n in onnx.load(str(opt)).graph.node}
    assert {"ReduceMax", "ArgMax"} <= kept
    _compare(src, opt, [(2, 3, 1), (0, 3, 4), (2, 3, 5)])


def _topk_model(tmp_path: Path, k: int) -> Path:
    """mmdet's pre-NMS top-k: scores[N, 50, 3] -> ReduceMax(axes=[-1], keepdims=0) -> TopK(k) -> indices, which a
    Mul and an Add read (a kernel's worth after the TopK)."""
    nodes = [helper.make_node("Sigmoid", ["x"], ["s"]),
             helper.make_node("ReduceMax", ["s", "ax"], ["m"], keepdims=0),
             helper.make_node("TopK", ["m", "k"], ["v", "i"], axis=-1),
             helper.make_node("Mul", ["v", "two"], ["a"]), helper.make_node("Add", ["a", "one"], ["y"])]
    inits = [onnx.numpy_helper.from_array(np.array([-1], np.int64), "ax"),
             onnx.numpy_helper.from_array(np.array([k], np.int64), "k"),
             onnx.numpy_helper.from_array(np.array(2.0, np.float32), "two"),
             onnx.numpy_helper.from_array(np.array(1.0, np.float32), "one")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 50, 3])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", k])], inits)
    path = tmp_path / f"topk{k}.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=8), str(path))
    return path


@pytest.mark.parametrize("k", [10, 2])
def test_a_topk_that_fails_on_the_quirk_shape_ends_the_quirk(tmp_path: Path, k: int) -> None:
    # At N = 0 the ReduceMax is [0, 50, 3] in onnxruntime, and a TopK of 10 along its last axis fails there (in
    # both models): what reads the TopK is fused. A TopK of 2 runs on [0, 50, 3] and gives [0, 50, 2]: what reads
    # it stays with onnxruntime
    src = _topk_model(tmp_path, k)
    opt = tmp_path / f"topk{k}.opt.onnx"
    evonnx.optimize(src, opt, guard=False, planner="greedy")
    after = [n for n in onnx.load(str(opt)).graph.node if n.domain == "ai.evonnx"]
    kept = [n.op_type for n in onnx.load(str(opt)).graph.node if n.domain != "ai.evonnx"]
    assert ("Mul" in kept) == (k == 2) and len(after) == (2 if k == 10 else 1)
    _compare_topk(src, opt, fails_at_zero=k == 10)


def _compare_topk(src: Path, opt: Path, fails_at_zero: bool) -> None:
    """Both models at N = 0, 1, 3: the same result, or (at N = 0 where `fails_at_zero`) both fail on the TopK."""
    ref = ort.InferenceSession(str(src), providers=["CPUExecutionProvider"])
    got = evonnx.load_session(opt)
    for n in (0, 1, 3):
        x = np.random.default_rng(n).standard_normal((n, 50, 3)).astype(np.float32)
        try:
            want = ref.run(None, {"x": x})[0]
        except Exception as e:  # noqa: BLE001 - onnxruntime's TopK of k along 3 at N = 0
            assert n == 0 and fails_at_zero, e
            with pytest.raises(Exception, match="k argument"):
                got.run(None, {"x": x})
            continue
        np.testing.assert_allclose(got.run(None, {"x": x})[0], want, rtol=1e-6)


def _topk_of_all_model(tmp_path: Path, index: int) -> Path:
    """As `_topk_model`, with k = scores.shape[index] (TorchScript's dynamic-batch export of a level with fewer
    anchors than nms_pre): Gather(Shape(ReduceMax), index) -> Reshape([1]) -> TopK."""
    nodes = [helper.make_node("Sigmoid", ["x"], ["s"]),
             helper.make_node("ReduceMax", ["s", "ax"], ["m"], keepdims=0),
             helper.make_node("Shape", ["m"], ["sh"]), helper.make_node("Gather", ["sh", "i"], ["n"], axis=0),
             helper.make_node("Reshape", ["n", "one_dim"], ["k"]),
             helper.make_node("TopK", ["m", "k"], ["v", "t"], axis=-1),
             helper.make_node("Mul", ["v", "two"], ["a"]), helper.make_node("Add", ["a", "one"], ["y"])]
    inits = [onnx.numpy_helper.from_array(np.array([-1], np.int64), "ax"),
             onnx.numpy_helper.from_array(np.array(index, np.int64), "i"),
             onnx.numpy_helper.from_array(np.array([1], np.int64), "one_dim"),
             onnx.numpy_helper.from_array(np.array(2.0, np.float32), "two"),
             onnx.numpy_helper.from_array(np.array(1.0, np.float32), "one")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 50, 3])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 50])], inits)
    path = tmp_path / f"topk_all{index}.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=8), str(path))
    return path


@pytest.mark.parametrize("index", [1, -1])
def test_a_topk_of_a_dim_that_both_shapes_share_ends_the_quirk(tmp_path: Path, index: int) -> None:
    # k = Shape(m)[1] is 50 in [N, 50] and in the quirk's [0, 50, 3]: the TopK of 50 along the last axis fails on
    # [0, 50, 3], and what reads it fuses. Shape(m)[-1] is 50 in one shape and 3 in the other: the quirk goes on
    src = _topk_of_all_model(tmp_path, index)
    opt = tmp_path / f"topk_all{index}.opt.onnx"
    evonnx.optimize(src, opt, guard=False, planner="greedy")
    kept = [n.op_type for n in onnx.load(str(opt)).graph.node if n.domain != "ai.evonnx"]
    assert ("Mul" in kept) == (index == -1), kept
    _compare_topk(src, opt, fails_at_zero=index == 1)


def test_a_topk_of_k_computed_has_the_shape_its_k_gives(tmp_path: Path) -> None:
    # k = x2.shape[1] (7), computed in the graph: ONNX shape inference leaves the TopKs' outputs [?, ?], evonnx
    # gives them [N, 7], and the Concat of both levels' top-k (axis 0) provably agrees off its axis and fuses
    nodes = [helper.make_node("Shape", ["x2"], ["sh"]), helper.make_node("Gather", ["sh", "i"], ["n"], axis=0),
             helper.make_node("Reshape", ["n", "one_dim"], ["k"]),
             helper.make_node("TopK", ["x1", "k"], ["v1", "t1"], axis=-1),
             helper.make_node("TopK", ["x2", "k"], ["v2", "t2"], axis=1),
             helper.make_node("Concat", ["v1", "v2"], ["c"], axis=0), helper.make_node("Mul", ["c", "two"], ["y"])]
    inits = [onnx.numpy_helper.from_array(np.array(1, np.int64), "i"),
             onnx.numpy_helper.from_array(np.array([1], np.int64), "one_dim"),
             onnx.numpy_helper.from_array(np.array(2.0, np.float32), "two")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x1", TensorProto.FLOAT, ["N", 50]),
                                           helper.make_tensor_value_info("x2", TensorProto.FLOAT, ["N", 7])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["M", 7])], inits)
    src, opt = tmp_path / "topk_k.onnx", tmp_path / "topk_k.opt.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=8), str(src))
    evonnx.optimize(src, opt, guard=False, planner="greedy")
    kept = [n.op_type for n in onnx.load(str(opt)).graph.node if n.domain != "ai.evonnx"]
    assert "Concat" not in kept and "Mul" not in kept, kept
    ref = ort.InferenceSession(str(src), providers=["CPUExecutionProvider"])
    got = evonnx.load_session(opt)
    for n in (0, 1, 3):
        rng = np.random.default_rng(n)
        feeds = {"x1": rng.standard_normal((n, 50)).astype(np.float32),
                 "x2": rng.standard_normal((n, 7)).astype(np.float32)}
        np.testing.assert_array_equal(got.run(None, feeds)[0], ref.run(None, feeds)[0])


def test_a_float16_reduction_keeps_the_quirk_shape_computed_in_float32(tmp_path: Path) -> None:
    """A float16 reduction is computed in float32 and converted back (lower_ops._in_float32): the conversion kept
    the shape but dropped the quirk shape of an empty input, so ReduceSum(x[8, M, M], axes=[-3], keepdims=0) gave
    [0, 0] against onnxruntime's [8, 0, 0] at M = 0. The If beside it (a float16 body) makes evonnx plan on the
    model as written, where the ReduceSum is float16 (fuzz case 10515 of the long run on 6acdaa3)."""
    h, f16 = helper, TensorProto.FLOAT16
    body = {k: h.make_graph([h.make_node(op, ["r"], [k])], k, [], [h.make_tensor_value_info(k, f16, None)])
            for k, op in (("a", "Abs"), ("b", "Neg"))}
    nodes = [h.make_node("Round", ["x"], ["r"]), h.make_node("ReduceSum", ["r", "ax"], ["y"], keepdims=0),
             h.make_node("Size", ["r"], ["n"]), h.make_node("Greater", ["n", "zero"], ["c"]),
             h.make_node("If", ["c"], ["z"], then_branch=body["a"], else_branch=body["b"])]
    graph = h.make_graph(nodes, "g", [h.make_tensor_value_info("x", f16, [8, "M", "M"])],
                         [h.make_tensor_value_info("y", f16, None), h.make_tensor_value_info("z", f16, None)],
                         [onnx.numpy_helper.from_array(np.array([-3], np.int64), "ax"),
                          onnx.numpy_helper.from_array(np.array(0, np.int64), "zero")])
    src, out = tmp_path / "m.onnx", tmp_path / "o.onnx"
    onnx.save(h.make_model(graph, opset_imports=[h.make_opsetid("", 18)], ir_version=8), str(src))
    result = evonnx.optimize(src, out, guard=False, planner="greedy")
    assert len(result.kernels) == 1 and not [r for r in result.plan.rejected if "left to" in r.reason]
    ref = ort.InferenceSession(str(src), providers=["CPUExecutionProvider"])
    got = evonnx.load_session(out)
    for m in (0, 3):
        x = np.arange(8 * m * m, dtype=np.float16).reshape(8, m, m)
        (r, _), (g, _) = ref.run(None, {"x": x}), got.run(None, {"x": x})
        assert g.shape == r.shape == ((8, 0, 0) if m == 0 else (m, m))
        np.testing.assert_array_equal(g, r)
