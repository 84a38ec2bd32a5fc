"""Regression tests for hostile models (issue 8): text from a model never becomes code, a library serves only the
model it was built for, and optimize time does not explode on deep expression DAGs."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from evonnx.api import library_path, load_session, optimize

pytestmark = pytest.mark.compiler


def _canary(marker: Path) -> str:
    """C that, if it were ever compiled as code, creates `marker` when the library is loaded."""
    return (f'int evil_{marker.stem}(void); __attribute__((constructor)) static void pwn(void) '
            f'{{ FILE *f = fopen("{marker}", "w"); if (f) fclose(f); }}')


def _hostile_model(marker: Path) -> onnx.ModelProto:
    code = _canary(marker)
    out = f"y */ {code} /*"  # ends the tensor comment of a task function
    spliced = f"n *\\\n/ {code} /*"  # backslash-newline: the compiler splices `*` and `/` back together
    trigraph = f'q ??/" {code} /* %n %s'  # ??/ is a backslash under trigraphs; % is a format directive
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])
    y = helper.make_tensor_value_info(out, TensorProto.FLOAT, ["N", 4])
    nodes = [helper.make_node("Neg", ["x"], [trigraph], name=spliced),
             helper.make_node("Mul", [trigraph, "c"], ["t\u00e9\u2028" + "*/" * 40], name=trigraph),
             helper.make_node("Exp", ["t\u00e9\u2028" + "*/" * 40], [out], name=out + " node")]
    graph = helper.make_graph(nodes, f"g */ {code} /*", [x], [y],
                              initializer=[numpy_helper.from_array(np.array([2.0], np.float32), "c")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def test_names_never_reach_the_source_as_code(tmp_path: Path) -> None:
    marker = tmp_path / "PWNED"
    src = tmp_path / "m.onnx"
    onnx.save(_hostile_model(marker), src)
    dump = tmp_path / "dump"
    result = optimize(src, tmp_path / "m.opt.onnx", dump_dir=dump)
    assert result.kernels, "the hostile graph must go through code generation"
    source = (dump / "kernels.c").read_text()
    assert "*/ int evil" not in source and "??" not in source and "\\\n/" not in source
    assert "__attribute__((constructor))" in source  # present, but only inside an encoded comment
    # a fresh process loads the library and runs the model: the constructor must never run
    run = (f"import numpy as np, evonnx; s = evonnx.load_session({str(tmp_path / 'm.opt.onnx')!r}); "
           "print(s.run(None, {'x': np.ones((3, 4), np.float32)})[0].sum())")
    done = subprocess.run([sys.executable, "-c", run], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert not marker.exists(), "code from a model name ran"


def _arith_model(scale: float) -> onnx.ModelProto:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4])
    nodes = [helper.make_node("Mul", ["x", "c"], ["t"], name="mul"),
             helper.make_node("Add", ["t", "c"], ["y"], name="add")]
    graph = helper.make_graph(nodes, "g", [x], [y],
                              initializer=[numpy_helper.from_array(np.array([scale], np.float32), "c")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def test_library_serves_only_its_own_model(tmp_path: Path) -> None:
    # same node names, so the same kernel names; different arithmetic
    for name, scale in (("a", 2.0), ("b", 3.0)):
        onnx.save(_arith_model(scale), tmp_path / f"{name}.onnx")
        optimize(tmp_path / f"{name}.onnx", tmp_path / f"{name}.opt.onnx")
    so = ort.SessionOptions()
    so.register_custom_ops_library(str(library_path(tmp_path / "b.opt.onnx")))
    with pytest.raises(Exception, match="the model and the library do not belong together"):
        ort.InferenceSession(str(tmp_path / "a.opt.onnx"), so, providers=["CPUExecutionProvider"])


def _doubling_chain(levels: int) -> onnx.ModelProto:
    """a = a*a + a, `levels` times: 2*levels nodes, 3^levels paths through the expression."""
    nodes, a = [], "x"
    for k in range(levels):
        nodes += [helper.make_node("Mul", [a, a], [f"m{k}"], name=f"mul{k}"),
                  helper.make_node("Add", [f"m{k}", a], [f"a{k}"], name=f"add{k}")]
        a = f"a{k}"
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])],
                              [helper.make_tensor_value_info(a, TensorProto.FLOAT, ["N", 4])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def test_deep_shared_expressions_plan_in_linear_time(tmp_path: Path) -> None:
    # 24 levels are 2.8e11 paths: any walk that is not memoised never finishes; memoised, this takes seconds
    onnx.save(_doubling_chain(24), tmp_path / "chain.onnx")
    script = (f"from evonnx.api import optimize; "
              f"r = optimize({str(tmp_path / 'chain.onnx')!r}, {str(tmp_path / 'chain.opt.onnx')!r}, check=False); "
              f"print(len(r.kernels))")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert int(done.stdout.split()[-1]) >= 1


def _slice_chain(levels: int) -> onnx.ModelProto:
    """x[N] sliced [1:-1] `levels` times, each slice's exp concatenated: each Slice of a symbolic size nests the
    size before it about three times in min/max (fuzz case 109)."""
    nodes, a, parts = [], "x", []
    for k in range(levels):
        nodes += [helper.make_node("Slice", [a, "one", "minus_one", "zero"], [f"s{k}"]),
                  helper.make_node("Exp", [f"s{k}"], [f"e{k}"])]
        a = f"s{k}"
        parts.append(f"e{k}")
    nodes.append(helper.make_node("Concat", parts, ["y"], axis=0))
    inits = [numpy_helper.from_array(np.array([v], np.int64), n) for n, v in
             (("one", 1), ("minus_one", -1), ("zero", 0))]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N"])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def test_nested_sizes_stay_small_in_the_plan_and_the_source(tmp_path: Path) -> None:
    """16 chained Slices of a symbolic size: without bounds their sizes are tens of millions of atoms and the
    kernel source gigabytes. A node whose output sizes outgrow MAX_SIZE_WEIGHT is left to onnxruntime (its outputs
    get sizes of their own, so the chain after it fuses again), and a kernel prints each long size expression once,
    as a local (cprint.Hoist). The check passes at N = 0, 1, 3 and 65537."""
    from evonnx.index import Poly
    from evonnx.passes.analyze import MAX_SIZE_WEIGHT

    onnx.save(_slice_chain(16), tmp_path / "chain.onnx")
    dump = tmp_path / "dump"
    result = optimize(tmp_path / "chain.onnx", tmp_path / "chain.opt.onnx", dump_dir=dump, guard=False)
    assert result.kernels
    plan = (dump / "plan.txt").read_text()
    assert "min/max/division terms deep" in plan
    code = (dump / "kernels.c").read_text()
    assert "const int64_t z0 = " in code  # a size expression named once
    assert len(code) < 200_000 and max(len(line) for line in code.split("\n")) < 4_000
    for spec in result.kernels:  # a Concat adds its parts' sizes: a few times the bound at most
        assert all(isinstance(d, Poly) and d.weight() <= 3 * MAX_SIZE_WEIGHT for o in spec.outputs for d in o.shape)
    sess = load_session(tmp_path / "chain.opt.onnx")
    x = np.linspace(-1, 1, 40, dtype=np.float32)
    want = np.concatenate([np.exp(x[k + 1:len(x) - k - 1]) for k in range(16)])
    np.testing.assert_allclose(sess.run(None, {"x": x})[0], want, rtol=1e-6)


def test_kernels_whose_indices_multiply_out_too_far_are_left_to_onnxruntime(tmp_path: Path,
                                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """Sizes each within MAX_SIZE_WEIGHT can still multiply into index polynomials of millions of terms (the
    strides of a tensor whose dims are sums); a kernel holding one above MAX_INDEX_WEIGHT goes back to onnxruntime,
    and the plan says why. The bound is lowered here so that a small model meets it."""
    import evonnx.passes.lower_groups as lower_groups

    onnx.save(_slice_chain(3), tmp_path / "chain.onnx")
    monkeypatch.setattr(lower_groups, "MAX_INDEX_WEIGHT", 4)
    dump = tmp_path / "dump"
    result = optimize(tmp_path / "chain.onnx", tmp_path / "chain.opt.onnx", dump_dir=dump, guard=False)
    assert "index arithmetic is too large to print" in (dump / "plan.txt").read_text()
    for spec in result.kernels:
        assert all(p.weight() <= 4 for p in lower_groups._kernel_polys(spec))
    x = np.linspace(-1, 1, 12, dtype=np.float32)
    want = np.concatenate([np.exp(x[k + 1:len(x) - k - 1]) for k in range(3)])
    np.testing.assert_allclose(load_session(tmp_path / "chain.opt.onnx").run(None, {"x": x})[0], want, rtol=1e-6)
