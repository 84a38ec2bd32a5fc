"""Tasks of boxes (issue 12): a task that unrolls the 4 coordinates of [.., N, 4] outputs and computes an exp, a
log or a division runs blocks of 8 boxes as the 8 lanes of a vector (16 for float16): its [N, 4] inputs come in
through `evo_boxes_in` (8 rows to 4 columns), its outputs go out through `evo_boxes_out`, the rest of a row (fewer
than a block) through the plain loop (codegen_c._box_block). Every coordinate must land where onnxruntime puts it,
at whole blocks, rows cut short, rows shorter than a block, and task ranges that start inside a row (2 threads)."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import evonnx

pytestmark = pytest.mark.compiler

# (B, N): empty, shorter than a block, one block, a block and one, several with a cut, large enough for the pool
SHAPES = [(1, 0), (0, 5), (1, 1), (2, 7), (1, 8), (3, 9), (2, 17), (1, 1003), (2, 20001)]


def _column(name: str, c: int, out: str) -> onnx.NodeProto:
    return helper.make_node("Slice", [name, f"s{c}", f"e{c}", "last"], [out])


def _model(path: Path, dtype: int, columns_of_d: tuple[int, ...]) -> Path:
    """y[B, N, 4] from x[B, N, 4] and d[B, N, 4], each coordinate by another operation, so that a coordinate read
    or stored in the wrong column shows. float32: an exp and a division (delta2bbox's kind); int32: integer
    division by a coordinate of d, exact. d's columns outside `columns_of_d` are never read."""
    nodes = [_column("x", c, f"x{c}") for c in range(4)] + [_column("d", c, f"d{c}") for c in columns_of_d]
    d = [f"d{c}" if c in columns_of_d else f"x{(c + 1) % 4}" for c in range(4)]
    if dtype in (TensorProto.FLOAT, TensorProto.FLOAT16):
        nodes += [helper.make_node("Exp", [d[2]], ["ex2"]),
                  helper.make_node("Mul", ["x0", "ex2"], ["y0"]),
                  helper.make_node("Div", ["x1", d[3]], ["y1"]),
                  helper.make_node("Sub", ["x2", d[0]], ["y2"]),
                  helper.make_node("Add", ["x3", d[1]], ["y3"])]
    else:
        nodes += [helper.make_node("Div", ["x0", d[2]], ["y0"]),
                  helper.make_node("Mul", ["x1", d[3]], ["y1"]),
                  helper.make_node("Sub", ["x2", d[0]], ["y2"]),
                  helper.make_node("Add", ["x3", d[1]], ["y3"])]
    nodes.append(helper.make_node("Concat", ["y0", "y1", "y2", "y3"], ["y"], axis=-1))
    inits = [numpy_helper.from_array(np.array([-1], np.int64), "last")]
    for c in range(4):
        inits += [numpy_helper.from_array(np.array([c], np.int64), f"s{c}"),
                  numpy_helper.from_array(np.array([c + 1], np.int64), f"e{c}")]
    graph = helper.make_graph(nodes, "boxes", [helper.make_tensor_value_info(n, dtype, ["B", "N", 4]) for n in "xd"],
                              [helper.make_tensor_value_info("y", dtype, ["B", "N", 4])], inits)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), str(path))
    return path


def _inputs(shape: tuple[int, int], dtype: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
    full = (*shape, 4)
    if dtype in (TensorProto.FLOAT, TensorProto.FLOAT16):
        t = np.float32 if dtype == TensorProto.FLOAT else np.float16
        return {"x": (rng.standard_normal(full) * 8).astype(t),
                "d": (rng.uniform(0.5, 3.0, full) * rng.choice([-1.0, 1.0], full)).astype(t)}
    d = rng.integers(1, 50, size=full, dtype=np.int32) * rng.choice(np.array([-1, 1], np.int32), full)
    return {"x": rng.integers(-10**6, 10**6, size=full, dtype=np.int32), "d": d}


def _threads(n: int) -> ort.SessionOptions:
    so = ort.SessionOptions()
    so.intra_op_num_threads = n
    return so


@pytest.mark.parametrize(("dtype", "columns_of_d"), [(TensorProto.INT32, (0, 1, 2, 3)),
                                                     (TensorProto.FLOAT, (0, 1, 2, 3)),
                                                     (TensorProto.INT32, (0, 2)),
                                                     (TensorProto.FLOAT16, (0, 1, 2, 3))])
def test_box_blocks_put_every_coordinate_where_onnxruntime_does(tmp_path: Path, dtype: int,
                                                                 columns_of_d: tuple[int, ...]) -> None:
    """float16 runs blocks of 16 boxes (evo_boxes_in2x16: 2-byte columns of 16 lanes, so that gcc vectorises the
    block's float arithmetic 8 wide), the 4-byte types blocks of 8."""
    src = _model(tmp_path / "m.onnx", dtype, columns_of_d)
    dump = tmp_path / "dump"
    evonnx.optimize(src, tmp_path / "m.opt.onnx", dump_dir=dump, guard=False)
    code = (dump / "kernels.c").read_text()
    helper_in, helper_out, lanes = ("in2x16", "out2x16", 16) if dtype == TensorProto.FLOAT16 else ("in", "out", 8)
    assert f"blocks of {lanes} boxes" in code
    # x comes in as columns; d only where the task reads all four of its columns
    assert len(re.findall(rf"evo_boxes_{helper_in}\(&in\d", code)) == (2 if len(columns_of_d) == 4 else 1)
    assert len(re.findall(rf"evo_boxes_{helper_out}\(evo_bout\d", code)) == 1
    ref = ort.InferenceSession(str(src), providers=["CPUExecutionProvider"])
    # column 0 goes through an exp: evonnx's against MLAS's, a few float32 ulp apart (at most one float16 ulp
    # once rounded), where a moved value is far off; the other columns are bit for bit
    rtol = {TensorProto.FLOAT: 1e-6, TensorProto.FLOAT16: 2e-3}.get(dtype, 0)
    for threads in (1, 2):
        opt = evonnx.load_session(tmp_path / "m.opt.onnx", sess_options=_threads(threads))
        rng = np.random.default_rng(threads)
        for shape in SHAPES:
            feeds = _inputs(shape, dtype, rng)
            (want,) = ref.run(None, feeds)
            (got,) = opt.run(None, feeds)
            assert got.shape == want.shape and got.dtype == want.dtype
            np.testing.assert_allclose(got[..., 0].astype(np.float64), want[..., 0].astype(np.float64), rtol=rtol,
                                       atol=0, err_msg=f"{shape}, {threads} thread(s)")
            np.testing.assert_array_equal(got[..., 1:], want[..., 1:], err_msg=f"{shape}, {threads} thread(s)")


def test_cheap_boxes_stay_with_gccs_vectors(tmp_path: Path) -> None:
    """A clamp per coordinate (clamp_inplace's kind) is not blocked: the shuffles would cost more than they save."""
    path = tmp_path / "clamp.onnx"
    lo = numpy_helper.from_array(np.zeros((4,), np.float32), "lo")
    hi = numpy_helper.from_array(np.array([1333, 800, 1333, 800], np.float32), "hi")
    nodes = [helper.make_node("Max", ["x", "lo"], ["m"]), helper.make_node("Min", ["m", "hi"], ["y"])]
    graph = helper.make_graph(nodes, "clamp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4])], [lo, hi])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), str(path))
    dump = tmp_path / "dump"
    evonnx.optimize(path, tmp_path / "clamp.opt.onnx", dump_dir=dump, guard=False)
    code = (dump / "kernels.c").read_text()
    assert "4 unrolled" in code and "blocks of 8 boxes" not in code
