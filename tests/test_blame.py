"""A difference at the check that starts in one kernel leaves that kernel to onnxruntime (`evonnx.blame`), not the
whole model: the rest of the plan is built and checked again, and the report says which kernel and why."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import evonnx
from evonnx.blame import blame_reason, blamed_kernel, differs
from evonnx.verify import RTOL

pytestmark = pytest.mark.compiler

F = TensorProto.FLOAT


def _overflowing_product(path: Path) -> Path:
    """y = ReduceProd(Concat([0], x)): at the check's large sizes the product of x overflows. onnxruntime's SIMD
    lanes reach inf before their zero and give NaN; a kernel that starts from the zero gives 0 (fuzz case 260).
    z = Relu(Neg(w)) is a kernel of its own that matches."""
    nodes = [helper.make_node("Concat", ["zero", "x"], ["c"], axis=0, name="cat"),
             helper.make_node("ReduceProd", ["c"], ["y"], keepdims=0, name="prod"),
             helper.make_node("Neg", ["w"], ["n"], name="neg"),
             helper.make_node("Relu", ["n"], ["z"], name="relu")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", F, ["N"]),
                                           helper.make_tensor_value_info("w", F, ["M", 4])],
                              [helper.make_tensor_value_info("y", F, []),
                               helper.make_tensor_value_info("z", F, ["M", 4])],
                              [numpy_helper.from_array(np.zeros(1, np.float32), "zero")])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), str(path))
    return path


def test_a_kernel_whose_output_differs_is_left_to_onnxruntime_and_the_rest_stays_fused(tmp_path: Path) -> None:
    src = _overflowing_product(tmp_path / "m.onnx")
    dst = tmp_path / "m.opt.onnx"
    result = evonnx.optimize(src, dst, planner="greedy", guard=False, report=tmp_path / "r.json")
    reasons = {r.node: r.reason for r in result.plan.rejected}
    assert blamed_kernel(reasons.get("prod", "")) and blamed_kernel(reasons.get("cat", "")), reasons
    assert "differed from onnxruntime at the check" in reasons["prod"] and "output 'y'" in reasons["prod"]
    # the other kernel is still there, and checked
    fused = [n for n in onnx.load(str(dst)).graph.node if n.domain == "ai.evonnx"]
    assert len(fused) == 1 and result.check is not None and result.check.runs
    assert {"neg", "relu"} <= {n for k in result.kernels for n in k.source_nodes}
    assert "nodes left to onnxruntime: kernel" in result.summary()
    assert any(blamed_kernel(r["reason"]) for r in json.loads((tmp_path / "r.json").read_text())["rejected"])
    # the written model gives onnxruntime's NaN where the product overflows
    so = ort.SessionOptions()
    so.register_custom_ops_library(str(tmp_path / "m.opt.evonnx.so"))
    sess = ort.InferenceSession(str(dst), so, providers=["CPUExecutionProvider"])
    feeds = {"x": np.full(4096, 400.0, np.float32), "w": -np.ones((3, 4), np.float32)}
    y, z = sess.run(None, feeds)
    ref = ort.InferenceSession(str(src), providers=["CPUExecutionProvider"]).run(None, feeds)
    assert np.array_equal(y, ref[0], equal_nan=True) and np.array_equal(z, np.ones((3, 4), np.float32))


def test_a_last_bit_that_onnxruntime_amplifies_is_traced_to_its_kernel(tmp_path: Path) -> None:
    """Where no kernel's outputs differ beyond the tolerance, the first kernel upstream of the output whose bits
    differ at all is where the difference starts: here a float64 sum of exps, 1 ulp off onnxruntime's, which its Cos
    of values near 1e300 turns into another number (fuzz case 2074 of the long run on da57773; replayed in
    tests/security too)."""
    src = Path(__file__).resolve().parent / "security" / "replays" / "case002074-84118808.onnx"
    result = evonnx.optimize(src, tmp_path / "m.opt.onnx", guard=False)
    assert result.check is not None and any(blamed_kernel(r.reason) for r in result.plan.rejected)


def test_blamed_kernel_reads_only_its_own_reasons() -> None:
    assert blamed_kernel(blame_reason("evo3_0123abcd", "output 'y' differs")) == "evo3_0123abcd"
    assert blamed_kernel("left to onnxruntime by the never-slower guard (a reduced plan failed the check)") is None
    assert blamed_kernel("left to onnxruntime: kernel evo1_ff, made of it, differed from onnxruntime at the "
                         "check (output ', kernel evo9_00' differs)") == "evo1_ff"


def test_differs_in_shape_nan_places_and_beyond_the_tolerance() -> None:
    a = np.array([1.0, np.nan, 3.0], np.float32)
    assert not differs(a, a.copy(), RTOL)
    assert not differs(a, a * np.float32(1 + 1e-6), RTOL)
    assert differs(a, np.array([1.0, 0.0, 3.0], np.float32), RTOL)  # a NaN's place
    assert differs(a, a * np.float32(1.01), RTOL)
    assert differs(a, a[:2], RTOL)
    assert differs(np.array([1, 2]), np.array([1, 3]), RTOL)
    assert not differs(np.array([True, False]), np.array([True, False]), RTOL)
