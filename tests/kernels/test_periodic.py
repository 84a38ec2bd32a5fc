"""Strided slice assignments (issue 12): `boxes[:, k::n] = f(...)`, exported as one ScatterND per stride whose
index grid steps by n, makes every output element a select on `fmod(i + k, n)`. The kernel splits that axis
into (q, r) with r < n unrolled, so each condition is a constant and folds (`schedule._modular`), and folds the
`x & 0` that a ScatterND's in-range test leaves (`expr._fold_logic`): no select, no read of a dead branch.

maskrcnn-benchmark's BoxCoder.decode (`models/delta2bbox_inplace.onnx`) ran 101x its bandwidth floor with a
select chain per element; split, it runs straight-line code over the box's 4 coordinates."""

from __future__ import annotations

import itertools
import re
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import evonnx
from evonnx.expr import Const, Load, binary
from evonnx.index import Poly, var

pytestmark = pytest.mark.compiler

MODELS = Path(__file__).resolve().parents[2] / "models"


def _tasks(code: str) -> str:
    """The generated task functions (the prelude defines evo_fmod and the like)."""
    return code[code.index("EVO_TASK(", code.index("kernel evo")):]


def test_and_or_xor_with_a_constant_fold() -> None:
    i = var("i", Poly.of(8))
    x = binary("lt", Load(0, i, "float32"), Load(0, i + 1, "float32"))
    false, true = Const(False, "bool"), Const(True, "bool")
    assert binary("and", x, false) == false and binary("and", false, x) == false
    assert binary("and", true, x) == x and binary("or", x, false) == x
    assert binary("or", true, x) == true and binary("or", x, true) == true
    assert binary("xor", x, false) == x
    negated = binary("xor", true, x)
    assert negated != x and getattr(negated, "op", None) == "not"


def _strided_assignments(path: Path, n_rows: int, cols: int, parts: list[tuple[int, int, str]]) -> Path:
    """y = x, then for each (start, step, op): y[:, start::step] = op(x[:, start::step]), one ScatterND each, with
    constant index grids as the TorchScript exporter leaves them once folded."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [n_rows, cols])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [n_rows, cols])
    nodes, inits, cur = [], [], "x"
    for k, (start, step, op) in enumerate(parts):
        picked = list(range(start, cols, step))
        grid = np.array([[[r, c] for c in picked] for r in range(n_rows)], np.int64).reshape(n_rows, len(picked), 2)
        inits += [numpy_helper.from_array(grid, f"idx{k}"),
                  numpy_helper.from_array(np.array([start], np.int64), f"s{k}"),
                  numpy_helper.from_array(np.array([cols], np.int64), f"e{k}"),
                  numpy_helper.from_array(np.array([1], np.int64), f"a{k}"),
                  numpy_helper.from_array(np.array([step], np.int64), f"p{k}"),
                  numpy_helper.from_array(np.array(0.5 + k, np.float32), f"c{k}")]
        nodes.append(helper.make_node("Slice", ["x", f"s{k}", f"e{k}", f"a{k}", f"p{k}"], [f"sl{k}"]))
        if op == "Exp":
            nodes.append(helper.make_node("Exp", [f"sl{k}"], [f"u{k}"]))
        else:
            nodes.append(helper.make_node(op, [f"sl{k}", f"c{k}"], [f"u{k}"]))
        out = "y" if k == len(parts) - 1 else f"w{k}"
        nodes.append(helper.make_node("ScatterND", [cur, f"idx{k}", f"u{k}"], [out]))
        cur = out
    graph = helper.make_graph(nodes, "g", [x], [y], inits)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), str(path))
    return path


CASES = [
    (5, 12, [(0, 4, "Mul"), (1, 4, "Add"), (2, 4, "Exp"), (3, 4, "Sub")], True),  # every coordinate of a box
    (3, 12, [(1, 4, "Mul"), (3, 4, "Exp")], True),  # some strides left as they were
    (4, 8, [(0, 2, "Max"), (1, 2, "Min")], True),  # a clamp of x and of y: 2 x 2 unrolled
    (2, 9, [(2, 3, "Add"), (0, 3, "Mul")], True),  # a period of 3
    (3, 13, [(1, 4, "Mul"), (0, 4, "Exp")], False),  # 4 does not divide 13: selects stay, results must not move
    (1, 40, [(5, 8, "Add"), (7, 8, "Mul")], True),  # a period of 8
]


@pytest.mark.parametrize(("rows", "cols", "parts", "periodic"), CASES)
def test_strided_slice_assignments_match_onnxruntime(tmp_path: Path, rows: int, cols: int,
                                                     parts: list[tuple[int, int, str]], periodic: bool) -> None:
    src = _strided_assignments(tmp_path / "m.onnx", rows, cols, parts)
    dump = tmp_path / "dump"
    evonnx.optimize(src, tmp_path / "m.opt.onnx", dump_dir=dump, guard=False)
    code = (dump / "kernels.c").read_text()
    assert "Fused" in {nd.op_type for nd in onnx.load(str(tmp_path / "m.opt.onnx")).graph.node}
    if periodic:
        period = max(p[1] for p in parts)
        tasks = _tasks(code)
        widths = [int(w) for w in re.findall(r"(\d+) unrolled", code)]
        assert widths and all(w % period == 0 for w in widths), widths
        assert "volatile" not in tasks and "evo_fmod" not in tasks and "evo_fdiv" not in tasks
    ref = ort.InferenceSession(str(src), providers=["CPUExecutionProvider"])
    opt = evonnx.load_session(tmp_path / "m.opt.onnx")
    rng = np.random.default_rng(rows * cols)
    for scale in (1.0, 50.0):
        x = (rng.standard_normal((rows, cols)) * scale).astype(np.float32)
        x.flat[:4] = [np.nan, np.inf, -np.inf, -0.0]
        (want,), (got,) = ref.run(None, {"x": x}), opt.run(None, {"x": x})
        np.testing.assert_allclose(got, want, rtol=2e-6, atol=0, equal_nan=True)
        assert np.array_equal(np.signbit(got), np.signbit(want))


@pytest.mark.parametrize("name", ["delta2bbox_inplace", "clamp_inplace"])
def test_exported_slice_assignments_run_without_selects(tmp_path: Path, name: str) -> None:
    """The real exports: one piece over the whole row, the coordinates unrolled, and onnxruntime's result at
    N = 0, 1 and more."""
    src = MODELS / f"{name}.onnx"
    dump = tmp_path / "dump"
    evonnx.optimize(src, tmp_path / "m.opt.onnx", dump_dir=dump, guard=False)
    code = (dump / "kernels.c").read_text()
    tasks = _tasks(code)
    assert "4 unrolled" in code and "volatile" not in tasks and "evo_fmod" not in tasks
    assert tasks.count("EVO_TASK(") == 1
    ref = ort.InferenceSession(str(src), providers=["CPUExecutionProvider"])
    opt = evonnx.load_session(tmp_path / "m.opt.onnx")
    rng = np.random.default_rng(3)
    for n in (0, 1, 7, 1000):
        feeds = {}
        for i in ref.get_inputs():
            shape = [n if isinstance(d, str) else d for d in i.shape]
            lo = rng.uniform(0, 500, shape[:-1] + [2]).astype(np.float32) if shape[-1] == 4 else None
            if lo is not None:  # boxes: x1 y1 x2 y2 with x2 >= x1
                feeds[i.name] = np.concatenate([lo, lo + rng.uniform(1, 300, lo.shape).astype(np.float32)], -1)
            else:
                feeds[i.name] = rng.standard_normal(shape).astype(np.float32)
        want, got = ref.run(None, feeds), opt.run(None, feeds)
        for a, b in itertools.zip_longest(want, got):
            np.testing.assert_allclose(b, a, rtol=2e-5, atol=1e-3)
