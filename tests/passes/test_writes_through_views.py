"""Writes through views (issue 3): hypothesis draws a tensor and a sequence of reads and writes through random
views of it, exported as exporters do (Slice reads, ScatterND / ScatterElements writes with constant index grids),
and the optimized model must reproduce onnxruntime on the original bit for bit, with the writes fused."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

import evonnx

pytestmark = pytest.mark.compiler


@st.composite
def view_slices(draw: st.DrawFn, shape: tuple[int, ...]) -> tuple[slice, ...]:
    out = []
    for d in shape:
        step = draw(st.sampled_from([1, 1, 2, -1, -2, 3]))
        start = draw(st.integers(0, d - 1))
        length = draw(st.integers(1, len(range(start, d if step > 0 else -1, step))))
        stop = start + step * length
        out.append(slice(start, stop if stop >= 0 else None, step))
    return tuple(out)


def _region(shape: tuple[int, ...], sl: tuple[slice, ...]) -> list[np.ndarray]:
    return [np.arange(d)[s] for d, s in zip(shape, sl)]


class _Builder:
    def __init__(self) -> None:
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []
        self.n = 0

    def name(self, base: str) -> str:
        self.n += 1
        return f"{base}{self.n}"

    def const(self, arr: np.ndarray) -> str:
        name = self.name("c")
        self.inits.append(numpy_helper.from_array(np.asarray(arr), name))
        return name

    def slice(self, x: str, shape: tuple[int, ...], sl: tuple[slice, ...]) -> str:
        starts, ends, steps = [], [], []
        for d, s in zip(shape, sl):
            starts.append(s.start)
            ends.append(s.stop if s.stop is not None else -d - 1)  # before the first element
            steps.append(s.step)
        out = self.name("v")
        self.nodes.append(helper.make_node("Slice", [x, self.const(np.array(starts, np.int64)),
                                                     self.const(np.array(ends, np.int64)),
                                                     self.const(np.arange(len(shape), dtype=np.int64)),
                                                     self.const(np.array(steps, np.int64))], [out]))
        return out

    def op(self, op_type: str, inputs: list[str], **attrs: object) -> str:
        out = self.name("t")
        self.nodes.append(helper.make_node(op_type, inputs, [out], **attrs))
        return out


@st.composite
def programs(draw: st.DrawFn) -> tuple[onnx.ModelProto, tuple[int, ...], int]:
    """A model, its input shape, and how many of its writes have affine index grids (those must fuse; a write
    with other constant indices may stay with onnxruntime)."""
    shape = tuple(draw(st.lists(st.integers(1, 6), min_size=2, max_size=3)))
    b = _Builder()
    affine = 0
    cur = "x"
    outputs: list[str] = []
    for _ in range(draw(st.integers(1, 4))):
        kind = draw(st.sampled_from(["update", "copy", "elements", "read"]))
        dst = draw(view_slices(shape))
        lengths = [len(r) for r in _region(shape, dst)]
        if kind == "read":
            outputs.append(b.slice(cur, shape, dst))
            continue
        if kind == "elements":
            # ScatterElements along axis 0 into rows `rows`, for every column: out[rows[i], j] = upd[i, j]
            rows = np.array(sorted(set(draw(st.lists(st.integers(0, shape[0] - 1), min_size=1, max_size=shape[0])))))
            affine += len(rows) < 3 or bool(np.all(np.diff(rows) == rows[1] - rows[0]))
            ind = np.broadcast_to(rows.reshape((-1,) + (1,) * (len(shape) - 1)), (len(rows),) + shape[1:])
            upd = b.op("Add", [b.op("Gather", [cur, b.const(rows.astype(np.int64))], axis=0),
                               b.const(np.array(1.0, np.float32))])
            red = draw(st.sampled_from(["none", "add", "max"]))
            cur = b.op("ScatterElements", [cur, b.const(np.ascontiguousarray(ind).astype(np.int64)), upd], axis=0,
                       reduction=red)
            continue
        if kind == "update":
            src = dst  # x[dst] = x[dst] * 2 + 1
        else:
            src = []  # x[dst] = x[src] for another region of the same lengths
            for d, n in zip(shape, lengths):
                step = draw(st.sampled_from([1, -1, 2]))
                span = (n - 1) * abs(step) + 1
                if span > d:
                    step, span = 1, n
                start = draw(st.integers(0, d - span)) if step > 0 else draw(st.integers(span - 1, d - 1))
                stop = start + step * n
                src.append(slice(start, stop if stop >= 0 else None, step))
            src = tuple(src)
        val = b.slice(cur, shape, src)
        if kind == "update":
            val = b.op("Add", [b.op("Mul", [val, b.const(np.array(2.0, np.float32))]),
                               b.const(np.array(1.0, np.float32))])
        grid = np.stack(np.meshgrid(*_region(shape, dst), indexing="ij"), axis=-1).astype(np.int64)
        cur = b.op("ScatterND", [cur, b.const(grid), val])
        affine += 1
    final = b.op("Mul", [cur, b.const(np.array(3.0, np.float32))])
    outputs = outputs + [final]
    graph = helper.make_graph(
        b.nodes, "views", [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(shape))],
        [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in outputs], b.inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=8)
    model = onnx.shape_inference.infer_shapes(model)
    inferred = {v.name: v for v in list(model.graph.value_info) + list(model.graph.output)
                if v.type.tensor_type.HasField("shape")}
    typed = [inferred[o] for o in outputs]
    del model.graph.output[:]
    model.graph.output.extend(typed)
    return model, shape, affine


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(programs())
def test_writes_through_views_match_onnxruntime(tmp_path_factory: pytest.TempPathFactory,
                                                 prog: tuple[onnx.ModelProto, tuple[int, ...], int]) -> None:
    model, shape, affine = prog
    d = tmp_path_factory.mktemp("views")
    src, dst = d / "m.onnx", d / "m.opt.onnx"
    onnx.save(model, str(src))
    result = evonnx.optimize(src, dst)
    fused_writes = sum(op in ("ScatterND", "ScatterElements") for k in result.kernels for op in k.source_ops)
    assert fused_writes >= affine, "every write with an affine index grid is fused"
    x = np.random.default_rng(7).standard_normal(shape).astype(np.float32)
    ref = ort.InferenceSession(str(src), providers=["CPUExecutionProvider"]).run(None, {"x": x})
    got = evonnx.load_session(dst).run(None, {"x": x})
    for r, g in zip(ref, got):
        np.testing.assert_array_equal(g, r)


def test_a_tabled_scatter_comes_out_the_same_in_every_run_of_one_process() -> None:
    """Constant indices that are no affine grid are lowered through tables; their names are numbered per pipeline
    run, so one model gives the same kernel (and library fingerprint) however many models the process planned."""
    from evonnx.kernels.codegen_c import generate
    from evonnx.passes.pipeline import run_pipeline
    from evonnx.records import kernel_fingerprint

    nodes = [helper.make_node("Neg", ["x"], ["n"], name="a"), helper.make_node("Neg", ["u"], ["m"], name="b"),
             helper.make_node("ScatterND", ["n", "idx", "m"], ["s"], name="c"),
             helper.make_node("Abs", ["s"], ["y"], name="d")]
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [7, 8]),
                     helper.make_tensor_value_info("u", TensorProto.FLOAT, [3, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [7, 8])],
        [numpy_helper.from_array(np.array([[3], [1], [6]], np.int64), "idx")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    runs = [run_pipeline(model, planner="greedy").specs for _ in range(3)]
    assert "scount" in str(runs[0][0].outputs[0].expr), "the scatter is lowered through tables"
    assert len({tuple(kernel_fingerprint(s) for s in specs) for specs in runs}) == 1
    assert len({generate(specs, "m") for specs in runs}) == 1


def test_pipeline_runs_in_two_threads_at_once_number_their_tables_alike() -> None:
    """Each run numbers tables and reduction variables in a context of its own (`lazy.naming`), not in process
    state: two runs at once in two threads give the kernels one run alone gives (with one counter they took turns
    and got other names)."""
    import threading

    from evonnx.passes.pipeline import run_pipeline
    from evonnx.records import kernel_fingerprint

    nodes = [helper.make_node("Neg", ["x"], ["n"], name="a"), helper.make_node("Neg", ["u"], ["m"], name="b"),
             helper.make_node("ScatterND", ["n", "idx", "m"], ["s"], name="c"),
             helper.make_node("ReduceSum", ["s", "ax"], ["r"], name="e", keepdims=1),
             helper.make_node("Sub", ["s", "r"], ["y"], name="d")]
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [7, 8]),
                     helper.make_tensor_value_info("u", TensorProto.FLOAT, [3, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [7, 8])],
        [numpy_helper.from_array(np.array([[3], [1], [6]], np.int64), "idx"),
         numpy_helper.from_array(np.array([1], np.int64), "ax")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    alone = tuple(kernel_fingerprint(s) for s in run_pipeline(model, planner="greedy").specs)
    assert alone
    got: list[tuple[str, ...]] = []
    start = threading.Barrier(4)

    def run() -> None:
        start.wait()
        for _ in range(5):
            got.append(tuple(kernel_fingerprint(s) for s in run_pipeline(model, planner="greedy").specs))

    threads = [threading.Thread(target=run) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(got) == 20 and set(got) == {alone}
