"""Tiled transposes (issue 12): a task whose inner loop stores contiguously but reads across a stride (NCHW to
NHWC under Sigmoid, the scores of YOLO and RetinaNet heads) is computed in 8x8 blocks, transposed in registers
(`evo_transpose8x8_to`, `evo_transpose16x8_to`) and stored row by row. Whole blocks, blocks cut at either edge,
and loops shorter than one block must all give onnxruntime's result, for float32 and for int32 (whose bits the
transpose moves as floats)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import evonnx
from evonnx.expr import Load, Op, Reduce
from evonnx.index import Poly, floordiv, var
from evonnx.kernels.tiles import merged_inner, merged_tile_axis, tile_axis

pytestmark = pytest.mark.compiler


def _nchw_to_nhwc(tmp_path: Path, dtype: int, then: str, dims: tuple[object, ...] = ("N", "C", "H", "W")) -> Path:
    n, c, h, w = dims
    x = helper.make_tensor_value_info("x", dtype, [n, c, h, w])
    y = helper.make_tensor_value_info("y", dtype, [n, h, w, c])
    nodes = [helper.make_node("Transpose", ["x"], ["t"], perm=[0, 2, 3, 1])]
    inits = []
    if then == "Sigmoid":
        nodes.append(helper.make_node("Sigmoid", ["t"], ["y"]))
    else:  # an integer op that keeps every bit pattern distinct
        inits.append(numpy_helper.from_array(np.array(7, np.int32), "seven"))
        nodes.append(helper.make_node("Add", ["t", "seven"], ["y"]))
    graph = helper.make_graph(nodes, "g", [x], [y], inits)
    path = tmp_path / "m.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), str(path))
    return path


# (N, C, H, W): C is the inner loop (stored contiguously), W the tiled outer one (read contiguously). W over 256
# spans several chunks of a task's unit (EVO_TILE_CHUNK blocks of 8), the last one cut short; the largest are
# split over the pool at 2 threads.
SHAPES = [(1, 16, 2, 8), (2, 80, 3, 24), (1, 13, 5, 11), (1, 8, 1, 9), (3, 9, 2, 7), (1, 81, 4, 17), (1, 3, 2, 5),
          (0, 16, 2, 8), (1, 24, 3, 700), (2, 17, 1, 520), (1, 8, 2, 256)]


@pytest.mark.parametrize("dtype", [TensorProto.FLOAT, TensorProto.INT32])
def test_tiled_transpose_matches_onnxruntime_at_whole_and_cut_blocks(tmp_path: Path, dtype: int) -> None:
    src = _nchw_to_nhwc(tmp_path, dtype, "Sigmoid" if dtype == TensorProto.FLOAT else "Add")
    dump = tmp_path / "dump"
    evonnx.optimize(src, tmp_path / "m.opt.onnx", dump_dir=dump, guard=False)
    source = (dump / "kernels.c").read_text()
    # symbolic H and W: the tiles run along H*W (tiles.merged_tile_axis; index._recombined puts the merged loop's
    # Reshape back together over symbolic sizes), not along rows of W cut short at both ends
    assert "8x16 tiles of w<H*W," in source
    # both loops store the transposed rows straight from registers to the output rows (prelude.c), not through a
    # block of rows copied on with memcpy (16-byte halves of 32-byte stores read back: YOLOv5's decode 12% slower)
    assert "evo_transpose16x8_to(tile, &out0[" in source and "evo_transpose8x8_to(tile, &out0[" in source
    assert "rows[" not in source
    ref = ort.InferenceSession(str(src), providers=["CPUExecutionProvider"])
    for threads in (1, 2):
        opt = evonnx.load_session(tmp_path / "m.opt.onnx", sess_options=_threads(threads))
        rng = np.random.default_rng(threads)
        for shape in SHAPES:
            if dtype == TensorProto.FLOAT:
                x = (rng.standard_normal(shape) * 4).astype(np.float32)
            else:
                x = rng.integers(-2**31, 2**31 - 8, size=shape, dtype=np.int32)
            (want,) = ref.run(None, {"x": x})
            (got,) = opt.run(None, {"x": x})
            np.testing.assert_array_equal(got, want, err_msg=f"shape {shape}, {threads} thread(s)")


@pytest.mark.parametrize("c", [96, 90])
def test_a_large_tiled_transpose_merges_its_rows_and_streams_whole_lines(tmp_path: Path, c: int) -> None:
    # constant H and W: the H and W loops are one loop of H*W along which the tiles read (tiles.merged_tile_axis);
    # the output is over EVO_STREAM_BYTES (4 MB): rows of 384 bytes (C = 96) are whole lines and stored around the
    # cache; rows of 360 bytes (C = 90) are not, and the cached loop stores them
    src = _nchw_to_nhwc(tmp_path, TensorProto.FLOAT, "Sigmoid", ("N", c, 160, 150))
    dump = tmp_path / "dump"
    evonnx.optimize(src, tmp_path / "m.opt.onnx", dump_dir=dump, guard=False)
    assert "8x16 tiles of w<24000," in (dump / "kernels.c").read_text()
    ref = ort.InferenceSession(str(src), providers=["CPUExecutionProvider"])
    x = (np.random.default_rng(c).standard_normal((1, c, 160, 150)) * 4).astype(np.float32)
    (want,) = ref.run(None, {"x": x})
    assert want.nbytes >= 8 << 20
    for threads in (1, 2):
        (got,) = evonnx.load_session(tmp_path / "m.opt.onnx", sess_options=_threads(threads)).run(None, {"x": x})
        np.testing.assert_array_equal(got, want, err_msg=f"{threads} thread(s)")


def test_merged_tile_axis_merges_only_loops_every_index_takes_as_one() -> None:
    h, w, c = var("h", Poly.of(80)), var("w", Poly.of(64)), var("c", Poly.of(16))
    read = Op("sigmoid", (Load(0, c * 5120 + h * 64 + w, "float32"),), "float32")
    outer, k, expr, pos = merged_tile_axis([h, w], 1, read, h * 1024 + w * 16 + c)
    assert (len(outer), k, str(pos)) == (1, 0, str(outer[0] * 16 + c))
    assert isinstance(expr, Op) and isinstance(expr.args[0], Load) and expr.args[0].index == c * 5120 + outer[0]
    # the store takes h and w as one, the read does not (a padded row): nothing merges
    padded = Op("sigmoid", (Load(0, c * 5440 + h * 68 + w, "float32"),), "float32")
    assert len(merged_tile_axis([h, w], 1, padded, h * 1024 + w * 16 + c)[0]) == 2
    # h inside a division: nothing merges
    halved = Op("sigmoid", (Load(0, c * 5120 + floordiv(h, 2) * 128 + w, "float32"),), "float32")
    assert len(merged_tile_axis([h, w], 1, halved, h * 1024 + w * 16 + c)[0]) == 2


def test_a_plain_tasks_inner_loop_merges_with_every_loop_all_its_indices_take_as_one() -> None:
    # a Concat piece of [1, 32, 80, 80] inputs: channel, row and column are one loop of 204,800 for both the read
    # and the store (codegen_c._add_task, tiles.merged_inner); an empty loop merges nothing (fuzz case 1219)
    c, h, w = var("c", Poly.of(32)), var("h", Poly.of(80)), var("w", Poly.of(80))
    read = Load(0, c * 6400 + h * 80 + w, "float32")
    outer, inner, [(tag, expr, pos)] = merged_inner([c, h], w, [("piece", read, c * 6400 + h * 80 + w + 204800)])
    assert outer == [] and inner.atom().extent == Poly.of(204800) and tag == "piece"  # type: ignore[union-attr]
    assert isinstance(expr, Load) and expr.index == inner and pos == inner + 204800
    # a broadcast along w (the read takes h but not w): nothing merges with w
    bcast = Load(0, c * 80 + h, "float32")
    outer, inner, _ = merged_inner([c, h], w, [("piece", bcast, c * 6400 + h * 80 + w)])
    assert len(outer) == 2 and inner == w
    empty = var("e", Poly.of(0))
    assert merged_inner([c], empty, [("piece", read, c * 0 + empty)])[0] == [c]


@pytest.mark.parametrize("dims", [(1, 32, 80, 80), ("N", 8, "H", "W")])
def test_a_concat_of_contiguous_tensors_is_one_loop_and_matches_onnxruntime(tmp_path: Path, dims: tuple) -> None:
    # C2f's Add + Concat: the plain task's inner loop takes in channel and row (tiles.merged_inner), with symbolic
    # sizes too; compared with onnxruntime on the original at sizes 0 and 1 of every symbolic dim
    f = TensorProto.FLOAT
    cat = [dims[0], 3 * dims[1] if isinstance(dims[1], int) else None, *dims[2:]]
    nodes = [helper.make_node("Add", ["a", "b"], ["r"]), helper.make_node("Concat", ["a", "b", "r"], ["y"], axis=1)]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info(x, f, list(dims)) for x in "ab"],
                              [helper.make_tensor_value_info("y", f, cat)])
    src = tmp_path / "m.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), str(src))
    dump = tmp_path / "dump"
    evonnx.optimize(src, tmp_path / "m.opt.onnx", dump_dir=dump, guard=False)
    source = (dump / "kernels.c").read_text()
    # the batch stays a loop of its own where it is symbolic: the Concat's output strides it by 24*H*W, the inputs
    # by 8*H*W
    assert ("; loops j<204800 " if isinstance(dims[0], int) else "; loops o0<N j<8*H*W ") in source
    ref = ort.InferenceSession(str(src), providers=["CPUExecutionProvider"])
    opt = evonnx.load_session(tmp_path / "m.opt.onnx")
    rng = np.random.default_rng(3)
    for n, h, w in ([(1, 80, 80)] if isinstance(dims[0], int) else [(2, 5, 7), (0, 3, 4), (1, 1, 1), (1, 0, 9)]):
        shape = (n, dims[1], h, w)
        feeds = {x: rng.standard_normal(shape).astype(np.float32) for x in "ab"}
        np.testing.assert_array_equal(opt.run(None, feeds)[0], ref.run(None, feeds)[0], err_msg=str(shape))


def test_tiles_start_where_the_input_rows_are_aligned_whatever_the_input_offset(tmp_path: Path) -> None:
    # blocks along w start where the strided rows are 32-byte aligned (tiles.row_start): an input 4, 8, ... 28
    # bytes into a line cuts the first block of every row short, and the last chunk takes one more block
    src = _nchw_to_nhwc(tmp_path, TensorProto.FLOAT, "Sigmoid", ("N", "C", 3, "W"))
    evonnx.optimize(src, tmp_path / "m.opt.onnx", guard=False)
    ref = ort.InferenceSession(str(src), providers=["CPUExecutionProvider"])
    opt = evonnx.load_session(tmp_path / "m.opt.onnx")
    rng = np.random.default_rng(7)
    for shape in [(1, 24, 3, 700), (2, 80, 3, 24), (1, 17, 3, 9)]:
        x = (rng.standard_normal(shape) * 4).astype(np.float32)
        for offset in range(0, 32, 4):
            buf = np.empty(x.nbytes + 64, np.uint8)
            start = (-buf.ctypes.data) % 32 + offset
            moved = buf[start:start + x.nbytes].view(np.float32).reshape(shape)
            moved[...] = x
            (want,) = ref.run(None, {"x": x})
            (got,) = opt.run(None, {"x": moved})
            np.testing.assert_array_equal(got, want, err_msg=f"shape {shape}, input {offset} bytes past 32")


def test_tiles_of_a_float16_input_start_where_its_rows_are_aligned(tmp_path: Path) -> None:
    # a float16 input cast to float32: blocks of 8 elements are 16 bytes, so rows 2, 4, ... 14 bytes past a block
    # start cut block 0 at another element than a float32 input would
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT16, ["N", "C", 3, "W"])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 3, "W", "C"])
    nodes = [helper.make_node("Cast", ["x"], ["f"], to=TensorProto.FLOAT),
             helper.make_node("Transpose", ["f"], ["t"], perm=[0, 2, 3, 1]), helper.make_node("Sigmoid", ["t"], ["y"])]
    src = tmp_path / "m.onnx"
    onnx.save(helper.make_model(helper.make_graph(nodes, "g", [x], [y]), opset_imports=[helper.make_opsetid("", 17)],
                                ir_version=8), str(src))
    dump = tmp_path / "dump"
    evonnx.optimize(src, tmp_path / "m.opt.onnx", dump_dir=dump, guard=False)
    assert "8x16 tiles of w<" in (dump / "kernels.c").read_text()
    ref = ort.InferenceSession(str(src), providers=["CPUExecutionProvider"])
    opt = evonnx.load_session(tmp_path / "m.opt.onnx")
    x16 = (np.random.default_rng(3).standard_normal((1, 40, 3, 301)) * 4).astype(np.float16)
    for offset in range(0, 16, 2):
        buf = np.empty(x16.nbytes + 64, np.uint8)
        start = (-buf.ctypes.data) % 32 + offset
        moved = buf[start:start + x16.nbytes].view(np.float16).reshape(x16.shape)
        moved[...] = x16
        np.testing.assert_array_equal(opt.run(None, {"x": moved})[0], ref.run(None, {"x": x16})[0],
                                      err_msg=f"input {offset} bytes past 32")


def _threads(n: int) -> ort.SessionOptions:
    so = ort.SessionOptions()
    so.intra_op_num_threads = n
    return so


def test_tile_axis_takes_only_a_strided_read_under_a_contiguous_store() -> None:
    c, w = var("c", Poly.of(80)), var("w", Poly.of(64))
    hw = Poly.of(6400)
    pos = w * 80 + c  # NHWC store: c contiguous
    strided = Op("sigmoid", (Load(0, c * hw + w, "float32"),), "float32")
    assert tile_axis([w], c, strided, pos, 4) == 0
    assert tile_axis([w], c, strided, pos, 8) is None  # float64: not 4-byte elements
    assert tile_axis([w], c, Op("sigmoid", (Load(0, w * 80 + c, "float32"),), "float32"), pos, 4) is None  # a copy
    assert tile_axis([w], c, strided, c * 64 + w, 4) is None  # the store is strided in c: the inner loop is wrong
    short = var("c", Poly.of(5))
    assert tile_axis([w], short, Op("sigmoid", (Load(0, short * hw + w, "float32"),), "float32"),
                     w * 5 + short, 4) is None  # shorter than a block
    k = var("k", Poly.of(4))
    summed = Reduce("sum", k, Load(0, c * hw + w + k, "float32"), "float32")
    assert tile_axis([w], c, summed, pos, 4) is None  # a reduction would be recomputed per element


def test_a_select_seen_only_inside_a_piece_splits_it_and_the_parts_tile(tmp_path: Path) -> None:
    """YOLOX's head: per level, Concat(objectness, classes) along channels, flattened, levels concatenated along
    anchors, Sigmoid. The select objectness-or-class reads `fmod(fdiv(i1, 64) + i2, 17) < 1` until the level
    split bounds i1; the refined pieces then tile the classes with no select left in the tile."""
    levels = [(8, 8), (4, 4)]
    nodes, inputs, flat = [], [], []
    for k, (h, w) in enumerate(levels):
        inputs += [helper.make_tensor_value_info(f"obj{k}", TensorProto.FLOAT, [1, 1, h, w]),
                   helper.make_tensor_value_info(f"cls{k}", TensorProto.FLOAT, [1, 16, h, w])]
        nodes += [helper.make_node("Concat", [f"obj{k}", f"cls{k}"], [f"cat{k}"], axis=1),
                  helper.make_node("Reshape", [f"cat{k}", "shape"], [f"flat{k}"])]
        flat.append(f"flat{k}")
    nodes += [helper.make_node("Concat", flat, ["all"], axis=2),
              helper.make_node("Transpose", ["all"], ["t"], perm=[0, 2, 1]),
              helper.make_node("Sigmoid", ["t"], ["y"])]
    graph = helper.make_graph(nodes, "g", inputs, [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 80, 17])],
                              [numpy_helper.from_array(np.array([1, 17, -1], np.int64), "shape")])
    src = tmp_path / "m.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), str(src))
    dump = tmp_path / "dump"
    evonnx.optimize(src, tmp_path / "m.opt.onnx", dump_dir=dump, guard=False)
    source = (dump / "kernels.c").read_text()
    tiled = [t for t in source.split("EVO_TASK")[1:] if "evo_transpose8x8_to(tile" in t]
    assert tiled and not any("?" in t.split("tile[jj][ww] =")[1].split(";")[0] for t in tiled), source
    rng = np.random.default_rng(0)
    feeds = {i.name: rng.standard_normal([d.dim_value for d in i.type.tensor_type.shape.dim]).astype(np.float32)
             for i in inputs}
    (want,) = ort.InferenceSession(str(src), providers=["CPUExecutionProvider"]).run(None, feeds)
    (got,) = evonnx.load_session(tmp_path / "m.opt.onnx").run(None, feeds)
    np.testing.assert_array_equal(got, want)


def _normalize_nhwc(tmp_path: Path, c: int) -> Path:
    """JDE's embeddings as exported: x [1, C, H, W] permuted to [1, H, W, C], divided by its L2 norm over C
    (F.normalize: the norm clipped at eps and expanded)."""
    n = helper.make_node
    nodes = [n("Transpose", ["x"], ["t"], perm=[0, 2, 3, 1]), n("ReduceL2", ["t"], ["l2"], axes=[-1], keepdims=1),
             n("Clip", ["l2", "eps", ""], ["d"]), n("Shape", ["t"], ["s"]), n("Expand", ["d", "s"], ["e"]),
             n("Div", ["t", "e"], ["y"])]
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, c, "H", "W"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, "H", "W", c])],
        [numpy_helper.from_array(np.array(1e-12, np.float32), "eps")])
    path = tmp_path / "norm.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), str(path))
    return path


@pytest.mark.parametrize("c", [64, 37])
def test_a_lane_task_stored_across_a_stride_is_tiled_and_matches_onnxruntime(tmp_path: Path, c: int,
                                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """A lane task (the norm over C for 8 lanes along W) whose store is contiguous along C and strided along W
    computes 8 x 8 tiles and stores them transposed (tiles.lane_tile_store): whole tiles, then the rest of C, the
    last block of lanes moved back over the one before, and W shorter than a block."""
    monkeypatch.setenv("EVONNX_COST_MODEL", "defaults")
    path = _normalize_nhwc(tmp_path, c)
    out, dump = tmp_path / "o.onnx", tmp_path / "dump"
    evonnx.optimize(path, out, sizes={"H": 3, "W": 16}, dump_dir=dump)
    code = (dump / "kernels.c").read_text()
    assert "reductions for 8 lanes of w<W" in code and "evo_transpose8x8_to(tile, &out0[" in code, code[-3000:]
    ref = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    got = evonnx.load_session(out)
    for h, w in ((3, 16), (2, 13), (1, 8), (3, 7), (1, 3)):
        x = np.random.default_rng(c * h * w).standard_normal((1, c, h, w)).astype(np.float32)
        x[0, :, 0, 0] = 0.0  # a zero norm: the eps
        (r,), (g,) = ref.run(None, {"x": x}), got.run(None, {"x": x})
        np.testing.assert_allclose(g, r, rtol=1e-6, atol=1e-7)
