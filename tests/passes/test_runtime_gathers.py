"""Gathers whose indices a kernel reads at run time (passes/lower_gathers.py, expr.Picked): Gather, GatherElements
and GatherND of a TopK's or an input's indices fuse on the CPU, give onnxruntime's result for every index in
[-dim, dim), and fail the Run as onnxruntime does on one outside it, on an axis of 0 elements included. A CUDA
target leaves them to onnxruntime (its kernels cannot fail a Run)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

import evonnx
from evonnx.passes.pipeline import run_pipeline

pytestmark = pytest.mark.compiler


def test_run_time_indices_are_on_unless_turned_off(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    src = _gather_model(tmp_path, "GatherND", ["N", 5, 3], ["K", 2], ["K", 3])
    opt = src.with_suffix(".opt.onnx")
    monkeypatch.delenv("EVONNX_RUNTIME_INDICES", raising=False)
    evonnx.optimize(src, opt, guard=False, planner="greedy")
    assert "GatherND" not in [n.op_type for n in onnx.load(str(opt)).graph.node]
    monkeypatch.setenv("EVONNX_RUNTIME_INDICES", "0")
    evonnx.optimize(src, opt, guard=False, planner="greedy")
    assert "GatherND" in [n.op_type for n in onnx.load(str(opt)).graph.node]


def _save(tmp_path: Path, name: str, nodes: list[onnx.NodeProto], inputs: list[onnx.ValueInfoProto],
          outputs: list[onnx.ValueInfoProto], inits: list[onnx.TensorProto] = ()) -> Path:
    for k, n in enumerate(nodes):
        n.name = n.name or f"{n.op_type}_{k}"
    graph = helper.make_graph(nodes, "g", inputs, outputs, list(inits))
    path = tmp_path / f"{name}.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), str(path))
    return path


def _gather_model(tmp_path: Path, op: str, x_shape: list[object], i_shape: list[object], y_shape: list[object],
                  **attrs: int) -> Path:
    """x -> Exp -> op(., i) -> Neg: the indices `i` are an input, read by the kernel at run time."""
    nodes = [helper.make_node("Exp", ["x"], ["e"]), helper.make_node(op, ["e", "i"], ["g"], **attrs),
             helper.make_node("Neg", ["g"], ["y"])]
    return _save(tmp_path, op, nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, x_shape),
                                       helper.make_tensor_value_info("i", TensorProto.INT64, i_shape)],
                 [helper.make_tensor_value_info("y", TensorProto.FLOAT, y_shape)])


def _optimized(src: Path, planner: str = "greedy") -> Path:
    opt = src.with_suffix(".opt.onnx")
    evonnx.optimize(src, opt, guard=False, planner=planner)
    kept = [n.op_type for n in onnx.load(str(opt)).graph.node if n.domain != "ai.evonnx"]
    assert kept == [], f"everything fuses, {kept} left"
    return opt


def _agree(src: Path, opt: Path, feeds: dict[str, np.ndarray]) -> str:
    """Both models' outputs equal, or both Runs fail: 'ok' or 'failed'."""
    ref = ort.InferenceSession(str(src), providers=["CPUExecutionProvider"])
    got = evonnx.load_session(opt)
    try:
        want = ref.run(None, feeds)
    except Exception:  # noqa: BLE001 - onnxruntime's index errors
        with pytest.raises(Exception, match="index out of range|axis of 0 elements|out of data bounds"):
            got.run(None, feeds)
        return "failed"
    for w, g in zip(want, got.run(None, feeds), strict=True):
        assert g.shape == w.shape
        np.testing.assert_allclose(g, w, rtol=1e-6)
    return "ok"


CASES = {
    # op, data shape, indices shape, output shape, attributes, indices for (n, k)
    "Gather": ("Gather", [4, "N"], ["K"], [4, "K"], {"axis": 1}, lambda r, n, k: r.integers(-n, max(n, 1), (k,))),
    "Gather axis 0": ("Gather", ["N", 5], ["K", 2], ["K", 2, 5], {"axis": 0},
                      lambda r, n, k: r.integers(-n, max(n, 1), (k, 2))),
    "GatherElements": ("GatherElements", ["N", 5], ["N", "K"], ["N", "K"], {"axis": 1},
                       lambda r, n, k: r.integers(-5, 5, (n, k))),
    "GatherND": ("GatherND", ["N", 5, 3], ["K", 2], ["K", 3], {},
                 lambda r, n, k: np.stack([r.integers(-n, max(n, 1), k), r.integers(-5, 5, k)], 1)),
    "GatherND batch_dims": ("GatherND", ["N", 5, 3], ["N", "K", 1], ["N", "K", 3], {"batch_dims": 1},
                            lambda r, n, k: r.integers(-5, 5, (n, k, 1))),
}


@pytest.mark.parametrize("case", list(CASES))
def test_indices_read_at_run_time_give_onnxruntimes_result_or_its_failure(tmp_path: Path, case: str) -> None:
    op, xs, ishape, ys, attrs, draw = CASES[case]
    src = _gather_model(tmp_path, op, xs, ishape, ys, **attrs)
    opt = _optimized(src)
    rng = np.random.default_rng(0)
    seen = []
    for n, k, bad in [(4, 3, 0), (1, 7, 0), (6, 5, 99), (6, 5, -99), (5, 3, 5), (0, 3, 0), (4, 0, 0)]:
        x = rng.random([n if d == "N" else d for d in xs]).astype(np.float32)
        i = np.asarray(draw(rng, n, k), np.int64)
        if bad and i.size:
            i.reshape(-1)[-1] = bad  # one index out of range (5: just past an axis of 5 elements)
        seen.append(_agree(src, opt, {"x": x, "i": i}))
    assert seen[:2] == ["ok", "ok"] and seen[2:5] == ["failed"] * 3 and seen[6] == "ok", seen


def test_a_topk_gathered_by_a_batch_grid_fuses_with_what_reads_it(tmp_path: Path) -> None:
    # mmdet's batched top-k in a dynamic-batch export: GatherND(boxes, Concat(batch grid, TopK indices)). The
    # grid's index is the loop's own (no run-time read); the TopK's is read and checked
    k = 7
    nodes = [helper.make_node("TopK", ["s", "k"], ["v", "t"], axis=-1),
             helper.make_node("Shape", ["s"], ["sh"]), helper.make_node("Gather", ["sh", "zero"], ["b"], axis=0),
             helper.make_node("Range", ["zero", "b", "one"], ["r"]),
             helper.make_node("Unsqueeze", ["r", "ax1"], ["r1"]), helper.make_node("Expand", ["r1", "shp"], ["rg"]),
             helper.make_node("Unsqueeze", ["rg", "axm"], ["rg2"]), helper.make_node("Unsqueeze", ["t", "axm"], ["t2"]),
             helper.make_node("Concat", ["rg2", "t2"], ["ind"], axis=-1),
             helper.make_node("GatherND", ["boxes", "ind"], ["g"]), helper.make_node("Sigmoid", ["g"], ["y"])]
    inits = [onnx.numpy_helper.from_array(np.array(v, np.int64), name) for name, v in
             (("k", [k]), ("zero", 0), ("one", 1), ("ax1", [1]), ("axm", [-1]), ("shp", [1, k]))]
    src = _save(tmp_path, "topk", nodes, [helper.make_tensor_value_info("s", TensorProto.FLOAT, ["B", 40]),
                                          helper.make_tensor_value_info("boxes", TensorProto.FLOAT, ["B", 40, 4])],
                [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["B", k, 4])], inits)
    opt = src.with_suffix(".opt.onnx")
    evonnx.optimize(src, opt, guard=False, planner="greedy")
    kept = sorted(n.op_type for n in onnx.load(str(opt)).graph.node if n.domain != "ai.evonnx")
    assert kept == ["TopK"]
    rng = np.random.default_rng(1)
    for b in (0, 1, 3):
        feeds = {"s": rng.random((b, 40)).astype(np.float32), "boxes": rng.random((b, 40, 4)).astype(np.float32)}
        assert _agree(src, opt, feeds) == "ok"


def test_an_argmax_read_as_an_index_is_computed_where_it_is_read(tmp_path: Path) -> None:
    # boxes[n, argmax(scores[n]), :]: the ArgMax is a reduction inside the index
    nodes = [helper.make_node("ArgMax", ["x"], ["a"], axis=1, keepdims=1),
             helper.make_node("Unsqueeze", ["a", "ax"], ["a2"]), helper.make_node("Expand", ["a2", "shp"], ["a3"]),
             helper.make_node("GatherElements", ["b", "a3"], ["g"], axis=1), helper.make_node("Sigmoid", ["g"], ["y"])]
    inits = [onnx.numpy_helper.from_array(np.array([2], np.int64), "ax"),
             onnx.numpy_helper.from_array(np.array([1, 1, 4], np.int64), "shp")]
    src = _save(tmp_path, "argmax", nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 80]),
                                            helper.make_tensor_value_info("b", TensorProto.FLOAT, ["N", 80, 4])],
                [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 1, 4])], inits)
    opt = _optimized(src, planner="search")  # the greedy planner leaves the ArgMax to onnxruntime
    rng = np.random.default_rng(2)
    for n in (0, 1, 9):
        feeds = {"x": rng.random((n, 80)).astype(np.float32), "b": rng.random((n, 80, 4)).astype(np.float32)}
        assert _agree(src, opt, feeds) == "ok"


def test_a_cuda_target_leaves_run_time_indices_to_onnxruntime(tmp_path: Path) -> None:
    src = _gather_model(tmp_path, "GatherND", ["N", 5, 3], ["K", 2], ["K", 3])
    model = onnx.load(str(src))
    cpu = run_pipeline(model, planner="greedy", runtime_indices=True)
    cuda = run_pipeline(model, planner="greedy", runtime_indices=False)
    assert "GatherND" in [op for s in cpu.specs for op in s.source_ops]
    assert "GatherND" not in [op for s in cuda.specs for op in s.source_ops]
    assert any("GatherND" in str(r) and "CPU only" in str(r) for r in cuda.plan.rejected)


@pytest.mark.parametrize("shape, axis", [(["N", "M"], 0), (["N", "M"], 1)])
def test_onnxruntime_checks_indices_no_element_reads_so_such_gathers_stay(tmp_path: Path, shape: list[object],
                                                                         axis: int) -> None:
    # Gather of x[N, M] along axis 0 with M = 0, or along axis 1 with N = 0: onnxruntime checks every index (and
    # fails on any where the axis is empty: fuzz case 173), the kernel would read none
    out = [["K", "M"], ["N", "K"]][axis]
    src = _gather_model(tmp_path, "Gather", shape, ["K"], out, axis=axis)
    opt = src.with_suffix(".opt.onnx")
    evonnx.optimize(src, opt, guard=False, planner="greedy", check=False)
    assert "Gather" in [n.op_type for n in onnx.load(str(opt)).graph.node]
    x = np.zeros((0, 0), np.float32)
    assert _agree(src, opt, {"x": x, "i": np.zeros(3, np.int64)}) == "failed"


def test_an_index_the_address_does_not_use_is_still_checked(tmp_path: Path) -> None:
    # GatherElements(t, t) of t = x[N, 1]: along an axis of one element the address reads 0 whatever the index,
    # and the check went with it (fuzz case 918): an index of 4 returned a result where onnxruntime fails
    nodes = [helper.make_node("Unsqueeze", ["x", "ax"], ["t"]),
             helper.make_node("GatherElements", ["t", "t"], ["g"], axis=-1), helper.make_node("Neg", ["g"], ["y"])]
    src = _save(tmp_path, "one", nodes, [helper.make_tensor_value_info("x", TensorProto.INT64, ["N"])],
                [helper.make_tensor_value_info("y", TensorProto.INT64, ["N", 1])],
                [onnx.numpy_helper.from_array(np.array([1], np.int64), "ax")])
    opt = _optimized(src)
    assert [_agree(src, opt, {"x": np.array(v, np.int64)}) for v in ([0, -1, 0], [0, 4], [])] == \
        ["ok", "failed", "ok"]


def test_indices_computed_by_an_inexact_op_leave_their_kernel_to_onnxruntime(tmp_path: Path) -> None:
    # indices = Cast(Exp(x)) mod 1000: the last bit of evonnx's exp against onnxruntime's picks another element
    # (fuzz case 1261), so the kernel that would gather there is left to onnxruntime
    nodes = [helper.make_node("Exp", ["x"], ["e"]), helper.make_node("Cast", ["e"], ["c"], to=TensorProto.INT64),
             helper.make_node("Mod", ["c", "m"], ["i"]),
             helper.make_node("GatherElements", ["e", "i"], ["y"], axis=1)]
    src = _save(tmp_path, "inexact", nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 1000])],
                [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 1000])],
                [onnx.numpy_helper.from_array(np.array(1000, np.int64), "m")])
    opt = src.with_suffix(".opt.onnx")
    evonnx.optimize(src, opt, guard=False, planner="greedy")
    assert "GatherElements" in [n.op_type for n in onnx.load(str(opt)).graph.node]


def test_float16_data_gathers_at_run_time_indices(tmp_path: Path) -> None:
    # expr.keep of a float16 element was printed as arithmetic on float16, which kernels never compute in (fuzz
    # seed 972000, cases 187, 589, 733, 774: an internal error for every float16 gather of run-time indices)
    nodes = [helper.make_node("Gather", ["x", "i"], ["g"], axis=1), helper.make_node("Neg", ["g"], ["y"])]
    src = _save(tmp_path, "half", nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT16, [3, 5]),
                                          helper.make_tensor_value_info("i", TensorProto.INT64, ["K"])],
                [helper.make_tensor_value_info("y", TensorProto.FLOAT16, [3, "K"])])
    opt = _optimized(src)
    x = np.arange(15, dtype=np.float16).reshape(3, 5) / 4
    assert [_agree(src, opt, {"x": x, "i": np.array(v, np.int64)}) for v in ([4, -5, 0], [5], [])] == \
        ["ok", "failed", "ok"]
