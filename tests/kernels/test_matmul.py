"""MatMul by a small right-hand matrix (a DFL head's projection): fused as onnxruntime computes it.

onnxruntime's MLAS GEMM on a machine with FMA computes each output as one chain acc = fma(a_k, b_k, acc) over k in
order from +0; the fused kernel computes the same chain, so its result is the same bit for bit there (both CPU
variants: the baseline one calls libm's exact fmaf). The semantics table (tests/security) covers the special
values; this covers ordinary data, on lanes and on rows.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import evonnx
from evonnx import expr as E
from evonnx.passes.lazy import Reject, naming, source
from evonnx.passes.lower_common import Known
from evonnx.passes.lower_ops import lower_node
from evonnx.toolchain import cpu_runs_v3

pytestmark = pytest.mark.compiler

# (input shape, right-hand matrix shape, permutation of the input before the MatMul or None)
CASES = {
    "dfl column": ([1, 4, 16, "N"], (16, 1), [0, 3, 1, 2]),  # [1, N, 4, 16] x [16, 1], read along N: lanes
    "two columns": (["N", 3, 16], (16, 2), None),
    "matrix over rows": (["N", 5], (5, 4), None),
}
OUT_SHAPES = {"dfl column": [1, "N", 4, 1], "two columns": ["N", 3, 2], "matrix over rows": ["N", 4]}


def _model(tmp_path: Path, shape: list, w_shape: tuple[int, int], perm: list[int] | None, out: list) -> Path:
    rng = np.random.default_rng(7)
    w = rng.standard_normal(w_shape).astype(np.float32)
    # (Transpose, then Neg: onnxruntime folds a Transpose that feeds a MatMul alone into its FusedMatMul)
    nodes = [helper.make_node("Transpose", ["x"], ["t"], perm=perm)] if perm is not None else []
    nodes += [helper.make_node("Neg", ["t" if perm is not None else "x"], ["n"]),
              helper.make_node("MatMul", ["n", "w"], ["m"]),
              helper.make_node("Sigmoid", ["m"], ["y"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, out)],
                              [onnx.numpy_helper.from_array(w, "w")])
    path = tmp_path / "m.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), str(path))
    return path


@pytest.mark.parametrize("name", list(CASES))
def test_matmul_by_a_small_matrix_matches_onnxruntime(tmp_path: Path, name: str,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    shape, w_shape, perm = CASES[name]
    path = _model(tmp_path, shape, w_shape, perm, OUT_SHAPES[name])
    monkeypatch.setenv("EVONNX_COST_MODEL", "defaults")
    result = evonnx.optimize(path, tmp_path / "o.onnx", planner="greedy", sizes={"N": 37})
    optimized = onnx.load(str(tmp_path / "o.onnx"))
    assert "MatMul" not in {n.op_type for n in optimized.graph.node}, "the MatMul was left to onnxruntime"
    assert result.check is not None and result.check.compared >= 3
    if cpu_runs_v3():  # MLAS runs its FMA kernels: the same chain, bit for bit
        assert result.check.max_rel_err == 0, str(result.check)


def test_matmul_outside_the_small_forms_is_left_to_onnxruntime() -> None:
    def lowered(a: list[int], b: list[int], dtype: str = "float32", constant: bool = True) -> bool:
        w = np.ones(b, E.np_dtype(dtype))
        value = Known(dtype, w.shape, tuple(E.const(v, dtype) for v in w.reshape(-1).tolist())) if constant else None
        with naming():
            try:
                lower_node("MatMul", {}, [source(0, dtype, a), source(1, dtype, b)], [None, value], 1)
            except Reject:
                return False
            return True

    assert lowered([7, 16], [16, 1]) and lowered([2, 7, 32], [32, 4]) and lowered([7, 3], [3, 2], "float64")
    # B fed or computed at run time: onnxruntime's GEMM does not pack it and rounds otherwise (fuzz case 326)
    assert not lowered([7, 16], [16, 1], constant=False)
    assert not lowered([7, 1], [1, 4])  # an outer product
    assert not lowered([7, 64], [64, 1])  # K above 32: onnxruntime's GEMM
    assert not lowered([7, 16], [16, 8])  # N above 4
    assert not lowered([16], [16, 1])  # a vector on the left
    assert not lowered([2, 7, 16], [2, 16, 1])  # a batch of right-hand matrices
    assert not lowered([7, 16], [16, 1], "int32")  # integer MatMul
