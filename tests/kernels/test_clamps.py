"""Clamps against constant bounds (Clip, Min/Max with a constant): the bounds are printed as opaque locals
(cprint.Hoist.opaque, prelude.c evo_opaque_*), so that gcc vectorises each clamp as vmaxps/vminps instead of the
mask arithmetic it makes of comparisons it folds through a select of constants. The operand order must give
exactly onnxruntime's results: a NaN value kept and a NaN bound ignored in Clip, a NaN from either side in Min and
Max, and Clip's zero signs for every pairing of -0.0 and +0.0 (Min's and Max's are onnxruntime's to choose), on both
CPU variants. A bound not given is the type's largest finite value (the spec and onnxruntime: Clip(+inf) with a
minimum only is FLT_MAX, 65504 in float16)."""

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

NP = {TensorProto.FLOAT: np.float32, TensorProto.DOUBLE: np.float64, TensorProto.FLOAT16: np.float16}
SPECIAL = [np.nan, -0.0, 0.0, np.inf, -np.inf, -4.0, 4.0, -4.5, 4.5, 1e-45, -1e-45, 3.0, -3.0, 1e30, -1e30, 0.5]


def _model(path: Path, dtype: int, lo: float, hi: float) -> Path:
    np_t = NP[dtype]
    with np.errstate(over="ignore"):  # 1e30 is inf in float16
        consts = [numpy_helper.from_array(np.array(v, np_t), name) for name, v in (("lo", lo), ("hi", hi))]
    nodes = [helper.make_node("Mul", ["x", "one"], ["m"]),
             helper.make_node("Clip", ["m", "lo", "hi"], ["clip"]),
             helper.make_node("Max", ["m", "lo"], ["mx"]),
             helper.make_node("Min", ["mx", "hi"], ["minmax"]),
             helper.make_node("Clip", ["m", "lo"], ["below"]),
             helper.make_node("Clip", ["m", "", "hi"], ["above"])]
    outs = [helper.make_tensor_value_info(n, dtype, ["N", 16]) for n in ("clip", "minmax", "below", "above")]
    graph = helper.make_graph(nodes, "clamps", [helper.make_tensor_value_info("x", dtype, ["N", 16])], outs,
                              [*consts, numpy_helper.from_array(np.array(1, np_t), "one")])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), path)
    return path


@pytest.mark.parametrize("dtype", [TensorProto.FLOAT, TensorProto.DOUBLE, TensorProto.FLOAT16])
@pytest.mark.parametrize(("lo", "hi"), [(-4.0, 4.0), (0.0, 1e30), (-0.0, 0.0), (np.nan, 3.0)])
def test_clamps_against_constant_bounds_match_onnxruntime_bit_for_bit(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                       dtype: int, lo: float, hi: float) -> None:
    src = _model(tmp_path / "m.onnx", dtype, lo, hi)
    dump = tmp_path / "dump"
    res = evonnx.optimize(src, tmp_path / "m.opt.onnx", guard=False, dump_dir=dump)
    assert res.kernels
    source = (dump / "kernels.c").read_text()
    suffix = "f64" if dtype == TensorProto.DOUBLE else "f32"  # float16 is clamped in float32
    assert re.search(rf"const (float|double) zf\d+ = evo_opaque_{suffix}\(", source), "bounds printed as locals"
    assert not re.search(rf"evo_n?m(in|ax)_{suffix}\([^;]*, -?[0-9.]+(e[-+]?[0-9]+)?f?\)", source), \
        "no clamp against a literal"
    rng = np.random.default_rng(3)
    np_t = NP[dtype]
    with np.errstate(over="ignore"):  # 1e30 is inf in float16
        x = np.concatenate([np.array(SPECIAL), rng.standard_normal(16 * 40) * 5]).astype(np_t).reshape(-1, 16)
    want = ort.InferenceSession(str(src), providers=["CPUExecutionProvider"]).run(None, {"x": x})
    for isa in ("", "baseline"):  # as this machine picks (x86-64-v3 where it can), then the baseline
        monkeypatch.setenv("EVONNX_CPU_ISA", isa)
        got = evonnx.load_session(tmp_path / "m.opt.onnx").run(None, {"x": x})
        for name, g, w in zip(("clip", "minmax", "below", "above"), got, want, strict=True):
            np.testing.assert_array_equal(g, w, err_msg=f"{name} ({isa or 'auto'})")
            if name != "minmax":  # onnxruntime's Min and Max leave the sign of a zero undefined (model.py)
                assert np.array_equal(np.signbit(g), np.signbit(w)), f"zero signs of {name} ({isa or 'auto'})"
