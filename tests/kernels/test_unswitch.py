"""Unswitched guards (kernels/unswitch.py): a guarded select whose condition depends on the outer loops alone is
decided once per row, and each way's loop reads its branch unconditionally (no volatile reads, which kept gcc from
vectorising YOLOv8-pose's keypoint decode). The results must be onnxruntime's at every size, on both CPU
variants."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import evonnx
from evonnx.expr import Const, IndexVal, Load, Op, binary, guarded_where, unary
from evonnx.index import Poly, sym, var
from evonnx.kernels.unswitch import choose, invariant_guards

F32 = TensorProto.FLOAT


def _keypoints(tmp_path: Path) -> Path:
    """YOLOv8-pose's keypoint decode, written as its export has it: [1, 3K, A] viewed as K triples, x and y scaled
    and shifted by a grid, the third through a Sigmoid, concatenated back along the triple's axis."""
    nodes = [helper.make_node("Reshape", ["x", "view"], ["v"]),
             helper.make_node("Slice", ["v", "zero", "two", "axis"], ["xy"]),
             helper.make_node("Mul", ["xy", "k2"], ["m"]), helper.make_node("Add", ["m", "grid"], ["d"]),
             helper.make_node("Slice", ["v", "two", "three", "axis"], ["s"]),
             helper.make_node("Sigmoid", ["s"], ["p"]), helper.make_node("Concat", ["d", "p"], ["c"], axis=2),
             helper.make_node("Reshape", ["c", "back"], ["y"])]
    consts = [numpy_helper.from_array(np.array(v, np.int64), n) for n, v in
              (("view", [1, 17, 3, -1]), ("back", [1, 51, -1]), ("zero", [0]), ("two", [2]), ("three", [3]),
               ("axis", [2]))] + [numpy_helper.from_array(np.array(2.0, np.float32), "k2")]
    g = helper.make_graph(nodes, "kpt", [helper.make_tensor_value_info("x", F32, [1, 51, "A"]),
                                         helper.make_tensor_value_info("grid", F32, [1, 1, 2, "A"])],
                          [helper.make_tensor_value_info("y", F32, [1, 51, "A"])], consts)
    path = tmp_path / "kpt.onnx"
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), path)
    return path


@pytest.mark.compiler
def test_a_keypoint_decode_reads_unconditionally_and_matches(tmp_path: Path) -> None:
    src = _keypoints(tmp_path)
    result = evonnx.optimize(src, tmp_path / "o.onnx", sizes={"A": 1000}, guard=False, dump_dir=tmp_path / "d")
    assert result.check is not None and result.check.compared > 0 and len(result.kernels) == 1
    text = (tmp_path / "d" / "kernels.c").read_text()
    assert "volatile" not in text
    assert text.count("for (int64_t j = j0; j < stop; ++j) {") >= 2  # one loop per way
    ref = ort.InferenceSession(str(src), providers=["CPUExecutionProvider"])
    opt = evonnx.load_session(tmp_path / "o.onnx")
    rng = np.random.default_rng(0)
    for a in (1, 7, 8400):
        feeds = {"x": rng.normal(size=(1, 51, a)).astype(np.float32) * 4,
                 "grid": rng.uniform(0, 80, size=(1, 1, 2, a)).astype(np.float32)}
        np.testing.assert_allclose(opt.run(None, feeds)[0], ref.run(None, feeds)[0], rtol=1e-6, atol=1e-6)


def test_only_conditions_of_the_outer_loops_outside_other_guards_are_taken() -> None:
    j, o = var("j", sym("N")).atom(), var("o", sym("M")).atom()
    x = Load(0, Poly.of(j), "float32")
    y = Load(1, Poly.of(j) + Poly.of(o), "float32")
    outer = binary("lt", IndexVal(Poly.of(o)), Const(2, "int64"))
    inner = binary("lt", IndexVal(Poly.of(j)), Const(5, "int64"))
    nested = binary("gt", IndexVal(Poly.of(o)), Const(7, "int64"))
    # outer: taken; inner: moves with j; nested: only evaluated where `outer` holds, so its reads stay guarded
    e = guarded_where(outer, guarded_where(nested, x, y), unary("neg", guarded_where(inner, x, y)))
    assert invariant_guards([(Poly.of(j), e)], j, {o}) == [outer]  # type: ignore[arg-type]
    taken = choose(e, {outer: False})
    assert isinstance(taken, Op) and taken.op == "neg" and taken.args[0].args[0] == inner  # type: ignore[attr-defined]
    assert choose(e, {outer: True}) == guarded_where(nested, x, y)
