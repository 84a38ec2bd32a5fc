"""A DFL head fused whole (issue 12): Softmax over 16 bins, then a MatMul by the constant bins [16, 1].

`lower_reduce._matmul` computes a Softmax row times constant weights as the weighted sum of the exps divided once by
their sum (`weights_bounded`), and `cprint.lane_reduce` runs the row sum and the weighted sum in one loop, so each
exp is computed once (`lane_groups`). The cost model prices that (`cost_model._softmax_stats`): such a Softmax is
fused with its MatMul, where a Softmax whose output is stored stays with onnxruntime (it computes each exp once and
scales it; a fused element computes its exp beside the row sum's).
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

import evonnx
from evonnx.expr import Const, Load, Op, Reduce, unary
from evonnx.index import Poly, sym, var
from evonnx.kernels.cprint import SHORT_SUM, _sum_type, lane_groups
from evonnx.passes.lower_reduce import weights_bounded

pytestmark = pytest.mark.compiler


def _dfl(tmp_path: Path, weights: np.ndarray) -> Path:
    """[1, 64, H, W] -> [1, 4, 16, H*W] -> [1, H*W, 4, 16] -> Softmax -> MatMul(weights) -> [1, H*W, 4], as
    mmyolo's YOLOv8 head exports its DFL."""
    nodes = [helper.make_node("Reshape", ["x", "shape"], ["r"]),
             helper.make_node("Transpose", ["r"], ["t"], perm=[0, 3, 1, 2]),
             helper.make_node("Softmax", ["t"], ["s"], axis=-1),
             helper.make_node("MatMul", ["s", "w"], ["m"])]
    if weights.shape[1] == 1:
        nodes.append(helper.make_node("Squeeze", ["m", "axes"], ["y"]))
        out = [1, "HW", 4]
    else:
        nodes.append(helper.make_node("Identity", ["m"], ["y"]))
        out = [1, "HW", 4, weights.shape[1]]
    graph = helper.make_graph(
        nodes, "dfl", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 64, "H", "W"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, out)],
        [onnx.numpy_helper.from_array(np.array([1, 4, 16, -1], np.int64), "shape"),
         onnx.numpy_helper.from_array(weights.astype(np.float32), "w"),
         onnx.numpy_helper.from_array(np.array([-1], np.int64), "axes")])
    path = tmp_path / "m.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), str(path))
    return path


def _inputs(h: int, w: int, rng: np.random.Generator, special: bool) -> np.ndarray:
    x = (rng.standard_normal((1, 64, h, w)) * 4).astype(np.float32)
    if special and x.size:
        flat = x.reshape(-1)
        k = rng.choice(flat.size, size=max(1, flat.size // 11), replace=False)
        flat[k[0::3]] = np.inf
        flat[k[1::3]] = -np.inf
        flat[k[2::3]] = np.nan
        x[0, 16:32, 0, 0] = -np.inf  # a whole row of -inf: 0/0
        x[0, 32:48, -1, -1] = 80.0  # a row whose exps overflow unshifted
    return x


def _fused_ops(path: Path) -> set[str]:
    return {n.op_type for n in onnx.load(str(path)).graph.node}


@pytest.mark.parametrize("hw", [(3, 5), (8, 8), (1, 1), (0, 4), (5, 7)])
def test_dfl_head_fuses_whole_and_matches_onnxruntime(tmp_path: Path, hw: tuple[int, int],
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EVONNX_COST_MODEL", "defaults")
    path = _dfl(tmp_path, np.arange(16, dtype=np.float32).reshape(16, 1))
    out = tmp_path / "o.onnx"
    evonnx.optimize(path, out, sizes={"H": 20, "W": 20})
    assert _fused_ops(out) == {"Fused"}, "the Softmax and its MatMul were not fused with the views"
    rng = np.random.default_rng(hw[0] * 31 + hw[1])
    ref = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    got = evonnx.load_session(out)
    for special in (False, True):
        x = _inputs(*hw, rng, special)
        (r,), (g,) = ref.run(None, {"x": x}), got.run(None, {"x": x})
        assert r.shape == g.shape
        np.testing.assert_allclose(g, r, rtol=2e-6, atol=2e-5, equal_nan=True)


def test_softmax_stored_stays_with_onnxruntime(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A Softmax over 8 whose output is stored computes two exps per element fused (238 us against onnxruntime's
    71-118 us for (4096, 8), measured): the planner leaves it, with the Mul in front of it."""
    monkeypatch.setenv("EVONNX_COST_MODEL", "defaults")
    graph = helper.make_graph([helper.make_node("Mul", ["x", "x"], ["t"]),
                               helper.make_node("Softmax", ["t"], ["y"], axis=-1)], "s",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4096, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4096, 8])])
    path = tmp_path / "s.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8), str(path))
    evonnx.optimize(path, tmp_path / "o.onnx", check=False, guard=False)
    assert "Softmax" in _fused_ops(tmp_path / "o.onnx")


@pytest.mark.parametrize("weights, quotient", [
    (np.arange(16, dtype=np.float32).reshape(16, 1), True),
    (np.full((16, 2), 3e37, np.float32), False),  # the weighted sum of the exps could overflow: divided first
    (np.array([[np.nan]] + [[1.0]] * 15, np.float32), False),
    (np.array([[np.inf]] + [[1.0]] * 15, np.float32), False),
])
def test_weights_bounded_decides_the_quotient_form(tmp_path: Path, weights: np.ndarray, quotient: bool,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    assert weights_bounded(weights, "float32") is quotient
    # either form matches onnxruntime: NaN and inf weights make NaN and inf results as its own MatMul does
    monkeypatch.setenv("EVONNX_COST_MODEL", "defaults")
    path = _dfl(tmp_path, weights)
    out = tmp_path / "o.onnx"
    evonnx.optimize(path, out, planner="greedy", sizes={"H": 4, "W": 6})
    x = _inputs(4, 6, np.random.default_rng(3), special=True)
    (r,) = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"x": x})
    (g,) = evonnx.load_session(out).run(None, {"x": x})
    np.testing.assert_allclose(g, r, rtol=2e-6, atol=2e-5, equal_nan=True)


def test_weights_bounded_refuses_what_is_not_float_matrix() -> None:
    assert not weights_bounded(None, "float32")
    assert not weights_bounded(np.ones((16, 1), np.float32), "int32")
    assert not weights_bounded(np.ones(16, np.float32), "float32")
    assert weights_bounded(np.ones((16, 4), np.float64), "float64")


def test_lane_groups_share_one_loop_only_between_independent_reductions_of_one_extent() -> None:
    x = Load(0, Poly.of(0), "float32")
    k, r, q, s = var("_a", Poly.of(16)), var("_b", Poly.of(16)), var("_c", Poly.of(16)), var("_d", Poly.of(8))

    def red(op: str, v: Poly, body: object) -> Reduce:
        return Reduce(op, v, body, "float32")  # type: ignore[arg-type]

    m = red("max", k, Load(0, k, "float32"))
    total = red("sum", r, unary("exp", Op("sub", (Load(0, r, "float32"), m), "float32")))
    dot = red("dot", q, Op("mul", (unary("exp", Op("sub", (Load(0, q, "float32"), m), "float32")),
                                   Const(2.0, "float32")), "float32"))
    short = red("sum", s, Load(1, s, "float32"))
    nested = red("sum", r, Op("sub", (x, total), "float32"))
    # the max is read by both: a loop of its own; the sum and the dot share one; another extent starts a group
    assert lane_groups([m, total, dot, short]) == [[m], [total, dot], [short]]
    # a reduction reading one of the group is computed after it
    assert lane_groups([m, total, nested]) == [[m], [total], [nested]]


def test_float_sums_accumulate_in_float_only_over_short_constant_axes() -> None:
    """A softmax row of 16 bins sums in float (as onnxruntime's); a long or run-time axis sums in double, whose one
    rounding keeps evonnx's error below onnxruntime's own (`cprint._sum_type`)."""
    def total(extent: Poly, dtype: str = "float32") -> Reduce:
        v = var("_s", extent)
        return Reduce("sum", v, Load(0, v, dtype), dtype)

    assert _sum_type(total(Poly.of(16)), "float") == "float"
    assert _sum_type(total(Poly.of(SHORT_SUM)), "float") == "float"
    assert _sum_type(total(Poly.of(SHORT_SUM + 1)), "float") == "double"
    assert _sum_type(total(sym("N")), "float") == "double"
    assert _sum_type(total(Poly.of(16), "float64"), "double") == "double"
    prod = Reduce("prod", var("_p", Poly.of(4096)), Load(0, var("_p", Poly.of(4096)), "float32"), "float32")
    assert _sum_type(prod, "float") == "float"


def _ultralytics_dfl(tmp_path: Path, weights: np.ndarray, bias: np.ndarray | None = None) -> Path:
    """ultralytics' DFL: [1, 64, A] -> [1, 4, 16, A] -> [1, 16, 4, A] -> Softmax(axis=1) -> Conv(W[O, 16, 1, 1])."""
    o = weights.shape[0]
    nodes = [helper.make_node("Reshape", ["x", "s1"], ["r"]),
             helper.make_node("Transpose", ["r"], ["t"], perm=[0, 2, 1, 3]),
             helper.make_node("Softmax", ["t"], ["s"], axis=1),
             helper.make_node("Conv", ["s", "w"] + (["b"] if bias is not None else []), ["y"], kernel_shape=[1, 1])]
    inits = [onnx.numpy_helper.from_array(np.array([1, 4, 16, -1], np.int64), "s1"),
             onnx.numpy_helper.from_array(weights.astype(np.float32), "w")]
    if bias is not None:
        inits.append(onnx.numpy_helper.from_array(bias.astype(np.float32), "b"))
    graph = helper.make_graph(nodes, "dfl", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 64, "A"])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, o, 4, "A"])], inits)
    path = tmp_path / "u.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), str(path))
    return path


@pytest.mark.parametrize("o, bias", [(1, False), (2, True), (4, True)])
def test_ultralytics_dfl_fuses_whole_and_matches_onnxruntime(tmp_path: Path, o: int, bias: bool,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """onnxruntime runs a Softmax over axis 1 by transposing around it: 5.1-5.3 ms for [1, 16, 4, 8400] with its
    Conv, against 628 us for the fused kernel (1 thread, measured)."""
    monkeypatch.setenv("EVONNX_COST_MODEL", "defaults")
    rng = np.random.default_rng(o)
    w = np.arange(16, dtype=np.float32).reshape(1, 16, 1, 1) if o == 1 else rng.standard_normal((o, 16, 1, 1))
    path = _ultralytics_dfl(tmp_path, w, rng.standard_normal(o) if bias else None)
    out = tmp_path / "o.onnx"
    evonnx.optimize(path, out, sizes={"A": 400})
    assert _fused_ops(out) == {"Fused"}, "the Softmax over axis 1 and its Conv were not fused"
    ref = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    got = evonnx.load_session(out)
    for a in (1, 13, 400):
        for special in (False, True):
            x = _inputs(1, a, rng, special).reshape(1, 64, a)
            (r,), (g,) = ref.run(None, {"x": x}), got.run(None, {"x": x})
            np.testing.assert_allclose(g, r, rtol=2e-6, atol=2e-5, equal_nan=True)
    empty = np.zeros((1, 64, 0), np.float32)  # onnxruntime fails a Conv over an empty axis: so does the kernel
    for sess in (ref, got):
        with pytest.raises(Exception, match="(?i)invalid input shape|empty spatial axis"):
            sess.run(None, {"x": empty})


def test_conv_outside_the_1x1_form_is_left_to_onnxruntime() -> None:
    from evonnx.passes.analyze import Known
    from evonnx.passes.lazy import Reject, naming, source
    from evonnx.passes.lower_ops import lower_node

    def lowered(x: list[int], w: list[int], consts: bool = True, **attrs: object) -> bool:
        weights = np.ones(w, np.float32)
        known = Known("float32", tuple(w), tuple(Const(1.0, "float32") for _ in range(weights.size)))
        with naming():
            try:
                lower_node("Conv", attrs, [source(0, "float32", x), source(1, "float32", w)],
                           [None, known if consts else None], 1)
            except Reject:
                return False
            return True

    assert lowered([1, 16, 4, 9], [1, 16, 1, 1]) and lowered([2, 8, 5], [4, 8, 1], kernel_shape=[1])
    assert not lowered([1, 16, 4, 9], [1, 16, 1, 1], consts=False)  # run-time weights
    assert not lowered([1, 16, 4, 9], [1, 16, 3, 3])  # a 3x3 kernel
    assert not lowered([1, 16, 4, 9], [1, 16, 1, 1], strides=[2, 2])
    assert not lowered([1, 16, 4, 9], [1, 16, 1, 1], pads=[0, 0, 1, 1])
    assert not lowered([1, 16, 4, 9], [1, 8, 1, 1], group=2)
    assert not lowered([1, 64, 4, 9], [1, 64, 1, 1])  # more channels than a DFL's bins: onnxruntime's GEMM
    assert not lowered([1, 16, 4, 9], [8, 16, 1, 1])  # more filters
    assert not lowered([1, 16, 4, 9], [1, 16, 1, 1], auto_pad="SAME_UPPER")


def _pose_head(tmp_path: Path) -> Path:
    """ultralytics' pose head after its convolutions: the DFL box (x, y centre rows, then w, h), the score, and
    17 keypoints (x, y, visibility) flattened to 51 channels, concatenated to [1, 56, A]."""
    def c(name: str, value: list[float] | list[int], dtype: type = np.int64) -> onnx.TensorProto:
        return onnx.numpy_helper.from_array(np.array(value, dtype), name)

    n = helper.make_node
    nodes = [n("Reshape", ["x", "s4"], ["r"]), n("Transpose", ["r"], ["t"], perm=[0, 2, 1, 3]),
             n("Softmax", ["t"], ["sm"], axis=1), n("Conv", ["sm", "w"], ["cv"], kernel_shape=[1, 1]),
             n("Reshape", ["cv", "s3"], ["d"]), n("Split", ["d", "two"], ["lt", "rb"], axis=1),
             n("Sub", ["anc", "lt"], ["p1"]), n("Add", ["anc", "rb"], ["p2"]), n("Add", ["p1", "p2"], ["ps"]),
             n("Div", ["ps", "half"], ["cxy"]), n("Sub", ["p2", "p1"], ["wh"]),
             n("Concat", ["cxy", "wh"], ["box"], axis=1), n("Mul", ["box", "st"], ["dbox"]),
             n("Sigmoid", ["s"], ["score"]),
             n("Reshape", ["k", "sk"], ["kr"]), n("Split", ["kr", "ksplit"], ["kxy_", "kv"], axis=2),
             n("Mul", ["kxy_", "two_f"], ["k2"]), n("Unsqueeze", ["anc", "one"], ["anc4"]),
             n("Sub", ["anc4", "half_f"], ["ancm"]), n("Add", ["k2", "ancm"], ["ka"]), n("Mul", ["ka", "st"], ["kxy"]),
             n("Sigmoid", ["kv"], ["kvs"]), n("Concat", ["kxy", "kvs"], ["kc"], axis=2),
             n("Reshape", ["kc", "s51"], ["kp"]), n("Concat", ["dbox", "score", "kp"], ["y"], axis=1)]
    f = TensorProto.FLOAT
    graph = helper.make_graph(
        nodes, "pose", [helper.make_tensor_value_info("x", f, [1, 64, "A"]),
                        helper.make_tensor_value_info("s", f, [1, 1, "A"]),
                        helper.make_tensor_value_info("k", f, [1, 51, "A"]),
                        helper.make_tensor_value_info("anc", f, [1, 2, "A"]),
                        helper.make_tensor_value_info("st", f, [1, 1, "A"])],
        [helper.make_tensor_value_info("y", f, [1, 56, "A"])],
        [c("s4", [1, 4, 16, -1]), c("s3", [1, 4, -1]), c("two", [2, 2]), c("sk", [1, 17, 3, -1]), c("ksplit", [2, 1]),
         c("one", [1]), c("s51", [1, 51, -1]), c("w", list(range(16)), np.float32),
         c("half", [2.0], np.float32), c("two_f", [2.0], np.float32), c("half_f", [0.5], np.float32)])
    graph.initializer[7].dims[:] = [1, 16, 1, 1]
    path = tmp_path / "pose.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), str(path))
    return path


def test_pose_head_computes_its_dfl_softmax_in_one_task(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The keypoints' period of 3 past channel 5 split the box rows [0:2] into single rows, which joined the
    visibility rows' task apart from [2:4]: the Softmax both read ran in two tasks, twice the kernel's work
    (ultralytics' yolov8n-pose head 1.2 -> 0.7-0.9 ms at 1 thread)."""
    monkeypatch.setenv("EVONNX_COST_MODEL", "defaults")
    path = _pose_head(tmp_path)
    out, dump = tmp_path / "o.onnx", tmp_path / "dump"
    evonnx.optimize(path, out, sizes={"A": 400}, dump_dir=dump)
    assert _fused_ops(out) == {"Fused"}
    code = (dump / "kernels.c").read_text()
    headers = re.findall(r"^/\* evo\w+: (.*) \*/$", code, re.M)
    with_softmax = [h for h in headers if "reductions" in h]
    assert len(with_softmax) == 1, "\n".join(headers)
    assert "[0:1, 0:2, 0:A)" in with_softmax[0] and "[0:1, 2:4, 0:A)" in with_softmax[0], with_softmax[0]
    rng = np.random.default_rng(5)
    ref = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    got = evonnx.load_session(out)
    for a in (1, 9, 400):
        feeds = {"x": rng.standard_normal((1, 64, a)).astype(np.float32) * 3,
                 "s": rng.standard_normal((1, 1, a)).astype(np.float32),
                 "k": rng.standard_normal((1, 51, a)).astype(np.float32),
                 "anc": rng.random((1, 2, a), dtype=np.float32) * 80, "st": np.full((1, 1, a), 8.0, np.float32)}
        (r,), (g,) = ref.run(None, feeds), got.run(None, feeds)
        np.testing.assert_allclose(g, r, rtol=2e-6, atol=2e-5)
